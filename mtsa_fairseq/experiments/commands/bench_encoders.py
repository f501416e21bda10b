"""``mtsa-bench-encoders``'s options; the benchmark (and its --help) is experiments/bench/encoders.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from mtsa_fairseq.experiments.bench import encoders, measure
from mtsa_fairseq.experiments.files import write_json
from mtsa_fairseq.experiments.processes import run_command


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=encoders.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024],
                        help="sequence lengths, increasing")
    parser.add_argument("--archs", nargs="+", choices=encoders.ARCHS, default=list(encoders.ARCHS),
                        help="sentence_encoder architectures to run")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--dim", type=int, default=300, help="input channels (word embedding size)")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per encoder and length")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--memory-limit-gb", type=float, default=None,
                        help="CPU: how far one pass may grow the address space; an encoder needing more is OOM "
                             "(default: 85%% of the memory available at the start)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="do not run an encoder at longer lengths once its pass took longer than this")
    parser.add_argument("--json", type=Path, help="write the raw numbers here (after every length)")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")
    parser.add_argument("--from-json", type=Path, nargs="+",
                        help="measure nothing: merge these --json files into --json/--plot and print the table")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)  # internal: "encoder:L", in a fresh process
    return parser


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    measure.check_positive(parser, args)
    measure.check_device(parser, args.device, memory=True)
    if args.memory_of:
        name, length = args.memory_of.split(":")
        measure.emit(encoders.memory_mb(name, int(length), args))
        return
    measure.check_outputs(parser, args.json, args.plot)
    if args.from_json:
        missing = [str(path) for path in args.from_json if not path.is_file()]
        if missing:
            parser.error(f"no such file: {', '.join(missing)}")
        result = encoders.merge(args.from_json)
        if args.json:
            write_json(args.json, result, indent=2)
        encoders.report(result, args.plot)
        return
    if args.lengths != sorted(set(args.lengths)) or min(args.lengths) < 2:
        parser.error("--lengths must be increasing, distinct and at least 2")
    if args.memory_limit_gb is None and args.device == "cpu":
        args.memory_limit_gb = round(0.85 * measure.memory_available_gib(), 1) or None
    encoders.run(args, Path(__file__))


def main() -> None:
    """The command: one line, never a traceback, for a full disk, a file of --from-json that is no record (status 1),
    Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main, resumes=False, errors=(encoders.RecordError,))


if __name__ == "__main__":
    main()
