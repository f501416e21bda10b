"""scripts/multi30k_study.py: input checks and the per-run table (the training itself is the pipeline's, tested
in test_pipeline.py; the study's configs are checked in test_configs.py)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtsa_fairseq.checkpoint_safety import load_checkpoint
from mtsa_fairseq.contracts import RESULT_SCHEMA, RUN_SCHEMA
from mtsa_fairseq.experiments.commands import multi30k_study
from mtsa_fairseq.experiments.translation import study
from mtsa_fairseq.experiments.translation.curves import budget
from mtsa_fairseq.experiments.translation.train_config import load_config
from mtsa_fairseq.models.transformer_mtsa import MTSA_OPTIONS

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "multi30k_study.py"


def test_systems_differ_only_in_the_encoder_self_attention():
    base, mtsa = (load_config(study.STUDY.configs[k]) for k in ("baseline", "system"))
    assert (base.arch, mtsa.arch) == ("transformer", "transformer_mtsa")
    plugin = {option.flag.lstrip("-") for option in MTSA_OPTIONS}
    strip = lambda options: {k: v for k, v in options.items() if k != "arch" and k not in plugin}  # noqa: E731
    assert strip(base.fairseq) == strip(mtsa.fairseq)
    assert mtsa.fairseq["encoder-self-attention-type"] == "mtsa" and base.max_update == mtsa.max_update == 1000


def test_the_ablation_changes_only_the_source2token_bias_of_the_studys_mtsa():
    mtsa, ablated = (load_config(study.ABLATION.configs[k]) for k in ("baseline", "system"))
    assert study.ABLATION.configs["baseline"] == study.STUDY.configs["system"]
    assert {k: v for k, v in ablated.fairseq.items() if mtsa.fairseq.get(k) != v} == {"mtsa-s2t-bias-init": 5.0}
    assert set(ablated.fairseq) == set(mtsa.fairseq) and mtsa.fairseq["mtsa-s2t-bias-init"] == 0.0


def test_missing_release_file_stops_before_anything_is_written(tmp_path):
    raw = tmp_path / "multi30k"
    raw.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            (raw / f"{split}.{lang}").write_text("a\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--multi30k", str(raw), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "neither test_2017_flickr.en nor test_2017_flickr.en.gz" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_runs_table_has_one_row_per_run(tmp_path):
    for config, bleu in (("multi30k_transformer", 30.0), ("multi30k_mtsa", 31.5)):
        run_dir = tmp_path / "runs" / config / "seed7"
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps({
            "schema": RUN_SCHEMA, "num_updates": 1000, "wall_seconds": 1500.0,
            "train_target_tokens_per_second": 1234.4, "peak_rss_mb": 1100.2}))
        for offset, test in enumerate(study.TESTS):
            (tmp_path / "results").mkdir(exist_ok=True)
            (tmp_path / "results" / f"{config}_seed7_{test}.json").write_text(json.dumps({
                "schema": RESULT_SCHEMA, "num_params": 9_000_000, "bleu": {"sacrebleu": bleu - offset}}))
    table = study.runs_table(tmp_path, [7]).splitlines()
    assert len(table) == 4
    assert table[2] == "| multi30k_transformer | 7 | 1000 | 25.0 | 1234 | 1100 | 9,000,000 | 30.00 | 29.00 |"
    assert table[3].startswith("| multi30k_mtsa | 7 |") and table[3].endswith("| 31.50 | 30.50 |")
    (tmp_path / "results" / "multi30k_mtsa_seed7_test_2017_flickr.json").unlink()
    with pytest.raises(RuntimeError, match="result not found"):
        study.runs_table(tmp_path, [7])


def _valid_line(update: int, loss: float, bleu: float) -> str:
    return (f"2026-11-25 00:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {loss} | "
            f"nll_loss 1.0 | ppl 2.0 | bleu {bleu} | wps 100 | wpb 100 | bsz 10 | num_updates {update}\n")


def _fake_study(out: Path, comparison: study.Comparison = study.STUDY) -> None:
    """What the pipeline and scoring leave for seeds 1 and 2: run records, logs, results of both kinds and the
    six significance reports (only the fields the study report reads); runs already there are kept."""
    for role, config in comparison.configs.items():
        for seed in (1, 2):
            run_dir = out / "runs" / config.stem / f"seed{seed}"
            if run_dir.exists():
                continue
            run_dir.mkdir(parents=True)
            (run_dir / "run.json").write_text(json.dumps({
                "schema": RUN_SCHEMA, "system": role, "max_update": 600, "num_updates": 600, "wall_seconds": 60.0,
                "train_target_tokens_per_second": 1000.0, "peak_rss_mb": 900.0}))
            (run_dir / "train.log").write_text("".join(_valid_line(u, 5 - u / 300, u / 20 + seed)
                                                       for u in (200, 400, 600)))
            for test in study.TESTS:
                for kind in study.KINDS:
                    path = study.result_path(out, config, seed, test, kind)
                    path.parent.mkdir(exist_ok=True)
                    bleu = 30.0 + seed + (0.5 if kind == "avg5" else 0) + (1 if role == "system" else 0) + (
                        2 if config.stem.endswith("bias5") else 0)
                    path.write_text(json.dumps({"schema": RESULT_SCHEMA, "num_params": 7, "bleu": {
                        "sacrebleu": bleu, "sacrebleu_lc": bleu + 1, "tokenized_compound_split": bleu + 2}}))
    for name, mean in (("report", 31.5), ("report-avg5", 32.0), ("report-lowercased", 32.5),
                       ("report-avg5-lowercased", 33.0), ("report-tokenized", 33.5), ("report-avg5-tokenized", 34.0)):
        groups = [{"test_set": test, "paired": [{"seed": 1, "p_ar": 0.5}], "t_test": {
            "mean_baseline": mean, "std_baseline": 0.7, "n_baseline": 2, "mean_system": mean + 1, "std_system": 0.7,
            "n_system": 2, "t": 1.4, "df": 2.0, "p_two_sided": 0.3, "p_greater": 0.15}} for test in study.TESTS]
        (out / comparison.reports).mkdir(exist_ok=True)
        (out / comparison.reports / f"{name}.json").write_text(json.dumps({"schema": "mtsa-fairseq.significance.v1",
                                                      "signature": f"sig-{name}", "groups": groups}))


def test_study_report_holds_curves_both_checkpoints_and_the_tests(tmp_path):
    _fake_study(tmp_path)
    report = study.study_report(tmp_path, [1, 2])
    assert report["schema"] == study.STUDY_SCHEMA and report["averaged_epochs"] == 5 and report["budget"] is None
    first = report["runs"][0]
    assert (first["system"], first["seed"], first["max_update"]) == ("Transformer", 1, 600)
    assert first["valid_bleu"] == [[200, 11.0], [400, 21.0], [600, 31.0]]
    assert first["plateau"]["plateaued"] is False  # still gaining 10 BLEU in the last quarter
    assert first["test"] == {test: {"last": 31.0, "avg5": 31.5} for test in study.TESTS}
    assert first["test_lowercased"] == {test: {"last": 32.0, "avg5": 32.5} for test in study.TESTS}
    assert first["test_tokenized"] == {test: {"last": 33.0, "avg5": 33.5} for test in study.TESTS}
    assert report["runs"][3]["system"] == "MTSA" and report["runs"][3]["test"]["test_2016_flickr"]["last"] == 33.0
    assert set(report["summary"]) == set(study.TESTS)
    summary = report["summary"]["test_2017_flickr"]
    assert set(summary) == {"last", "avg5"}
    assert summary["avg5"]["MTSA"] == {"mean": 33.0, "std": 0.7, "n": 2}
    assert summary["avg5"]["welch"]["p_two_sided"] == 0.3 and summary["last"]["paired"] == [{"seed": 1, "p_ar": 0.5}]
    tokenized = report["summary_tokenized"]["test_2016_flickr"]
    assert (tokenized["last"]["Transformer"]["mean"], tokenized["avg5"]["MTSA"]["mean"]) == (33.5, 35.0)
    lowercased = report["summary_lowercased"]["test_2016_flickr"]
    assert (lowercased["last"]["Transformer"]["mean"], lowercased["avg5"]["MTSA"]["mean"]) == (32.5, 34.0)
    assert report["sacrebleu_signature"] == "sig-report"


def test_the_ablation_reuses_the_studys_mtsa_runs_and_reports_apart(tmp_path):
    _fake_study(tmp_path)
    _fake_study(tmp_path, study.ABLATION)
    report = study.study_report(tmp_path, [1, 2], comparison=study.ABLATION)
    assert [(run["system"], run["config"], run["seed"]) for run in report["runs"]] == [
        ("MTSA", "multi30k_mtsa", 1), ("MTSA", "multi30k_mtsa", 2),
        ("MTSA s2t bias 5", "multi30k_mtsa_s2t_bias5", 1), ("MTSA s2t bias 5", "multi30k_mtsa_s2t_bias5", 2)]
    assert report["runs"][:2] == study.study_report(tmp_path, [1, 2])["runs"][2:]  # the study's MTSA runs
    assert report["runs"][2]["test"]["test_2016_flickr"] == {"last": 34.0, "avg5": 34.5}
    assert set(report["summary"]["test_2016_flickr"]["last"]) == {"MTSA", "MTSA s2t bias 5", "welch", "paired"}
    study.write_curves(tmp_path, [1, 2], "ablation", comparison=study.ABLATION)
    assert set(json.loads((tmp_path / "ablation" / "curves.json").read_text())["runs"]) == {
        "MTSA seed 1", "MTSA seed 2", "MTSA s2t bias 5 seed 1", "MTSA s2t bias 5 seed 2"}
    assert not (tmp_path / "curves.json").exists()
    shutil.rmtree(tmp_path / "ablation")
    study.interim_curves(tmp_path, [1, 2], study.ABLATION)  # --ablation --curves-only, before any report
    assert "MTSA s2t bias 5 seed 2" in json.loads((tmp_path / "ablation" / "curves-interim.json").read_text())["runs"]
    table = study.runs_table(tmp_path, [1, 2], study.ABLATION).splitlines()
    assert [row.split(" | ")[0] for row in table[2:]] == ["| multi30k_mtsa"] * 2 + ["| multi30k_mtsa_s2t_bias5"] * 2


def test_probe_curves_and_averaged_checkpoint(tmp_path):
    _fake_study(tmp_path)
    runs = study.write_curves(tmp_path, [1, 2], "probe")
    assert json.loads((tmp_path / "curves.json").read_text())["runs"] == json.loads(json.dumps(runs))
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    run_dir = tmp_path / "runs" / "multi30k_mtsa" / "seed1"
    for epoch in range(1, 8):  # the last five (3..7) are averaged
        torch.save({"model": {"w": torch.full((2,), float(epoch))},
                    "optimizer_history": [{"num_updates": 100 * epoch}]}, run_dir / f"checkpoint{epoch}.pt")
    averaged = study.averaged_checkpoint(run_dir)
    assert averaged.name == "checkpoint_avg5.pt"
    state = load_checkpoint(averaged)
    assert state["model"]["w"].tolist() == [5.0, 5.0] and state["optimizer_history"][-1]["num_updates"] == 700


def test_curves_only_reads_the_logs_as_they_stand(tmp_path):
    _fake_study(tmp_path)
    command = [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--seeds", "1", "2", "--curves-only"]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "MTSA seed 2: last validation at update 600, gain of the last quarter 10.0 BLEU: not yet on a plateau" \
        in proc.stdout
    interim = json.loads((tmp_path / "curves-interim.json").read_text())
    assert interim["runs"]["Transformer seed 1"]["curve"][-1] == {"update": 600, "loss": 3.0, "bleu": 31.0}
    assert (tmp_path / "curves-interim.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "curves.json").exists()  # the probe's own output is left to the probe
    proc = subprocess.run([*command[:-3], "3", "--curves-only"], capture_output=True, text=True)
    assert proc.returncode == 1 and "error: no training log" in proc.stderr
    proc = subprocess.run([*command, "--train-only"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--curves-only trains nothing" in proc.stderr
    proc = subprocess.run(command[:-1], capture_output=True, text=True)
    assert proc.returncode == 2 and "--multi30k is required" in proc.stderr


def _probe(out: Path, bleu: dict[str, list[float]], comparison: study.Comparison = study.STUDY) -> None:
    """Probe logs of seed 1 of both systems: validation BLEU per epoch of 100 updates."""
    for role, config in comparison.configs.items():
        run_dir = out / "runs" / config.stem / "seed1"
        run_dir.mkdir(parents=True)
        (run_dir / "train.log").write_text("".join(_valid_line(100 * (i + 1), 4.0, b)
                                                   for i, b in enumerate(bleu[role])))


def test_budget_is_the_first_validation_with_every_probe_run_on_a_plateau(tmp_path):
    # Transformer: on a plateau from update 300 on (gain 0.1 < 0.3); MTSA: at update 600 it still gains 1.0
    # (best 31 after 0.75 * 600 = 450 against 30 up to it), at 700 nothing: both first at 700, and still at 800
    _probe(tmp_path, {"baseline": [20, 30, 30.1, 30.2, 30.2, 30.2, 30.2, 30.2],
                      "system": [20, 25, 28, 30, 31, 31, 31, 31]})
    curves = {label: run["curve"] for label, run in study.run_curves(tmp_path, [1]).items()}
    assert [budget([c[:n] for c in curves.values()]) for n in (6, 7, 8)] == [None, 700, 700]
    record = study.probe_budget(tmp_path)
    assert record["max_update"] == 700 and record["probe"] == str(tmp_path)
    assert {label: v["plateaued"] for label, v in record["verdicts"].items()} == \
        {"Transformer seed 1": True, "MTSA seed 1": True}
    assert record["verdicts"]["MTSA seed 1"]["last_update"] == 700


def test_budget_from_a_probe_is_refused_until_it_fixes_one(tmp_path, monkeypatch, capsys):
    _probe(tmp_path / "probe", {"baseline": [20, 30, 30.1, 30.2], "system": [20, 25, 28, 30]})
    raw = tmp_path / "multi30k"
    raw.mkdir()
    for split in ("train", "val", *study.TESTS):
        for lang in ("en", "de"):
            (raw / f"{split}.{lang}").write_text("a\n")
    args = [str(SCRIPT), "--multi30k", str(raw), "--out", str(tmp_path / "out"), "--budget-from",
            str(tmp_path / "probe")]
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"error: the probe in {tmp_path / 'probe'} fixes no budget yet: no validation at which all its runs are on "
        "a plateau (last validations: Transformer seed 1 at update 400, MTSA seed 1 at update 400)")
    proc = subprocess.run([sys.executable, *args, "--max-update", "300"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().endswith(
        "error: --budget-from sets the budget of a study: drop --max-update, --train-only and --curves-only")
    for config, bleu in (("multi30k_transformer", 30.2), ("multi30k_mtsa", 31.0)):  # now both: budget 700
        with (tmp_path / "probe" / "runs" / config / "seed1" / "train.log").open("a") as log:
            log.write("".join(_valid_line(u, 4.0, bleu) for u in (500, 600, 700)))
    launched = []
    monkeypatch.setattr(sys, "argv", args)
    monkeypatch.setattr(study.subprocess, "run", lambda cmd, **_: launched.append(cmd) or subprocess.CompletedProcess(
        cmd, 1))  # the pipeline is not run here: its command line is what the budget changes
    with pytest.raises(SystemExit, match="the pipeline failed"):
        multi30k_study._main()
    assert launched[0][launched[0].index("--train-args") + 1] == "--extra-args '--max-update 700'"
    assert "budget: 700 updates, the first validation at which every run of the probe" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [*args, "--ablation"])
    with pytest.raises(SystemExit, match="the pipeline failed"):
        multi30k_study._main()
    ablation = launched[1]
    option = lambda name, n=1: ablation[ablation.index(name) + 1:ablation.index(name) + 1 + n]  # noqa: E731
    assert option("--baseline-config") == [str(study.STUDY.configs["system"])]
    assert Path(option("--system-config")[0]).name == "multi30k_mtsa_s2t_bias5.yaml"
    assert option("--names", 2) == ["MTSA", "MTSA s2t bias 5"]
    assert option("--report-dir") == [str(tmp_path / "out" / "ablation")]
    assert option("--out") == [str(tmp_path / "out")] and option("--train-args") == ["--extra-args '--max-update 700'"]
    assert launched[0][launched[0].index("--report-dir") + 1] == str(tmp_path / "out")


def test_a_tiny_probe_that_reaches_the_recipes_cap_unplateaued_fixes_the_cap(tmp_path):
    """The Tiny recipe trains at most its anchor's 8,000 updates (its configs' max-update): curves still rising
    there fix 8,000; short of it, nothing. The base recipe has no cap."""
    assert {load_config(path).fairseq["max-update"] for path in study.TINY.configs.values()} == {study.TINY.cap}
    rising = [20.0 + i for i in range(80)]  # a validation every 100 updates up to 8,000, gaining to the end
    _probe(tmp_path / "short", {"baseline": rising[:79], "system": rising}, study.TINY)
    with pytest.raises(SystemExit, match="on a plateau or at the recipe's cap of 8000 updates .*at update 7900"):
        study.probe_budget(tmp_path / "short", study.TINY)
    _probe(tmp_path / "probe", {"baseline": rising, "system": rising}, study.TINY)
    record = study.probe_budget(tmp_path / "probe", study.TINY)
    assert record["max_update"] == 8000 and record["capped"]
    assert not any(verdict["plateaued"] for verdict in record["verdicts"].values())
    assert not study.probe_budget(ROOT / "results" / "multi30k" / "probe" / "curves.json")["capped"]


def test_the_probes_curves_report_fixes_the_budget_its_logs_fix(tmp_path):
    _probe(tmp_path / "probe", {"baseline": [20, 30, 30.1, 30.2, 30.2, 30.2, 30.2, 30.2],
                                "system": [20, 25, 28, 30, 31, 31, 31, 31]})
    study.write_curves(tmp_path / "probe", [1], "probe")
    from_logs = study.probe_budget(tmp_path / "probe")
    from_report = study.probe_budget(tmp_path / "probe" / "curves.json")
    assert from_report["max_update"] == from_logs["max_update"] == 700
    assert from_report["verdicts"] == from_logs["verdicts"]
    committed = study.probe_budget(ROOT / "results" / "multi30k" / "probe" / "curves.json")  # the budget docs/ states
    assert committed["max_update"] == 6864 and all(v["plateaued"] for v in committed["verdicts"].values())


def test_a_curves_report_of_another_recipe_fixes_no_budget():
    probe = ROOT / "results" / "multi30k" / "probe" / "curves.json"  # the 3+3 x 256 recipe's probe
    with pytest.raises(SystemExit, match=r"probed multi30k_mtsa, multi30k_transformer, not this recipe's "
                                         r"multi30k_tiny_mtsa, multi30k_tiny_transformer: its budget is another"):
        study.probe_budget(probe, study.TINY)
    assert study.probe_budget(ROOT / "results" / "multi30k" / "grid-tiny" / "curves.json", study.TINY)["capped"]


def _release(root: Path) -> Path:
    """A stand-in Multi30k release directory (one line per file: what the study's input checks read)."""
    raw = root / "multi30k"
    raw.mkdir()
    for split in ("train", "val", *study.TESTS):
        for lang in ("en", "de"):
            (raw / f"{split}.{lang}").write_text("a\n")
    return raw


def test_budget_from_a_file_that_is_no_curves_report_is_one_error_line(tmp_path):
    raw = _release(tmp_path)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"schema": RESULT_SCHEMA}))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--multi30k", str(raw), "--out", str(tmp_path / "out"),
                           "--budget-from", str(report)], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"error: probe curves report {report} has schema {RESULT_SCHEMA!r}, expected {study.STUDY_SCHEMA!r}")
    assert not (tmp_path / "out").exists()


