"""The Multi30k study (``mtsa-multi30k-study``, docs/results-multi30k.md): two configs over the same seeds in one
pipeline OUT, seed by seed, each finished seed scored on both test sets at ``checkpoint_last.pt`` and at the average
of its last 5 epoch checkpoints; the significance reports, the per-run table, the validation curves and the probe's
budget rule over them, and ``study.json`` (schema ``mtsa-fairseq.multi30k-study.v1``), from which mtsa-docs-tables
renders the docs' tables. Failures exit with one line.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mtsa_fairseq.contracts import RESULT_SCHEMA, RUN_SCHEMA, read_json, relative_path
from mtsa_fairseq.experiments.checkpoint_average import (
    AverageError,
    average_checkpoints,
    last_checkpoints,
    save_checkpoint,
)
from mtsa_fairseq.experiments.files import readable_json, write_atomic, write_json
from mtsa_fairseq.experiments.processes import RunLock
from mtsa_fairseq.experiments.tables import markdown_table
from mtsa_fairseq.experiments.translation.curves import budget, plateau, plot_curves, run_curve
from mtsa_fairseq.experiments.translation.pipeline import KINDS, Command, result_path, run_dir

CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # mtsa_fairseq.experiments.CONFIGS


@dataclass(frozen=True)
class Comparison:
    """Two configs trained over the same seeds in one OUT (``runs/``, ``results/``, ``data/`` shared), the
    baseline's and the system's, with their names in the reports, which go to ``OUT/<reports>``."""

    configs: dict[str, Path]  # "baseline" / "system" -> training config
    names: dict[str, str]  # "baseline" / "system" -> name in the reports
    reports: str  # folder of OUT for the reports ("" for OUT itself)
    cap: int | None = None  # the recipe's most updates: a probe whose runs reach it unplateaued fixes it

    def runs(self, seeds: list[int]) -> list[tuple[str, Path, int]]:
        """(role, config, seed) of every run, the baseline's first."""
        return [(role, config, seed) for role, config in self.configs.items() for seed in seeds]


STUDY = Comparison({"baseline": CONFIGS / "multi30k_transformer.yaml", "system": CONFIGS / "multi30k_mtsa.yaml"},
                   {"baseline": "Transformer", "system": "MTSA"}, "")
TINY = Comparison({"baseline": CONFIGS / "multi30k_tiny_transformer.yaml",
                   "system": CONFIGS / "multi30k_tiny_mtsa.yaml"}, STUDY.names, "", cap=8000)  # Wu et al.'s
RECIPES = {"base": STUDY, "tiny": TINY}  # --recipe: the study's grid of model recipes
ABLATION = Comparison({"baseline": CONFIGS / "multi30k_mtsa.yaml",
                       "system": CONFIGS / "multi30k_mtsa_s2t_bias5.yaml"},
                      {"baseline": "MTSA", "system": "MTSA s2t bias 5"}, "ablation")
TESTS = ("test_2016_flickr", "test_2017_flickr")
AVERAGED = 5  # epoch checkpoints averaged (fairseq's average_checkpoints.py --num-epoch-checkpoints 5)
STUDY_SCHEMA = "mtsa-fairseq.multi30k-study.v1"
EQUIVALENCE_MARGIN = 0.45  # BLEU: the MTSA paper's gain (Table 6, Setup 1), the margin of the equivalence tests


def raw_files(multi30k: Path) -> dict[str, list[Path]]:
    """The release's split files (plain or .gz), by split name; exits naming the first missing one."""
    files: dict[str, list[Path]] = {}
    for split in ("train", "val", *TESTS):
        for lang in ("en", "de"):
            plain, gz = multi30k / f"{split}.{lang}", multi30k / f"{split}.{lang}.gz"
            if not (plain.is_file() or gz.is_file()):
                sys.exit(f"error: {multi30k} has neither {plain.name} nor {gz.name} (the Multi30k task 1 release)")
            files.setdefault(split, []).append(plain if plain.is_file() else gz)
    return files


