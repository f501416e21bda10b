"""The pipeline's steps (``mtsa-pipeline``), each a project command run as a subprocess (``python -m``, so an
installed wheel works as a checkout does), and the layout of its OUT: ``data/`` (unless ``--data`` names a
prepared directory), ``runs/<config>/seed<k>/``, ``results/<config>_seed<k>_<test>.json`` and the report (in
``--report-dir``). Every step keeps what an earlier run finished."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtsa_fairseq.experiments.errors import ConfigError
from mtsa_fairseq.experiments.files import readable_json
from mtsa_fairseq.experiments.processes import PROGRESS_PREFIX, run_logged, say, stop_children
from mtsa_fairseq.experiments.translation.train_config import check_with_fairseq, load_config

Command = Callable[..., list[str]]  # name, *args -> the command line of that project command (experiments.command)
TOY_SIZES = {"train": 4000, "valid": 200, "test": 200}
KINDS = {"last": "", "avg5": "_avg5"}  # checkpoint kind -> result file suffix (avg5: the Multi30k study's)


def run_dir(out: Path, config: Path, seed: int) -> Path:
    """OUT/runs/<config>/seed<k>: where mtsa-train-seeds trains seed ``seed`` of ``config``."""
    return out / "runs" / config.stem / f"seed{seed}"


def result_path(out: Path, config: Path, seed: int, test: str, kind: str = "last") -> Path:
    """The result file of one run, test set and checkpoint kind (``last`` is the pipeline's own)."""
    return out / "results" / f"{config.stem}_seed{seed}_{test}{KINDS[kind]}.json"


def log(message: str) -> None:
    say(f"[pipeline] {message}")


def run_script(command: Command, name: str, *args: str, log_file: Path | None = None,
               threads: int | None = None) -> None:
    """Run the project command ``name`` (``mtsa-<name>``, e.g. ``"score"``); its output goes to the console, or to
    ``log_file`` with only its progress lines on the console. A failure exits with the command's own error line."""
    cmd = command(name, *args)
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
    if log_file is not None:
        with log_file.open("a", encoding="utf-8") as out:
            out.write(f"$ {shlex.join(cmd)}\n")

    def show_progress(line: str) -> None:
        if line.startswith(PROGRESS_PREFIX):
            say(f"[pipeline]   {line[len(PROGRESS_PREFIX):].rstrip()}")

    code, _, output = run_logged(cmd, log_file, env, echo=log_file is None,
                                 on_line=show_progress if log_file is not None else None)
    if code != 0:
        errors = [line for line in output.splitlines() if line.startswith("error: ")]
        if errors and log_file is None:  # the command's own error line is on the console already
            sys.exit(code)
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


def prepare(args: argparse.Namespace, data: Path, command: Command) -> None:
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
    run_script(command, "prepare_data", *prep)


def train_seeds_args(args: argparse.Namespace, config: Path, data: Path) -> list[str]:
    cmd = ["--config", str(config), "--data", str(data), "--seeds", *map(str, args.seeds),
           "--save-root", str(args.out / "runs")]
    if args.cpu:
        cmd.append("--cpu")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return cmd + shlex.split(args.train_args)


def train(args: argparse.Namespace, data: Path, command: Command) -> None:
    """Every check of mtsa-train-seeds (configs, data, options) for both configs before either trains, then the
    training, both configs at once with ``--parallel``."""
    configs = [args.baseline_config, args.system_config]
    for config in configs:
        run_script(command, "train_seeds", *train_seeds_args(args, config, data), "--dry-run",
                   log_file=args.out / f"train-{config.stem}.log")
    jobs = 2 if args.parallel else 1
    seeds = f"seed {args.seeds[0]}" if len(args.seeds) == 1 else f"{len(args.seeds)} seeds"
    log(f"training {seeds} of {', '.join(c.stem for c in configs)} "
        f"({'both configs at once' if jobs == 2 else 'one run at a time'}); logs in {args.out / 'runs'}")

    def one(config: Path) -> None:
        start = time.time()
        run_script(command, "train_seeds", *train_seeds_args(args, config, data),
                   log_file=args.out / f"train-{config.stem}.log")
        log(f"  {config.stem}: {len(args.seeds)} runs done in {time.time() - start:.0f} s")

    with ThreadPoolExecutor(jobs) as pool:
        try:
            list(pool.map(one, configs))
        except BaseException:
            stop_children()  # the other config's training stops too
            raise


def test_sets(data: Path) -> list[str]:
    """The test sets of a prepared data directory, in its manifest's order."""
    return list(json.loads((data / "manifest.json").read_text())["tests"])


def score(args: argparse.Namespace, data: Path, command: Command) -> dict[str, list[Path]]:
    """Every run's result file on every test set of the data, by role. A readable result is kept unless its run's
    ``checkpoint_last.pt`` is newer (the run trained on since it was scored)."""
    results: dict[str, list[Path]] = {"baseline": [], "system": []}
    tests = test_sets(data)
    kept = 0
    for role, config in (("baseline", args.baseline_config), ("system", args.system_config)):
        for seed in args.seeds:
            run = run_dir(args.out, config, seed)
            checkpoint = run / "checkpoint_last.pt"
            for test in tests:
                out = result_path(args.out, config, seed, test)
                results[role].append(out)
                again = []
                if readable_json(out):
                    if not checkpoint.is_file() or checkpoint.stat().st_mtime <= out.stat().st_mtime:
                        kept += 1
                        continue
                    log(f"  {out} scored an older checkpoint_last.pt (the run trained on since): scoring again")
                    again = ["--overwrite"]
                elif out.exists():  # 0 bytes or cut short (by an older version on a full disk): not finished
                    log(f"  {out} is empty or unreadable: scoring again")
                out.parent.mkdir(parents=True, exist_ok=True)
                cmd = ["--run-dir", str(run), "--data", str(data), "--test", test, "--result", str(out), *again]
                cmd += (["--cpu"] if args.cpu else []) + shlex.split(args.score_args)
                run_script(command, "score", *cmd, log_file=args.out / "score.log", threads=args.threads)
                bleu = json.loads(out.read_text())["bleu"]
                log(f"  {config.stem} seed {seed} {test}: sacreBLEU {bleu['sacrebleu']:.2f}")
    if kept:
        log(f"  kept {kept} result(s) scored before (--score-args apply to new scores only: delete a result to score "
            "it again)")
    return results


def run_pipeline(args: argparse.Namespace, start: float, command: Command) -> None:
    """The four steps for the pipeline's options ``args`` (``out`` and ``report_dir`` resolved), OUT locked."""
    data = args.data.resolve() if args.data else args.out / "data"
    log(f"1/4 data -> {data}")
    if not args.data:
        prepare(args, data, command)
    log("2/4 training")
    train(args, data, command)
    if args.train_only:
        log(f"done in {time.time() - start:.0f} s (--train-only: no test set scored); runs in {args.out / 'runs'}")
        return
    log("3/4 translating and scoring the test sets")
    results = score(args, data, command)
    log("4/4 significance report")
    args.report_dir.mkdir(parents=True, exist_ok=True)
    report = ["--baseline", *map(str, results["baseline"]), "--system", *map(str, results["system"]),
              "--names", *args.names, "--markdown", str(args.report_dir / "report.md"), "--json",
              str(args.report_dir / "report.json"), "--plot", str(args.report_dir / "report.png"),
              "--overwrite"]  # derived from the result files: rewritten (atomically) every time
    run_script(command, "significance", *report)
    log(f"done in {time.time() - start:.0f} s: {args.report_dir / 'report.md'}, {args.report_dir / 'report.png'}")