def test_each_seed_is_trained_then_scored_before_the_next_and_a_scored_run_needs_no_checkpoint(tmp_path, monkeypatch):
    args = [str(SCRIPT), "--multi30k", str(_release(tmp_path)), "--out", str(tmp_path / "out"), "--seeds", "1", "2"]
    calls, averaged = [], []

    def run(cmd, **_):  # the pipeline and the scorer stand in: what is launched, in which order, is under test
        name = cmd[2].rsplit(".", 1)[-1]
        if name == "score":
            result = Path(cmd[cmd.index("--result") + 1])
            result.write_text("{}")
            calls.append(("score", result.name, cmd[3]))
            return subprocess.CompletedProcess(cmd, 0)
        seeds = cmd[cmd.index("--seeds") + 1:]
        seeds = [int(s) for s in seeds[:next((i for i, s in enumerate(seeds) if s.startswith("--")), len(seeds))]]
        calls.append(("pipeline", seeds, "--train-only" in cmd))
        return subprocess.CompletedProcess(cmd, 0 if "--train-only" in cmd else 1)  # the last call ends the test

    monkeypatch.setattr(sys, "argv", args)
    monkeypatch.setattr(study.subprocess, "run", run)
    monkeypatch.setattr(study, "averaged_checkpoint", lambda run_dir: averaged.append(run_dir) or run_dir / "avg.pt")
    with pytest.raises(SystemExit, match="the pipeline failed"):
        multi30k_study._main()
    scores = lambda seed: [("score", f"{config.stem}_seed{seed}_{test}{suffix}.json", option)  # noqa: E731
                           for config in study.STUDY.configs.values()
                           for suffix, option in (("", "--run-dir"), ("_avg5", "--checkpoint"))
                           for test in study.TESTS]
    assert calls == [("pipeline", [1], True), *scores(1), ("pipeline", [2], True), *scores(2),
                     ("pipeline", [1, 2], False)]
    assert len(averaged) == 8  # once per averaged score (the real one writes checkpoint_avg5.pt once, then reuses it)
    calls.clear()
    averaged.clear()
    with pytest.raises(SystemExit, match="the pipeline failed"):  # rerun: every score exists, no checkpoint needed
        multi30k_study._main()
    assert calls == [("pipeline", [1], True), ("pipeline", [2], True), ("pipeline", [1, 2], False)] and not averaged


