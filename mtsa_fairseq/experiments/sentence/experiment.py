"""Sentence-encoder experiments: several architectures x seeds (x cross-validation folds) on one task.

A task config (``configs/sentence/<task>.yaml``) holds the authors' training protocol as fairseq-train
options, with optional per-architecture overrides::

    name: sst5                 # file stem
    dataset: sst5              # must equal the prepared data's manifest
    metric: accuracy           # accuracy | pearson: what the report compares
    description: ...
    fairseq: {task: sentence_encoding, criterion: sentence_encoding, optimizer: adadelta, ...}
    arch_overrides: {disan_encoder: {batch-size: 64}}

Each run is ``fairseq-train`` in ``OUT/runs/<arch>/seed<k>[/fold<f>]`` (with its ``run.json``, the translation
launcher's run record: status, command, time, updates, throughput, peak memory) followed by an evaluation of its
``checkpoint_best.pt`` (selected on dev; for cross-validation on the held-out fold, the papers' protocol)
into ``OUT/results/<arch>_seed<k>[_fold<f>].json``. Finished runs (result file present) are skipped and
interrupted ones resume from ``checkpoint_last.pt``. The report gives each architecture's mean and standard
deviation over seeds (for CV: per seed, the mean over folds) and Welch's t-test of the reference architecture
against each other one; for CV also three held-out numbers over all runs (best checkpoint, update chosen on the
other folds, last update) with paired t-tests over the folds, corrected for their overlapping training sets and
naive (:func:`cross_validation`).
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtsa_fairseq.contracts import RUN_SCHEMA, SENTENCE_RESULT_SCHEMA, read_json
from mtsa_fairseq.experiments.errors import ConfigError, LaunchError
from mtsa_fairseq.experiments.fairseq_train import (
    USER_DIR,
    option_origins,
    options_to_args,
    parse_fairseq_train,
    read_config_file,
)
from mtsa_fairseq.experiments.files import atomic_path, write_json
from mtsa_fairseq.experiments.plotting import pyplot
from mtsa_fairseq.experiments.processes import RunLock, UpdateProgress, find_executable, run_logged
from mtsa_fairseq.experiments.runs import Session, is_done, mean_train_wps, previous_run, session, write_run
from mtsa_fairseq.experiments.significance import (
    SignificanceError,
    anchor_test,
    binomial_se,
    corrected_resampled_t_test,
    paired_t_test,
    t_interval,
    t_test,
)

CONFIG_KEYS = ("name", "dataset", "metric", "description", "fairseq")
TASK_METRICS = ("accuracy", "pearson")
# set per run by the driver
RUN_OPTIONS = ("arch", "seed", "save-dir", "cv-fold", "user-dir", "task")
# fairseq's simple-format validation line: "... | valid on 'valid' subset | ... | accuracy 54.9 | ... | num_updates 300"
_VALID_LINE = re.compile(r"\| valid on 'valid' subset \|(.*)$", re.MULTILINE)
_FIELD = re.compile(r"\| ([a-z_]+) ([-+0-9.eE]+|nan|inf)(?= \||$)")


def dev_curve(log_text: str, metric: str) -> list[list[float]]:
    """``[[updates, dev metric], ...]`` from the validation lines of a fairseq-train log (simple or tqdm
    format), in update order; a validation logged twice (a resumed run repeats its last one) counts once."""
    points: dict[int, float] = {}
    for match in _VALID_LINE.finditer(log_text):
        fields = dict(_FIELD.findall("| " + match.group(1).strip()))
        if metric in fields and "num_updates" in fields:
            points[int(float(fields["num_updates"]))] = float(fields[metric])
    return [[u, points[u]] for u in sorted(points)]


class ExperimentError(ValueError):
    """A config, data directory or option that cannot be used; the message says why."""


@dataclass(frozen=True)
class TaskConfig:
    path: Path
    name: str
    dataset: str
    metric: str
    fairseq: dict[str, Any]
    arch_overrides: dict[str, dict[str, Any]]

    def options(self, arch: str) -> dict[str, Any]:
        """The fairseq-train options of ``arch`` (the config's, then its overrides)."""
        return {**self.fairseq, **self.arch_overrides.get(arch, {})}


def load_task_config(path: str | Path) -> TaskConfig:
    """Read and check a task config; ``ExperimentError`` names the first problem."""
    path = Path(path)
    raw = read_config_file(path, ExperimentError)
    missing = [k for k in CONFIG_KEYS if k not in raw]
    unknown = [k for k in raw if k not in (*CONFIG_KEYS, "arch_overrides")]
    if missing or unknown:
        raise ExperimentError(f"{path}: missing keys {missing}, unknown keys {unknown}")
    if raw["name"] != path.stem:
        raise ExperimentError(f"{path}: name {raw['name']!r} must equal the file name {path.stem!r}")
    if raw["metric"] not in TASK_METRICS:
        raise ExperimentError(f"{path}: metric must be one of {TASK_METRICS}, got {raw['metric']!r}")
    overrides = raw.get("arch_overrides") or {}
    sections = [("fairseq", raw["fairseq"])] + [(f"arch_overrides.{a}", o) for a, o in overrides.items()]
    for where, section in sections:
        if not isinstance(section, dict):
            raise ExperimentError(f"{path}: {where} must be a mapping of fairseq-train options")
        fixed = [k for k in section if k in RUN_OPTIONS and not (k == "task" and section[k] == "sentence_encoding")]
        if fixed:
            raise ExperimentError(f"{path}: {where} sets {fixed}, which the experiment sets per run")
    if not isinstance(raw["fairseq"].get("max-update"), int):
        raise ExperimentError(f"{path}: fairseq.max-update (an integer) is required")
    return TaskConfig(path, raw["name"], raw["dataset"], raw["metric"], dict(raw["fairseq"]), dict(overrides))


@dataclass(frozen=True)
class Run:
    arch: str
    seed: int
    fold: int | None

    @property
    def key(self) -> str:
        return f"{self.arch}_seed{self.seed}" + ("" if self.fold is None else f"_fold{self.fold}")

    def run_dir(self, out: Path) -> Path:
        path = out / "runs" / self.arch / f"seed{self.seed}"
        return path if self.fold is None else path / f"fold{self.fold}"

    def result_path(self, out: Path) -> Path:
        return out / "results" / f"{self.key}.json"


def check_options(config: TaskConfig, archs: list[str], data: Path, extra: list[str]) -> None:
    """Parse each architecture's fairseq-train options (the config's, its overrides, ``extra``) with
    fairseq-train's real parser before anything trains; a bad option raises ExperimentError naming it."""
    for arch in archs:
        options = config.options(arch)
        options.pop("task", None)
        where = config.path if arch not in config.arch_overrides else f"{config.path} (arch_overrides.{arch})"
        try:
            parse_fairseq_train(str(data), ["--task", "sentence_encoding", "--arch", arch, *options_to_args(options),
                                            *extra], option_origins(where, options, extra))
        except ConfigError as err:
            raise ExperimentError(str(err)) from None


def command_lr(command: list[str]) -> float | None:
    """The learning rate a fairseq-train command line trains with: its last ``--lr`` (None: fairseq's default)."""
    values = [command[i + 1] for i, token in enumerate(command[:-1]) if token == "--lr"]
    return float(values[-1]) if values else None


def plan_runs(archs: list[str], seeds: list[int], folds: list[int] | None) -> list[Run]:
    """Every (arch, seed, fold) combination, seeds outermost so that early stops leave whole seeds."""
    return [Run(a, s, f) for s in seeds for a in archs for f in (folds if folds else [None])]


def train_command(config: TaskConfig, run: Run, data: Path, out: Path, max_update: int | None,
                  extra: list[str]) -> list[str]:
    """The run's fairseq-train command line."""
    options = config.options(run.arch)
    if max_update is not None:
        options["max-update"] = max_update
    options.pop("task", None)
    command = [find_executable("fairseq-train"), str(data), "--user-dir", USER_DIR, "--task", "sentence_encoding",
               "--arch", run.arch, "--seed", str(run.seed), "--save-dir", str(run.run_dir(out))]
    if run.fold is not None:
        command += ["--cv-fold", str(run.fold)]
    return command + options_to_args(options) + extra


def _say(line: str) -> None:
    print(line, flush=True)


def _execute(command: list[str], run_dir: Path, started: Session, threads: int | None, lock: RunLock,
             progress: UpdateProgress) -> dict[str, Any]:
    """Train in the session ``started`` (run.json kept as the translation launcher keeps it: running, then done,
    failed or interrupted, with time, updates, throughput and peak memory); returns the finished record."""
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
    log_path = run_dir / "train.log"
    with log_path.open("a", encoding="utf-8") as log:
        log.write(f"$ {shlex.join(command)}\n")
    code, peak_mb, output = run_logged(command, log_path, env, lock, echo=False, on_line=progress)
    if code < 0:  # stopped by a signal: with --jobs > 1 the experiment's own SIGTERM or Ctrl-C arrives this way
        raise ExperimentError(f"{run_dir}: fairseq-train stopped by signal {-code}; rerun to resume")
    return started.finish(code, peak_mb, output)


def _run_record(config: TaskConfig, run: Run, run_dir: Path, command: list[str], data: Path,
                budget: int) -> dict[str, Any]:
    """The run's ``run.json`` as training starts (schema and fields of the translation launcher's records; the
    session's own fields come from :func:`~mtsa_fairseq.experiments.runs.session`)."""
    return {
        "schema": RUN_SCHEMA, "config": config.name, "system": run.arch, "setup": config.dataset,
        "arch": run.arch, "seed": run.seed, "fold": run.fold, "status": "running", "command": command,
        "data": str(data), "checkpoint": str(run_dir / "checkpoint_best.pt"), "num_updates": None,
        "train_target_tokens_per_second": None, "max_update": budget,
        "average_last": 0, "launcher": "local", "world_size": 1,
    }


def adopt_run(source: Path, run_dir: Path, command: list[str], budget: int) -> bool:
    """Take over a run that the same fairseq-train command (but for ``--save-dir``) finished in ``source``, a
    learning-rate search's run at the chosen rate and seed, instead of training it again: its checkpoints, log
    and record are copied into ``run_dir`` (copies: training on in either directory leaves the other as it was),
    run.json last. False, and nothing copied, when ``source`` holds no such run finished at ``budget``."""
    names = ("checkpoint_best.pt", "checkpoint_last.pt", "train.log")
    if not all((source / name).is_file() for name in names):
        return False
    with RunLock(source / ".lock", f"run {source}").acquire(ExperimentError):
        record = previous_run(source)
        if not is_done(record, budget) or _but_save_dir(record["command"]) != _but_save_dir(command):
            return False
        for name in names:
            with atomic_path(run_dir / name) as tmp:
                shutil.copyfile(source / name, tmp)
        write_run(run_dir, {**record, "command": command, "checkpoint": str(run_dir / "checkpoint_best.pt"),
                            "trained_in": str(source)})
    return True


def _but_save_dir(command: list[str]) -> list[str]:
    at = command.index("--save-dir")
    return command[:at] + command[at + 2:]


def run_one(config: TaskConfig, run: Run, data: Path, out: Path, max_update: int | None, extra: list[str],
            threads: int | None, cpu: bool, log: Callable[[str], None] | None = None,
            split: str | None = None, trained_in: Path | None = None) -> dict[str, Any]:
    """Train (or resume) one run and evaluate its best checkpoint on ``split`` (default: test, or the held-out
    fold for cross-validation data); returns (and writes) the result with the run's dev curve. A run finished
    with a smaller update budget trains on from its last checkpoint to the new one, unless fairseq's
    ``--patience`` stopped it: it would stop there under any larger budget (no sentence config's learning rate
    depends on ``--max-update``), so its result stands for the new one. A new run that the same command has
    finished in ``trained_in`` is taken from there (:func:`adopt_run`). The run directory's lock is held
    throughout: a run still trained by another live process is refused, naming it."""
    log = log or _say
    run_dir = run.run_dir(out)
    run_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(run_dir / ".lock", f"run {run_dir}").acquire(ExperimentError) as lock:
        return _run_locked(config, run, data, out, max_update, extra, threads, cpu, log, split, lock, trained_in)


def _run_locked(config: TaskConfig, run: Run, data: Path, out: Path, max_update: int | None, extra: list[str],
                threads: int | None, cpu: bool, log: Callable[[str], None], split: str | None,
                lock: RunLock, trained_in: Path | None) -> dict[str, Any]:
    from mtsa_fairseq.experiments.sentence.evaluation import evaluate, write_result

    result_path = run.result_path(out)
    budget = max_update if max_update is not None else config.options(run.arch)["max-update"]
    run_dir = run.run_dir(out)
    try:
        command = train_command(config, run, data, out, max_update, extra + (["--cpu"] if cpu else []))
    except LaunchError as exc:
        raise ExperimentError(str(exc)) from exc
    trained = (previous_run(run_dir) or {}).get("command")
    if trained and command_lr(trained) != command_lr(command):
        raise ExperimentError(f"{run.key}: {run_dir} was trained with --lr {command_lr(trained)!r}, not "
                              f"{command_lr(command)!r}; use another --out for another learning rate")
    if result_path.is_file():
        previous = read_json(result_path, SENTENCE_RESULT_SCHEMA, "result file", ExperimentError)
        if previous.get("max_update") == budget:
            return previous
        if not isinstance(previous.get("max_update"), int) or previous["max_update"] > budget:
            raise ExperimentError(
                f"{run.key}: {result_path} was trained with max-update {previous.get('max_update')}, not {budget}; "
                "use another --out for a smaller budget")
        record = previous_run(run_dir)
        if is_done(record, budget):  # below the budget only when --patience stopped it
            log(f"[experiment] {run.key}: stopped early (--patience) at update {record['num_updates']} under "
                f"max-update {previous['max_update']}, where it stops under {budget} too")
            previous["max_update"] = budget
            write_json(result_path, previous)
            return previous
        log(f"[experiment] {run.key}: continuing from max-update {previous['max_update']} to {budget}")
    if trained_in is not None and previous_run(run_dir) is None and adopt_run(trained_in, run_dir, command, budget):
        log(f"[experiment] {run.key}: the same command finished in {trained_in}; taken from there, not trained again")
    finished = previous_run(run_dir)
    if is_done(finished, budget):  # trained (to the budget, or stopped by --patience), then not evaluated
        log(f"[experiment] {run.key}: trained already ({finished['num_updates']:,} updates); evaluating it")
    else:
        finished = _train(config, run, run_dir, command, data, budget, threads, lock, log)
    best = run_dir / "checkpoint_best.pt"
    if not best.is_file():
        raise ExperimentError(f"{run.key}: no {best} (did validation run? check validate-interval-updates)")
    split = split or ("valid" if run.fold is not None else "test")
    result = evaluate(best, split, data, run.fold)
    log_text = (run_dir / "train.log").read_text(encoding="utf-8", errors="replace")
    wps = mean_train_wps(log_text)
    result.update(experiment=config.name, run=run.key, fold=run.fold, max_update=budget, lr=command_lr(command),
                  dev_curve=dev_curve(log_text, config.metric),
                  train_seconds=finished["wall_seconds"],
                  train_words_per_second=None if wps is None else round(wps, 1))
    result_path.parent.mkdir(parents=True, exist_ok=True)
    write_result(result_path, result)
    shown = ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items())
    log(f"[experiment] {run.key}: {split} {shown}")
    return result


