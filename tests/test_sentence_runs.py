"""The sentence experiment's runs (mtsa_fairseq/experiments/sentence/runs.py, scripts/sentence_experiment.py):
task configs, seeds and their report, resumes, the run lock and killed or terminated trainers, runs stopped early
or before their evaluation, and unreadable best checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from process_helpers import trainers_on, wait_for
from sentence_helpers import ROOT, SMALL, prepare, run, write_trec

from mtsa_fairseq.contracts import checksums, read_run
from mtsa_fairseq.experiments.fairseq_train import options_to_args, parse_fairseq_train
from mtsa_fairseq.experiments.runs import checkpoint_updates, write_run
from mtsa_fairseq.experiments.sentence.runs import ExperimentError, load_task_config

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands

CONFIGS = sorted((ROOT / "configs" / "sentence").rglob("*.yaml"))


def test_experiment_runs_seeds_reports_t_tests_and_resumes(trec_data, tmp_path, monkeypatch):
    config = tmp_path / "trec_small.yaml"
    config.write_text(
        "name: trec_small\ndataset: trec\nmetric: accuracy\ndescription: test\nfairseq:\n"
        "  criterion: sentence_encoding\n  optimizer: adam\n  lr: 0.005\n  batch-size: 16\n  max-update: 10\n"
        "  validate-interval-updates: 5\n  save-interval-updates: 5\n  best-checkpoint-metric: accuracy\n"
        "  maximize-best-checkpoint-metric: true\n  embed-dim: 16\n  encoder-hidden-dim: 8\n"
        "  classifier-hidden-dim: 8\n  num-workers: 0\n  log-format: simple\n  log-interval: 5\n"
        "  no-epoch-checkpoints: true\narch_overrides:\n  multi_cnn_encoder: {encoder-hidden-dim: 4}\n")
    cmd = [sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config", str(config), "--data",
           str(trec_data), "--archs", "mtsa_encoder", "multi_cnn_encoder", "--seeds", "1", "2", "--out",
           str(tmp_path / "exp"), "--cpu"]
    first = run(*cmd)
    report = json.loads((tmp_path / "exp" / "report.json").read_text())
    assert set(report["archs"]) == {"mtsa_encoder", "multi_cnn_encoder"}
    assert report["archs"]["mtsa_encoder"]["seeds"] == [1, 2]
    assert all(r["max_update"] == 10 and r["best_checkpoint_updates"] in (5, 10) for r in report["runs"])
    assert {r["run"] for r in report["runs"]} == {f"{a}_seed{s}" for a in ("mtsa_encoder", "multi_cnn_encoder")
                                                   for s in (1, 2)}
    test = report["welch_vs_reference"]["multi_cnn_encoder"]
    assert "p_two_sided" in test or "error" in test
    assert "| multi_cnn_encoder | 2 |" in (tmp_path / "exp" / "report.md").read_text()
    assert "test accuracy of the best-dev checkpoints" in (tmp_path / "exp" / "report.md").read_text()
    assert all([u for u, _ in r["dev_curve"]] == [5, 10] and r["split"] == "test" for r in report["runs"])
    assert (tmp_path / "exp" / "dev-curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert first.stdout.count("training ->") == 4
    for arch in ("mtsa_encoder", "multi_cnn_encoder"):  # run records as the translation launcher writes them
        record = read_run(tmp_path / "exp" / "runs" / arch / "seed2", AssertionError)
        assert (record["status"], record["num_updates"], record["max_update"], record["seed"]) == ("done", 10, 10, 2)
        assert record["arch"] == arch and record["wall_seconds"] > 0 and record["peak_rss_mb"] > 0
        assert record["train_target_tokens_per_second"] > 0 and record["checkpoint"].endswith("checkpoint_best.pt")
        assert record["cpu_kernels"] == [torch.backends.cpu.get_cpu_capability()]
    second = run(*cmd)  # finished runs are skipped
    assert "training ->" not in second.stdout
    changed = run(*cmd, "--extra-args=--dropout 0.0", check=False)  # under other options: refused, not reused
    assert changed.returncode != 0 and changed.stderr.strip().splitlines()[-1].endswith(
        "was trained with 'nothing' where this command gives '--dropout 0.0'; use another --out for other options")
    kernels = read_run(tmp_path / "exp" / "runs" / "multi_cnn_encoder" / "seed1", AssertionError)["cpu_kernels"]
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # resumed under torch's plainest kernels: said and kept
    longer = run(*cmd[:-1], "--archs", "multi_cnn_encoder", "--seeds", "1", "--max-update", "15", "--cpu")
    assert longer.stdout.count("continuing from max-update 10 to 15") == 1
    resumed = read_run(tmp_path / "exp" / "runs" / "multi_cnn_encoder" / "seed1", AssertionError)["cpu_kernels"]
    if kernels != ["DEFAULT"]:
        assert resumed == [*kernels, "DEFAULT"] and (
            f"trained with torch's {kernels[0]} CPU kernels so far, resumed with DEFAULT: it will not repeat an "
            f"uninterrupted run bit for bit (ATEN_CPU_CAPABILITY={kernels[0].lower()} selects") in longer.stdout
    result = json.loads((tmp_path / "exp" / "results" / "multi_cnn_encoder_seed1.json").read_text())
    assert result["max_update"] == 15
    log = (tmp_path / "exp" / "runs" / "multi_cnn_encoder" / "seed1" / "train.log").read_text()
    assert "Stopping training due to num_updates: 15 >= max_update: 15" in log.split("Loaded checkpoint")[-1]
    shorter = run(*cmd[:-1], "--archs", "multi_cnn_encoder", "--seeds", "1", "--max-update", "5", "--cpu",
                  check=False)
    assert shorter.returncode != 0 and "was trained with max-update 15, not 5" in shorter.stderr
    again = run(*cmd[:-1], "--archs", "multi_cnn_encoder", "--seeds", "1", "--max-update", "20", "--cpu")
    assert "CPU kernels so far" not in again.stdout  # resumed under the kernels it last trained with: nothing said
    assert read_run(tmp_path / "exp" / "runs" / "multi_cnn_encoder" / "seed1", AssertionError)["cpu_kernels"] == resumed


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_task_configs_parse_with_fairseq_train_for_every_arch(config, trec_data):
    task = load_task_config(config)
    assert task.fairseq["task"] == "sentence_encoding" and task.fairseq["criterion"] == "sentence_encoding"
    for arch in ("mtsa_encoder", "fast_disa_encoder", "disan_encoder", "bilstm_encoder", "multi_head_encoder"):
        options = task.options(arch)
        options.pop("task")
        namespace = parse_fairseq_train(str(trec_data), ["--task", "sentence_encoding", "--arch", arch,
                                                         *options_to_args(options)])
        assert namespace.arch == arch and namespace.max_update == options["max-update"]


def test_dev_curve_reads_fairseq_validation_lines_once_per_update():
    from mtsa_fairseq.experiments.sentence.runs import dev_curve

    line = ("2026-11-22 20:30:00 | INFO | valid | epoch {e:03d} | valid on 'valid' subset | loss 2.104 | l2 0.5 | "
            "accuracy {a} | wps 1234.5 | wpb 300 | bsz 32 | num_updates {u} | best_accuracy {a}")
    log = "\n".join([line.format(e=1, a=54.9, u=300), "2026-11-22 | INFO | train_inner | accuracy 99 | num_updates 310",
                     line.format(e=2, a=61.5, u=600), "$ fairseq-train (resumed)", line.format(e=2, a=61.5, u=600),
                     line.format(e=3, a=60.0, u=900)])
    assert dev_curve(log, "accuracy") == [[300, 54.9], [600, 61.5], [900, 60.0]]
    assert dev_curve(log, "pearson") == []


def test_experiment_run_stopped_early_by_patience_is_done(trec_data, tmp_path):
    config = tmp_path / "patience.yaml"  # lr 0: dev accuracy never improves after the first validation
    config.write_text(SMALL.replace("name: small", "name: patience").replace("lr: 0.005", "lr: 0.0")
                      .format(updates=400) + "  validate-interval-updates: 1\n  patience: 2\n")
    cmd = [sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config", str(config), "--data",
           str(trec_data), "--archs", "multi_cnn_encoder", "--seeds", "1", "--out", str(tmp_path / "exp"), "--cpu"]
    run(*cmd)
    record = read_run(tmp_path / "exp" / "runs" / "multi_cnn_encoder" / "seed1", AssertionError)
    assert (record["status"], record["early_stopped"], record["num_updates"]) == ("done", True, 3)
    result = json.loads((tmp_path / "exp" / "results" / "multi_cnn_encoder_seed1.json").read_text())
    assert result["max_update"] == 400 and [u for u, _ in result["dev_curve"]] == [1, 2, 3]
    assert "training ->" not in run(*cmd).stdout  # done: not resumed
    result_path = tmp_path / "exp" / "results" / "multi_cnn_encoder_seed1.json"
    first = json.loads(result_path.read_text())
    result_path.unlink()  # stopped after training, before its evaluation: evaluated, not trained past the stop
    again = run(*cmd).stdout
    assert "training ->" not in again and "multi_cnn_encoder_seed1: trained already (3 updates); evaluating it" in again
    assert json.loads(result_path.read_text()) == first
    larger = run(*cmd, "--max-update", "800").stdout  # it would stop at update 3 under this budget too
    assert "training ->" not in larger and "stopped early (--patience) at update 3" in larger
    result = json.loads((tmp_path / "exp" / "results" / "multi_cnn_encoder_seed1.json").read_text())
    assert result["max_update"] == 800 and [u for u, _ in result["dev_curve"]] == [1, 2, 3]
    result_path.unlink()  # and its best checkpoint deleted: said so, not "did validation run?"
    (tmp_path / "exp" / "runs" / "multi_cnn_encoder" / "seed1" / "checkpoint_best.pt").unlink()
    gone = run(*cmd, "--max-update", "800", check=False)
    assert gone.returncode != 0 and "checkpoint_best.pt is gone, though the run validated (train.log): move" in (
        gone.stderr)


def test_a_run_stopped_after_training_before_its_evaluation_is_evaluated_not_trained_on(trec_data, tmp_path):
    """Relaunched on a checkpoint_last.pt at max-update, fairseq would train one update more (1,501 of 1,500)."""
    config = tmp_path / "small.yaml"
    config.write_text(SMALL.format(updates=10))
    out = tmp_path / "exp"
    cmd = [sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config", str(config), "--data",
           str(trec_data), "--archs", "multi_cnn_encoder", "--seeds", "1", "--out", str(out), "--cpu"]
    run(*cmd)
    result_path = out / "results" / "multi_cnn_encoder_seed1.json"
    run_dir = out / "runs" / "multi_cnn_encoder" / "seed1"
    first = json.loads(result_path.read_text())
    result_path.unlink()  # stopped after fairseq's last checkpoint, before the evaluation wrote its result
    write_run(run_dir, {**read_run(run_dir, AssertionError), "status": "interrupted"})
    again = run(*cmd).stdout
    assert "multi_cnn_encoder_seed1: checkpoint_last.pt is at 10 updates already; evaluating it" in again
    assert "Loaded checkpoint" not in (run_dir / "train.log").read_text()  # fairseq-train was not relaunched
    assert checkpoint_updates(run_dir / "checkpoint_last.pt") == 10
    assert json.loads(result_path.read_text()) == first
    record = read_run(run_dir, AssertionError)
    assert (record["status"], record["num_updates"]) == ("done", 10)
    assert record["dictionaries"] == {"dict.txt": checksums(trec_data, ["dict.txt"])["dict.txt"]["sha256"]}
    (tmp_path / "other_raw").mkdir()  # another corpus of the same task: another dictionary
    other = prepare("trec", write_trec(tmp_path / "other_raw", seed=1), tmp_path / "other")
    refused = run(sys.executable, str(ROOT / "scripts/evaluate_sentence.py"), "--checkpoint",
                  str(run_dir / "checkpoint_best.pt"), "--data", str(other), check=False)
    assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
        f"error: {run_dir / 'checkpoint_best.pt'} was trained with another dict.txt than {other / 'dict.txt'} (its "
        "run.json records the dictionaries it was trained with): use it on its own data")


@pytest.mark.parametrize("status", ["done", "running"], ids=["evaluation-lost", "killed"])
def test_an_unreadable_best_checkpoint_is_moved_aside_and_trained_again(trec_data, tmp_path, status):
    """Training repeats itself under its seed: trained again from scratch, the run has the same best checkpoint."""
    config = tmp_path / "small.yaml"
    config.write_text(SMALL.format(updates=10) + "  no-epoch-checkpoints: true\n")
    out, key = tmp_path / "exp", "multi_cnn_encoder_seed1"
    cmd = [sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config", str(config), "--data",
           str(trec_data), "--archs", "multi_cnn_encoder", "--seeds", "1", "--out", str(out), "--cpu"]
    run(*cmd)
    result_path, run_dir = out / "results" / f"{key}.json", out / "runs" / "multi_cnn_encoder" / "seed1"
    first = json.loads(result_path.read_text())
    result_path.unlink()  # stopped before its evaluation, by a kill -9 ("running") or after run.json was filled in
    write_run(run_dir, {**read_run(run_dir, AssertionError), "status": status})
    last = (run_dir / "checkpoint_last.pt").read_bytes()
    truncated = (run_dir / "checkpoint_best.pt").read_bytes()[:100]
    (run_dir / "checkpoint_best.pt").write_bytes(truncated)
    again = run(*cmd).stdout
    best_aside, = run_dir.glob("checkpoint_best.pt.unreadable-*")
    last_aside, = run_dir.glob("checkpoint_last.pt.superseded-*")
    assert (best_aside.read_bytes(), last_aside.read_bytes()) == (truncated, last)  # renamed, never deleted
    assert (f"[experiment] {key}: checkpoint_best.pt is unreadable (moved to {best_aside.name}); training again "
            "from update 0 so that a best checkpoint exists") in again.splitlines()
    assert checkpoint_updates(run_dir / "checkpoint_best.pt") is not None
    record = read_run(run_dir, AssertionError)
    assert (record["status"], record["num_updates"], record["resumed_from_updates"]) == ("done", 10, 0)
    assert record["unreadable_checkpoint"] == str(best_aside) and record["resumed_from"] is None
    result = json.loads(result_path.read_text())
    ignored = ("train_seconds", "train_words_per_second")  # the time of the training done twice
    assert {k: v for k, v in result.items() if k not in ignored} == {k: v for k, v in first.items() if k not in ignored}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_experiment_never_leaves_two_trainers_on_a_run(trec_data, tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text(SMALL.format(updates=100_000))
    out, run_dir = tmp_path / "exp", tmp_path / "exp" / "runs" / "mtsa_encoder" / "seed1"
    cmd = [sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config", str(config), "--data",
           str(trec_data), "--archs", "mtsa_encoder", "--seeds", "1", "--out", str(out), "--cpu", "--threads", "1"]
    experiment = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    trainer = wait_for(lambda: trainers_on(run_dir), "the trainer")
    # the launcher names its trainer in the lock just after starting it
    wait_for(lambda: "trainer pid" in (run_dir / ".lock").read_text(), "the lock to name the trainer")
    assert f"launcher pid {experiment.pid}, trainer pid {trainer[0]}" in (run_dir / ".lock").read_text()
    busy = run(*cmd, check=False)  # a second experiment on the same run is refused, naming the holders
    assert busy.returncode == 1 and busy.stderr.strip().splitlines()[-1] == (
        f"error: run {run_dir} is in use by launcher pid {experiment.pid}, trainer pid {trainer[0]}; wait for it to "
        "finish or stop it, then rerun")
    assert trainers_on(run_dir) == trainer
    wait_for(lambda: "| train_inner |" in (run_dir / "train.log").read_text(), "a logged update", timeout=300)
    started = read_run(run_dir, AssertionError)["started_at"]
    experiment.kill()  # kill -9: the trainer stops with it, and run.json still says "running"
    experiment.wait()
    wait_for(lambda: not trainers_on(run_dir), "the trainer to stop", timeout=300)
    killed_session = (run_dir / "train.log").stat().st_mtime - started
    assert read_run(run_dir, AssertionError)["status"] == "running" and killed_session > 0

    config.write_text(SMALL.format(updates=10))  # a rerun takes the freed run over and finishes it
    run(*cmd)
    assert json.loads((out / "results" / "mtsa_encoder_seed1.json").read_text())["max_update"] == 10
    assert read_run(run_dir, AssertionError)["wall_seconds"] >= killed_session - 0.01  # the killed session counts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_terminated_parallel_experiment_records_its_runs_as_interrupted(trec_data, tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text(SMALL.format(updates=100_000))
    out = tmp_path / "exp"
    run_dirs = [out / "runs" / "mtsa_encoder" / f"seed{seed}" for seed in (1, 2)]
    cmd = [sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config", str(config), "--data",
           str(trec_data), "--archs", "mtsa_encoder", "--seeds", "1", "2", "--out", str(out), "--cpu", "--threads",
           "1", "--jobs", "2"]
    experiment = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for run_dir in run_dirs:
        wait_for(lambda run_dir=run_dir: trainers_on(run_dir), "both trainers")
    experiment.terminate()
    _, err = experiment.communicate(timeout=600)
    assert experiment.returncode == 143
    assert err.strip().splitlines()[-1] == "interrupted: rerun the same command to resume"
    for run_dir in run_dirs:
        assert not trainers_on(run_dir) and read_run(run_dir, AssertionError)["status"] == "interrupted"


def test_task_config_with_a_repeated_key_is_refused(tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text(SMALL.format(updates=10) + "  lr: 0.01\n")
    with pytest.raises(ExperimentError, match=r"small.yaml: key 'lr' given twice \(lines 8 and 19\)"):
        load_task_config(config)


def test_experiment_refuses_a_bad_option_before_training(trec_data, tmp_path):
    config = tmp_path / "small.yaml"
    config.write_text(SMALL.format(updates=10) + "arch_overrides:\n  multi_cnn_encoder: {encoder-hiden-dim: 4}\n")
    proc = run(sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config", str(config), "--data",
               str(trec_data), "--archs", "mtsa_encoder", "multi_cnn_encoder", "--out", str(tmp_path / "exp"), "--cpu",
               check=False)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        f"error: {config} (arch_overrides.multi_cnn_encoder): fairseq option 'encoder-hiden-dim': "
        f"'--encoder-hiden-dim' is not a fairseq-train option (arch multi_cnn_encoder, with --user-dir "
        f"{ROOT / 'mtsa_fairseq'})")
    assert not (tmp_path / "exp").exists()  # mtsa_encoder did not train first


@pytest.mark.parametrize("section, line, message", [
    ("fairseq", "  dropout: [0.1]", ": fairseq option 'dropout': takes one value, not the list [0.1]"),
    ("fairseq", "  cpu: maybe", ": fairseq option 'cpu': a flag takes true or false, not 'maybe'"),
    ("fairseq", "  clip-norm: {a: 1}", ": fairseq option 'clip-norm': takes a value, not the mapping {'a': 1}"),
    ("arch_overrides", "  mtsa_encoder: {embed-dim: [16, 32]}",
     " (arch_overrides.mtsa_encoder): fairseq option 'embed-dim': takes one value, not the list [16, 32]"),
])
def test_task_config_values_are_checked_as_fairseq_reads_them(tmp_path, section, line, message):
    from mtsa_fairseq.experiments.sentence.runs import check_options

    config = tmp_path / "small.yaml"
    text = SMALL.format(updates=10)
    config.write_text(text + line + "\n" if section == "fairseq" else text + "arch_overrides:\n" + line + "\n")
    with pytest.raises(ExperimentError) as caught:
        check_options(load_task_config(config), ["mtsa_encoder"], tmp_path, [])
    assert str(caught.value) == f"{config}{message}"


@pytest.mark.parametrize("args, message", [
    (["--archs", "mtsa_encoder", "--reference", "disan_encoder"], "--reference disan_encoder is not among --archs"),
    (["--archs", "mtsa_encoder", "--jobs", "0"], "--jobs must be positive"),
    (["--archs", "mtsa_encoder", "--jobs", "-2"], "--jobs must be positive"),
    (["--archs", "mtsa_encoder", "--threads", "0"], "--threads must be positive"),
    (["--archs", "mtsa_encoder", "--seeds", "1", "-1"], "--seeds must be non-negative integers"),
])
def test_experiment_usage_errors_before_reading_anything(tmp_path, monkeypatch, capsys, args, message):
    from mtsa_fairseq.experiments.commands import sentence_experiment

    monkeypatch.setattr(sys, "argv", ["mtsa-sentence-experiment", "--config", str(tmp_path / "c.yaml"), "--data",
                                      str(tmp_path), "--out", str(tmp_path / "out"), *args])
    with pytest.raises(SystemExit) as exc:
        sentence_experiment.main()
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"mtsa-sentence-experiment: error: {message}"
    assert not (tmp_path / "out").exists()
