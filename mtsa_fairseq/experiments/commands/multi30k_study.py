"""The Multi30k study (docs/results-multi30k.md), end to end and resumable.

Multi30k task 1 En-De (train 29,000 / val 1,014 / test_2016_flickr / test_2017_flickr) -> the project's data script
(joint 8k sentencepiece) -> configs/multi30k_transformer.yaml and configs/multi30k_mtsa.yaml, N seeds each, seed by
seed, the two systems' runs of a seed side by side on one CPU core each, validation BLEU every epoch -> as soon as a
seed's two runs finish, BLEU on both test sets of checkpoint_last.pt (the MTSA paper's protocol) and of the average
of the last 5 epoch checkpoints (the Transformer paper's) -> Welch's t-test, paired bootstrap and approximate
randomization for each (mtsa-pipeline does the first; OUT/report.md, OUT/report-avg5.md), the same on the tokenized,
compound-split BLEU (OUT/report-tokenized.md, OUT/report-avg5-tokenized.md) -> OUT/runs.md (a row per run: wall
time, throughput, peak memory, parameters, BLEU), OUT/curves.png (validation BLEU and loss of every run) and
OUT/study.json (per run its validation curve and test BLEU, per test set and checkpoint the means, standard
deviations, Welch p-values and paired tests), from which mtsa-docs-tables renders the docs' tables.

  python scripts/multi30k_study.py --multi30k path/to/multi30k --out multi30k-study --seeds 1 2 3 4 5 6

The learning-curve probe that fixes the budget on validation data, before any test set is scored:

  python scripts/multi30k_study.py --multi30k path/to/multi30k --out multi30k-probe --seeds 1 \\
      --max-update 20000 --train-only

writes OUT/curves.json and OUT/curves.png with the plateau rule's verdict per run (the best validation BLEU
after 3/4 of the updates gains less than 0.3 over the best before). While it trains (it takes hours), the
curves so far, from the runs' logs, without training anything:

  python scripts/multi30k_study.py --out multi30k-probe --seeds 1 --curves-only

writes OUT/curves-interim.json and OUT/curves-interim.png and prints each run's verdict. Once every probe run is
on a plateau at one validation, the study takes that update as its budget straight from the probe's logs:

  python scripts/multi30k_study.py --multi30k path/to/multi30k --out multi30k-study --seeds 1 2 3 4 5 6 \\
      --budget-from multi30k-probe

(refused while the probe fixes none; OUT/study.json records the budget and the probe's verdicts there). The
probe's curves report fixes the same budget without its logs: ``--budget-from results/multi30k/probe/curves.json``
reruns the project's study at the budget of its probe.

``--recipe tiny`` trains both systems on the Transformer-Tiny recipe of Wu et al. (2021) instead
(configs/multi30k_tiny_{transformer,mtsa}.yaml: 4+4 layers x 128, FFN 256, 8,192 tokens per update), for probe,
study and curves alike; its probe, one point of the grid the study's recipe is chosen from on validation BLEU:

  python scripts/multi30k_study.py --multi30k path/to/multi30k --out multi30k-grid-tiny --recipe tiny --seeds 1 \\
      --max-update 8000 --train-only

The ablation, after the study and in its OUT: MTSA with the MTSA paper's Setup 1 source2token bias
(configs/multi30k_mtsa_s2t_bias5.yaml, ``--mtsa-s2t-bias-init 5``) against the study's MTSA runs of the same
seeds, which it reuses, at the same budget, in the same form (every report and table above, in OUT/ablation/):

  python scripts/multi30k_study.py --multi30k path/to/multi30k --out multi30k-study --seeds 1 2 3 \\
      --budget-from multi30k-probe --ablation

Rerunning the same command skips finished runs (keyed by config and seed) and existing scores, continues an
interrupted run from its checkpoint_last.pt and rewrites the reports. A finished seed is final: a run whose
run.json says it finished and whose four result files (with their hypotheses) exist needs neither its
checkpoints nor its training again, so those files and its train.log, copied into OUT's layout, are all the
study needs of it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mtsa_fairseq.contracts import RESULT_SCHEMA, RUN_SCHEMA, read_json, relative_path
from mtsa_fairseq.experiments import CONFIGS as PACKAGE_CONFIGS
from mtsa_fairseq.experiments import command
from mtsa_fairseq.experiments.checkpoint_average import (
    AverageError,
    average_checkpoints,
    last_checkpoints,
    save_checkpoint,
)
from mtsa_fairseq.experiments.files import readable_json, write_atomic, write_json
from mtsa_fairseq.experiments.processes import RunLock, run_command
from mtsa_fairseq.experiments.translation.curves import budget, plateau, plot_curves, run_curve


@dataclass(frozen=True)
class Comparison:
    """Two configs trained over the same seeds in one OUT (``runs/``, ``results/``, ``data/`` shared), the
    baseline's and the system's, with their names in the reports, which go to ``OUT/<reports>``."""

    configs: dict[str, Path]  # "baseline" / "system" -> training config
    names: dict[str, str]  # "baseline" / "system" -> name in the reports
    reports: str  # folder of OUT for the reports ("" for OUT itself)


STUDY = Comparison({"baseline": PACKAGE_CONFIGS / "multi30k_transformer.yaml",
                    "system": PACKAGE_CONFIGS / "multi30k_mtsa.yaml"},
                   {"baseline": "Transformer", "system": "MTSA"}, "")
TINY = Comparison({"baseline": PACKAGE_CONFIGS / "multi30k_tiny_transformer.yaml",
                   "system": PACKAGE_CONFIGS / "multi30k_tiny_mtsa.yaml"},
                  {"baseline": "Transformer", "system": "MTSA"}, "")
RECIPES = {"base": STUDY, "tiny": TINY}  # --recipe: the study's grid of model recipes
ABLATION = Comparison({"baseline": PACKAGE_CONFIGS / "multi30k_mtsa.yaml",
                       "system": PACKAGE_CONFIGS / "multi30k_mtsa_s2t_bias5.yaml"},
                      {"baseline": "MTSA", "system": "MTSA s2t bias 5"}, "ablation")
TESTS = ("test_2016_flickr", "test_2017_flickr")
AVERAGED = 5  # epoch checkpoints averaged (fairseq's average_checkpoints.py --num-epoch-checkpoints 5)
KINDS = {"last": "", "avg5": "_avg5"}  # checkpoint kind -> result file suffix
STUDY_SCHEMA = "mtsa-fairseq.multi30k-study.v1"
EQUIVALENCE_MARGIN = 0.45  # BLEU: the MTSA paper's gain (Table 6, Setup 1), the margin of the equivalence tests


def raw_files(multi30k: Path) -> dict[str, tuple[Path, Path]]:
    """The release's split files (plain or .gz), by split name; exits naming the first missing one."""
    files = {}
    for split in ("train", "val", *TESTS):
        pair = []
        for lang in ("en", "de"):
            plain, gz = multi30k / f"{split}.{lang}", multi30k / f"{split}.{lang}.gz"
            if not (plain.is_file() or gz.is_file()):
                sys.exit(f"error: {multi30k} has neither {plain.name} nor {gz.name} (the Multi30k task 1 release)")
            pair.append(plain if plain.is_file() else gz)
        files[split] = (pair[0], pair[1])
    return files


