"""The benchmarks of the commands ``mtsa-bench-*`` and their shared measurement helpers (measure.py)."""