def _run(cmd: list[str], failure: str, quiet: bool = True) -> None:
    """Run a project command (its stdout dropped when ``quiet``); a failure exits with ``error: <failure>``."""
    if subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else None).returncode != 0:
        sys.exit(f"error: {failure}")


def _run_record(out: Path, config: Path, seed: int) -> dict:
    return read_json(run_dir(out, config, seed) / "run.json", RUN_SCHEMA, "run record", RuntimeError)


def _result(out: Path, config: Path, seed: int, test: str, kind: str = "last") -> dict:
    return read_json(result_path(out, config, seed, test, kind), RESULT_SCHEMA, "result", RuntimeError)


def runs_table(out: Path, seeds: list[int], comparison: Comparison = STUDY) -> str:
    """One Markdown row per run: updates, wall time, target tokens/s, peak RSS, parameters, sacreBLEU per test."""
    header = ["system", "seed", "updates", "wall time (min)", "target tokens/s", "peak RSS (MB)", "parameters",
              *(f"sacreBLEU {t}" for t in TESTS)]
    rows = []
    for _, config, seed in comparison.runs(seeds):
        run = _run_record(out, config, seed)
        scores = [_result(out, config, seed, t) for t in TESTS]
        rows.append([config.stem, str(seed), str(run["num_updates"]), f"{run['wall_seconds'] / 60:.1f}",
                     f"{run['train_target_tokens_per_second']:.0f}", f"{run['peak_rss_mb']:.0f}",
                     f"{scores[0]['num_params']:,}", *(f"{s['bleu']['sacrebleu']:.2f}" for s in scores)])
    return "\n".join(markdown_table(header, rows)) + "\n"


def averaged_checkpoint(run_dir: Path) -> Path:
    """``run_dir/checkpoint_avg5.pt``, the parameter average of the run's last 5 epoch checkpoints (written
    once, atomically, so an existing file is whole)."""
    out = run_dir / f"checkpoint_avg{AVERAGED}.pt"
    if not out.is_file():
        save_checkpoint(average_checkpoints(last_checkpoints(run_dir, AVERAGED, "epoch")), out)
    return out


def score_runs(out: Path, seeds: list[int], comparison: Comparison, command: Command) -> None:
    """Score every run of ``seeds`` on both test sets at both checkpoint kinds (result files that exist are kept,
    and a run's averaged checkpoint is made only for a score it lacks: a run whose four results exist needs no
    checkpoint any more)."""
    for _, config, seed in comparison.runs(seeds):
        for kind in KINDS:
            for test in TESTS:
                result = result_path(out, config, seed, test, kind)
                if readable_json(result):
                    continue
                model = ["--run-dir", str(run_dir(out, config, seed))] if kind == "last" else \
                    ["--checkpoint", str(averaged_checkpoint(run_dir(out, config, seed)))]
                result.parent.mkdir(parents=True, exist_ok=True)
                _run(command("score", *model, "--data", str(out / "data"), "--test", test, "--result", str(result),
                             "--overwrite"), f"scoring {model[1]} ({kind}) on {test} failed")


def run_curves(out: Path, seeds: list[int], comparison: Comparison = STUDY) -> dict[str, dict]:
    """Every run's validation curve and plateau verdict, keyed ``"<system> seed <k>"``."""
    runs = {}
    for role, config, seed in comparison.runs(seeds):
        curve = run_curve(run_dir(out, config, seed))
        runs[f"{comparison.names[role]} seed {seed}"] = {"config": config.stem, "seed": seed, "curve": curve,
                                                          "plateau": plateau(curve)}
    return runs


