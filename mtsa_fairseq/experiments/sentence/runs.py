"""Sentence-encoder runs: architectures x seeds (x folds) on one task, each trained and evaluated to a result file.

A task config (``configs/sentence/<task>.yaml``) holds ``name`` (its file stem), ``dataset`` (the prepared data's),
``metric`` (accuracy | pearson), ``description``, ``fairseq`` (the authors' protocol as fairseq-train options) and
optionally ``arch_overrides`` (``{arch: options}``). Each run is ``fairseq-train`` in
``OUT/runs/<arch>/seed<k>[/fold<f>]`` (its ``run.json`` the translation launcher's run record), then an evaluation
of its ``checkpoint_best.pt`` into ``OUT/results/<arch>_seed<k>[_fold<f>].json``. Finished runs are skipped,
interrupted ones resume, and one whose best checkpoint cannot be read trains again
(:func:`~mtsa_fairseq.experiments.runs.best_repair`)."""

from __future__ import annotations

import difflib
import re
import shlex
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtsa_fairseq.contracts import RUN_SCHEMA, SENTENCE_RESULT_SCHEMA, checksums, read_json
from mtsa_fairseq.experiments.errors import ConfigError, LaunchError
from mtsa_fairseq.experiments.fairseq_train import (
    USER_DIR,
    option_origins,
    options_to_args,
    parse_fairseq_train,
    read_config_file,
)
from mtsa_fairseq.experiments.files import atomic_path, write_json
from mtsa_fairseq.experiments.processes import (
    RunLock,
    UpdateProgress,
    find_executable,
    run_logged,
    say,
    stop_children,
)
from mtsa_fairseq.experiments.runs import best_repair, is_done, mean_train_wps, previous_run, session, write_run

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
    fairseq-train's real parser, their values as fairseq reads them, before anything trains; a bad option or value
    raises ExperimentError naming the file and key."""
    for arch in archs:
        options = config.options(arch)
        options.pop("task", None)
        where = config.path if arch not in config.arch_overrides else f"{config.path} (arch_overrides.{arch})"
        try:
            parse_fairseq_train(str(data), ["--task", "sentence_encoding", "--arch", arch, *options_to_args(options),
                                            *extra], option_origins(where, options, extra), options)
        except ConfigError as err:
            raise ExperimentError(str(err)) from None


def command_lr(command: list[str]) -> float | None:
    """The learning rate a fairseq-train command line trains with: its last ``--lr`` (None: fairseq's default)."""
    values = [command[i + 1] for i, token in enumerate(command[:-1]) if token == "--lr"]
    return float(values[-1]) if values else None


def unknown_archs(archs: list[str]) -> list[str]:
    """Those of ``archs`` that are not sentence-encoder architectures."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    import mtsa_fairseq.plugin  # noqa: F401  (registers the architectures)

    return [a for a in archs if ARCH_MODEL_REGISTRY.get(a) is None or
            ARCH_MODEL_REGISTRY[a].__name__ != "SentenceEncoderModel"]


def plan_folds(manifest: dict[str, Any], folds: list[int] | None, data: Path) -> list[int] | None:
    """The folds to run (None: the data has a fixed split): ``folds``, or every fold of cross-validation data;
    ValueError names folds that the data ``data`` does not have."""
    num_folds = int(manifest.get("num_folds") or 0)
    folds = folds if folds is not None else (list(range(num_folds)) if num_folds else None)
    if folds and not num_folds:
        raise ValueError(f"{data} is not cross-validation data; drop --folds")
    if folds and any(not 0 <= f < num_folds for f in folds):
        raise ValueError(f"--folds must be in 0..{num_folds - 1}")
    return folds


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


def adopt_run(source: Path, run_dir: Path, command: list[str], budget: int) -> bool:
    """Copy into ``run_dir`` (checkpoints, log, then run.json) a run that the same fairseq-train command (but for
    ``--save-dir``) finished in ``source`` at ``budget``, a learning-rate search's run at the chosen rate, instead of
    training it again. False, and nothing copied, when ``source`` holds no such run."""
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


def _option_groups(command: list[str]) -> list[list[str]]:
    """A fairseq-train command line as what it trains: each option with its values, in order, without the
    executable and the options that name places or the budget (``--save-dir``, ``--user-dir``, ``--max-update``)."""
    groups: list[list[str]] = [[]]
    for token in command[1:]:
        if token.startswith("--"):
            groups.append([])
        groups[-1].append(token)
    return [group for group in groups if group and group[0] not in ("--save-dir", "--user-dir", "--max-update")]


def changed_option(trained: list[str], command: list[str]) -> tuple[str, str] | None:
    """The first option (with its values) in which the fairseq-train command ``command`` differs from the one a run
    was ``trained`` with, as each gives it ("" where one lacks it); None when they train alike."""
    old, new = ([" ".join(group) for group in _option_groups(c)] for c in (trained, command))
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag != "equal":
            return " ".join(old[i1:i2]), " ".join(new[j1:j2])
    return None


def run_one(config: TaskConfig, run: Run, data: Path, out: Path, max_update: int | None, extra: list[str],
            threads: int | None, cpu: bool, log: Callable[[str], None] | None = None,
            split: str | None = None, trained_in: Path | None = None) -> dict[str, Any]:
    """Train (or resume) one run under its directory's lock and evaluate its best checkpoint on ``split`` (default:
    test, or the held-out fold); returns (and writes) the result with the run's dev curve. A run finished under a
    smaller budget trains on to the new one, unless ``--patience`` stopped it (then it would stop there under any
    budget, and its result stands); a new run that the same command finished in ``trained_in`` is adopted."""
    from mtsa_fairseq.experiments.sentence.evaluation import EvaluationError, evaluate, write_result

    log = log or say
    run_dir, result_path = run.run_dir(out), run.result_path(out)
    budget = max_update if max_update is not None else config.options(run.arch)["max-update"]
    run_dir.mkdir(parents=True, exist_ok=True)
    with RunLock(run_dir / ".lock", f"run {run_dir}").acquire(ExperimentError) as lock:
        try:
            command = train_command(config, run, data, out, max_update, extra + (["--cpu"] if cpu else []))
        except LaunchError as exc:
            raise ExperimentError(str(exc)) from exc
        trained = (previous_run(run_dir) or {}).get("command")
        if trained and command_lr(trained) != command_lr(command):
            raise ExperimentError(f"{run.key}: {run_dir} was trained with --lr {command_lr(trained)!r}, not "
                                  f"{command_lr(command)!r}; use another --out for another learning rate")
        changed = changed_option(trained, command) if trained else None
        if changed:
            raise ExperimentError(f"{run.key}: {run_dir} was trained with {changed[0] or 'nothing'!r} where this "
                                  f"command gives {changed[1] or 'nothing'!r}; use another --out for other options")
        if result_path.is_file():
            previous = read_json(result_path, SENTENCE_RESULT_SCHEMA, "result file", ExperimentError)
            if previous.get("max_update") == budget:
                return previous
            if not isinstance(previous.get("max_update"), int) or previous["max_update"] > budget:
                raise ExperimentError(f"{run.key}: {result_path} was trained with max-update "
                                      f"{previous.get('max_update')}, not {budget}; use another --out for a smaller "
                                      "budget")
            record = previous_run(run_dir)
            if is_done(record, budget):  # below the budget only when --patience stopped it
                log(f"[experiment] {run.key}: stopped early (--patience) at update {record['num_updates']} under "
                    f"max-update {previous['max_update']}, where it stops under {budget} too")
                previous["max_update"] = budget
                write_json(result_path, previous)
                return previous
            log(f"[experiment] {run.key}: continuing from max-update {previous['max_update']} to {budget}")
        if trained_in and previous_run(run_dir) is None and adopt_run(trained_in, run_dir, command, budget):
            log(f"[experiment] {run.key}: the same command finished in {trained_in}; taken from there, not trained "
                "again")
        repair = best_repair(run_dir, lambda line: log(f"[experiment] {run.key}: {line}"))
        finished = previous_run(run_dir)
        if is_done(finished, budget) and not repair:  # trained (to the budget, or stopped by --patience)
            log(f"[experiment] {run.key}: trained already ({finished['num_updates']:,} updates); evaluating it")
        else:
            finished = _train(config, run, run_dir, command, data, budget, threads, lock, log, repair)
        best = run_dir / "checkpoint_best.pt"
        log_text = (run_dir / "train.log").read_text(encoding="utf-8", errors="replace")
        curve = dev_curve(log_text, config.metric)
        if not best.is_file() and curve:
            raise ExperimentError(f"{run.key}: {best} is gone, though the run validated (train.log): move {run_dir} "
                                  "aside to train the run again")
        if not best.is_file():
            raise ExperimentError(f"{run.key}: no {best} (did validation run? check validate-interval-updates)")
        split = split or ("valid" if run.fold is not None else "test")
        try:
            result = evaluate(best, split, data, run.fold)
        except EvaluationError as exc:  # one line, not a traceback
            raise ExperimentError(f"{run.key}: {exc}") from exc
        wps = mean_train_wps(log_text)
        result.update(experiment=config.name, run=run.key, fold=run.fold, max_update=budget, lr=command_lr(command),
                      dev_curve=curve, train_seconds=finished["wall_seconds"],
                      train_words_per_second=None if wps is None else round(wps, 1))
        result_path.parent.mkdir(parents=True, exist_ok=True)
        write_result(result_path, result)
        log(f"[experiment] {run.key}: {split} " + ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()))
    return result


def _train(config: TaskConfig, run: Run, run_dir: Path, command: list[str], data: Path, budget: int,
           threads: int | None, lock: RunLock, log: Callable[[str], None],
           notes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train (or resume) the run to ``budget`` in a :func:`~mtsa_fairseq.experiments.runs.session` (run.json with
    ``notes``); returns its finished record."""
    log(f"[experiment] {run.key}: training -> {run_dir}")
    record = {"schema": RUN_SCHEMA, "config": config.name, "system": run.arch, "setup": config.dataset,
              "arch": run.arch, "seed": run.seed, "fold": run.fold, "status": "running", "command": command,
              "data": str(data), "checkpoint": str(run_dir / "checkpoint_best.pt"), "num_updates": None,
              "train_target_tokens_per_second": None, "max_update": budget, "average_last": 0, "launcher": "local",
              "world_size": 1, "dictionaries": {"dict.txt": checksums(data, ["dict.txt"])["dict.txt"]["sha256"]},
              **(notes or {})}
    with session(run_dir, record, run.key, lambda line: log(f"[experiment] {line}"), cpu=True) as started:
        done = started.resumed_from
        if done >= budget:  # trained, then stopped before run.json was filled in: fairseq would train one more update
            log(f"[experiment] {run.key}: checkpoint_last.pt is at {done:,} updates already; evaluating it")
            finished = started.finish(0, trained=False)
        else:
            env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
            with (run_dir / "train.log").open("a", encoding="utf-8") as log_file:
                log_file.write(f"$ {shlex.join(command)}\n")
            code, peak_mb, output = run_logged(command, run_dir / "train.log", env, lock, echo=False,
                                               on_line=UpdateProgress(run.key, budget, done, write=log))
            if code < 0:  # a signal: with --jobs > 1 the experiment's own SIGTERM or Ctrl-C arrives this way
                raise ExperimentError(f"{run_dir}: fairseq-train stopped by signal {-code}; rerun to resume")
            finished = started.finish(code, peak_mb, output)
    if finished["status"] != "done":
        raise ExperimentError(f"{run.key}: {finished['error']}")
    return finished


def train_all(jobs: int, one: Callable[[Any], Any], runs: list) -> list:
    """``one(run)`` for every run, ``jobs`` at a time, in order; Ctrl-C or a kill stops every run's trainer."""
    with ThreadPoolExecutor(jobs) as pool:
        try:
            return list(pool.map(one, runs))
        except BaseException:
            stop_children()  # Ctrl-C or kill: the runs of the other threads stop too
            raise