def _train(config: TaskConfig, run: Run, run_dir: Path, command: list[str], data: Path, budget: int,
           threads: int | None, lock: RunLock, log: Callable[[str], None]) -> dict[str, Any]:
    """Train (or resume) the run to ``budget``; returns its finished record."""
    log(f"[experiment] {run.key}: training -> {run_dir}")
    record = _run_record(config, run, run_dir, command, data, budget)
    with session(run_dir, record, run.key, lambda line: log(f"[experiment] {line}"), cpu=True) as started:
        done = started.resumed_from
        if done >= budget:  # trained, then stopped before run.json was filled in: fairseq would train one more update
            log(f"[experiment] {run.key}: checkpoint_last.pt is at {done:,} updates already; evaluating it")
            finished = started.finish(0, trained=False)
        else:
            finished = _execute(command, run_dir, started, threads, lock, UpdateProgress(run.key, budget, done,
                                                                                         write=log))
    if finished["status"] != "done":
        raise ExperimentError(f"{run.key}: {finished['error']}")
    return finished


def summarize(config: TaskConfig, results: list[dict[str, Any]], reference: str) -> dict[str, Any]:
    """Per architecture: the metric per seed (CV: mean over folds), mean, standard deviation; and
    Welch's t-test of ``reference`` (as the system) against each other architecture (as the baseline). The
    task's other metrics (SICK: Spearman's rho and MSE beside Pearson's r) get the same under ``other_metrics``."""
    archs, tests = _compare(results, config.metric, reference)
    summary = {"experiment": config.name, "dataset": config.dataset, "metric": config.metric,
               "reference": reference, "archs": archs, "welch_vs_reference": tests}
    others = [m for m in results[0]["metrics"] if m != config.metric] if results else []
    if others:
        summary["other_metrics"] = {}
        for metric in others:
            archs, tests = _compare(results, metric, reference)
            summary["other_metrics"][metric] = {"archs": archs, "welch_vs_reference": tests}
    if any(result.get("fold") is not None for result in results):
        summary["cross_validation"] = cross_validation(config, results, reference)
    return summary