def runs_table(out: Path, seeds: list[int], comparison: Comparison = STUDY) -> str:
    """One Markdown row per run: updates, wall time, target tokens/s, peak RSS, parameters, sacreBLEU per test."""
    rows = ["| system | seed | updates | wall time (min) | target tokens/s | peak RSS (MB) | parameters | "
            + " | ".join(f"sacreBLEU {t}" for t in TESTS) + " |",
            "|---|---|---|---|---|---|---|" + "---|" * len(TESTS)]
    for config in comparison.configs.values():
        for seed in seeds:
            run = read_json(out / "runs" / config.stem / f"seed{seed}" / "run.json", RUN_SCHEMA, "run record",
                            RuntimeError)
            scores = [read_json(out / "results" / f"{config.stem}_seed{seed}_{t}.json", RESULT_SCHEMA, "result",
                                RuntimeError) for t in TESTS]
            rows.append(f"| {config.stem} | {seed} | {run['num_updates']} | {run['wall_seconds'] / 60:.1f} | "
                        f"{run['train_target_tokens_per_second']:.0f} | {run['peak_rss_mb']:.0f} | "
                        f"{scores[0]['num_params']:,} | " + " | ".join(f"{s['bleu']['sacrebleu']:.2f}" for s in scores)
                        + " |")
    return "\n".join(rows) + "\n"


def result_path(out: Path, config: Path, seed: int, test: str, kind: str) -> Path:
    """The result file of one run, test set and checkpoint kind (``last`` is the pipeline's own)."""
    return out / "results" / f"{config.stem}_seed{seed}_{test}{KINDS[kind]}.json"


