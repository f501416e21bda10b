"""A learning-rate search on dev data (docs/sentence-tasks.md): every architecture at every rate of a grid (one seed, a
fixed split), the best-dev checkpoint evaluated on dev only, and one rule (:func:`choose`) for each architecture's rate.
Run ``(arch, rate)`` is the sentence experiment's run ``OUT/lr-<rate>/runs/<arch>/seed<k>`` trained with
``--lr <rate>``; a run fairseq stops with NaN/Inf gradients is recorded as stopped (its dev curve kept), not retrained.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtsa_fairseq.contracts import SENTENCE_RESULT_SCHEMA, read_json, read_run
from mtsa_fairseq.experiments.sentence.report import metric_format
from mtsa_fairseq.experiments.sentence.runs import ExperimentError, Run, TaskConfig, dev_curve, run_one
from mtsa_fairseq.experiments.tables import markdown_table

SCHEMA = "mtsa-fairseq/sentence-lr-search/1"
RULE = ("each architecture takes the rate with the highest best-dev {metric} among the rates it trained through "
        "without a NaN/Inf stop; ties: the higher dev {metric} at the last validation, then the larger rate")
STOPPED = "FloatingPointError"  # fairseq-train's NaN/Inf gradient stop


def rate_name(lr: float) -> str:
    """The rate as its directory names it (``lr-0.0005``)."""
    return f"lr-{lr!r}"


def search_runs(archs: list[str], lrs: list[float], seed: int) -> list[tuple[Run, float]]:
    """Every (architecture, rate) run, architectures outermost (in the given order), so that a search stopped
    part-way holds whole architectures."""
    return [(Run(arch, seed, None), lr) for arch in archs for lr in lrs]


def _stopped_by_nan(run_dir: Path) -> str | None:
    """fairseq's error line for a run it stopped with NaN/Inf gradients (None for any other state)."""
    record = read_run(run_dir, ExperimentError) if (run_dir / "run.json").is_file() else None
    if record is None or record.get("status") != "failed":
        return None
    session = (run_dir / "train.log").read_text(encoding="utf-8", errors="replace").split("\n$ ")[-1]
    errors = [line.strip() for line in session.splitlines() if line.startswith(STOPPED)]
    return errors[-1] if errors else None


def _row(run: Run, lr: float, out: Path, metric: str, result: dict[str, Any] | None = None,
         error: str | None = None) -> dict[str, Any]:
    """The search report's row of a run done with ``result``, or stopped by NaN/Inf with ``error``."""
    run_dir = run.run_dir(out / rate_name(lr))
    row = {"arch": run.arch, "lr": lr, "seed": run.seed, "run_dir": str(run_dir.relative_to(out))}
    if result is not None:
        return {**row, "status": "done", "dev_curve": result["dev_curve"], "evaluated": result["metrics"][metric],
                "best_checkpoint_updates": result["num_updates"], "max_update": result["max_update"],
                "train_seconds": result["train_seconds"]}
    curve = dev_curve((run_dir / "train.log").read_text(encoding="utf-8", errors="replace"), metric)
    record = read_run(run_dir, ExperimentError)
    return {**row, "status": "stopped", "error": error, "dev_curve": curve, "evaluated": None,
            "best_checkpoint_updates": None, "max_update": record.get("max_update"),
            "train_seconds": record.get("wall_seconds")}