def _compare(results: list[dict[str, Any]], metric: str,
             reference: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`summarize`'s per-architecture numbers and Welch's tests for one metric."""
    per_seed: dict[str, dict[int, list[float]]] = {}
    for result in results:
        value = result["metrics"][metric]
        per_seed.setdefault(result["arch"], {}).setdefault(result["seed"], []).append(value)
    archs: dict[str, Any] = {}
    for arch, seeds in per_seed.items():
        values = [float(np.mean(v)) for _, v in sorted(seeds.items())]
        archs[arch] = {"seeds": sorted(seeds), "values": values, "mean": float(np.mean(values)),
                       "std": float(np.std(values, ddof=1)) if len(values) > 1 else None,
                       "folds_per_seed": [len(v) for _, v in sorted(seeds.items())]}
    tests: dict[str, Any] = {}
    if reference in archs:
        for arch in archs:
            if arch == reference:
                continue
            try:
                stats = t_test(archs[arch]["values"], archs[reference]["values"])
            except SignificanceError as exc:
                tests[arch] = {"error": str(exc)}
                continue
            tests[arch] = {"t": stats.t, "df": stats.df, "p_two_sided": stats.p_two_sided,
                           "p_greater": stats.p_greater, "difference": stats.mean_system - stats.mean_baseline}
    return archs, tests


CV_KINDS = ("chosen", "best", "last")  # the honest number first


def cross_validation(config: TaskConfig, results: list[dict[str, Any]], reference: str) -> dict[str, Any]:
    """Cross-validation per architecture over its (seed, fold) runs, three held-out numbers per run:

    * ``chosen``: at the update that maximises the mean held-out metric of the architecture's runs on the
      *other* folds (validation steps every run has), so no run's own fold chooses its number;
    * ``best``: the best checkpoint's, selected on the held-out fold itself (the papers' protocol; optimistic);
    * ``last``: after the last update (no selection).

    Mean and sd over runs, and paired t-tests of ``reference`` against each other architecture over the runs
    both have (matched by seed and fold): naive, and under ``corrected`` Nadeau and Bengio's corrected resampled
    t-test (test/train ratio 1/(k - 1) for k folds). The metric is one to maximise (accuracy, as on every CV
    task)."""
    curves: dict[str, dict[tuple[int, int], dict[int, float]]] = {}
    runs: dict[str, dict[tuple[int, int], dict[str, float]]] = {}
    for result in results:
        if not result.get("dev_curve"):
            raise ExperimentError(f"{result['run']} has no held-out curve: its last-update metric is unknown")
        key = (result["seed"], result["fold"])
        curves.setdefault(result["arch"], {})[key] = {int(u): v for u, v in result["dev_curve"]}
        runs.setdefault(result["arch"], {})[key] = {"best": result["metrics"][config.metric],
                                                    "last": result["dev_curve"][-1][1]}
    for arch, by_run in curves.items():
        for key, step in chosen_steps(by_run).items():
            runs[arch][key]["chosen"] = by_run[key][step]
    archs = {}
    for arch, by_run in runs.items():
        archs[arch] = {"runs": len(by_run)}
        for kind in CV_KINDS:
            values = [by_run[key][kind] for key in sorted(by_run) if kind in by_run[key]]
            archs[arch][kind] = {"mean": float(np.mean(values)) if values else None,
                                 "std": float(np.std(values, ddof=1)) if len(values) > 1 else None}
    tests: dict[str, Any] = {}
    for arch in runs:
        if arch == reference or reference not in runs:
            continue
        shared = sorted(set(runs[arch]) & set(runs[reference]))
        tests[arch] = {}
        for kind in CV_KINDS:
            pairs = [(runs[arch][key][kind], runs[reference][key][kind]) for key in shared
                     if kind in runs[arch][key] and kind in runs[reference][key]]
            try:
                stats = paired_t_test([a for a, _ in pairs], [r for _, r in pairs])
            except SignificanceError as exc:
                tests[arch][kind] = {"error": str(exc)}
                continue
            tests[arch][kind] = {"n": stats.n, "difference": stats.mean_difference, "t": stats.t, "df": stats.df,
                                 "p_two_sided": stats.p_two_sided, "p_greater": stats.p_greater}
            ratio = test_train_ratio(shared)
            corrected = corrected_resampled_t_test([a for a, _ in pairs], [r for _, r in pairs], ratio)
            tests[arch][kind]["corrected"] = {"test_train_ratio": ratio, "t": corrected.t,
                                              "p_two_sided": corrected.p_two_sided, "p_greater": corrected.p_greater}
    return {"archs": archs, "paired_vs_reference": tests}


def test_train_ratio(runs: Sequence[tuple[int, int]]) -> float:
    """n_test / n_train of a k-fold cross-validation whose (seed, fold) ``runs`` name k folds: 1 / (k - 1)."""
    return 1 / (len({fold for _, fold in runs}) - 1)


def chosen_steps(curves: dict[tuple[int, int], dict[int, float]]) -> dict[tuple[int, int], int]:
    """Per (seed, fold) run of one architecture, the validation step its ``chosen`` number is read at: the step
    (among those every run has) that maximises the mean held-out metric of the runs on the other folds, the
    earliest of equally good ones. Runs without another fold get none."""
    steps = sorted(set.intersection(*(set(curve) for curve in curves.values())))
    chosen = {}
    for key in curves:
        others = [c for (_, fold), c in curves.items() if fold != key[1]]
        if others:
            chosen[key] = max(steps, key=lambda u: (np.mean([c[u] for c in others]), -u))
    return chosen


def report_markdown(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table."""
    metric, ref = summary["metric"], summary["reference"]
    lines = [f"### {summary['experiment']}: {summary.get('split', 'test')} {metric} of the best-dev checkpoints "
             f"(mean ± sd over seeds; Welch's t-test of {ref} vs each)", ""]
    if "lr_from" in summary:
        source = summary["lr_from"]
        lines += [f"Learning rates: each architecture's, chosen on {source['dataset']} {source['split']} data by the "
                  f"search {source['experiment']} ({source['search']}; rule: {source['rule']}).", ""]
    lines += summary_table(summary)
    for other in summary.get("other_metrics", {}):
        lines += ["", f"{summary.get('split', 'test')} {other}:", "", *summary_table(summary, metric=other)]
    if "cross_validation" in summary:
        lines += ["", f"### Cross-validation: held-out {metric}, mean ± sd over runs (seeds x folds); paired t-test "
                  f"of {ref} vs each, matched by seed and fold", "",
                  "chosen: at the update best on average over the other folds; best (test-selected): the best "
                  "checkpoint on the held-out fold (the papers' protocol, which selects on that fold); last: after the "
                  "last update.", "",
                  *cross_validation_table(summary)]
    if "runs" in summary:
        lines += ["", "### Runs", "", *(runs_table(summary) if "cross_validation" not in summary
                                        else folds_table(summary))]
    return "\n".join(lines) + "\n"