def averaged_checkpoint(run_dir: Path) -> Path:
    """``run_dir/checkpoint_avg5.pt``, the parameter average of the run's last 5 epoch checkpoints (written
    once, atomically, so an existing file is whole)."""
    out = run_dir / f"checkpoint_avg{AVERAGED}.pt"
    if not out.is_file():
        save_checkpoint(average_checkpoints(last_checkpoints(run_dir, AVERAGED, "epoch")), out)
    return out


def score_runs(out: Path, seeds: list[int], comparison: Comparison = STUDY) -> None:
    """Score every run of ``seeds`` on both test sets at both checkpoint kinds (result files that exist are kept,
    and a run's averaged checkpoint is made only for a score it lacks: a run whose four results exist needs no
    checkpoint any more)."""
    for config in comparison.configs.values():
        for seed in seeds:
            run_dir = out / "runs" / config.stem / f"seed{seed}"
            for kind in KINDS:
                for test in TESTS:
                    result = result_path(out, config, seed, test, kind)
                    if readable_json(result):
                        continue
                    model = ["--run-dir", str(run_dir)] if kind == "last" else \
                        ["--checkpoint", str(averaged_checkpoint(run_dir))]
                    result.parent.mkdir(parents=True, exist_ok=True)
                    cmd = command("score", *model, "--data", str(out / "data"), "--test", test, "--result",
                                  str(result), "--overwrite")
                    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
                        sys.exit(f"error: scoring {model[1]} ({kind}) on {test} failed")


def significance(out: Path, seeds: list[int], kind: str, metric: str, stem: str,
                 comparison: Comparison = STUDY) -> None:
    """mtsa-significance over the runs' ``kind`` results: <stem>.md and .json in the comparison's reports."""
    files = {role: [str(result_path(out, config, seed, test, kind)) for seed in seeds for test in TESTS]
             for role, config in comparison.configs.items()}
    reports = out / comparison.reports
    cmd = command("significance", "--baseline", *files["baseline"], "--system", *files["system"], "--names",
                  comparison.names["baseline"], comparison.names["system"], "--metric", metric,
                  "--equivalence-margin", str(EQUIVALENCE_MARGIN), "--markdown",
                  str(reports / f"{stem}.md"), "--json", str(reports / f"{stem}.json"), "--overwrite")
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        sys.exit(f"error: the significance report {stem} failed")


def run_curves(out: Path, seeds: list[int], comparison: Comparison = STUDY) -> dict[str, dict]:
    """Every run's validation curve and plateau verdict, keyed ``"<system> seed <k>"``."""
    runs = {}
    for role, config in comparison.configs.items():
        for seed in seeds:
            curve = run_curve(out / "runs" / config.stem / f"seed{seed}")
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
    """The budget the probe ``probe`` fixes (:func:`budget` over all its runs) with each probe run's verdict at
    it; ``probe`` is the probe's output directory (its runs' logs) or its curves report (OUT/curves.json or
    OUT/curves-interim.json, e.g. results/multi30k/probe/curves.json). Exits with one line while it fixes none."""
    if probe.is_file():
        try:
            runs = read_json(probe, STUDY_SCHEMA, "probe curves report", ValueError)["runs"]
        except ValueError as err:
            sys.exit(f"error: {err}")
    else:
        seeds = sorted({int(d.name.removeprefix("seed")) for config in comparison.configs.values()
                        for d in (probe / "runs" / config.stem).glob("seed*") if (d / "train.log").is_file()})
        if not seeds:
            sys.exit(f"error: {probe} holds no probe runs (runs/<config>/seed<k>/train.log) and is no curves report")
        runs = run_curves(probe, seeds, comparison)
    update = budget([run["curve"] for run in runs.values()])
    if update is None:
        last = ", ".join(f"{label} at update {plateau(run['curve'])['last_update']}" for label, run in runs.items())
        sys.exit(f"error: the probe in {probe} fixes no budget yet: no validation at which all its runs are on a "
                 f"plateau (last validations: {last})")
    return {"max_update": update, "probe": str(probe),
            "verdicts": {label: plateau([p for p in run["curve"] if p["update"] <= update])
                         for label, run in runs.items()}}


