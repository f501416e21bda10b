#!/usr/bin/env python
"""``mtsa-bench-fairseq-train`` from a clone: mtsa_fairseq/experiments/commands/bench_fairseq_train.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtsa_fairseq.experiments.commands.bench_fairseq_train import main  # noqa: E402

if __name__ == "__main__":
    main()