def write_curves(out: Path, seeds: list[int], title: str, stem: str = "curves",
                 comparison: Comparison = STUDY) -> dict[str, dict]:
    """<stem>.json and <stem>.png in the comparison's reports, from the runs' logs; returns the curves."""
    runs = run_curves(out, seeds, comparison)
    reports = out / comparison.reports
    reports.mkdir(parents=True, exist_ok=True)
    write_json(reports / f"{stem}.json", {"schema": STUDY_SCHEMA, "runs": runs})
    plot_curves({label: run["curve"] for label, run in runs.items()}, reports / f"{stem}.png", title)
    return runs


def print_verdicts(runs: dict[str, dict]) -> None:
    """One line per run: its last validation and the plateau rule's verdict."""
    for label, run in runs.items():
        verdict = run["plateau"]
        print(f"{label}: last validation at update {verdict['last_update']}, gain of the last quarter "
              f"{verdict['gain']} BLEU: {'plateau' if verdict['plateaued'] else 'not yet on a plateau'}")


def probe_budget(probe: Path, comparison: Comparison = STUDY) -> dict:
    """The budget the probe ``probe`` fixes (:func:`budget` over all its runs, or the recipe's ``cap`` once every run
    validated there, ``capped``) with each probe run's verdict at it; ``probe`` is the probe's output directory (its
    runs' logs) or its curves report (OUT/curves.json or OUT/curves-interim.json, e.g.
    results/multi30k/probe/curves.json). Exits with one line while it fixes none."""
    if probe.is_file():
        try:
            runs = read_json(probe, STUDY_SCHEMA, "probe curves report", ValueError)["runs"]
        except ValueError as err:
            sys.exit(f"error: {err}")
        probed = {run.get("config") for run in runs.values()}
        wanted = {config.stem for config in comparison.configs.values()}
        if not probed <= wanted:
            sys.exit(f"error: {probe} probed {', '.join(sorted(map(str, probed)))}, not this recipe's "
                     f"{', '.join(sorted(wanted))}: its budget is another recipe's")
    else:
        seeds = sorted({int(d.name.removeprefix("seed")) for config in comparison.configs.values()
                        for d in (probe / "runs" / config.stem).glob("seed*") if (d / "train.log").is_file()})
        if not seeds:
            sys.exit(f"error: {probe} holds no probe runs (runs/<config>/seed<k>/train.log) and is no curves report")
        runs = run_curves(probe, seeds, comparison)
    update = budget([run["curve"] for run in runs.values()])
    capped = update is None and comparison.cap is not None and all(
        (plateau(run["curve"])["last_update"] or 0) >= comparison.cap for run in runs.values())
    if capped:
        update = comparison.cap
    if update is None:
        last = ", ".join(f"{label} at update {plateau(run['curve'])['last_update']}" for label, run in runs.items())
        cap = f" or at the recipe's cap of {comparison.cap} updates" if comparison.cap is not None else ""
        sys.exit(f"error: the probe in {probe} fixes no budget yet: no validation at which all its runs are on a "
                 f"plateau{cap} (last validations: {last})")
    return {"max_update": update, "capped": capped, "probe": str(probe),
            "verdicts": {label: plateau([p for p in run["curve"] if p["update"] <= update])
                         for label, run in runs.items()}}


def interim_curves(out: Path, seeds: list[int], comparison: Comparison = STUDY) -> None:
    """``--curves-only``: curves-interim.{json,png} in the comparison's reports, from the logs as they stand (the
    runs may be training)."""
    logs = [run_dir(out, config, seed) / "train.log" for _, config, seed in comparison.runs(seeds)]
    missing = [str(log) for log in logs if not log.is_file()]
    if missing:
        sys.exit(f"error: no training log {missing[0]} (start the study or the probe first)")
    reports = out / comparison.reports
    reports.mkdir(parents=True, exist_ok=True)
    with RunLock(reports / ".curves-interim.lock", f"output {reports / 'curves-interim.json'}", "curves").acquire():
        runs = write_curves(out, seeds, "Multi30k: validation curves so far", "curves-interim", comparison)
    print_verdicts(runs)
    print(f"curves so far: {reports / 'curves-interim.json'}, {reports / 'curves-interim.png'}")


