"""Average the model parameters of fairseq checkpoints into one checkpoint (loadable by fairseq-generate):
floating-point parameters in float64, cast back; everything else from the newest checkpoint (most updates).

  scripts/average_checkpoints.py --inputs runs/setup1_mtsa/seed1 --num-update-checkpoints 5 --averaged avg.pt
  scripts/average_checkpoints.py --inputs a.pt b.pt --averaged avg.pt
"""

import argparse
from pathlib import Path

from mtsa_fairseq.experiments.checkpoint_average import (
    AverageError,
    average_checkpoints,
    last_checkpoints,
    save_checkpoint,
)
from mtsa_fairseq.experiments.processes import run_command


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=Path, nargs="+", required=True,
                        help="checkpoint files, or one save directory with --num-update/epoch-checkpoints")
    last = parser.add_mutually_exclusive_group()
    last.add_argument("--num-update-checkpoints", type=int, metavar="N",
                      help="average the last N checkpoint_<epoch>_<update>.pt files of the directory")
    last.add_argument("--num-epoch-checkpoints", type=int, metavar="N",
                      help="average the last N checkpoint<epoch>.pt files of the directory")
    parser.add_argument("--averaged", type=Path, required=True, help="averaged checkpoint to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --averaged if it exists")
    args = parser.parse_args()

    count = args.num_update_checkpoints if args.num_update_checkpoints is not None else args.num_epoch_checkpoints
    if count is not None:
        if len(args.inputs) != 1:
            parser.error("--num-update-checkpoints/--num-epoch-checkpoints need exactly one directory in --inputs")
        if not args.inputs[0].is_dir():
            parser.error(f"--inputs: {args.inputs[0]} is not a directory")
        if count < 1:
            parser.error("the number of checkpoints to average must be >= 1")
    else:
        missing = [str(p) for p in args.inputs if not p.is_file()]
        if missing:
            parser.error(f"--inputs: {missing[0]} is not a file (for a directory give --num-update-checkpoints N)")
    if args.averaged.is_dir():
        parser.error(f"--averaged {args.averaged} is a directory: name the checkpoint file to write")
    if args.averaged.exists() and not args.overwrite:
        parser.error(f"--averaged {args.averaged} exists (pass --overwrite to replace it)")
    kind = "update" if args.num_update_checkpoints is not None else "epoch"
    paths = args.inputs if count is None else last_checkpoints(args.inputs[0], count, kind=kind)
    if any(p.resolve() == args.averaged.resolve() for p in paths):
        parser.error(f"--averaged {args.averaged} is one of the inputs")
    save_checkpoint(average_checkpoints(paths), args.averaged)
    print(f"averaged {len(paths)} checkpoint(s): {', '.join(str(p) for p in paths)} -> {args.averaged}")


def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main, errors=(AverageError,))


if __name__ == "__main__":
    main()
