"""``mtsa-bench-core``'s options; the benchmark (and its --help) is experiments/bench/core.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from mtsa_fairseq.experiments.bench import core, measure
from mtsa_fairseq.experiments.processes import run_command


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=core.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096],
                        help="sequence lengths L")
    parser.add_argument("--batch", type=int, default=2, help="sequences per batch")
    parser.add_argument("--dim", type=int, default=512, help="model width (head width: dim / heads)")
    parser.add_argument("--heads", type=int, default=8, help="attention heads")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per cell (the median is reported)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="parameter and activation dtype")
    parser.add_argument("--methods", nargs="+", choices=core.METHODS,
                        help="default: mtsa naive mha on CPU; mtsa-sdpa mtsa-triton mha-flash mha on CUDA")
    parser.add_argument("--markdown", type=Path, help="write the Markdown table (with a line of settings) here")
    parser.add_argument("--json", type=Path, help="write the raw numbers here (after every length)")
    parser.add_argument("--core", action="store_true",
                        help="time the attention cores alone on per-head tensors (mtsa, the mtsa-* kernels and "
                             "mha-flash)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: "method:length", its memory in a subprocess
    parser.add_argument("--times-at", type=int, help=argparse.SUPPRESS)  # internal: every method's time at a length
    return parser


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    measure.check_positive(parser, args)
    if args.dim % args.heads:
        parser.error(f"--dim {args.dim} is not divisible by --heads {args.heads}")
    if args.one:
        method, length = args.one.split(":")
        measure.emit(core.pass_memory(method, int(length), args))
        return
    if args.times_at:
        measure.emit(core.pass_times(args.times_at, args))
        return
    measure.check_outputs(parser, args.markdown, args.json)
    measure.check_device(parser, args.device, memory=True)
    cuda = args.device.startswith("cuda")
    args.methods = args.methods or list(core.DEFAULT_METHODS["core" if args.core else "cuda" if cuda else "cpu"])
    if args.core and set(args.methods) - set(core.CORE_METHODS):
        parser.error(f"--core takes only the methods {', '.join(core.CORE_METHODS)}")
    measure.check_triton(parser, args.methods, args.device)
    core.run(args, Path(__file__))


def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main, resumes=False)


if __name__ == "__main__":
    main()