def study_report(out: Path, seeds: list[int], budget_record: dict | None = None,
                 comparison: Comparison = STUDY) -> dict:
    """The machine-readable study: per run its validation curve and test BLEU of both checkpoint kinds (sacreBLEU
    in ``test``, lowercased in ``test_lowercased``, tokenized compound-split BLEU in ``test_tokenized``); per test
    set and kind the two systems' means, standard deviations, Welch's test and the paired tests per seed
    (``summary``: sacreBLEU, ``summary_lowercased``, ``summary_tokenized``); the budget and where it came from
    (``budget_record`` of :func:`probe_budget`, its ``probe`` relative to the study.json's folder)."""
    runs = []
    for role, config, seed in comparison.runs(seeds):
        record = _run_record(out, config, seed)
        curve = run_curve(run_dir(out, config, seed))
        results = {test: {kind: _result(out, config, seed, test, kind) for kind in KINDS} for test in TESTS}
        runs.append({
            "system": comparison.names[role], "config": config.stem, "seed": seed, "max_update": record["max_update"],
            "num_updates": record["num_updates"], "wall_seconds": record["wall_seconds"],
            "train_target_tokens_per_second": record["train_target_tokens_per_second"],
            "num_params": results[TESTS[0]]["last"]["num_params"],
            "valid_bleu": [[p["update"], p["bleu"]] for p in curve if "bleu" in p],
            "valid_loss": [[p["update"], p["loss"]] for p in curve], "plateau": plateau(curve),
            **{key: {test: {kind: results[test][kind]["bleu"][metric] for kind in KINDS} for test in TESTS}
               for key, metric in (("test", "sacrebleu"), ("test_lowercased", "sacrebleu_lc"),
                                   ("test_tokenized", "tokenized_compound_split"))},
        })
    reports = out / comparison.reports
    return {"schema": STUDY_SCHEMA, "sacrebleu_signature": _significance_report(reports, "last", "")["signature"],
            "averaged_epochs": AVERAGED,
            "budget": budget_record and {**budget_record, "probe": relative_path(budget_record["probe"], reports)},
            "runs": runs,
            "summary": _summary(reports, "", comparison.names),
            "summary_lowercased": _summary(reports, "-lowercased", comparison.names),
            "summary_tokenized": _summary(reports, "-tokenized", comparison.names)}


def _significance_report(reports: Path, kind: str, suffix: str) -> dict:
    return read_json(reports / f"report{KINDS[kind].replace('_', '-')}{suffix}.json", "mtsa-fairseq.significance.v1",
                     "significance report", RuntimeError)


def _summary(reports: Path, suffix: str, names: dict[str, str]) -> dict[str, dict]:
    """Per test set and checkpoint kind, from the significance reports ``report[-avg5]<suffix>.json``: both
    systems' mean, standard deviation and run count, Welch's test and the per-seed paired tests."""
    summary: dict[str, dict] = {}
    for kind in KINDS:
        for group in _significance_report(reports, kind, suffix)["groups"]:
            t = group["t_test"]
            summary.setdefault(group["test_set"], {})[kind] = {
                names["baseline"]: {"mean": t["mean_baseline"], "std": t["std_baseline"], "n": t["n_baseline"]},
                names["system"]: {"mean": t["mean_system"], "std": t["std_system"], "n": t["n_system"]},
                "welch": {"t": t["t"], "df": t["df"], "p_two_sided": t["p_two_sided"], "p_greater": t["p_greater"]},
                "paired": group["paired"],
            }
    return summary


