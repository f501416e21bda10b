"""The whole experiment in one command: data -> N seeds of a baseline and an MTSA config -> BLEU -> t-test.

Without data options it runs the embedded demo: the synthetic reordering/agreement corpus
(``mtsa_fairseq/experiments/translation/toy_corpus.py``), ``configs/demo_transformer.yaml`` vs
``configs/demo_mtsa.yaml``, 3 seeds each, on CPU. With your raw parallel files and configs it runs the real
thing, e.g. Setup 1:

  scripts/pipeline.py --out runs/wmt14 --source-lang en --target-lang de \\
      --train europarl.en europarl.de --train commoncrawl.en commoncrawl.de --train nc-v9.en nc-v9.de \\
      --valid newstest2013.en newstest2013.de --test newstest2014 newstest2014-full.en newstest2014-full.de \\
      --baseline-config configs/setup1_transformer.yaml --system-config configs/setup1_mtsa.yaml \\
      --seeds 1 2 3 4 5 6

Each step is a command of its own (mtsa-prepare-data, mtsa-train-seeds, mtsa-score, mtsa-significance), run
as a subprocess of this interpreter (``python -m``, so an installed wheel works as a checkout does); OUT keeps
their outputs (data/, runs/, results/, report.*). Rerunning the same command reuses the prepared data, skips
finished runs and existing result files, resumes interrupted runs, and rewrites the report.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtsa_fairseq.experiments import CONFIGS, command
from mtsa_fairseq.experiments.errors import ConfigError
from mtsa_fairseq.experiments.files import readable_json
from mtsa_fairseq.experiments.processes import (
    PROGRESS_PREFIX,
    RunLock,
    run_command,
    run_logged,
    stop_children,
)
from mtsa_fairseq.experiments.translation.train_config import check_with_fairseq, load_config

TOY_SIZES = {"train": 4000, "valid": 200, "test": 200}


def log(message: str) -> None:
    print(f"[pipeline] {message}", flush=True)


def run_script(name: str, *args: str, log_file: Path | None = None, threads: int | None = None) -> None:
    """Run the project command ``name`` (``mtsa-<name>``, e.g. ``"score"``) with this interpreter; its output goes
    to the console, or to ``log_file`` with only its progress lines on the console. A failure exits with the
    command's own error line."""
    cmd = command(name, *args)
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
    if log_file is not None:
        with log_file.open("a", encoding="utf-8") as out:
            out.write(f"$ {shlex.join(cmd)}\n")

    def show_progress(line: str) -> None:
        if line.startswith(PROGRESS_PREFIX):
            print(f"[pipeline]   {line[len(PROGRESS_PREFIX):].rstrip()}", flush=True)

    code, _, output = run_logged(cmd, log_file, env, echo=log_file is None,
                                 on_line=show_progress if log_file is not None else None)
    if code != 0:
        errors = [line for line in output.splitlines() if line.startswith("error: ")]
        reason = errors[-1][len("error: "):] if errors else f"exit code {code}"
        where = f" (log: {log_file})" if log_file else ""
        sys.exit(f"error: {name}: {reason}{where}")


def check_configs(args: argparse.Namespace) -> None:
    """Refuse a config that fairseq-train would refuse, before anything is prepared or trained."""
    for config in (args.baseline_config, args.system_config):
        try:
            check_with_fairseq(load_config(config))
        except ConfigError as err:
            sys.exit(f"error: {err}")


def check_runs(args: argparse.Namespace, data: Path) -> None:
    """Every check of train_seeds.py (configs, data, options) for both configs before either trains."""
    for config in (args.baseline_config, args.system_config):
        run_script("train_seeds", *train_seeds_args(args, config, data), "--dry-run",
                   log_file=args.out / f"train-{config.stem}.log")


def prepare(args: argparse.Namespace, data: Path) -> None:
    if (data / "manifest.json").exists():
        log(f"data: reusing {data}")
        return
    prep = ["--source-lang", args.source_lang, "--target-lang", args.target_lang, "--out", str(data),
            "--vocab-size", str(args.vocab_size), "--workers", str(args.workers)]
    if args.train:
        for src, tgt in args.train:
            prep += ["--train", src, tgt]
        prep += ["--valid", *args.valid] if args.valid else ["--valid-from-train", "100"]
        for name, src, tgt in args.test:
            prep += ["--test", name, src, tgt]
    else:
        from mtsa_fairseq.experiments.translation.toy_corpus import write_corpus

        raw = args.out / "raw"
        log(f"data: synthetic reordering/agreement corpus {TOY_SIZES} -> {raw}")
        write_corpus(raw, TOY_SIZES, seed=1, src=args.source_lang, tgt=args.target_lang)
        split = {s: (str(raw / f"{s}.{args.source_lang}"), str(raw / f"{s}.{args.target_lang}")) for s in TOY_SIZES}
        prep += ["--train", *split["train"], "--valid", *split["valid"], "--test", "toy_test", *split["test"]]
    log(f"data: sentencepiece ({args.vocab_size}) + fairseq-preprocess -> {data}")
    run_script("prepare_data", *prep)