def metric_format(metric: str) -> str:
    return ".2f" if metric == "accuracy" else ".4f"


LOWER_IS_BETTER = {"mse"}  # metrics for which the one-sided test asks whether the reference is lower


def _p(p: float) -> str:
    return "< 0.001" if p < 0.0005 else f"{p:.3f}"


def _with_metric(summary: dict[str, Any], metric: str | None) -> dict[str, Any]:
    """``summary`` with ``metric`` (one of its ``other_metrics``) in place of the task's; None: unchanged."""
    if metric in (None, summary["metric"]):
        return summary
    if "cross_validation" in summary:
        raise ValueError(f"metric={metric}: a cross-validation report has one metric, {summary['metric']}")
    if metric not in summary.get("other_metrics", {}):
        known = ", ".join([summary["metric"], *summary.get("other_metrics", {})])
        raise ValueError(f"metric={metric}: the report has {known}")
    return {**summary, **summary["other_metrics"][metric], "metric": metric}


def summary_table(summary: dict[str, Any], names: dict[str, str] | None = None,
                  metric: str | None = None) -> list[str]:
    """Per architecture: the metric (default: the task's; else one of ``other_metrics``) per seed, mean ± sd, and
    Welch's t-test of the reference against it with its 95% interval (and each architecture's learning rate when
    a search chose them).
    The one-sided p is that of the reference being better: greater, or lower for a metric in LOWER_IS_BETTER."""
    summary = _with_metric(summary, metric)
    metric, ref, f, name = summary["metric"], summary["reference"], metric_format(summary["metric"]), names or {}
    ref = name.get(ref, ref)
    rates = summary["lr_from"]["chosen"] if "lr_from" in summary else None
    lr_column = " lr |" if rates else ""
    lower = metric in LOWER_IS_BETTER
    lines = [f"| architecture |{lr_column} seeds | {metric} per seed | mean ± sd | {ref} − it | 95% CI | t | df | "
             f"p (two-sided) | p ({ref} {'<' if lower else '>'} it) |", "|---|" + "---|" * (10 if rates else 9)]
    for arch, row in summary["archs"].items():
        sd = "" if row["std"] is None else f" ± {row['std']:{f}}"
        values = ", ".join(f"{v:{f}}" for v in row["values"])
        test = summary["welch_vs_reference"].get(arch)
        if test is None:
            cells = "— | — | — | — | — | —"
        elif "error" in test:
            cells = f"{test['error']} | | | | |"
        else:
            cells = (f"{test['difference']:+{f}} | {_interval(test, test['t'], test['df'], f)} | {test['t']:.2f} | "
                     f"{test['df']:.1f} | {_p(test['p_two_sided'])} | "
                     f"{_p(1 - test['p_greater'] if lower else test['p_greater'])}")
        lr = f" {rates[arch]:g} |" if rates else ""
        lines.append(f"| {name.get(arch, arch)} |{lr} {len(row['values'])} | {values} | {row['mean']:{f}}{sd} | "
                     f"{cells} |")
    return lines