def run_study(out: Path, files: dict[str, list[Path]], seeds: list[int], comparison: Comparison,
              command: Command, *, threads: int, max_update: int | None, train_only: bool,
              budget_record: dict | None) -> None:
    """The study (or with ``train_only`` the probe) of ``comparison`` in ``out`` from the release's ``files``:
    mtsa-pipeline trains, then the scores, reports, curves and study.json; ``max_update`` overrides the
    configs' budget (``budget_record``: the probe's, recorded in study.json)."""
    cmd = [*command("pipeline"), "--out", str(out), "--vocab-size", "8000",
           "--train", *map(str, files["train"]), "--valid", *map(str, files["val"]),
           "--baseline-config", str(comparison.configs["baseline"]), "--system-config",
           str(comparison.configs["system"]), "--names", comparison.names["baseline"], comparison.names["system"],
           "--report-dir", str(out / comparison.reports), "--parallel", "--threads", str(threads)]
    for test in TESTS:
        cmd += ["--test", test, *map(str, files[test])]
    if max_update is not None:
        cmd += ["--train-args", f"--extra-args '--max-update {max_update}'"]

    def pipeline(seeds: list[int], *more: str) -> None:
        _run([*cmd, "--seeds", *map(str, seeds), *more], "the pipeline failed (its logs are in --out)", quiet=False)

    out = out.resolve()
    reports = out / comparison.reports
    title = "Multi30k ablation" if comparison is ABLATION else "Multi30k probe" if train_only else "Multi30k study"
    if train_only:
        pipeline(seeds, "--train-only")
        print_verdicts(write_curves(out, seeds, f"{title}: validation curves", comparison=comparison))
        print(f"curves: {reports / 'curves.json'}, {reports / 'curves.png'}")
        return
    # seed by seed: both systems' runs of a seed train side by side, then are scored at both checkpoint kinds, so
    # that every finished seed is final (its scores need no checkpoint) before the next one starts
    for seed in seeds:
        pipeline([seed], "--train-only")
        try:
            score_runs(out, [seed], comparison, command)
        except AverageError as err:
            sys.exit(f"error: {err}")
    pipeline(seeds)  # every run trained and scored: the pipeline's own report (sacreBLEU, checkpoint_last)
    for kind, metric, stem in (("avg5", "sacrebleu", "report-avg5"),  # the others, with mtsa-significance
                               ("last", "sacrebleu_lc", "report-lowercased"),
                               ("avg5", "sacrebleu_lc", "report-avg5-lowercased"),
                               ("last", "tokenized_compound_split", "report-tokenized"),
                               ("avg5", "tokenized_compound_split", "report-avg5-tokenized")):
        results = {role: [str(result_path(out, config, seed, test, kind)) for seed in seeds for test in TESTS]
                   for role, config in comparison.configs.items()}
        _run(command("significance", "--baseline", *results["baseline"], "--system", *results["system"], "--names",
                     comparison.names["baseline"], comparison.names["system"], "--metric", metric,
                     "--equivalence-margin", str(EQUIVALENCE_MARGIN), "--markdown", str(reports / f"{stem}.md"),
                     "--json", str(reports / f"{stem}.json"), "--overwrite"), f"the significance report {stem} failed")
    table = runs_table(out, seeds, comparison)
    write_atomic(reports / "runs.md", table)
    write_curves(out, seeds, f"{title}: validation curves of every run", comparison=comparison)
    write_json(reports / "study.json", study_report(out, seeds, budget_record, comparison))
    print(table + f"\nreports: {reports / 'report.md'} (sacreBLEU, checkpoint_last), {reports / 'report-avg5.md'} "
          f"(sacreBLEU, average of the last {AVERAGED} epoch checkpoints), {reports / 'report-lowercased.md'} "
          f"and {reports / 'report-avg5-lowercased.md'} (lowercased), {reports / 'report-tokenized.md'} "
          f"and {reports / 'report-avg5-tokenized.md'} (tokenized, compound-split BLEU), {reports / 'runs.md'}, "
          f"{reports / 'curves.png'}, {reports / 'study.json'}")
