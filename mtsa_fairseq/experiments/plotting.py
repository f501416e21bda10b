"""matplotlib for the experiment tooling's figures, and their atomic PNG files."""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType
from typing import Any

from mtsa_fairseq.experiments.files import atomic_path


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display), with matplotlib's own loggers at WARNING:
    once fairseq is imported the root logger passes DEBUG records, and matplotlib's font search alone logs pages."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # before the import, which logs too
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Write the matplotlib figure ``fig`` to ``path`` as a PNG at ``dpi``, atomically, and close it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    pyplot().close(fig)
