"""The learning-rate search (mtsa_fairseq/experiments/sentence/lr_search.py, scripts/sentence_lr_search.py): the
rate chosen on dev, a NaN stop kept, resumes, interim reports and locks, usage errors, and experiments trained at the
rates a search chose (--lr-from)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from sentence_helpers import ROOT, SMALL, run

from mtsa_fairseq.contracts import read_run
from mtsa_fairseq.experiments.processes import RunLock

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands


def test_lr_search_chooses_a_rate_on_dev_keeps_a_nan_stop_and_resumes(trec_data, tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text(SMALL.format(updates=10) + "  validate-interval-updates: 5\n")
    out = tmp_path / "search"
    cmd = [sys.executable, str(ROOT / "scripts/sentence_lr_search.py"), "--config", str(config), "--data",
           str(trec_data), "--archs", "multi_cnn_encoder", "--lrs", "5e-3", "1e30", "--out", str(out), "--cpu",
           "--threads", "1"]
    early = run(*cmd, "--report-only", check=False)
    assert early.returncode == 1 and early.stderr.strip().endswith("does not exist (start the search first)")
    first = run(*cmd)
    assert first.stdout.count("training ->") == 2
    report = json.loads((out / "search.json").read_text())
    done, stopped = report["runs"]
    assert (done["lr"], done["status"], stopped["lr"], stopped["status"]) == (0.005, "done", 1e30, "stopped")
    assert stopped["error"] == "FloatingPointError: gradients are Nan/Inf" and stopped["best_dev"] is None
    assert [u for u, _ in done["dev_curve"]] == [5, 10] and done["best_dev"] == max(v for _, v in done["dev_curve"])
    assert done["evaluated"] == done["best_dev"]  # the best-dev checkpoint, evaluated on dev (never on test)
    assert report["chosen"] == {"multi_cnn_encoder": 0.005} and report["split"] == "valid"
    result = json.loads((out / "lr-0.005" / "results" / "multi_cnn_encoder_seed1.json").read_text())
    assert result["split"] == "valid"
    trained = read_run(out / "lr-0.005" / "runs" / "multi_cnn_encoder" / "seed1", AssertionError)
    assert trained["command"][-3:] == ["--lr", "0.005", "--cpu"]
    assert "| multi_cnn_encoder | **" in (out / "search.md").read_text()
    again = run(*cmd)  # finished runs are read, the NaN stop is not retrained
    assert "training ->" not in again.stdout and "stopped by fairseq" in again.stdout
    assert json.loads((out / "search.json").read_text())["runs"] == report["runs"]
    more = [*cmd[:cmd.index("--lrs") + 1], "5e-3", "1e30", "2e-3", *cmd[cmd.index("--out"):]]
    interim = run(*more, "--report-only")  # 2e-3 not trained yet
    assert "training ->" not in interim.stdout and "Still to finish: multi_cnn_encoder." in interim.stdout
    partial = json.loads((out / "search-interim.json").read_text())
    assert partial["runs"] == report["runs"] and partial["chosen"] == {} and partial["pending"] == ["multi_cnn_encoder"]
    assert json.loads((out / "search.json").read_text()) == report  # the search's own report is not touched
    exp = [sys.executable, str(ROOT / "scripts/sentence_experiment.py"), *cmd[2:cmd.index("--lrs")],
           "--seeds", "1", "2", "--lr-from", str(out / "search.json"), "--out", str(tmp_path / "exp"), "--cpu"]
    searched, seeds = out / "lr-0.005" / "runs" / "multi_cnn_encoder" / "seed1", run(*exp).stdout
    assert f"multi_cnn_encoder_seed1: the same command finished in {searched}; taken from there" in seeds
    assert seeds.count("training ->") == 1 and "multi_cnn_encoder_seed2: training ->" in seeds  # seed 2: trained
    taken = tmp_path / "exp" / "runs" / "multi_cnn_encoder" / "seed1"
    assert read_run(taken, AssertionError)["trained_in"] == str(searched)
    assert (taken / "train.log").read_text() == (searched / "train.log").read_text()
    assert (taken / "checkpoint_best.pt").read_bytes() == (searched / "checkpoint_best.pt").read_bytes()
    seed1 = json.loads((tmp_path / "exp" / "results" / "multi_cnn_encoder_seed1.json").read_text())
    assert seed1["split"] == "test" and seed1["dev_curve"] == done["dev_curve"] and seed1["lr"] == 0.005
    with RunLock(out / ".search.lock", "x", "search"):  # one search per output directory
        second = run(*cmd, check=False)
    assert second.returncode == 1 and second.stderr.strip().splitlines()[-1] == (
        f"error: search {out} is in use by search pid {os.getpid()}; wait for it to finish or stop it, then rerun")
    with RunLock(out / ".search-interim.lock", "x", "report"):  # one writer of the interim report at a time
        busy = run(*more, "--report-only", check=False)
    assert busy.returncode == 1 and busy.stderr.strip().splitlines()[-1] == (
        f"error: output {out / 'search-interim.json'} is in use by report pid {os.getpid()}; wait for it to "
        "finish or stop it, then rerun")


def test_experiment_trains_each_architecture_at_the_rate_a_search_chose(trec_data, tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text(SMALL.format(updates=5) + "  validate-interval-updates: 5\n")
    search = tmp_path / "search.json"
    search.write_text(json.dumps({"schema": "mtsa-fairseq/sentence-lr-search/1", "experiment": "small",
                                  "dataset": "trec", "split": "valid", "seed": 1, "lrs": [2e-3, 1e-4], "rule": "r",
                                  "chosen": {"multi_cnn_encoder": 2e-3}, "pending": ["mtsa_encoder"],
                                  "runs": []}))
    out = tmp_path / "exp"
    cmd = [sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config", str(config), "--data",
           str(trec_data), "--seeds", "1", "--out", str(out), "--cpu", "--threads", "1"]
    run(*cmd, "--archs", "multi_cnn_encoder", "--lr-from", str(search))
    trained = read_run(out / "runs" / "multi_cnn_encoder" / "seed1", AssertionError)
    assert trained["command"][-3:] == ["--lr", "0.002", "--cpu"]  # after the config's --lr 0.005
    report = json.loads((out / "report.json").read_text())
    assert report["lr_from"]["chosen"] == {"multi_cnn_encoder": 0.002} and report["lr_from"]["search"] == str(search)
    assert report["runs"][0]["lr"] == 0.002
    assert "| multi_cnn_encoder | 0.002 | 1 |" in (out / "report.md").read_text()
    pending = run(*cmd, "--archs", "multi_cnn_encoder", "mtsa_encoder", "--lr-from", str(search), check=False)
    assert pending.returncode == 1 and pending.stderr.strip().splitlines()[-1] == (
        f"error: {search} chose no learning rate for mtsa_encoder (rates still to finish)")
    both = run(*cmd, "--archs", "multi_cnn_encoder", "--lr-from", str(search), "--extra-args", "--lr 1e-3",
               check=False)
    assert both.returncode == 2 and both.stderr.strip().endswith("--extra-args must not set --lr with --lr-from")
    shared = run(*cmd, "--archs", "multi_cnn_encoder", check=False)  # the config's rate into the same OUT
    assert shared.returncode == 1 and shared.stderr.strip().splitlines()[-1] == (
        f"error: multi_cnn_encoder_seed1: {out / 'runs' / 'multi_cnn_encoder' / 'seed1'} was trained with --lr 0.002, "
        "not 0.005; use another --out for another learning rate")


@pytest.mark.parametrize("args, message", [
    (["--lrs", "1e-3", "--extra-args", "--lr 5e-4"], "--extra-args must not set --lr: the search sets it per run"),
])
def test_lr_search_usage_errors(trec_data, tmp_path, args, message):
    proc = run(sys.executable, str(ROOT / "scripts/sentence_lr_search.py"), "--config",
               str(ROOT / "configs/sentence/trec-random-init.yaml"), "--data", str(trec_data), "--archs",
               "mtsa_encoder", "--out", str(tmp_path / "out"), *args, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(f"error: {message}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("lrs, message", [
    (["1e-3", "1e-3"], "--lrs must not repeat"),
    (["0"], "--lrs must be positive and finite"),
    (["nan", "1e-3"], "--lrs must be positive and finite"),
    (["inf"], "--lrs must be positive and finite"),
    (["1e-3", "--seed", "-1"], "--seed must be a non-negative integer"),
])
def test_lr_search_refuses_bad_rates_before_reading_anything(tmp_path, monkeypatch, capsys, lrs, message):
    from mtsa_fairseq.experiments.commands import sentence_lr_search

    monkeypatch.setattr(sys, "argv", ["mtsa-sentence-lr-search", "--config", str(tmp_path / "c.yaml"), "--data",
                                      str(tmp_path), "--archs", "mtsa_encoder", "--out", str(tmp_path / "out"),
                                      "--lrs", *lrs])
    with pytest.raises(SystemExit) as exc:
        sentence_lr_search.main()
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"mtsa-sentence-lr-search: error: {message}"
    assert not (tmp_path / "out").exists()
