"""Train and evaluate sentence encoders on one task: architectures x seeds (x folds), then mean ± sd and
Welch's t-test of the reference architecture (default: the first) against each other one.

  python scripts/sentence_experiment.py --config configs/sentence/trec.yaml --data data/trec \\
      --archs mtsa_encoder disan_encoder fast_disa_encoder multi_head_encoder bilstm_encoder \\
      --seeds 1 2 3 --out runs/trec --cpu --max-update 3000

With --lr-from, each architecture trains at the learning rate an mtsa-sentence-lr-search report chose for it on
dev (a TREC search sets SST-5's rates too), recorded in the report; a run the search itself trained (the same
command) is taken from the search's directory, not trained again. Cross-validation data (CR, MPQA, SUBJ) runs every
fold unless --folds is given. Rerunning the command skips finished runs, resumes interrupted ones and rewrites
OUT/report.md, OUT/report.json and OUT/dev-curves.png.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from mtsa_fairseq.contracts import read_sentence_manifest
from mtsa_fairseq.experiments.processes import run_command
from mtsa_fairseq.experiments.sentence.lr_search import searched_rates
from mtsa_fairseq.experiments.sentence.report import write_report
from mtsa_fairseq.experiments.sentence.runs import (
    ExperimentError,
    TaskConfig,
    check_options,
    load_task_config,
    plan_folds,
    plan_runs,
    run_one,
    train_all,
    unknown_archs,
)


def add_training_arguments(parser: argparse.ArgumentParser, out_help: str) -> None:
    """The options of every command that trains sentence encoders through the experiment's runs."""
    parser.add_argument("--config", type=Path, required=True, help="task config (configs/sentence/<task>.yaml)")
    parser.add_argument("--data", type=Path, required=True, help="directory from scripts/prepare_sentence_data.py")
    parser.add_argument("--archs", nargs="+", required=True, help="architectures (e.g. mtsa_encoder disan_encoder)")
    parser.add_argument("--out", type=Path, required=True, help=out_help)
    parser.add_argument("--max-update", type=int, help="update budget per run (default: the config's)")
    parser.add_argument("--cpu", action="store_true", help="train on CPU")
    parser.add_argument("--threads", type=int, help="OMP/MKL threads per training process")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at the same time (default: 1)")
    parser.add_argument("--extra-args", default="",
                        help='more fairseq-train options, e.g. "--embedding-path glove.6B.300d.txt"')


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_arguments(parser, "output directory (runs/, results/, report.*)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds per architecture")
    parser.add_argument("--folds", type=int, nargs="+", help="CV data: folds to run (default: all)")
    parser.add_argument("--reference", help="architecture tested against the others (default: the first)")
    parser.add_argument("--split", choices=("test", "valid"),
                        help="split the best-dev checkpoint is evaluated on (default: test; CV data: the held-out "
                             "fold); valid keeps a protocol search off the test data")
    parser.add_argument("--lr-from", type=Path, metavar="SEARCH",
                        help="an mtsa-sentence-lr-search report (search.json, search-interim.json or a copy): "
                             "each architecture trains at the rate it chose (instead of the config's --lr)")
    return parser


def load_training(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[TaskConfig, dict, list[str]]:
    """The task config, the data's manifest and the --extra-args tokens of :func:`add_training_arguments`'s options,
    checked before anything trains (usage errors exit 2; an unreadable file or an option fairseq-train refuses 1)."""
    if len(set(args.archs)) != len(args.archs):
        parser.error("--archs must not repeat")
    for name in ("max_update", "threads", "jobs"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    try:
        extra = shlex.split(args.extra_args)
    except ValueError as exc:
        parser.error(f"--extra-args: {exc}")
    try:
        config = load_task_config(args.config)
        manifest = read_sentence_manifest(args.data)
    except (ExperimentError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    if manifest["dataset"] != config.dataset:
        parser.error(f"{args.data} holds {manifest['dataset']!r} but {args.config} is for {config.dataset!r}")
    if unknown := unknown_archs(args.archs):
        parser.error(f"not sentence-encoder architectures: {unknown}")
    check_options(config, args.archs, args.data.resolve(), extra)
    return config, manifest, extra


def sets_lr(extra_args: str) -> bool:
    """Whether ``--extra-args`` sets the learning rate (checked on the raw string, before the costlier checks)."""
    return any(token == "--lr" or token.startswith("--lr=") for token in extra_args.split())


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds must not repeat")
    if any(seed < 0 for seed in args.seeds):
        parser.error("--seeds must be non-negative integers")
    if args.reference is not None and args.reference not in args.archs:
        parser.error(f"--reference {args.reference} is not among --archs")
    config, manifest, extra = load_training(parser, args)
    try:
        folds = plan_folds(manifest, args.folds, args.data)
    except ValueError as exc:
        parser.error(str(exc))
    if args.lr_from is not None and sets_lr(args.extra_args):
        parser.error("--extra-args must not set --lr with --lr-from")
    out, data = args.out.resolve(), args.data.resolve()
    rates, lr_from, searched = searched_rates(args.lr_from, args.archs)

    def one(run):
        lr = ["--lr", repr(rates[run.arch])] if rates else []
        return run_one(config, run, data, out, args.max_update, [*extra, *lr], args.threads, args.cpu,
                       split=args.split, trained_in=searched.get(run.arch))

    results = train_all(args.jobs, one, plan_runs(args.archs, args.seeds, folds))
    print(write_report(config, results, args.reference or args.archs[0], args.split, lr_from, out))


def main() -> None:
    """The command: SIGTERM and Ctrl-C stop it after its children, with one line (exit 143 / 130)."""
    run_command(_main, errors=(ExperimentError,))


if __name__ == "__main__":
    main()