def interim_curves(out: Path, seeds: list[int], comparison: Comparison = STUDY) -> None:
    """``--curves-only``: curves-interim.{json,png} in the comparison's reports, from the logs as they stand (the
    runs may be training)."""
    logs = [out / "runs" / config.stem / f"seed{seed}" / "train.log" for config in comparison.configs.values()
            for seed in seeds]
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
    in ``test``, tokenized compound-split BLEU in ``test_tokenized``); per test set and kind the two systems'
    means, standard deviations, Welch's test and the paired tests per seed (``summary``: sacreBLEU,
    ``summary_tokenized``); the budget and where it came from (``budget_record`` of :func:`probe_budget`, its
    ``probe`` relative to the study.json's folder)."""
    curves = run_curves(out, seeds, comparison)
    runs = []
    for role, config in comparison.configs.items():
        for seed in seeds:
            record = read_json(out / "runs" / config.stem / f"seed{seed}" / "run.json", RUN_SCHEMA, "run record",
                               RuntimeError)
            curve = curves[f"{comparison.names[role]} seed {seed}"]
            results = {test: {kind: read_json(result_path(out, config, seed, test, kind), RESULT_SCHEMA, "result",
                                              RuntimeError) for kind in KINDS} for test in TESTS}
            runs.append({
                "system": comparison.names[role], "config": config.stem, "seed": seed,
                "max_update": record["max_update"],
                "num_updates": record["num_updates"], "wall_seconds": record["wall_seconds"],
                "train_target_tokens_per_second": record["train_target_tokens_per_second"],
                "num_params": results[TESTS[0]]["last"]["num_params"],
                "valid_bleu": [[p["update"], p["bleu"]] for p in curve["curve"] if "bleu" in p],
                "valid_loss": [[p["update"], p["loss"]] for p in curve["curve"]], "plateau": curve["plateau"],
                "test": {test: {kind: results[test][kind]["bleu"]["sacrebleu"] for kind in KINDS} for test in TESTS},
                "test_tokenized": {test: {kind: results[test][kind]["bleu"]["tokenized_compound_split"]
                                          for kind in KINDS} for test in TESTS},
            })
    reports = out / comparison.reports
    return {"schema": STUDY_SCHEMA, "sacrebleu_signature": _significance_report(reports, "last", "")["signature"],
            "averaged_epochs": AVERAGED,
            "budget": budget_record and {**budget_record, "probe": relative_path(budget_record["probe"], reports)},
            "runs": runs,
            "summary": _summary(reports, "", comparison.names),
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


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multi30k", type=Path,
                        help="directory with the Multi30k task 1 files {train,val,test_2016_flickr,"
                             "test_2017_flickr}.{en,de}[.gz] (github.com/multi30k/dataset, data/task1/raw); "
                             "required except with --curves-only")
    parser.add_argument("--out", type=Path, default=Path("multi30k-study"),
                        help="output directory (default: multi30k-study in the current directory)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds per system (default: 1 2 3)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per process (default 1: the two systems train at once, one core each)")
    parser.add_argument("--max-update", type=int,
                        help="train every run to this many updates instead of the configs' budget (a probe)")
    parser.add_argument("--train-only", action="store_true",
                        help="train, then stop: no test set is scored (the learning-curve probe that fixes the "
                             "budget: python scripts/multi30k_study.py --seeds 1 --max-update 20000 --train-only "
                             "--out multi30k-probe)")
    parser.add_argument("--curves-only", action="store_true",
                        help="train and score nothing: write OUT/curves-interim.json and .png from the runs' logs "
                             "as they stand and print each run's plateau verdict (safe while the runs train)")
    parser.add_argument("--budget-from", type=Path, metavar="PROBE",
                        help="the probe's output directory, or its curves report (OUT/curves.json; the project's "
                             "probe: results/multi30k/probe/curves.json): train every run to the budget its "
                             "validation curves fix (the first validation at which all its runs are on a "
                             "plateau); refused while there is none")
    parser.add_argument("--ablation", action="store_true",
                        help="the ablation instead of the study: configs/multi30k_mtsa_s2t_bias5.yaml (the MTSA "
                             "paper's Setup 1 source2token bias, --mtsa-s2t-bias-init 5) against "
                             "configs/multi30k_mtsa.yaml, reusing the study's MTSA runs in OUT; its reports go to "
                             "OUT/ablation/")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="base",
                        help="the model recipe of both systems: base, configs/multi30k_{transformer,mtsa}.yaml "
                             "(3+3 layers x 256, the default); tiny, configs/multi30k_tiny_{transformer,mtsa}.yaml "
                             "(Transformer-Tiny of Wu et al. 2021: 4+4 layers x 128, FFN 256, 8,192 tokens per "
                             "update)")
    args = parser.parse_args()
    if args.ablation and args.recipe != "base":
        parser.error("--ablation is of the base recipe: drop --recipe")
    comparison = ABLATION if args.ablation else RECIPES[args.recipe]
    if args.max_update is not None and args.max_update < 1:
        parser.error("--max-update must be positive")
    if args.budget_from is not None and (args.max_update is not None or args.train_only or args.curves_only):
        parser.error("--budget-from sets the budget of a study: drop --max-update, --train-only and --curves-only")
    if args.curves_only:
        if args.max_update is not None or args.train_only:
            parser.error("--curves-only trains nothing: drop --max-update and --train-only")
        interim_curves(args.out.resolve(), args.seeds, comparison)
        return
    if args.multi30k is None:
        parser.error("--multi30k is required (the Multi30k task 1 directory)")
    if not args.multi30k.is_dir():
        parser.error(f"--multi30k {args.multi30k} is not a directory")
    files = raw_files(args.multi30k)
    budget_record = None
    if args.budget_from is not None:
        budget_record = probe_budget(args.budget_from.resolve(), RECIPES[args.recipe])
        args.max_update = budget_record["max_update"]
        print(f"budget: {args.max_update} updates, the first validation at which every run of the probe in "
              f"{args.budget_from} is on a plateau")

    cmd = [*command("pipeline"), "--out", str(args.out), "--vocab-size", "8000",
           "--train", *map(str, files["train"]), "--valid", *map(str, files["val"]),
           "--baseline-config", str(comparison.configs["baseline"]), "--system-config",
           str(comparison.configs["system"]), "--names", comparison.names["baseline"], comparison.names["system"],
           "--report-dir", str(args.out / comparison.reports), "--parallel", "--threads", str(args.threads)]
    for test in TESTS:
        cmd += ["--test", test, *map(str, files[test])]
    if args.max_update is not None:
        cmd += ["--train-args", f"--extra-args '--max-update {args.max_update}'"]

    def pipeline(seeds: list[int], *more: str) -> None:
        if subprocess.run([*cmd, "--seeds", *map(str, seeds), *more]).returncode != 0:
            sys.exit("error: the pipeline failed (its logs are in --out)")

    out = args.out.resolve()
    reports = out / comparison.reports
    title = "Multi30k ablation" if args.ablation else "Multi30k probe" if args.train_only else "Multi30k study"
    if args.train_only:
        pipeline(args.seeds, "--train-only")
        print_verdicts(write_curves(out, args.seeds, f"{title}: validation curves", comparison=comparison))
        print(f"curves: {reports / 'curves.json'}, {reports / 'curves.png'}")
        return
    # seed by seed: both systems' runs of a seed train side by side, then are scored at both checkpoint kinds, so
    # that every finished seed is final (its scores need no checkpoint) before the next one starts
    for seed in args.seeds:
        pipeline([seed], "--train-only")
        try:
            score_runs(out, [seed], comparison)
        except AverageError as err:
            sys.exit(f"error: {err}")
    pipeline(args.seeds)  # every run trained and scored: the pipeline's own report (sacreBLEU, checkpoint_last)
    significance(out, args.seeds, "avg5", "sacrebleu", "report-avg5", comparison)
    significance(out, args.seeds, "last", "tokenized_compound_split", "report-tokenized", comparison)
    significance(out, args.seeds, "avg5", "tokenized_compound_split", "report-avg5-tokenized", comparison)
    table = runs_table(out, args.seeds, comparison)
    write_atomic(reports / "runs.md", table)
    write_curves(out, args.seeds, f"{title}: validation curves of every run", comparison=comparison)
    write_json(reports / "study.json", study_report(out, args.seeds, budget_record, comparison))
    print(table + f"\nreports: {reports / 'report.md'} (sacreBLEU, checkpoint_last), {reports / 'report-avg5.md'} "
          f"(sacreBLEU, average of the last {AVERAGED} epoch checkpoints), {reports / 'report-tokenized.md'} "
          f"and {reports / 'report-avg5-tokenized.md'} (tokenized, compound-split BLEU), {reports / 'runs.md'}, "
          f"{reports / 'curves.png'}, {reports / 'study.json'}")


def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main)


if __name__ == "__main__":
    main()
