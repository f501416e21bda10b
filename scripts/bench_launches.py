#!/usr/bin/env python
"""``mtsa-bench-launches`` from a clone; the command itself is mtsa_fairseq/experiments/commands/bench_launches.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtsa_fairseq.experiments.commands.bench_launches import main  # noqa: E402

if __name__ == "__main__":
    main()
