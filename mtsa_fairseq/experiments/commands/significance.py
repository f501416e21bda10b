"""Compare two systems' BLEU over training runs, as in the MTSA paper's Table 6.

Reads result files of scripts/score.py, groups them by setup, test set and scored checkpoint, runs a t-test over runs
(Welch's by default) with the difference it detects at 80% power (and, with --equivalence-margin, an
equivalence test) and, for runs of both systems trained with the same seed, the paired bootstrap
(centred, two-sided; --bootstrap moses shows sacreBLEU's one-sided-like one instead) and approximate
randomization on sacreBLEU's resamples. Prints a Markdown report; optionally writes it, a JSON summary
(both bootstraps) and a PNG plot. See mtsa_fairseq/experiments/significance.py.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from mtsa_fairseq.contracts import BLEU_METRICS
from mtsa_fairseq.experiments import significance
from mtsa_fairseq.experiments.files import atomic_path, write_atomic
from mtsa_fairseq.experiments.processes import run_command
from mtsa_fairseq.experiments.translation.scoring import hypotheses_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, nargs="+", required=True, metavar="RESULT",
                        help="result files of the baseline system (several runs, possibly several setups)")
    parser.add_argument("--system", type=Path, nargs="+", required=True, metavar="RESULT",
                        help="result files of the system compared with the baseline")
    parser.add_argument("--test", choices=significance.TESTS, default="welch",
                        help="t-test over runs: welch (unequal variances, default) or student (pooled variance)")
    parser.add_argument("--metric", choices=BLEU_METRICS, default="sacrebleu", help="BLEU value of the result files to "
                        "compare over runs (default: sacrebleu); paired tests always use sacreBLEU")
    parser.add_argument("--bootstrap", choices=significance.BOOTSTRAPS, default="two-sided",
                        help="the paired bootstrap the Markdown shows: two-sided (centred, default) or moses "
                             "(sacreBLEU's, as Moses computes it: one-sided-like); the JSON holds both")
    parser.add_argument("--equivalence-margin", type=float, metavar="M",
                        help="also test equivalence: two one-sided Welch t-tests of |difference| < M (e.g. 0.45)")
    parser.add_argument("--bootstrap-samples", type=int, default=1000,
                        help="paired bootstrap resamples (default: 1000)")
    parser.add_argument("--ar-samples", type=int, default=10000,
                        help="approximate randomization trials (default: 10000)")
    parser.add_argument("--seed", type=int, default=12345, help="positive seed of the paired tests' sampling "
                        "(default: 12345)")
    parser.add_argument("--allow-diverged", action="store_true",
                        help="compare results of runs recorded diverged (refused by default)")
    parser.add_argument("--names", nargs=2, metavar=("BASELINE", "SYSTEM"),
                        help='display names, e.g. --names Transformer MTSA (default: the results\' system names)')
    parser.add_argument("--markdown", type=Path, metavar="OUT.md", help="write the Markdown report here")
    parser.add_argument("--json", type=Path, metavar="OUT.json", help="write a JSON summary here")
    parser.add_argument("--plot", type=Path, metavar="OUT.png", help="write a PNG plot of BLEU per seed here")
    parser.add_argument("--overwrite", action="store_true", help="replace --markdown/--json/--plot files that exist")
    return parser


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.WARNING)  # fairseq's import sets up chatty root logging
    for option in ("bootstrap_samples", "ar_samples", "seed"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be a positive integer")
    if args.equivalence_margin is not None and not args.equivalence_margin > 0:
        parser.error("--equivalence-margin must be a positive number")
    outputs = [p for p in (args.markdown, args.json, args.plot) if p is not None]
    if len({p.resolve() for p in outputs}) != len(outputs):
        parser.error("--markdown, --json and --plot must be different files")
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        parser.error(f"--plot writes a PNG image: name it OUT.png, not {args.plot}")
    inputs = {path.resolve() for result in args.baseline + args.system if result.name
              for path in (result, hypotheses_path(result))}
    for path in outputs:
        if not path.parent.is_dir():
            parser.error(f"directory of {path} does not exist")
        if path.resolve() in inputs:
            parser.error(f"{path} is one of the compared result files or their hypotheses: write the report elsewhere")
        if path.is_dir():
            parser.error(f"{path} is a directory, not a file")
        if path.exists() and not args.overwrite:
            parser.error(f"{path} exists (pass --overwrite to replace it)")
    comparison = significance.compare(
        args.baseline, args.system, metric=args.metric, test=args.test, bootstrap=args.bootstrap,
        equivalence_margin=args.equivalence_margin, bootstrap_samples=args.bootstrap_samples,
        ar_samples=args.ar_samples, seed=args.seed, allow_diverged=args.allow_diverged,
    )
    names = tuple(args.names) if args.names else significance.default_names(comparison)
    report = significance.render_markdown(comparison, names)
    folder = args.json.parent if args.json is not None else None
    summary = json.dumps(significance.comparison_to_json(comparison, names, folder), indent=2) + "\n"
    sys.stdout.write(report)
    writing = None
    try:
        for writing, text in ((args.markdown, report), (args.json, summary)):
            if writing is not None:
                write_atomic(writing, text)
        if args.plot is not None:
            writing = args.plot
            with atomic_path(args.plot) as tmp:
                significance.plot(comparison, names, tmp)
    except OSError as exc:  # a full disk: the files written before stay whole, the others absent
        raise SystemExit(f"error: {exc.strerror or exc} (writing {writing})") from None


def main() -> None:
    """The command: usage errors exit 2, bad results and environment errors 1 (one line), Ctrl-C 130,
    SIGTERM 143."""
    run_command(_main, errors=(significance.SignificanceError,))


if __name__ == "__main__":
    main()
