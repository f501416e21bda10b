"""The whole experiment in one command: data -> N seeds of a baseline and an MTSA config -> BLEU -> t-test.

Without data options it runs the embedded demo: the synthetic reordering/agreement corpus (toy_corpus.py),
``configs/demo_transformer.yaml`` vs ``configs/demo_mtsa.yaml``, 3 seeds each, on CPU. With your raw parallel files
and configs it runs the real thing (docs/experiment.md gives the command of WMT14 En-De, Setup 1).

Each step is a command of its own (mtsa-prepare-data, mtsa-train-seeds, mtsa-score, mtsa-significance) run with
this interpreter; OUT keeps their outputs (data/, runs/, results/, report.*). Rerunning the same command reuses the
prepared data, skips finished runs and existing result files (scoring again those older than their run's
checkpoint_last.pt), resumes interrupted runs, and rewrites the report.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mtsa_fairseq.experiments import CONFIGS, command
from mtsa_fairseq.experiments.processes import RunLock, run_command
from mtsa_fairseq.experiments.translation.pipeline import check_configs, run_pipeline, test_sets


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("demo-output"),
                        help="output directory (default: demo-output in the current directory)")
    parser.add_argument("--source-lang", default="en", help="source language suffix (default: en)")
    parser.add_argument("--target-lang", default="de", help="target language suffix (default: de)")
    parser.add_argument("--train", nargs=2, action="append", metavar=("SRC", "TGT"),
                        help="raw training corpus (repeatable); without it the synthetic demo corpus is used")
    parser.add_argument("--valid", nargs=2, metavar=("SRC", "TGT"),
                        help="raw validation pair (default: every 100th training pair)")
    parser.add_argument("--test", nargs=3, action="append", default=[], metavar=("NAME", "SRC", "TGT"),
                        help="raw test set (repeatable); each is scored")
    parser.add_argument("--data", type=Path, help="an already prepared directory (scripts/prepare_data.py output)")
    parser.add_argument("--vocab-size", type=int, help="joint sentencepiece vocabulary (default: 32000; demo 100)")
    parser.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    parser.add_argument("--baseline-config", type=Path, default=CONFIGS / "demo_transformer.yaml",
                        help="training config of the baseline (default: the package's configs/demo_transformer.yaml)")
    parser.add_argument("--system-config", type=Path, default=CONFIGS / "demo_mtsa.yaml",
                        help="training config of the system (default: the package's configs/demo_mtsa.yaml)")
    parser.add_argument("--names", nargs=2, default=["Transformer", "MTSA"], metavar=("BASELINE", "SYSTEM"),
                        help="display names in the report")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds per system (at least 2)")
    parser.add_argument("--cpu", action="store_true", help="train and translate on CPU (default: GPUs)")
    parser.add_argument("--threads", type=int, help="CPU threads per training/translation process")
    parser.add_argument("--parallel", action="store_true",
                        help="train the baseline's and the system's seeds at the same time (two processes)")
    parser.add_argument("--train-args", default="",
                        help='more train_seeds.py options, e.g. "--launcher torchrun --nproc-per-node 4"')
    parser.add_argument("--score-args", default="", help='more score.py options, e.g. "--max-tokens 8000"')
    parser.add_argument("--train-only", action="store_true",
                        help="prepare and train, then stop: no test set is translated (a learning-curve probe "
                             "chooses a budget on validation data before any test set is scored)")
    parser.add_argument("--report-dir", type=Path,
                        help="where report.md, .json and .png go (default: OUT); another comparison over the runs "
                             "of OUT, e.g. an ablation against OUT's system, keeps OUT's own report")
    args = parser.parse_args()

    if args.data and args.train:
        parser.error("give either --data (prepared) or --train/--test (raw), not both")
    if args.data:
        given = [f"--{name.replace('_', '-')}" for name in ("source_lang", "target_lang", "vocab_size", "workers")
                 if getattr(args, name) != parser.get_default(name)]
        if given:
            parser.error(f"{', '.join(given)} prepare raw data; --data {args.data} is prepared already")
    if args.train and not args.test:
        parser.error("--train needs at least one --test set to score")
    if (args.valid or args.test) and not args.train:
        parser.error("--valid/--test need --train")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error("--seeds must be distinct")
    if len(args.seeds) < 2 and not args.train_only:
        parser.error("--seeds must be at least 2 distinct seeds (the t-test needs 2 runs per system)")
    for config in (args.baseline_config, args.system_config):
        if not config.is_file():
            parser.error(f"config {config} does not exist")
    if args.baseline_config.stem == args.system_config.stem:
        parser.error("--baseline-config and --system-config must be different configs")
    for src, tgt in (args.train or []) + ([args.valid] if args.valid else []) + [t[1:] for t in args.test]:
        for path in (src, tgt):
            if not Path(path).is_file():
                parser.error(f"{path} does not exist")
    if args.data and not (args.data / "manifest.json").is_file():
        parser.error(f"--data {args.data} has no manifest.json (prepare it with scripts/prepare_data.py)")
    if args.data and not args.train_only and not test_sets(args.data):
        parser.error(f"--data {args.data} has no test set to score (prepare it with --test, or pass --train-only)")
    if args.names[0] == args.names[1]:
        parser.error("--names must name the two systems differently")
    for option, folder in (("--out", args.out), ("--report-dir", args.report_dir)):
        if folder is not None and folder.exists() and not folder.is_dir():
            parser.error(f"{option} {folder} is a file, not a directory")
    if args.vocab_size is None:
        args.vocab_size = 32000 if args.train else 100

    check_configs(args)
    start = time.time()
    args.out = args.out.resolve()
    args.report_dir = (args.report_dir or args.out).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    with RunLock(args.out / ".lock", f"pipeline output {args.out}", "pipeline").acquire():
        run_pipeline(args, start, command)


def main() -> None:
    """The command: SIGTERM and Ctrl-C stop it after its children, with one line (exit 143 / 130)."""
    run_command(_main)


if __name__ == "__main__":
    main()