def search_one(config: TaskConfig, run: Run, lr: float, data: Path, out: Path, max_update: int | None,
               extra: list[str], threads: int | None, cpu: bool,
               log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train (or resume, or read) one run of the search; returns its row of the search report."""
    rate_out = out / rate_name(lr)
    run_dir = run.run_dir(rate_out)
    error = _stopped_by_nan(run_dir)
    if error is None:
        try:
            result = run_one(config, run, data, rate_out, max_update, [*extra, "--lr", repr(lr)], threads, cpu,
                             log=log, split="valid")
        except ExperimentError:
            error = _stopped_by_nan(run_dir)
            if error is None:
                raise
        else:
            return _row(run, lr, out, config.metric, result)
    (log or print)(f"[lr-search] {run.arch} lr {lr!r}: stopped by fairseq ({error}); delete {run_dir} to retrain")
    return _row(run, lr, out, config.metric, error=error)


def read_one(config: TaskConfig, run: Run, lr: float, out: Path, max_update: int | None) -> dict[str, Any] | None:
    """One run's row as far as it has finished, without training: done (its result at the budget), stopped by
    NaN/Inf, or None (not started, training, or interrupted)."""
    rate_out = out / rate_name(lr)
    budget = max_update if max_update is not None else config.options(run.arch)["max-update"]
    result_path = run.result_path(rate_out)
    if result_path.is_file():
        result = read_json(result_path, SENTENCE_RESULT_SCHEMA, "result file", ExperimentError)
        if result.get("max_update") == budget:
            return _row(run, lr, out, config.metric, result)
    error = _stopped_by_nan(run.run_dir(rate_out))
    return None if error is None else _row(run, lr, out, config.metric, error=error)


def run_scores(row: dict[str, Any]) -> dict[str, Any]:
    """A run's best dev value, the first update that reached it, and its last validation."""
    curve = row["dev_curve"]
    if not curve:
        return {"best_dev": None, "best_dev_update": None, "last_update": None, "last_dev": None}
    best = max(v for _, v in curve)
    return {"best_dev": best, "best_dev_update": min(int(u) for u, v in curve if v == best),
            "last_update": int(curve[-1][0]), "last_dev": curve[-1][1]}


def choose(rows: list[dict[str, Any]], lrs: list[float]) -> dict[str, float | None]:
    """The rule, per architecture whose every rate has finished (the others are left out): of the rates it trained
    through without stopping, the one whose best-dev checkpoint has the highest dev metric, ties going to the higher
    dev metric at the last validation, then to the larger rate; None if no rate trained through."""
    chosen: dict[str, float | None] = {}
    for arch in dict.fromkeys(row["arch"] for row in rows):
        if {r["lr"] for r in rows if r["arch"] == arch} != set(lrs):
            continue
        eligible = [r for r in rows if r["arch"] == arch and r["status"] == "done" and r["best_dev"] is not None]
        best = max(eligible, key=lambda r: (r["best_dev"], r["last_dev"], r["lr"]), default=None)
        chosen[arch] = None if best is None else best["lr"]
    return chosen


def search_report(config: TaskConfig, rows: list[dict[str, Any]], archs: list[str], lrs: list[float],
                  seed: int) -> dict[str, Any]:
    """The search as JSON: every finished run with its scores, the rule and each architecture's chosen rate
    (``pending``: the architectures with a rate still to finish)."""
    runs = [{**row, **run_scores(row)} for row in rows]
    chosen = choose(runs, lrs)
    return {"schema": SCHEMA, "experiment": config.name, "dataset": config.dataset, "metric": config.metric,
            "split": "valid", "seed": seed, "archs": archs, "lrs": lrs, "rule": RULE.format(metric=config.metric),
            "runs": runs, "chosen": chosen, "pending": [arch for arch in archs if arch not in chosen]}


def chosen_rates(path: Path, archs: list[str]) -> tuple[dict[str, float], dict[str, Any]]:
    """The rate a search report (``search.json``, ``search-interim.json`` or a copy) chose for each of ``archs``, and
    the search; ExperimentError names an unreadable report or each architecture without a rate and why."""
    report = read_json(path, SCHEMA, "learning-rate search", ExperimentError)
    chosen, pending = report.get("chosen") or {}, report.get("pending") or []
    why = {arch: "rates still to finish" if arch in pending else
           "every rate stopped with NaN/Inf" if arch in chosen else "not searched"
           for arch in archs if chosen.get(arch) is None}
    if why:
        raise ExperimentError(f"{path} chose no learning rate for " +
                              ", ".join(f"{arch} ({reason})" for arch, reason in why.items()))
    source = {"search": str(path), "experiment": report["experiment"], "dataset": report["dataset"],
              "split": report["split"], "seed": report["seed"], "lrs": report["lrs"], "rule": report["rule"]}
    return {arch: float(chosen[arch]) for arch in archs}, source


def searched_rates(path: Path | None, archs: list[str]) -> tuple[dict[str, float], dict | None, dict[str, Path]]:
    """What ``--lr-from`` a search report ``path`` gives ``archs``: each one's rate (:func:`chosen_rates`), the search
    with them (the report's ``lr_from``), and the run directory, beside ``path``, of each architecture's run at its
    rate (left out where not there: a copy of the report elsewhere). Empty, None and empty without ``path``."""
    if path is None:
        return {}, None, {}
    rates, source = chosen_rates(path, archs)
    report = read_json(path.resolve(), SCHEMA, "learning-rate search", ExperimentError)
    found = {row["arch"]: path.resolve().parent / row["run_dir"] for row in report["runs"]
             if row["arch"] in rates and row["lr"] == rates[row["arch"]] and row["status"] == "done"}
    return rates, {**source, "chosen": rates}, {arch: run_dir for arch, run_dir in found.items() if run_dir.is_dir()}


def search_table(report: dict[str, Any], names: dict[str, str] | None = None) -> list[str]:
    """One row per architecture: at every rate the best dev metric with the first update that reached it (the
    chosen rate's in bold, a stopped run marked), the last validation, and the chosen rate."""
    f, name, metric = metric_format(report["metric"]), names or {}, report["metric"]
    lrs = report["lrs"]
    header = ["architecture", *(f"lr {lr:g}: best dev {metric} (update); last" for lr in lrs), "chosen rate"]
    rows = []
    by_arch: dict[str, dict[float, dict[str, Any]]] = {arch: {} for arch in report["archs"]}
    for run in report["runs"]:
        by_arch[run["arch"]][run["lr"]] = run
    for arch, runs in by_arch.items():
        chosen = report["chosen"].get(arch)
        cells = []
        for lr in lrs:
            run = runs.get(lr)
            if run is None or run["best_dev"] is None:
                cells.append("not finished" if run is None else "stopped (NaN/Inf) before its first validation")
                continue
            best = f"{run['best_dev']:{f}} ({run['best_dev_update']:,})"
            end = (f"stopped (NaN/Inf) after {run['last_update']:,}" if run["status"] == "stopped"
                   else f"{run['last_dev']:{f}}")
            cells.append((f"**{best}**" if lr == chosen else best) + f"; {end}")
        shown = "pending" if arch in report["pending"] else "—" if chosen is None else f"{chosen:g}"
        rows.append([name.get(arch, arch), *cells, shown])
    return markdown_table(header, rows)


def search_markdown(report: dict[str, Any]) -> str:
    """The search report as Markdown."""
    pending = f" Still to finish: {', '.join(report['pending'])}." if report["pending"] else ""
    return "\n".join([f"### {report['experiment']}: learning-rate search on dev (seed {report['seed']})", "",
                      f"Rule: {report['rule']}.{pending}", "", *search_table(report)]) + "\n"
