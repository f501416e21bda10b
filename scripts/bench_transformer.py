#!/usr/bin/env python
"""``mtsa-bench-transformer`` from a clone; the command is mtsa_fairseq/experiments/commands/bench_transformer.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtsa_fairseq.experiments.commands.bench_transformer import main  # noqa: E402

if __name__ == "__main__":
    main()
