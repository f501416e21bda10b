"""matplotlib for the experiment tooling's figures."""

from __future__ import annotations

import logging
from types import ModuleType


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display), with matplotlib's own loggers at WARNING:
    once fairseq is imported the root logger passes DEBUG records, and matplotlib's font search alone logs pages."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # before the import, which logs too
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