def test_the_tiny_recipe_trains_its_own_configs_and_takes_the_budget_of_its_own_probe(tmp_path, monkeypatch):
    _probe(tmp_path / "probe", {"baseline": [20, 30, 30.1, 30.2, 30.2, 30.2, 30.2, 30.2],
                                "system": [20, 25, 28, 30, 31, 31, 31, 31]})
    for config in ("multi30k_transformer", "multi30k_mtsa"):  # the probe of the tiny recipe
        (tmp_path / "probe" / "runs" / config).rename(tmp_path / "probe" / "runs" / config.replace("_", "_tiny_", 1))
    with pytest.raises(SystemExit, match="holds no probe runs"):
        study.probe_budget(tmp_path / "probe")  # the base recipe's runs are not there
    assert study.probe_budget(tmp_path / "probe", study.TINY)["max_update"] == 700
    raw = _release(tmp_path)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--multi30k", str(raw), "--recipe", "tiny", "--ablation"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().endswith("--ablation is of the base recipe: drop --recipe")
    launched = []
    monkeypatch.setattr(study.subprocess, "run", lambda cmd, **_: launched.append(cmd) or subprocess.CompletedProcess(
        cmd, 1))
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--multi30k", str(raw), "--out", str(tmp_path / "out"), "--recipe",
                                      "tiny", "--budget-from", str(tmp_path / "probe")])
    with pytest.raises(SystemExit, match="the pipeline failed"):
        multi30k_study._main()
    cmd = launched[0]
    assert Path(cmd[cmd.index("--baseline-config") + 1]).name == "multi30k_tiny_transformer.yaml"
    assert Path(cmd[cmd.index("--system-config") + 1]).name == "multi30k_tiny_mtsa.yaml"
    assert cmd[cmd.index("--train-args") + 1] == "--extra-args '--max-update 700'"
