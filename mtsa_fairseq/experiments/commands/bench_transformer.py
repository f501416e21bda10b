"""``mtsa-bench-transformer``'s options; the benchmark (and its --help) is experiments/bench/transformer.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from mtsa_fairseq.experiments.bench import measure, transformer
from mtsa_fairseq.experiments.bench.transformer import LONGEST_SENTENCE
from mtsa_fairseq.experiments.processes import run_command


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=transformer.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048],
                        help="encoder sequence lengths")
    parser.add_argument("--batch", type=int, default=8, help="sentences per encoder batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed encoder passes per model and length")
    parser.add_argument("--vocab", type=int, default=32_768, help="joined dictionary size (the paper's setup)")
    parser.add_argument("--train-steps", type=int, default=4, help="timed training steps per model (plus a warm-up)")
    parser.add_argument("--train-max-tokens", type=int, default=2048,
                        help=f"target tokens per training batch (Setup 1: 2048 per GPU; at least {LONGEST_SENTENCE}, "
                             "the longest sentence drawn)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="encoder rows: parameter and activation dtype; training: the autocast dtype")
    parser.add_argument("--kernel", default="auto",
                        help="mtsa_core's kernel in the MTSA layers, one of fairseq-train's --mtsa-kernel choices "
                             "(auto: SDPA, on CPU dense from 2**16 scores with keys up to 256)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--profile", type=int, metavar="N",
                        help="also profile N encoder passes per model and length: host self time per aten operator")
    parser.add_argument("--markdown", type=Path, help="write the Markdown table here")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)  # internal: "model:L", run in a fresh process
    return parser


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    import torch

    from mtsa_fairseq.modules.mtsa_core import EXP_KERNELS

    measure.check_positive(parser, args)
    if args.kernel not in EXP_KERNELS:
        parser.error(f"--kernel must be one of {', '.join(EXP_KERNELS)}, not {args.kernel!r}")
    if args.train_max_tokens < LONGEST_SENTENCE:
        parser.error(f"--train-max-tokens must be at least {LONGEST_SENTENCE}, the longest training sentence drawn")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.kernel == "triton" and not args.device.startswith("cuda"):
        parser.error("--kernel triton runs on --device cuda")
    measure.check_device(parser, args.device, memory=True)
    if args.memory_of:
        name, length = args.memory_of.split(":")
        measure.emit(transformer.peak_memory_mb(name, int(length), args))
        return
    measure.check_outputs(parser, args.markdown, args.json, args.plot)
    transformer.run(args, Path(__file__))


def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main, resumes=False)


if __name__ == "__main__":
    main()
