"""Experiment tooling: data preparation, training launchers, scoring, significance tests and benchmarks.

``fairseq-train --user-dir mtsa_fairseq`` never loads this subpackage (tests/test_plugin_imports.py): the plugin
(``modules``, ``models``, ``tasks``, ``criterions``) stands alone, and the tooling imports it. ``translation`` and
``sentence`` hold the two experiment stacks, ``bench`` the benchmarks' helpers, the modules here the layer both
stacks share, ``mtsa_fairseq.contracts`` their file formats, and ``configs/`` the training and task configs (package
data; the checkout's top-level ``configs`` is a link to it)."""

import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"  # shipped with the package; the checkout's configs/ links here


def command(name: str, *args: str) -> list[str]:
    """The command line running the project command ``name`` (e.g. ``"score"``) with this interpreter: as a
    module of the installed package, so it works from a wheel as from a checkout."""
    return [sys.executable, "-m", f"mtsa_fairseq.experiments.commands.{name}", *args]
