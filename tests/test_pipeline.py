"""The one-command pipeline at toy size: raw files -> data -> 2 seeds x 2 configs -> BLEU -> report."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from process_helpers import processes_naming, trainers_on, wait_for

from mtsa_fairseq.experiments.translation.pipeline import run_script
from mtsa_fairseq.experiments.translation.toy_corpus import write_corpus

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "scripts" / "pipeline.py"
ENV = {"PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}


def tiny_config(directory: Path, demo: str) -> Path:
    config = yaml.safe_load((ROOT / "configs" / f"{demo}.yaml").read_text())
    config["name"] = f"tiny_{config['system']}"
    config["fairseq"].update({"encoder-embed-dim": 32, "decoder-embed-dim": 32, "encoder-ffn-embed-dim": 64,
                              "decoder-ffn-embed-dim": 64, "max-update": 40, "warmup-updates": 10, "lr": 5e-3,
                              "max-tokens": 1024, "log-interval": 10})
    path = directory / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_state(run_dir: Path) -> str:
    """What a run directory says: run.json's status and error, the live train_seeds processes, train.log's end."""
    record = json.loads((run_dir / "run.json").read_text())
    log_path = run_dir / "train.log"
    log = log_path.read_text(errors="replace").splitlines()[-5:] if log_path.is_file() else []
    launchers = processes_naming(run_dir.parent.parent, "train_seeds")
    return (f"run.json status {record.get('status')!r} error {record.get('error')!r}; train_seeds pids {launchers}; "
            "train.log ends:\n" + "\n".join(log))


def pipeline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PIPELINE), *args], capture_output=True, text=True, env=ENV,
                          timeout=1800)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    write_corpus(root / "raw", {"train": 400, "valid": 30, "test": 20}, seed=5)
    raw = {s: [str(root / "raw" / f"{s}.en"), str(root / "raw" / f"{s}.de")] for s in ("train", "valid", "test")}
    args = ["--out", str(root / "out"), "--train", *raw["train"], "--valid", *raw["valid"],
            "--test", "toy", *raw["test"], "--vocab-size", "100", "--seeds", "1", "2",
            "--baseline-config", str(tiny_config(root, "demo_transformer")),
            "--system-config", str(tiny_config(root, "demo_mtsa")), "--names", "Base", "Mine",
            "--score-args", "--beam 2"]
    proc = pipeline(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "out", args, proc


def test_pipeline_writes_every_stage(finished):
    out, _, proc = finished
    assert (out / "data" / "manifest.json").exists()
    for system in ("tiny_transformer", "tiny_mtsa"):
        for seed in (1, 2):
            run = json.loads((out / "runs" / system / f"seed{seed}" / "run.json").read_text())
            assert run["status"] == "done" and run["seed"] == seed and run["num_updates"] == 40
            result = json.loads((out / "results" / f"{system}_seed{seed}_toy.json").read_text())
            assert result["num_sentences"] == 20 and result["system"] == run["system"]
    report = (out / "report.md").read_text()
    assert "| Base |" in report and "| Mine |" in report and "2 / 2" in report
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "report.json").read_text())
    assert "4/4 significance report" in proc.stdout
    for system in ("tiny_transformer", "tiny_mtsa"):  # progress while training, from every run
        for seed in (1, 2):
            line = rf"\[pipeline\]   {system} seed {seed}: 40/40 updates \(100%\), \d\d:\d\d elapsed, ETA 00:00"
            assert re.search(line, proc.stdout), proc.stdout


def test_rerun_reuses_everything_and_scores_an_empty_result_again(finished):
    """A rerun keeps every finished result; one left empty (a full disk under an older version) is not
    finished: it is scored again, with a line saying so."""
    out, args, _ = finished
    empty = out / "results" / "tiny_mtsa_seed2_toy.json"
    empty.write_text("")
    stamps = {p: p.stat().st_mtime_ns for p in (out / "results").glob("*.json") if p != empty}
    proc = pipeline(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "data: reusing" in proc.stdout
    assert f"{empty} is empty or unreadable: scoring again" in proc.stdout
    assert json.loads(empty.read_text())["num_sentences"] == 20
    assert {p: p.stat().st_mtime_ns for p in (out / "results").glob("*.json") if p != empty} == stamps
    assert "kept 3 result(s) scored before" in proc.stdout
    assert (out / "report.md").exists()


def test_a_second_comparison_over_the_same_runs_reports_apart(finished):
    """--report-dir: another comparison over OUT's runs (here the roles swapped) trains and scores nothing and
    leaves OUT's own report as it was."""
    out, args, _ = finished
    report = (out / "report.md").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in (out / "results").glob("*.json")}
    swapped = list(args)
    base, system = swapped.index("--baseline-config") + 1, swapped.index("--system-config") + 1
    swapped[base], swapped[system] = args[system], args[base]
    proc = pipeline(*swapped[:swapped.index("--names")], "--names", "Mine", "Base",
                    *swapped[swapped.index("--names") + 3:], "--report-dir", str(out / "swapped"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "report.md").read_text() == report
    assert {p: p.stat().st_mtime_ns for p in (out / "results").glob("*.json")} == stamps
    swapped_report = json.loads((out / "swapped" / "report.json").read_text())
    original = json.loads((out / "report.json").read_text())
    assert swapped_report["groups"][0]["t_test"]["mean_baseline"] == original["groups"][0]["t_test"]["mean_system"]
    assert "| Mine |" in (out / "swapped" / "report.md").read_text()
    assert (out / "swapped" / "report.png").is_file() and f"{out / 'swapped' / 'report.md'}" in proc.stdout


def test_a_run_trained_on_since_its_score_is_scored_again(finished):
    """A result older than its run's checkpoint_last.pt scored a checkpoint that is gone: the rerun scores the run
    again (a line says so) and keeps the others."""
    out, args, _ = finished
    stale = out / "results" / "tiny_transformer_seed1_toy.json"
    checkpoint = out / "runs" / "tiny_transformer" / "seed1" / "checkpoint_last.pt"
    later = stale.stat().st_mtime + 60
    os.utime(checkpoint, (later, later))
    stamps = {p: p.stat().st_mtime_ns for p in (out / "results").glob("*.json") if p != stale}
    proc = pipeline(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{stale} scored an older checkpoint_last.pt (the run trained on since): scoring again" in proc.stdout
    assert stale.stat().st_mtime >= later and json.loads(stale.read_text())["num_sentences"] == 20
    assert {p: p.stat().st_mtime_ns for p in (out / "results").glob("*.json") if p != stale} == stamps


@pytest.mark.parametrize(
    "args,message",
    [
        (["--seeds", "1"], "at least 2 distinct seeds"),
        (["--names", "A", "A"], "--names must name the two systems differently"),
        (["--data", "DATA"], "has no test set to score (prepare it with --test, or pass --train-only)"),
        (["--data", "DATA", "--vocab-size", "50", "--train-only"], "--vocab-size prepare raw data; --data"),
        (["--seeds", "3", "3"], "--seeds must be distinct"),
        (["--train", "nope.en", "nope.de", "--test", "t", "nope.en", "nope.de"], "does not exist"),
        (["--system-config", str(ROOT / "configs/demo_transformer.yaml")], "must be different configs"),
        (["--report-dir", "FILE"], "--report-dir FILE is a file, not a directory"),  # before hours of training
    ],
)
def test_bad_input_stops_before_writing(tmp_path, args, message):
    (tmp_path / "data").mkdir()  # a prepared directory without test sets
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({"tests": {}}))
    (tmp_path / "file").write_text("")
    names = {"DATA": str(tmp_path / "data"), "FILE": str(tmp_path / "file")}
    args = [names.get(arg, arg) for arg in args]
    proc = pipeline("--out", str(tmp_path / "out"), *args)
    assert proc.returncode != 0 and message.replace("FILE", names["FILE"]) in proc.stderr
    assert not (tmp_path / "out").exists()


def test_bad_config_is_refused_before_anything_is_written(tmp_path):
    system = tiny_config(tmp_path, "demo_mtsa")
    system.write_text(system.read_text().replace("fairseq:\n", "fairseq:\n  lrr: 0.1\n"))
    proc = pipeline("--out", str(tmp_path / "out"), "--system-config", str(system))
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        f"error: {system}: fairseq option 'lrr': '--lrr' is not a fairseq-train option "
        f"(arch transformer_mtsa_tiny, with --user-dir {ROOT / 'mtsa_fairseq'})")
    assert not (tmp_path / "out").exists()