def train_seeds_args(args: argparse.Namespace, config: Path, data: Path) -> list[str]:
    cmd = ["--config", str(config), "--data", str(data), "--seeds", *map(str, args.seeds),
           "--save-root", str(args.out / "runs")]
    if args.cpu:
        cmd.append("--cpu")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return cmd + shlex.split(args.train_args)


def train(args: argparse.Namespace, data: Path) -> None:
    configs = [args.baseline_config, args.system_config]
    jobs = 2 if args.parallel else 1
    seeds = f"seed {args.seeds[0]}" if len(args.seeds) == 1 else f"{len(args.seeds)} seeds"
    log(f"training {seeds} of {', '.join(c.stem for c in configs)} "
        f"({'both configs at once' if jobs == 2 else 'one run at a time'}); logs in {args.out / 'runs'}")

    def one(config: Path) -> None:
        start = time.time()
        run_script("train_seeds", *train_seeds_args(args, config, data),
                   log_file=args.out / f"train-{config.stem}.log")
        log(f"  {config.stem}: {len(args.seeds)} runs done in {time.time() - start:.0f} s")

    with ThreadPoolExecutor(jobs) as pool:
        try:
            list(pool.map(one, configs))
        except BaseException:
            stop_children()  # the other config's training stops too
            raise


def score(args: argparse.Namespace, data: Path) -> dict[str, list[Path]]:
    tests = list(json.loads((data / "manifest.json").read_text())["tests"])
    results: dict[str, list[Path]] = {"baseline": [], "system": []}
    for role, config in (("baseline", args.baseline_config), ("system", args.system_config)):
        for seed in args.seeds:
            run_dir = args.out / "runs" / config.stem / f"seed{seed}"
            for test in tests:
                out = args.out / "results" / f"{config.stem}_seed{seed}_{test}.json"
                results[role].append(out)
                if readable_json(out):
                    continue
                if out.exists():  # 0 bytes or cut short (by an older version on a full disk): not finished
                    log(f"  {out} is empty or unreadable: scoring again")
                out.parent.mkdir(parents=True, exist_ok=True)
                cmd = ["--run-dir", str(run_dir), "--data", str(data), "--test", test, "--result", str(out)]
                cmd += (["--cpu"] if args.cpu else []) + shlex.split(args.score_args)
                run_script("score", *cmd, log_file=args.out / "score.log", threads=args.threads)
                bleu = json.loads(out.read_text())["bleu"]
                log(f"  {config.stem} seed {seed} {test}: sacreBLEU {bleu['sacrebleu']:.2f}")
    return results


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
    if args.vocab_size is None:
        args.vocab_size = 32000 if args.train else 100

    check_configs(args)
    start = time.time()
    args.out = args.out.resolve()
    args.report_dir = (args.report_dir or args.out).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    with RunLock(args.out / ".lock", f"pipeline output {args.out}", "pipeline").acquire():
        run_pipeline(args, start)


def run_pipeline(args: argparse.Namespace, start: float) -> None:
    data = args.data.resolve() if args.data else args.out / "data"
    log(f"1/4 data -> {data}")
    if not args.data:
        prepare(args, data)
    log("2/4 training")
    check_runs(args, data)
    train(args, data)
    if args.train_only:
        log(f"done in {time.time() - start:.0f} s (--train-only: no test set scored); runs in {args.out / 'runs'}")
        return
    log("3/4 translating and scoring the test sets")
    results = score(args, data)
    log("4/4 significance report")
    args.report_dir.mkdir(parents=True, exist_ok=True)
    report = ["--baseline", *map(str, results["baseline"]), "--system", *map(str, results["system"]),
              "--names", *args.names, "--markdown", str(args.report_dir / "report.md"), "--json",
              str(args.report_dir / "report.json"), "--plot", str(args.report_dir / "report.png"),
              "--overwrite"]  # derived from the result files: rewritten (atomically) every time
    run_script("significance", *report)
    log(f"done in {time.time() - start:.0f} s: {args.report_dir / 'report.md'}, {args.report_dir / 'report.png'}")


def main() -> None:
    """The command: SIGTERM and Ctrl-C stop it after its children, with one line (exit 143 / 130)."""
    run_command(_main)


if __name__ == "__main__":
    main()
