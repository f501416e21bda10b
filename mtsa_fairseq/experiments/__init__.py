"""Experiment tooling: data preparation, training launchers, scoring, significance tests and benchmarks.

``fairseq-train --user-dir mtsa_fairseq`` never loads this subpackage (tests/test_plugin_imports.py): the
plugin (``modules``, ``models``, ``tasks``, ``criterions``) stands alone, and the tooling imports it, not the
other way round. ``translation`` and ``sentence`` hold the two experiment stacks, ``bench`` the benchmarks'
measurement helpers; ``processes`` (locks, child processes, progress) and ``significance`` serve both stacks,
and ``mtsa_fairseq.contracts`` holds the file formats both rooms share.
"""