def test_config_that_does_not_fit_the_data_is_refused_before_training(tmp_path):
    write_corpus(tmp_path / "raw", {"train": 200, "valid": 20, "test": 10}, seed=5)
    raw = {s: [str(tmp_path / "raw" / f"{s}.{lang}") for lang in ("en", "de")] for s in ("train", "valid", "test")}
    system = tiny_config(tmp_path, "demo_mtsa")
    system.write_text(system.read_text().replace("fairseq:\n", "fairseq:\n  source-lang: fr\n"))
    proc = pipeline("--out", str(tmp_path / "out"), "--train", *raw["train"], "--valid", *raw["valid"], "--test",
                    "toy", *raw["test"], "--vocab-size", "60", "--baseline-config",
                    str(tiny_config(tmp_path, "demo_transformer")), "--system-config", str(system))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: train_seeds: {system}: source-lang 'fr' differs from the data's 'en' (log: ")
    assert (tmp_path / "out" / "data" / "manifest.json").is_file() and not (tmp_path / "out" / "runs").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_pipeline_leaves_no_trainer_and_a_second_one_is_refused(tmp_path):
    write_corpus(tmp_path / "raw", {"train": 200, "valid": 20, "test": 10}, seed=5)
    raw = {s: [str(tmp_path / "raw" / f"{s}.{lang}") for lang in ("en", "de")] for s in ("train", "valid", "test")}
    base, system = tiny_config(tmp_path, "demo_transformer"), tiny_config(tmp_path, "demo_mtsa")
    base.write_text(base.read_text().replace("max-update: 40", "max-update: 100000"))
    out = tmp_path / "out"
    args = [sys.executable, str(PIPELINE), "--out", str(out), "--train", *raw["train"], "--valid", *raw["valid"],
            "--test", "toy", *raw["test"], "--vocab-size", "60", "--baseline-config", str(base), "--system-config",
            str(system), "--threads", "1"]
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    run_dir = out / "runs" / "tiny_transformer" / "seed1"
    wait_for(lambda: trainers_on(run_dir), "the first trainer", timeout=1200)
    second = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=1200)
    assert second.returncode == 1 and second.stderr.strip().splitlines()[-1] == (
        f"error: pipeline output {out} is in use by pipeline pid {first.pid}; wait for it to finish or stop it, "
        "then rerun")
    first.kill()  # kill -9: train_seeds is told to stop, and stops its trainer
    first.wait()
    wait_for(lambda: not trainers_on(run_dir), "the trainer to stop", timeout=300)
    wait_for(lambda: json.loads((run_dir / "run.json").read_text())["status"] == "interrupted",
             "train_seeds to record the run as interrupted", timeout=120, state=lambda: run_state(run_dir))


def test_a_failing_step_says_its_error_once(tmp_path, capfd):
    """A step whose output is on the console has printed its own error line: the pipeline does not repeat it; a step
    that writes a log is named, with its log."""
    def failing(name: str, *args: str) -> list[str]:
        return [sys.executable, "-c", "import sys; print('error: bad input', file=sys.stderr); sys.exit(1)"]

    with pytest.raises(SystemExit) as stop:
        run_script(failing, "significance")
    assert stop.value.code == 1 and "".join(capfd.readouterr()).count("error: bad input") == 1
    with pytest.raises(SystemExit) as stop:
        run_script(failing, "score", log_file=tmp_path / "score.log")
    assert stop.value.code == f"error: score: bad input (log: {tmp_path / 'score.log'})"
