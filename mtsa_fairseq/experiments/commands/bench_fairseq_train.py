"""``mtsa-bench-fairseq-train``'s options; the benchmark (and its --help) is experiments/bench/fairseq_train.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mtsa_fairseq.experiments.bench import fairseq_train, measure
from mtsa_fairseq.experiments.processes import run_command


def _system(text: str) -> str:
    """argparse type of one ``--archs`` value: kept as written, once ``fairseq_train.split_system`` accepts it."""
    try:
        fairseq_train.split_system(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None
    return text


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=fairseq_train.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="+", type=_system, default=list(fairseq_train.ARCHS), metavar="SYSTEM",
                        help="the systems compared, the baseline first: each an architecture, optionally followed "
                             "by fairseq-train options, as one word ('transformer_mtsa_wmt_en_de --mtsa-kernel "
                             "sdpa-joint'); at least two (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[4096, 8192],
                        help="tokens per batch, one row each (default: 4096 8192)")
    parser.add_argument("--updates", type=int, default=300, help="updates per run (default: 300)")
    parser.add_argument("--skip-updates", type=int, default=100,
                        help="updates left out of the throughput (start-up, autotuning; default: 100)")
    parser.add_argument("--log-interval", type=int, default=20, help="updates per fairseq log line (default: 20)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per arch and batch size; the median counts (default: 1)")
    parser.add_argument("--vocab", type=int, default=32_768, help="joined dictionary size (default: 32768)")
    parser.add_argument("--pairs", type=int, default=40_000, help="synthetic sentence pairs (default: 40000)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="where to train (default: cuda)")
    parser.add_argument("--precision", choices=["fp16", "amp", "fp32"], default="fp16",
                        help="fairseq's --fp16, --amp, or neither (default: fp16)")
    parser.add_argument("--no-cudnn-attention", dest="cudnn_attention", action="store_false",
                        help="keep scaled_dot_product_attention off its cuDNN backend in every run "
                             "(torch.backends.cuda.enable_cudnn_sdp(False)); default: torch's choice")
    parser.add_argument("--markdown", type=Path, help="write the Markdown table here")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    parser.add_argument("--logs", type=Path, help="keep each run's fairseq-train log in this directory")
    parser.add_argument("--profile", type=int, nargs=2, metavar=("START", "END"),
                        help="profile updates START-END of every run (within --skip-updates) and write each "
                             "run's report to --logs as ARCH-MAX_TOKENS-runN.profile.txt")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: one fairseq-train run, as JSON
    return parser


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.child is not None:
        fairseq_train.child(json.loads(args.child))
        return
    measure.check_positive(parser, args)
    if len(args.archs) < 2:
        parser.error("--archs needs at least two systems (the first is the baseline)")
    if args.skip_updates >= args.updates:
        parser.error("--skip-updates must be below --updates")
    measure.check_outputs(parser, args.markdown, args.json)
    if args.logs is not None and not args.logs.is_dir():
        parser.error(f"--logs {args.logs} is not a directory")
    if args.profile is not None:
        first, last = args.profile
        if args.logs is None:
            parser.error("--profile needs --logs (the reports are written there)")
        if not 1 <= first <= last <= args.skip_updates:
            parser.error("--profile START END needs 1 <= START <= END <= --skip-updates")
    measure.check_device(parser, args.device)
    if args.device == "cpu" and args.precision == "fp16":
        parser.error("--precision fp16 needs --device cuda (fairseq's CPU fp16 needs --fp16-no-flatten-grads)")
    fairseq_train.run(args, Path(__file__))


def main() -> None:
    """Entry point: usage errors exit 2, failures 1 with one line."""
    run_command(_main, resumes=False)


if __name__ == "__main__":
    main()