def _interval(test: dict[str, Any], t: float, df: float, f: str) -> str:
    """The 95% confidence interval of a test's ``difference`` at its statistic ``t`` and ``df``."""
    if t == 0:
        return "—"
    low, high = t_interval(test["difference"], t, df)
    return f"{low:+{f}} to {high:+{f}}"


def cross_validation_table(summary: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """Per architecture: chosen, best (test-selected) and last held-out metric (mean ± sd over runs) and the
    paired tests: the difference, its 95% interval by the corrected resampled t-test, and the two-sided p of that
    test, the naive paired one beside it (and each architecture's learning rate when a search chose them)."""
    cv, ref, f, name = summary["cross_validation"], summary["reference"], metric_format(summary["metric"]), names or {}
    rates = summary["lr_from"]["chosen"] if "lr_from" in summary else None
    lines = [f"| architecture |{' lr |' if rates else ''} runs | chosen | best (test-selected) | last | "
             f"{name.get(ref, ref)} − it, chosen: corrected 95% CI (p: corrected; paired) | best | last |",
             "|---|" + "---|" * (8 if rates else 7)]
    for arch, row in cv["archs"].items():
        cells = [name.get(arch, arch), *([f"{rates[arch]:g}"] if rates else []), str(row["runs"])]
        for kind in CV_KINDS:
            mean, sd = row[kind]["mean"], row[kind]["std"]
            cells.append("—" if mean is None else f"{mean:{f}}" + ("" if sd is None else f" ± {sd:{f}}"))
        test = cv["paired_vs_reference"].get(arch)
        for kind in CV_KINDS:
            if test is None:
                cells.append("—")
            elif "error" in test[kind]:
                cells.append(test[kind]["error"])
            else:
                corrected = test[kind]["corrected"]
                interval = _interval(test[kind], corrected["t"], test[kind]["df"], f)
                cells.append(f"{test[kind]['difference']:+{f}}: {interval} ({_p(corrected['p_two_sided'])}; "
                             f"{_p(test[kind]['p_two_sided'])})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _curve(run: dict[str, Any]) -> dict[int, float]:
    return {int(u): v for u, v in run.get("dev_curve") or []}


def runs_table(summary: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """One row per run (architectures in the summary's order, then seeds): the tested checkpoint's metric, its
    update and dev metric as the run's record holds them (fairseq keeps the later of equally good
    checkpoints, so the first update that reached that dev value is shown beside it), and the last validation."""
    metric, f, name = summary["metric"], metric_format(summary["metric"]), names or {}
    split = summary.get("split", "test")
    lines = [f"| architecture | seed | {split} {metric} | tested checkpoint: update | its dev {metric} | "
             f"first update with that dev {metric} | last validation: update | dev {metric} there |",
             "|---|---|---|---|---|---|---|---|"]
    order = list(summary["archs"])
    for run in sorted(summary["runs"], key=lambda r: (order.index(r["arch"]), r["seed"])):
        curve, tested = _curve(run), run["best_checkpoint_updates"]
        dev = last = "— | —"  # no validation in its log, or none at the tested update
        if tested in curve:
            first = min(u for u, v in curve.items() if v == curve[tested])
            dev = f"{curve[tested]:{f}} | {first:,}"
        if curve:
            last = f"{max(curve):,} | {curve[max(curve)]:{f}}"
        lines.append(f"| {name.get(run['arch'], run['arch'])} | {run['seed']} | {run['metrics'][metric]:{f}} | "
                     f"{tested:,} | {dev} | {last} |")
    return lines


def _runs_by_arch(summary: dict[str, Any], archs: list[str] | None = None) -> dict[str, dict[tuple[int, int], Any]]:
    """The runs of each architecture (all, or ``archs``) keyed by (seed, fold), in the summary's order."""
    by_arch: dict[str, dict[tuple[int, int], dict[str, Any]]] = {}
    for run in summary["runs"]:
        if archs is None or run["arch"] in archs:
            by_arch.setdefault(run["arch"], {})[(run["seed"], run["fold"])] = run
    if archs is not None and set(archs) - set(by_arch):
        raise KeyError(f"no runs of {sorted(set(archs) - set(by_arch))}")
    return {arch: by_arch[arch] for arch in summary["archs"] if arch in by_arch}


def held_out_numbers(summary: dict[str, Any], runs: dict[tuple[int, int], Any]) -> dict[tuple[int, int], dict]:
    """Per (seed, fold) run of one architecture its three held-out numbers as ``(value, update)``: best (the
    tested checkpoint's), chosen (at the update the other folds chose; None without other folds) and last."""
    chosen = chosen_steps({key: _curve(run) for key, run in runs.items()})
    numbers = {}
    for key, run in runs.items():
        curve, step = _curve(run), chosen.get(key)
        numbers[key] = {"best": (run["metrics"][summary["metric"]], run["best_checkpoint_updates"]),
                        "chosen": None if step is None else (curve[step], step),
                        "last": (curve[max(curve)], max(curve))}
    return numbers


def folds_table(summary: dict[str, Any], names: dict[str, str] | None = None,
                archs: list[str] | None = None) -> list[str]:
    """One row per (seed, fold), per architecture (all, or ``archs``) its held-out metric: chosen (with the update
    the other folds chose), best (the tested checkpoint's, with its update; test-selected) and last."""
    f, name = metric_format(summary["metric"]), names or {}
    numbers = {arch: held_out_numbers(summary, runs) for arch, runs in _runs_by_arch(summary, archs).items()}
    seeds = {seed for runs in numbers.values() for seed, _ in runs}
    head = ["seed", "fold"] if len(seeds) > 1 else ["fold"]
    for arch in numbers:
        head += [f"{name.get(arch, arch)}: chosen (update)", "best, test-selected (update)", "last"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(set().union(*(set(runs) for runs in numbers.values()))):
        cells = [str(key[0]), str(key[1])] if len(seeds) > 1 else [str(key[1])]
        for arch in numbers:
            run = numbers[arch].get(key)
            if run is None:
                cells += ["—"] * 3
                continue
            cells += ["—" if run["chosen"] is None else f"{run['chosen'][0]:{f}} ({run['chosen'][1]:,})",
                      f"{run['best'][0]:{f}} ({run['best'][1]:,})",
                      f"{run['last'][0]:{f}}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


ANCHOR_KINDS = {"chosen": "chosen on the other folds", "best": "best (test-selected)", "last": "last"}


def anchor_table(summary: dict[str, Any], names: dict[str, str] | None = None, value: float = 0.0,
                 label: str = "anchor", metric: str | None = None, anchor_n: int | None = None) -> list[str]:
    """One-sample t-tests of every architecture's numbers against a published figure ``value`` (``label``):
    the per-seed metric of a fixed split (default: the task's; else one of ``other_metrics``), or per fold the
    three held-out numbers of a cross-validation. The one-sided p is that of the mean being better than the
    figure: greater, or lower for a metric in LOWER_IS_BETTER. A cross-validation's test is Nadeau and Bengio's
    corrected one; with ``anchor_n`` (an accuracy measured on that many test items) the test adds the figure's
    binomial standard error (:func:`~mtsa_fairseq.experiments.significance.anchor_test`); either way the plain
    one-sample t-test (folds independent, the figure exact) stands beside it."""
    summary = _with_metric(summary, metric)
    f, name = metric_format(summary["metric"]), names or {}
    lower = summary["metric"] in LOWER_IS_BETTER
    cross_validation = "cross_validation" in summary
    if anchor_n is not None and summary["metric"] != "accuracy":
        raise ValueError(f"n={anchor_n}: a binomial standard error needs an accuracy, not {summary['metric']}")
    samples: list[tuple[str, str, list[float]]] = []
    ratio = 0.0
    if cross_validation:
        by_arch = _runs_by_arch(summary)
        ratio = test_train_ratio([key for runs in by_arch.values() for key in runs])
        for arch, runs in by_arch.items():
            numbers = held_out_numbers(summary, runs).values()
            samples += [(arch, title, [n[kind][0] for n in numbers if n[kind] is not None])
                        for kind, title in ANCHOR_KINDS.items()]
    else:
        samples = [(arch, "per seed", row["values"]) for arch, row in summary["archs"].items()]
    error = {} if anchor_n is None else {"anchor_se": binomial_se(value, anchor_n), "anchor_df": anchor_n - 1}
    lead = [*(["corrected"] if cross_validation else []),
            *([f"{label} ± {error['anchor_se']:.2f} on {anchor_n:,} items"] if error else [])]
    besides = {}  # the tests beside the leading one: the correction alone, and the plain one-sample t-test
    if cross_validation and error:
        besides["p (corrected, figure exact)"] = {"test_train_ratio": ratio}
    if lead:
        besides[f"p (naive: {'folds independent, ' if cross_validation else ''}figure exact)"] = {}
    t_head = f"t ({'; '.join(lead)})" if lead else "t"
    lines = [f"| architecture | number | n | mean ± sd | {label} | mean − {label} | {t_head} | p (two-sided) | "
             f"p (mean {'<' if lower else '>'} {label}) |" + "".join(f" {head} |" for head in besides),
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(besides)]
    for arch, title, values in samples:
        mean = float(np.mean(values))
        sd = float(np.std(values, ddof=1)) if len(values) > 1 else None
        cells = f"{mean:{f}}" + ("" if sd is None else f" ± {sd:{f}}") + f" | {value:{f}} | {mean - value:+{f}}"
        if sd is None or sd == 0:
            cells += " | —" * (3 + len(besides))  # one value, or no spread: no t-test
        else:
            test = anchor_test(values, value, test_train_ratio=ratio, **error)
            better = 1 - test.p_greater if lower else test.p_greater
            cells += f" | {test.t:.2f} | {_p(test.p_two_sided)} | {_p(better)}" + "".join(
                f" | {_p(anchor_test(values, value, **options).p_two_sided)}" for options in besides.values())
        lines.append(f"| {name.get(arch, arch)} | {title} | {len(values)} | {cells} |")
    return lines


def plot_dev_curves(runs: list[dict[str, Any]], metric: str, name: str, path: Path) -> None:
    """Dev (for cross-validation: held-out fold) ``metric`` against updates per architecture (PNG), titled with
    the experiment's ``name``: the mean over runs (seeds, or seeds x folds) at each validation step that every
    run of that architecture reached, the band from their lowest to their highest value there, and each run's
    own curve as a thin line to where it stopped."""
    plt = pyplot()

    curves: dict[str, list[dict[int, float]]] = {}
    for run in runs:
        if run.get("dev_curve"):
            curves.setdefault(run["arch"], []).append(dict((int(u), v) for u, v in run["dev_curve"]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for arch, per_run in curves.items():
        steps = sorted(set.intersection(*(set(c) for c in per_run)))
        values = np.array([[c[u] for u in steps] for c in per_run])
        line, = ax.plot(steps, values.mean(axis=0), label=f"{arch.removesuffix('_encoder')} (n = {len(per_run)})")
        if len(per_run) > 1:
            ax.fill_between(steps, values.min(axis=0), values.max(axis=0), color=line.get_color(), alpha=0.2)
            for curve in per_run:  # each run to its own end (runs stopped early end sooner)
                ax.plot(sorted(curve), [curve[u] for u in sorted(curve)], color=line.get_color(), lw=0.6, alpha=0.4)
    ax.set_xlabel("updates")
    split = "held-out fold" if any(run.get("fold") is not None for run in runs) else "dev"
    ax.set_ylabel(f"{split} {metric}")
    ax.set_title(f"{name}: {split} {metric} (mean, band: min to max over runs)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
