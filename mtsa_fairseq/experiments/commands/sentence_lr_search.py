"""Choose each sentence encoder's learning rate on dev data: every architecture at every rate of a grid, one
seed, the best-dev checkpoint evaluated on dev only (test is never read), and one rule for all.

  mtsa-sentence-lr-search --config configs/sentence/trec-random-init.yaml --data data/trec \\
      --archs mtsa_encoder disan_encoder fast_disa_encoder multi_head_encoder bilstm_encoder \\
      --lrs 1e-3 5e-4 3e-4 1e-4 --out runs/trec-lr-search --cpu --threads 1

Rule: each architecture takes the rate with the highest best-dev metric among the rates it trained through without
a NaN/Inf stop; ties go to the higher dev metric at the last validation, then to the larger rate. Run (arch, rate)
is what ``mtsa-sentence-experiment --out OUT/lr-<rate> --split valid --extra-args "--lr <rate>"`` trains,
architectures outermost. Rerunning the command skips finished runs, resumes interrupted ones (a NaN/Inf stop stays
stopped) and rewrites OUT/search.json and .md; a second search on the same OUT is refused while the first runs (use
--jobs for runs side by side). Meanwhile ``--report-only`` writes OUT/search-interim.json and .md from the finished
runs (an architecture's rate is chosen once all its rates have finished).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from mtsa_fairseq.experiments.commands.sentence_experiment import add_training_arguments, load_training, sets_lr
from mtsa_fairseq.experiments.processes import RunLock, run_command
from mtsa_fairseq.experiments.sentence.lr_search import (
    read_one,
    search_markdown,
    search_one,
    search_report,
    search_runs,
)
from mtsa_fairseq.experiments.sentence.report import publish
from mtsa_fairseq.experiments.sentence.runs import ExperimentError, TaskConfig, train_all


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_arguments(parser, "output directory (lr-<rate>/ per rate, search.json, search.md)")
    parser.add_argument("--lrs", type=float, nargs="+", required=True, help="learning rates to try (e.g. 1e-3 5e-4)")
    parser.add_argument("--seed", type=int, default=1, help="the one seed of every run (default: 1)")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: write OUT/search-interim.json and .md from the runs finished so far")
    return parser


def _report_only(config: TaskConfig, args: argparse.Namespace, out: Path) -> None:
    if not out.is_dir():
        sys.exit(f"error: {out} does not exist (start the search first)")
    with RunLock(out / ".search-interim.lock", f"output {out / 'search-interim.json'}", "report").acquire():
        rows = [read_one(config, run, lr, out, args.max_update) for run, lr in
                search_runs(args.archs, args.lrs, args.seed)]
        report = search_report(config, [r for r in rows if r is not None], args.archs, args.lrs, args.seed)
        print(publish(out / "search-interim", report, search_markdown(report)))


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.seed < 0:
        parser.error("--seed must be a non-negative integer")
    if not all(0 < lr < math.inf for lr in args.lrs):
        parser.error("--lrs must be positive and finite")
    if len(set(args.lrs)) != len(args.lrs):
        parser.error("--lrs must not repeat")
    if sets_lr(args.extra_args):
        parser.error("--extra-args must not set --lr: the search sets it per run")
    config, manifest, extra = load_training(parser, args)
    if manifest.get("num_folds"):
        parser.error(f"{args.data} is cross-validation data; a learning-rate search needs a fixed dev set")
    out, data = args.out.resolve(), args.data.resolve()
    if args.report_only:
        _report_only(config, args, out)
        return

    def one(item):
        run, lr = item
        return search_one(config, run, lr, data, out, args.max_update, extra, args.threads, args.cpu)

    out.mkdir(parents=True, exist_ok=True)
    with RunLock(out / ".search.lock", f"search {out}", "search").acquire():  # one search (and writer) per OUT
        rows = train_all(args.jobs, one, search_runs(args.archs, args.lrs, args.seed))
        report = search_report(config, rows, args.archs, args.lrs, args.seed)
        print(publish(out / "search", report, search_markdown(report)))


def main() -> None:
    """The command: SIGTERM and Ctrl-C stop it after its children, with one line (exit 143 / 130)."""
    run_command(_main, errors=(ExperimentError,))


if __name__ == "__main__":
    main()
