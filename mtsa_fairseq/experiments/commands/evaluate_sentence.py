"""Evaluate a sentence-encoder checkpoint (fairseq-train --task sentence_encoding) on one split.

  python scripts/evaluate_sentence.py --checkpoint runs/sst5/checkpoint_best.pt --split test --result sst5-test.json

Prints accuracy (classification) or Pearson r, Spearman rho and MSE (SICK) and writes a JSON result with the
per-example predictions; for cross-validation data it evaluates the checkpoint's --cv-fold (the held-out fold).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mtsa_fairseq.experiments.processes import run_command
from mtsa_fairseq.experiments.sentence.evaluation import EvaluationError, evaluate, write_result


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="checkpoint to evaluate")
    parser.add_argument("--split", default="test", help="split to evaluate (default: test; CV data: the held-out fold)")
    parser.add_argument("--data", type=Path, help="prepared data directory (default: the checkpoint's)")
    parser.add_argument("--cv-fold", type=int, help="held-out fold (default: the checkpoint's; another fold is in its "
                        "training data and is refused)")
    parser.add_argument("--batch-size", type=int, default=128, help="sentences per batch (default: 128)")
    parser.add_argument("--cpu", action="store_true", help="evaluate on the CPU (default: the GPU when there is one)")
    parser.add_argument("--result", type=Path, help="write the result JSON here")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --result")
    args = parser.parse_args()
    if args.batch_size <= 0:
        parser.error("--batch-size must be positive")
    if args.result and args.result.exists() and not args.overwrite:
        parser.error(f"{args.result} exists (pass --overwrite to replace it)")
    import torch

    try:
        use_cuda = not args.cpu and torch.cuda.is_available()
        result = evaluate(args.checkpoint, args.split, args.data, args.cv_fold, args.batch_size, use_cuda)
    except (EvaluationError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    shown = ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items())
    print(f"{result['dataset']} {result['split']} ({result['num_examples']} examples, {result['arch']}, "
          f"{result['num_updates']} updates): {shown}")
    if args.result:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        write_result(args.result, result)


def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main)


if __name__ == "__main__":
    main()
