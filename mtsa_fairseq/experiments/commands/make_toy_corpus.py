"""Write the synthetic reordering/agreement parallel corpus (mtsa_fairseq/experiments/translation/toy_corpus.py)."""

import argparse
from pathlib import Path

from mtsa_fairseq.experiments.processes import run_command
from mtsa_fairseq.experiments.translation.toy_corpus import write_corpus


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path, help="directory for {train,valid,test}.{en,de}")
    parser.add_argument("--train", type=int, default=4000, help="training pairs")
    parser.add_argument("--valid", type=int, default=200, help="validation pairs")
    parser.add_argument("--test", type=int, default=200, help="test pairs")
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    parser.add_argument("--overwrite", action="store_true", help="replace corpus files OUT_DIR already holds")
    args = parser.parse_args()
    for name in ("train", "valid", "test"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive")
    existing = [str(args.out_dir / f"{split}.{lang}") for split in ("train", "valid", "test") for lang in ("en", "de")
                if (args.out_dir / f"{split}.{lang}").exists()]
    if existing and not args.overwrite:
        parser.error(f"{existing[0]} exists (pass --overwrite to replace the corpus in {args.out_dir})")
    write_corpus(args.out_dir, {"train": args.train, "valid": args.valid, "test": args.test}, seed=args.seed)


def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main)


if __name__ == "__main__":
    main()
