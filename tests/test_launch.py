"""The launcher (mtsa_fairseq/experiments/translation/launch.py and plan.py) through scripts/train_seeds.py, and
scripts/average_checkpoints.py, on a tiny synthetic corpus, through fairseq's CLIs."""

import argparse
import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary, data_utils
from process_helpers import trainer_list_is, trainers_on, wait_for

import mtsa_fairseq.plugin  # noqa: F401  (fairseq's checkpoint loader below needs the plugin, as users' code does)
from mtsa_fairseq import checkpoint_safety
from mtsa_fairseq.checkpoint_safety import load_checkpoint
from mtsa_fairseq.contracts import RUN_SCHEMA, read_run
from mtsa_fairseq.experiments.errors import LaunchError
from mtsa_fairseq.experiments.fairseq_train import USER_DIR
from mtsa_fairseq.experiments.runs import checkpoint_updates, mean_train_wps, session, write_run
from mtsa_fairseq.experiments.translation import slurm
from mtsa_fairseq.experiments.translation.launch import execute
from mtsa_fairseq.experiments.translation.plan import LaunchOptions, plan
from mtsa_fairseq.experiments.translation.toy_corpus import write_corpus

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
TINY = """name: {name}
system: mtsa
setup: test
description: a tiny MTSA model on the toy corpus
hardware: {{nodes: 1, gpus_per_node: {gpus}}}
average_last: 0
train_max_length: 12
fairseq:
  arch: transformer_mtsa_tiny
  cpu: {cpu}
  num-workers: 0
  share-all-embeddings: true
  encoder-embed-dim: 32
  decoder-embed-dim: 32
  encoder-ffn-embed-dim: 64
  decoder-ffn-embed-dim: 64
  encoder-attention-heads: 4
  decoder-attention-heads: 4
  optimizer: adam
  lr: 2.0e-3
  lr-scheduler: inverse_sqrt
  warmup-updates: 10
  criterion: label_smoothed_cross_entropy
  label-smoothing: 0.1
  max-tokens: 1024
  max-update: {updates}
  save-interval-updates: 5
  keep-interval-updates: 3
  disable-validation: true
  log-format: simple
  log-interval: 5
"""


def write_config(directory: Path, name: str = "tiny", updates: int = 15, gpus: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(TINY.format(name=name, updates=updates, gpus=gpus, cpu="true" if gpus == 0 else "false"))
    return path


def tool(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    command = [sys.executable, str(ROOT / "scripts" / name)] if name.endswith(".py") else [str(BIN / name)]
    proc = subprocess.run([*command, *args], capture_output=True, text=True, env=ENV, timeout=1500)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def train(config: Path, data: Path, save_root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return tool("train_seeds.py", "--config", str(config), "--data", str(data), "--save-root", str(save_root),
                "--threads", "1", *args, check=check)


def updates_of(path: Path) -> int:
    return int(path.stem.split("_")[-1])


def interval_checkpoints(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("checkpoint_*_*.pt"), key=updates_of)


def snapshot_updates(run_dir: Path) -> list[int]:
    """Updates of every checkpoint fairseq wrote in ``run_dir`` (interval, epoch and last)."""
    names = [p for p in run_dir.glob("checkpoint*.pt") if "best" not in p.name and "avg" not in p.name]
    return [checkpoint_utils.load_checkpoint_to_cpu(str(p))["optimizer_history"][-1]["num_updates"] for p in names]


def launch(config: Path, data: Path, save_root: Path, seeds: list[int], **options) -> list[str]:
    """plan + execute in this process (the CLI path is covered by the ``trained`` fixture); returns the
    launcher's messages and checks that no run failed."""
    messages: list[str] = []
    the_plan = plan(config, data, seeds, save_root, LaunchOptions(threads=1, **options))
    assert execute(the_plan, log=messages.append) == 0, messages
    return messages


def run_json(run_dir: Path) -> dict:
    """run.json as the tools read it: its paths (relative to the run directory in the file) resolved."""
    return read_run(run_dir, AssertionError)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A prepared data directory (manifest.json + data-bin with a joined dictionary)."""
    root = tmp_path_factory.mktemp("launch")
    write_corpus(root / "raw", {"train": 300, "valid": 40, "test": 20}, seed=3)
    tool("fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", str(root / "raw/train"),
         "--validpref", str(root / "raw/valid"), "--testpref", str(root / "raw/test"),
         "--destdir", str(root / "prepared/bin"), "--joined-dictionary", "--workers", "1")
    manifest = {"schema": "mtsa-fairseq.data.v1", "source_lang": "en", "target_lang": "de", "data_bin": "bin",
                "spm_model": None, "vocab_size": None, "train": {"lines": 300, "kept": 300},
                "valid": {"lines": 40, "subset": "valid"}, "tests": {}}
    (root / "prepared/manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture(scope="module")
def trained(corpus):
    """Two seeds of the tiny config, 15 updates each, with the local launcher."""
    config = write_config(corpus / "configs")
    proc = train(config, corpus / "prepared", corpus / "runs", "--seeds", "1", "2")
    return config, corpus / "runs" / "tiny", proc


def test_two_seeds_train_to_done(trained, corpus):
    _, root, _ = trained
    states = []
    for seed in (1, 2):
        run_dir = root / f"seed{seed}"
        record = run_json(run_dir)
        assert record["schema"] == "mtsa-fairseq.run.v1" and record["status"] == "done"
        assert (record["config"], record["system"], record["setup"], record["arch"], record["seed"]) == (
            "tiny", "mtsa", "test", "transformer_mtsa_tiny", seed)
        assert record["num_updates"] == 15 and record["data"] == str(corpus / "prepared")
        assert record["checkpoint"] == str(run_dir / "checkpoint_last.pt")
        assert record["command"][record["command"].index("--seed") + 1] == str(seed)
        assert record["wall_seconds"] > 0 and record["peak_rss_mb"] > 50
        assert record["cpu_kernels"] == [torch.backends.cpu.get_cpu_capability()]  # a CPU run's, per start
        log = (run_dir / "train.log").read_text()
        wps = [float(line.split("wps=")[1].split(",")[0]) for line in log.splitlines() if "| train_inner |" in line]
        assert len(wps) == 3  # updates 5, 10, 15 at --log-interval 5
        assert record["train_target_tokens_per_second"] == pytest.approx(sum(wps) / 3)
        assert mean_train_wps(log) == pytest.approx(sum(wps) / 3)
        assert {updates_of(p) for p in interval_checkpoints(run_dir)} <= {5, 10, 15}
        assert {updates for updates in snapshot_updates(run_dir) if updates % 5 == 0} == {5, 10, 15}
        state = checkpoint_utils.load_checkpoint_to_cpu(record["checkpoint"])
        assert state["optimizer_history"][-1]["num_updates"] == 15
        states.append(state["model"])
    assert states[0].keys() == states[1].keys()
    assert any(not torch.equal(states[0][k], states[1][k]) for k in states[0] if ".s2t." in k)


def test_train_length_filter_applies_to_training_pairs_only(trained, corpus):
    _, root, _ = trained
    view = root / "train-maxlen12"
    stamp = json.loads((view / "view.json").read_text())
    assert stamp["pairs"] == 300 and 0 < stamp["kept"] < 300
    lengths = [max(len(s.split()), len(t.split())) + 1 for s, t in zip(
        (corpus / "raw/train.en").read_text().splitlines(), (corpus / "raw/train.de").read_text().splitlines())]
    assert stamp["kept"] == sum(n <= 12 for n in lengths)  # EOS included, as t2t counts
    log = (root / "seed1" / "train.log").read_text()
    assert f"loaded {stamp['kept']} examples from: {view}/train.en-de.en" in log
    dictionary = Dictionary.load(str(view / "dict.de.txt"))
    original = data_utils.load_indexed_dataset(str(corpus / "prepared/bin/train.en-de.de"), dictionary)
    filtered = data_utils.load_indexed_dataset(str(view / "train.en-de.de"), dictionary)
    kept = [i for i, n in enumerate(lengths) if n <= 12]
    assert len(filtered) == len(kept) and all(torch.equal(filtered[j], original[i]) for j, i in enumerate(kept))
    # every other subset and the dictionaries are the original files
    assert (view / "test.en-de.en.idx").resolve() == (corpus / "prepared/bin/test.en-de.en.idx").resolve()
    assert (view / "dict.en.txt").is_symlink() and (view / "train.en-de.en.bin").is_symlink()
    assert not (view / "train.en-de.en.idx").is_symlink()


def test_rerun_skips_done_seeds(trained, corpus):
    config, root, _ = trained
    before = {seed: (root / f"seed{seed}" / "train.log").read_text() for seed in (1, 2)}
    messages = launch(config, corpus / "prepared", corpus / "runs", [1, 2])
    assert messages == ["seed 1: done (15 updates), skipped", "seed 2: done (15 updates), skipped"]
    assert {seed: (root / f"seed{seed}" / "train.log").read_text() for seed in (1, 2)} == before


def test_run_left_running_resumes_from_checkpoint_last(trained, corpus, tmp_path):
    config, root, _ = trained
    run_dir = tmp_path / "tiny" / "seed1"
    shutil.copytree(root / "seed1", run_dir, symlinks=True)
    # as if the launcher had been killed after update 10: checkpoint_last at 10, run.json "running", and the
    # first session had run under other CPU kernels than this machine's
    shutil.copy(next(p for p in interval_checkpoints(run_dir) if updates_of(p) == 10), run_dir / "checkpoint_last.pt")
    now = torch.backends.cpu.get_cpu_capability()
    other = "DEFAULT" if now != "DEFAULT" else "AVX2"
    (run_dir / "run.json").write_text(json.dumps({**run_json(run_dir), "status": "running", "cpu_kernels": [other]}))
    messages = launch(config, corpus / "prepared", tmp_path, [1])
    assert any(m.startswith("seed 1: resuming from update 10") for m in messages)
    assert f"seed 1: trained with torch's {other} CPU kernels so far, resumed with {now}: it will not repeat an " \
        f"uninterrupted run bit for bit (ATEN_CPU_CAPABILITY={other.lower()} selects {other})" in messages
    after = run_json(run_dir)
    assert after["status"] == "done" and after["resumed_from_updates"] == 10 and after["num_updates"] == 15
    assert after["cpu_kernels"] == [other, now]
    session = (run_dir / "train.log").read_text().split("fairseq_cli.train | done training")[1]
    assert "Loaded checkpoint" in session and "@ 10 updates" in session


def test_slurm_start_records_cpu_kernels_once_per_change(trained, tmp_path):
    # what a Slurm job records before fairseq-train: the start's kernels beside those of the earlier starts
    _, root, _ = trained
    run_dir = tmp_path / "seed1"
    shutil.copytree(root / "seed1", run_dir, symlinks=True)
    shutil.copy(next(p for p in interval_checkpoints(run_dir) if updates_of(p) == 10), run_dir / "checkpoint_last.pt")
    now = torch.backends.cpu.get_cpu_capability()
    other = "DEFAULT" if now != "DEFAULT" else "AVX2"
    (run_dir / "run.json").write_text(json.dumps({**run_json(run_dir), "cpu_kernels": [other]}))
    messages: list[str] = []

    def record_start(cpu_label: str | None = None, **fields: object) -> dict:
        with session(run_dir, None, cpu_label or "tiny.seed1", messages.append, cpu_label is not None,
                     **fields) as started:
            return started.record

    record = record_start("tiny.seed1", slurm_job="7")
    assert messages == [f"tiny.seed1: trained with torch's {other} CPU kernels so far, resumed with {now}: it will "
                        f"not repeat an uninterrupted run bit for bit (ATEN_CPU_CAPABILITY={other.lower()} selects "
                        f"{other})"]
    assert run_json(run_dir) == record
    assert (record["status"], record["slurm_job"], record["resumed_from_updates"]) == ("running", "7", 10)
    assert record["cpu_kernels"] == [other, now]
    assert record_start("tiny.seed1")["cpu_kernels"] == [other, now]  # same kernels
    assert len(messages) == 1
    assert record_start()["cpu_kernels"] == [other, now]  # a GPU job leaves them as they were


def test_truncated_checkpoint_last_resumes_from_the_newest_readable_checkpoint(trained, corpus, tmp_path):
    """A full disk during fairseq's copy into checkpoint_last.pt leaves it truncated; fairseq alone then
    refuses to resume for good. The launcher moves it aside and resumes from the interval checkpoint."""
    config, root, _ = trained
    run_dir = tmp_path / "tiny" / "seed1"
    shutil.copytree(root / "seed1", run_dir, symlinks=True)
    for path in run_dir.glob("checkpoint*.pt"):  # interval and epoch checkpoints: the newest left is at update 10
        if path.name != "checkpoint_last.pt" and checkpoint_updates(path) > 10:
            path.unlink()
    data = (run_dir / "checkpoint_last.pt").read_bytes()
    (run_dir / "checkpoint_last.pt").write_bytes(data[: len(data) // 2])
    (run_dir / "run.json").write_text(json.dumps({**run_json(run_dir), "status": "running"}))
    messages = launch(config, corpus / "prepared", tmp_path, [1])
    aside = [p.name for p in run_dir.iterdir() if p.name.startswith("checkpoint_last.pt.unreadable-")]
    assert len(aside) == 1 and (run_dir / aside[0]).read_bytes() == data[: len(data) // 2]  # kept, not deleted
    after = run_json(run_dir)
    assert checkpoint_updates(run_dir / after["resumed_from"]) == 10
    assert f"seed 1: {run_dir}: checkpoint_last.pt is unreadable (moved to {aside[0]}); resuming from " \
           f"{after['resumed_from']} (update 10)" in messages
    assert after["status"] == "done" and after["resumed_from_updates"] == 10 and after["num_updates"] == 15
    assert after["unreadable_checkpoint"] == str(run_dir / aside[0])
    assert "@ 10 updates" in (run_dir / "train.log").read_text().split("fairseq_cli.train | done training")[1]


def test_finished_checkpoint_with_running_status_is_recorded_without_training(trained, corpus, tmp_path):
    config, root, _ = trained
    run_dir = tmp_path / "tiny" / "seed2"
    shutil.copytree(root / "seed2", run_dir, symlinks=True)
    (run_dir / "run.json").write_text(json.dumps({**run_json(run_dir), "status": "running"}))
    log = (run_dir / "train.log").read_text()
    the_plan = plan(config, corpus / "prepared", [2], tmp_path, LaunchOptions(threads=1))
    assert execute(the_plan, log=lambda _: None) == 0
    assert run_json(run_dir)["status"] == "done" and run_json(run_dir)["num_updates"] == 15
    assert (run_dir / "train.log").read_text() == log


def test_raised_max_update_resumes_and_averages(trained, corpus, tmp_path):
    _, root, _ = trained
    config = write_config(tmp_path / "raised", updates=20)  # same name, so the same run directories
    shutil.copytree(root / "seed2", tmp_path / "tiny" / "seed2", symlinks=True)
    launch(config, corpus / "prepared", tmp_path, [2], average_last=2)
    run_dir = tmp_path / "tiny" / "seed2"
    record = run_json(run_dir)
    assert record["status"] == "done" and record["resumed_from_updates"] == 15 and record["num_updates"] == 20
    assert "Loaded checkpoint" in (run_dir / "train.log").read_text().split("done training")[-2]
    assert record["checkpoint"] == str(run_dir / "checkpoint_avg_last2.pt")
    last = [checkpoint_utils.load_checkpoint_to_cpu(p) for p in record["averaged"]]
    assert [state["optimizer_history"][-1]["num_updates"] for state in last] == [15, 20]
    last = [state["model"] for state in last]
    averaged = checkpoint_utils.load_checkpoint_to_cpu(record["checkpoint"])
    assert averaged["optimizer_history"][-1]["num_updates"] == 20
    for key, value in averaged["model"].items():
        torch.testing.assert_close(value, ((last[0][key].double() + last[1][key].double()) / 2).to(value.dtype))


def test_a_run_trained_past_the_budget_is_refused_not_taken_as_done(trained, corpus, tmp_path):
    """A smaller budget in the same directories would otherwise score the 15-update checkpoints as its own."""
    _, root, _ = trained
    config = write_config(tmp_path / "lowered", updates=10)  # same name, so the same run directories
    shutil.copytree(root / "seed1", tmp_path / "tiny" / "seed1", symlinks=True)
    with pytest.raises(LaunchError, match=r"seed 1: .* trained to 15 updates, past this plan's --max-update 10; "
                                          "use another --out"):
        execute(plan(config, corpus / "prepared", [1], tmp_path, LaunchOptions(threads=1)), dry_run=True)
    proc = train(config, corpus / "prepared", tmp_path, "--seeds", "1", check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith("error: seed 1: ") and "past this plan's" in proc.stderr
    assert run_json(tmp_path / "tiny" / "seed1")["num_updates"] == 15


def test_a_run_is_not_resumed_under_other_training_options(trained, corpus, tmp_path):
    """A changed config (or --extra-args) would continue the checkpoints under other options: refused, naming
    them; a larger budget is the one change that trains on (test_raised_max_update_resumes_and_averages)."""
    _, root, _ = trained
    config = write_config(tmp_path / "changed", updates=20)  # same name, so the same run directories
    config.write_text(config.read_text().replace("  lr: 2.0e-3\n", "  lr: 1.0e-3\n  dropout: 0.3\n"))
    shutil.copytree(root / "seed1", tmp_path / "tiny" / "seed1", symlinks=True)
    with pytest.raises(LaunchError, match=r"seed 1: .* was trained with other fairseq-train options \(--dropout "
                                          r"added; --lr 0.002 -> 0.001\); use another --out"):
        execute(plan(config, corpus / "prepared", [1], tmp_path, LaunchOptions(threads=1)), dry_run=True)
    for extra in (("--clip-norm", "0.1"), ("--clip-norm=0.1",)):
        options = LaunchOptions(threads=1, extra_args=extra)
        with pytest.raises(LaunchError, match=r"\(--clip-norm added; --dropout added; --lr 0.002 -> 0.001\)"):
            execute(plan(config, corpus / "prepared", [1], tmp_path, options), dry_run=True)
    assert run_json(tmp_path / "tiny" / "seed1")["num_updates"] == 15


def test_a_run_is_not_resumed_or_taken_as_done_on_other_data_or_averaging(trained, corpus, tmp_path):
    """A run trained on other dictionaries (the same size or not) would go on, or be scored, with ids that mean
    other words; a finished run scored at another average_last would be skipped unscored as asked: both refused."""
    _, root, _ = trained
    config = write_config(tmp_path / "same", updates=20)  # same name, so the same run directories
    run_dir = tmp_path / "tiny" / "seed1"
    shutil.copytree(root / "seed1", run_dir, symlinks=True)
    record = json.loads((run_dir / "run.json").read_text())
    record["dictionaries"] = {name: "0" * 64 for name in record["dictionaries"]}  # trained on other data
    (run_dir / "run.json").write_text(json.dumps(record))
    with pytest.raises(LaunchError, match=r"seed 1: .* was trained with another dict\.de\.txt than .*prepared has "
                                          r"\(its run.json records the dictionaries\); use another --out"):
        execute(plan(config, corpus / "prepared", [1], tmp_path, LaunchOptions(threads=1)), dry_run=True)
    shutil.rmtree(run_dir)
    shutil.copytree(root / "seed1", run_dir, symlinks=True)  # done at 15 updates, the last checkpoint scored
    config = write_config(tmp_path / "same", updates=15)
    with pytest.raises(LaunchError, match=r"seed 1: .* is done, scored at .*checkpoint_last.pt \(average_last 0\), "
                                          r"where this plan asks for average_last 2; average its kept checkpoints"):
        execute(plan(config, corpus / "prepared", [1], tmp_path, LaunchOptions(threads=1, average_last=2)),
                dry_run=True)
    assert run_json(run_dir)["num_updates"] == 15


def average_script(*args: str) -> None:
    """Run scripts/average_checkpoints.py in this process (its errors raise SystemExit)."""
    argv = sys.argv
    sys.argv = ["average_checkpoints.py", *args]
    try:
        runpy.run_path(str(ROOT / "scripts" / "average_checkpoints.py"), run_name="__main__")
    finally:
        sys.argv = argv


def test_average_script_equals_mean_and_loads_in_generate(trained, corpus, tmp_path, capsys):
    _, root, _ = trained
    inputs = interval_checkpoints(root / "seed1")[-2:]
    assert len(inputs) == 2 and updates_of(inputs[0]) < updates_of(inputs[1])
    out = tmp_path / "avg.pt"
    average_script("--inputs", str(root / "seed1"), "--num-update-checkpoints", "2", "--averaged", str(out))
    models = [checkpoint_utils.load_checkpoint_to_cpu(str(p))["model"] for p in inputs]
    averaged = load_checkpoint(out)
    assert averaged["optimizer_history"][-1]["num_updates"] == updates_of(inputs[1])  # the rest from the newest
    for key, value in averaged["model"].items():
        assert value.dtype == models[0][key].dtype
        torch.testing.assert_close(value, ((models[0][key].double() + models[1][key].double()) / 2).float())
    with pytest.raises(SystemExit):
        average_script("--inputs", *map(str, inputs), "--averaged", str(out))
    assert "exists (pass --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        average_script("--inputs", *map(str, inputs), "--averaged", str(tmp_path), "--overwrite")
    assert f"--averaged {tmp_path} is a directory: name the checkpoint file to write" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        average_script("--inputs", str(inputs[0]), "--num-update-checkpoints", "2", "--averaged", str(out))
    assert f"--inputs: {inputs[0]} is not a directory" in capsys.readouterr().err
    average_script("--inputs", *map(str, reversed(inputs)), "--averaged", str(out), "--overwrite")
    torch.testing.assert_close(load_checkpoint(out)["model"], averaged["model"])
    with pytest.raises(SystemExit, match="fewer than the 9 to average"):
        average_script("--inputs", str(root / "seed1"), "--num-update-checkpoints", "9", "--averaged",
                       str(tmp_path / "nine.pt"))
    assert not (tmp_path / "nine.pt").exists()
    record = json.loads((root / "seed1" / "run.json").read_text())
    assert set(record["dictionaries"]) == {"dict.en.txt", "dict.de.txt"}
    other = tmp_path / "other_run"  # a run on another corpus whose dictionaries have the same sizes
    other.mkdir()
    shutil.copyfile(inputs[0], other / inputs[0].name)
    (other / "run.json").write_text(json.dumps({**record, "dictionaries": {**record["dictionaries"],
                                                                           "dict.de.txt": "0" * 64}}))
    with pytest.raises(SystemExit) as refused:
        average_script("--inputs", str(inputs[1]), str(other / inputs[0].name), "--averaged", str(tmp_path / "x.pt"))
    assert refused.value.code == (  # sys.exit(message): the line on stderr, status 1
        f"error: {other / inputs[0].name} was trained with another dict.de.txt than {inputs[1]} (their run.json "
        "files record the dictionaries): average checkpoints of one vocabulary")
    assert not (tmp_path / "x.pt").exists()
    state = load_checkpoint(inputs[0])  # the same parameters, trained as an ablation: refused; another kernel: not
    model = state["cfg"]["model"]
    assert model.arch == "transformer_mtsa_tiny" and model.mtsa_s2t_bias_init == 0.0
    model.mtsa_s2t_bias_init = 5.0
    torch.save(state, tmp_path / "bias5.pt")
    with pytest.raises(SystemExit) as refused:
        average_script("--inputs", str(inputs[1]), str(tmp_path / "bias5.pt"), "--averaged", str(tmp_path / "x.pt"))
    assert refused.value.code == (f"error: {tmp_path / 'bias5.pt'} was trained with mtsa_s2t_bias_init 5.0, "
                                  f"{inputs[1]} with 0.0: average checkpoints of one model configuration")
    model.mtsa_s2t_bias_init, model.mtsa_kernel = 0.0, "dense"
    torch.save(state, tmp_path / "dense.pt")
    average_script("--inputs", str(inputs[1]), str(tmp_path / "dense.pt"), "--averaged", str(tmp_path / "x.pt"))
    for name, digest in (("ids_a.pt", "a" * 64), ("ids_b.pt", "b" * 64)):  # as sentence_encoding checkpoints record
        torch.save({**state, "task_state": {"ids_sha256": digest}}, tmp_path / name)
    with pytest.raises(SystemExit) as refused:
        average_script("--inputs", str(tmp_path / "ids_a.pt"), str(tmp_path / "ids_b.pt"), "--averaged",
                       str(tmp_path / "y.pt"))
    assert refused.value.code == (
        f"error: {tmp_path / 'ids_b.pt'} was trained on data whose word or class ids mean other words or classes than "
        f"{tmp_path / 'ids_a.pt'}'s (their task states record them): average checkpoints of one dataset")
    assert not (tmp_path / "y.pt").exists()
    last_epoch = max(root.glob("seed1/checkpoint[0-9]*.pt"), key=lambda p: int(p.stem[len("checkpoint"):]))
    with pytest.raises(SystemExit) as refused:  # checkpoint_last.pt holds the last epoch checkpoint's weights
        average_script("--inputs", str(last_epoch), str(root / "seed1" / "checkpoint_last.pt"), "--averaged",
                       str(tmp_path / "z.pt"))
    assert refused.value.code == (
        f"error: {root / 'seed1' / 'checkpoint_last.pt'} and {last_epoch} were both saved at update 15: the same "
        "weights would count twice; average checkpoints of different updates")
    seed2 = interval_checkpoints(root / "seed2")[-1]
    with pytest.raises(SystemExit) as refused:  # independently trained runs: their weights do not align
        average_script("--inputs", str(inputs[0]), str(seed2), "--averaged", str(tmp_path / "z.pt"))
    assert refused.value.code == (f"error: {seed2} is of another run than {inputs[0]} (seed and fold (2, None) against "
                                  "(1, None)): average checkpoints of one run")
    assert not (tmp_path / "z.pt").exists()
    gen = tool("fairseq-generate", str(corpus / "prepared/bin"), "--user-dir", USER_DIR, "--path", str(out), "--cpu",
               "--beam", "2", "--batch-size", "16", "--required-batch-size-multiple", "1", "--num-workers", "0")
    assert sum(line.startswith("H-") for line in gen.stdout.splitlines()) == 20


def test_torchrun_two_cpu_processes(corpus, tmp_path):
    config = write_config(tmp_path / "configs", name="tiny_ddp", updates=4)
    launch(config, corpus / "prepared/bin", tmp_path / "runs", [7], launcher="torchrun", nproc_per_node=2, cpu=True,
           master_port=29731)
    run_dir = tmp_path / "runs" / "tiny_ddp" / "seed7"
    record = run_json(run_dir)
    assert record["status"] == "done" and record["world_size"] == 2 and record["num_updates"] == 4
    assert Path(record["command"][0]).name == "torchrun" and "--distributed-backend" in record["command"]
    log = (run_dir / "train.log").read_text()
    assert log.count("distributed init (rank -1): env://") == 2  # torch reads each process's RANK
    assert log.count("| fairseq_cli.train | {") == 1  # only rank 0 logs at INFO after the init
    state = checkpoint_utils.load_checkpoint_to_cpu(record["checkpoint"])
    assert state["cfg"]["distributed_training"]["distributed_world_size"] == 2
    assert state["optimizer_history"][-1]["num_updates"] == 4


def test_slurm_jobs_dry_run(corpus, tmp_path, capsys):
    config = write_config(tmp_path / "configs", name="tiny_gpu", gpus=2)
    options = LaunchOptions(launcher="slurm", threads=4, master_port=12000, slurm_partition="gpu",
                            slurm_args=("account=nlp", "constraint=volta32gb"))
    the_plan = plan(config, corpus / "prepared", [3], tmp_path / "runs", options, dry_run=True)
    assert execute(the_plan, dry_run=True) == 0
    out = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("# would build")]
    assert json.loads(out[0].split("Slurm job ", 1)[1].rsplit(", every task:", 1)[0]) == {
        "name": "tiny_gpu.seed3", "nodes": 1, "tasks_per_node": 2, "gpus_per_node": 2, "timeout_min": 4320,
        "slurm_signal_delay_s": 90,
        "cpus_per_task": 4, "slurm_partition": "gpu",
        "slurm_additional_parameters": {"account": "nlp", "constraint": "volta32gb"}}
    command = out[1].split()
    assert "fairseq-train" in command[0] and "--cpu" not in command and command[-4:] == [
        "--distributed-world-size", "2", "--distributed-port", "12003"]
    assert "--load-checkpoint-on-all-dp-ranks" in command  # a resume loads on every rank, no pickled broadcast
    assert not (tmp_path / "runs").exists()
    if shutil.which("sbatch") is None:
        with pytest.raises(LaunchError, match="sbatch, which is not on PATH"):
            plan(config, corpus / "prepared", [3], tmp_path / "runs", options)


def test_slurm_job_resumes_after_preemption(corpus, tmp_path):
    """A seed's job through submitit's local executor (the Slurm job without Slurm): preempted mid-training, it is
    requeued, fairseq resumes from checkpoint_last.pt and run.json ends done with both sessions' time."""
    config = write_config(tmp_path / "configs", updates=200)
    the_plan = plan(config, corpus / "prepared", [1], tmp_path / "runs", LaunchOptions(threads=1, cpu=True))
    run = the_plan.runs[0]
    the_plan.view.build(lambda _: None)  # the length-filtered data execute() builds before submitting
    run.run_dir.mkdir(parents=True)
    write_run(run.run_dir, {**run.record, "status": "submitted"})
    job = slurm.submit(the_plan, run, cluster="local")
    wait_for(lambda: job.done() or (checkpoint_updates(run.run_dir / "checkpoint_last.pt") or 0) >= 5, "5 updates")
    assert not job.done(), job.stderr()
    assert run_json(run.run_dir)["status"] == "running"
    task = int(re.match(r"launcher pid (\d+)", (run.run_dir / ".lock").read_text())[1])  # the job's task 0
    trainer = trainers_on(run.run_dir)
    assert len(trainer) == 1
    os.kill(task, signal.SIGUSR2)  # what Slurm sends the tasks of a preempted job (submitit's --signal)
    assert job.result() == 0
    assert not any(pid in trainers_on(run.run_dir) for pid in trainer)  # the first session's fairseq was stopped
    record = run_json(run.run_dir)
    assert record["status"] == "done" and record["num_updates"] == 200 and record["slurm_job"] == job.job_id
    assert 0 < record["resumed_from_updates"] < 200 and record["wall_seconds"] > 0 and "started_at" not in record
    assert record["cpu_kernels"] == [torch.backends.cpu.get_cpu_capability()]  # both sessions under the same kernels
    assert "Requeued job" in job.stdout()  # submitit logs the requeue at INFO, which its config sends to stdout
    log = (run.run_dir / "train.log").read_text()
    assert f"@ {record['resumed_from_updates']} updates)" in log
    assert not (run.run_dir / ".lock").exists()


@pytest.mark.parametrize("read", ["finished check", "resume point"])
def test_slurm_warning_out_of_requeues_while_a_checkpoint_is_read(read, tmp_path, monkeypatch):
    """Out of requeues, submitit's handler for the time-limit warning (SIGUSR2) records the run and raises
    UncompletedJobError, a RuntimeError. Arriving while the job reads a checkpoint (is it finished? where to resume?),
    it must not pass for an unreadable file: run.json says failed, checkpoint_last.pt stays and fairseq never starts."""
    from submitit.core.utils import UncompletedJobError

    run_dir = tmp_path / "seed1"
    run_dir.mkdir()
    torch.save({"optimizer_history": [{"num_updates": 7}]}, run_dir / "checkpoint_last.pt")
    write_run(run_dir, {"schema": RUN_SCHEMA, "status": "requeued", "max_update": 10})
    job = slurm.SeedJob(run_dir, [sys.executable, "-c", "print('trained')"], {}, 10, "seed1", cpu=True)
    monkeypatch.setattr(slurm.submitit, "JobEnvironment", lambda: argparse.Namespace(global_rank=0, job_id="42"))
    reads, real_load = [], checkpoint_safety.load_checkpoint

    def load(path):
        reads.append(path)
        if len(reads) == (1 if read == "finished check" else 2):
            signal.raise_signal(signal.SIGUSR2)
        return real_load(path)

    def no_requeue_left(signum, frame):  # submitit's checkpoint_and_try_requeue, countdown below 0
        job.checkpoint()
        raise UncompletedJobError("Job not requeued because: timed-out too many times.")

    monkeypatch.setattr(checkpoint_safety, "load_checkpoint", load)
    previous = signal.signal(signal.SIGUSR2, no_requeue_left)
    try:
        with pytest.raises(UncompletedJobError):
            job()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    record = run_json(run_dir)
    assert record["status"] == "failed" and "timed-out too many times" in record["error"], record
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint_last.pt", "run.json"]
    assert checkpoint_updates(run_dir / "checkpoint_last.pt") == 7


@pytest.mark.parametrize("case, message", [
    ("unknown_config", "does not exist"),
    ("no_dictionary", "has no fairseq dictionary"),
    ("dictionary_only", "cannot tell the language pair"),
    ("no_valid", "has no binarised 'valid' subset for en-de"),
    ("repeated_seeds", "seed 2 is given more than once"),
    ("world_size", "world size inconsistent with --launcher local"),
])
def test_errors_exit_nonzero_and_write_nothing(corpus, tmp_path, case, message):
    config = write_config(tmp_path / "configs")
    data, seeds, extra = corpus / "prepared", ["1", "2"], []
    if case == "unknown_config":
        config = tmp_path / "configs" / "nope.yaml"
    elif case == "no_dictionary":
        data = tmp_path / "empty"
        data.mkdir()
    elif case in ("dictionary_only", "no_valid"):
        data = tmp_path / "bin"
        shutil.copytree(corpus / "prepared/bin", data)
        for path in data.glob("valid.*" if case == "no_valid" else "*.??-??.*"):
            path.unlink()
        config.write_text(config.read_text().replace("  disable-validation: true\n", ""))
    elif case == "repeated_seeds":
        seeds = ["1", "2", "2"]
    else:
        extra = ["--nproc-per-node", "2"]
    proc = train(config, data, tmp_path / "runs", "--seeds", *seeds, *extra, check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and message in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("options, message", [
    (LaunchOptions(extra_args=("--seed", "3")), "--seed is set by the launcher"),
    (LaunchOptions(extra_args=("--arch", "transformer_tiny")), "--arch is the config's (its system)"),
    (LaunchOptions(extra_args=("--max-tokenz", "3")), "'--max-tokenz' is not a fairseq-train option"),
    (LaunchOptions(launcher="torchrun", nnodes=2, cpu=True), "needs --master-addr"),
    (LaunchOptions(launcher="slurm", cpu=True, nnodes=2), "--launcher slurm --cpu runs one task on one node"),
    (LaunchOptions(node_rank=1), "outside 0..0"),
    (LaunchOptions(average_last=5), "'keep-interval-updates' >= 5"),
    (LaunchOptions(slurm_partition="gpu"), "--slurm-* options are for --launcher slurm"),
    (LaunchOptions(launcher="slurm", slurm_args=("account",)), "'account' is not KEY=VALUE"),
    (LaunchOptions(launcher="slurm", slurm_time=2), "--slurm-time must be >= 3 minutes"),
    (LaunchOptions(launcher="slurm", slurm_requeues=-1), "--slurm-requeues must be >= 0"),
    (LaunchOptions(extra_args=("--decoder-self-attention-type", "mtsa", "--mtsa-s2t-activation", "exp")),
     "fairseq-train: --decoder-self-attention-type mtsa needs --mtsa-s2t-activation sigmoid or scaled_sigmoid"),
    (LaunchOptions(extra_args=("--mtsa-bi-directional", "--encoder-attention-heads", "3")),
     "needs an even --encoder-attention-heads, got 3"),
    (LaunchOptions(extra_args=("--encoder-self-attention-type", "standard", "--mtsa-kernel", "dense")),
     "fairseq-train: --mtsa-kernel has no effect: no layer uses MTSA"),
    (LaunchOptions(extra_args=("--encoder-self-attention-type", "standard", "--decoder-self-attention-type", "mtsa",
                               "--mtsa-s2t-activation", "sigmoid",
                               "--mtsa-bi-directional")),
     "fairseq-train: --mtsa-bi-directional has no effect: it masks the encoder's MTSA heads"),
    (LaunchOptions(extra_args=("--mtsa-s2t-bias-init", "nan")), "--mtsa-s2t-bias-init must be finite, got nan"),
    (LaunchOptions(extra_args=("--mtsa-kernel", "sdpa-joint", "--attention-dropout", "0.1")),
     "--mtsa-kernel sdpa-joint has no attention dropout: train with --attention-dropout 0 (got 0.1)"),
    (LaunchOptions(extra_args=("--mtsa-kernel", "triton")),
     "--mtsa-kernel triton runs on CUDA (on the CPU only under TRITON_INTERPRET=1)"),
])
def test_plan_rejects_inconsistent_options(corpus, tmp_path, monkeypatch, options, message):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # under it the Triton kernel runs on the CPU
    config = write_config(tmp_path / "configs")
    with pytest.raises(LaunchError, match=re.escape(message)):
        plan(config, corpus / "prepared", [1], tmp_path / "runs", options)
    assert not (tmp_path / "runs").exists()


def test_dry_run_prints_commands_and_writes_nothing(corpus, tmp_path, capsys):
    config = write_config(tmp_path / "configs")
    options = LaunchOptions(extra_args=("--update-freq", "2"))
    the_plan = plan(config, corpus / "prepared", [4, 5], tmp_path / "runs", options, dry_run=True)
    execute(the_plan, dry_run=True)
    out, err = capsys.readouterr()
    commands = [line for line in out.splitlines() if "fairseq-train" in line]
    assert len(commands) == 2 and all(c.endswith("--update-freq 2") for c in commands) and "--seed 5" in commands[1]
    assert "would build the length-filtered training data" in out
    assert "effective batch is 2048 tokens per update" in err
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------ one trainer per run directory


def start_launcher(config: Path, data: Path, save_root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "scripts/train_seeds.py"), "--config", str(config), "--data",
                             str(data), "--save-root", str(save_root), "--seeds", "1", "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_launcher_never_leaves_two_trainers(corpus, tmp_path):
    config = write_config(tmp_path / "configs", name="long", updates=100_000)
    run_dir = tmp_path / "runs" / "long" / "seed1"
    first = start_launcher(config, corpus / "prepared", tmp_path / "runs")
    wait_for(lambda: (run_dir / "checkpoint_last.pt").is_file(), "the first checkpoint")
    holders = (run_dir / ".lock").read_text()
    trainer = int(re.search(r"trainer pid (\d+)", holders).group(1))
    assert f"launcher pid {first.pid}" in holders and trainer_list_is(run_dir, [trainer])
    first.kill()  # kill -9 of the launcher: its trainer is told to stop (SIGTERM) and releases the run
    first.wait()
    wait_for(lambda: not trainers_on(run_dir), "the orphaned trainer to stop", timeout=300)
    assert run_json(run_dir)["status"] == "running"  # stale: nobody holds the lock
    killed_session = (run_dir / "train.log").stat().st_mtime - run_json(run_dir)["started_at"]
    assert killed_session > 0

    second = start_launcher(config, corpus / "prepared", tmp_path / "runs")
    wait_for(lambda: "Loaded checkpoint" in (run_dir / "train.log").read_text(), "the rerun to resume", timeout=600)
    assert trainer_list_is(run_dir, wait_for(lambda: trainers_on(run_dir), "the second trainer"))
    log_before = (run_dir / "train.log").read_text()
    third = subprocess.run(start_launcher(config, corpus / "prepared", tmp_path / "runs").args, capture_output=True,
                           text=True, env=ENV, timeout=600)
    assert third.returncode == 1
    assert re.fullmatch(rf"error: run {re.escape(str(run_dir))} is in use by launcher pid {second.pid}, trainer pid "
                        r"\d+; wait for it to finish or stop it, then rerun\n", third.stderr), third.stderr
    assert len(trainers_on(run_dir)) == 1 and (run_dir / "train.log").read_text().startswith(log_before)

    second.terminate()  # a plain kill: the launcher stops its trainer and records the run as interrupted
    assert second.wait(timeout=300) == 143  # 128 + SIGTERM, after stopping its trainer
    wait_for(lambda: not trainers_on(run_dir), "the second trainer to stop", timeout=300)
    assert run_json(run_dir)["status"] == "interrupted"
    assert run_json(run_dir)["wall_seconds"] > killed_session  # the killed session's time counts, and the second's


def test_a_diverged_run_is_recorded_diverged_and_fails_the_launch(corpus, tmp_path):
    config = write_config(tmp_path / "configs", name="tiny_diverges", updates=20)
    config.write_text(config.read_text().replace("lr: 2.0e-3", "lr: -1"))
    proc = train(config, corpus / "prepared", tmp_path / "runs", "--seeds", "1", check=False)
    record = run_json(tmp_path / "runs" / "tiny_diverges" / "seed1")
    assert proc.returncode == 1 and record["status"] == "diverged" and record["num_updates"] == 20
    assert f"seed 1: diverged at 20 updates (training diverged: its last training loss is {record['last_loss']})" \
        in proc.stdout + proc.stderr


def _two_nodes(config: Path, data: Path, save_root: Path, port: int) -> list[subprocess.Popen]:
    """train_seeds.py as two torchrun "nodes" on 127.0.0.1, one CPU process each (gloo), seed 4."""
    common = ["--config", str(config), "--data", str(data), "--save-root", str(save_root), "--seeds", "4",
              "--threads", "1", "--launcher", "torchrun", "--nnodes", "2", "--cpu", "--master-addr", "127.0.0.1",
              "--master-port", str(port)]
    return [subprocess.Popen([sys.executable, str(ROOT / "scripts/train_seeds.py"), *common, "--node-rank", str(rank)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV) for rank in (0, 1)]


def test_torchrun_two_nodes_on_one_host(corpus, tmp_path):
    """Node 0 records the run, node 1 joins it, and both train the same updates to the end."""
    config = write_config(tmp_path / "configs", name="tiny_nodes", updates=6)
    nodes = _two_nodes(config, corpus / "prepared/bin", tmp_path / "runs", 29743)
    outputs = [node.communicate(timeout=900)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    run_dir = tmp_path / "runs" / "tiny_nodes" / "seed4"
    record = run_json(run_dir)
    assert record["status"] == "done" and record["world_size"] == 2 and record["num_updates"] == 6
    assert "--nnodes 2 --node_rank 1 --master_addr 127.0.0.1" in outputs[1]
    # every update is an all-reduce over both ranks, so node 1 trained all 6 updates before node 0 could finish
    assert "done training" in (run_dir / "train.log").read_text()
    assert "initialized host" in (run_dir / "train.node1.log").read_text()


def test_killing_one_node_stops_the_other_and_both_resume(corpus, tmp_path):
    """kill -9 of node 1's launcher mid-run: its trainer follows it, node 0's trainer stops within a bounded time,
    and rerunning both nodes resumes from checkpoint_last.pt to the end, never two trainers per rank."""
    config = write_config(tmp_path / "configs", name="tiny_kill", updates=60)
    run_dir = tmp_path / "runs" / "tiny_kill" / "seed4"
    nodes = _two_nodes(config, corpus / "prepared/bin", tmp_path / "runs", 29747)
    wait_for(lambda: (checkpoint_updates(run_dir / "checkpoint_last.pt") or 0) >= 5, "a checkpoint of both nodes",
             timeout=600)
    nodes[1].kill()
    nodes[0].communicate(timeout=180)  # gloo fails the all-reduce as soon as rank 1's trainer is gone
    assert nodes[0].returncode != 0 and run_json(run_dir)["status"] != "done"
    wait_for(lambda: not trainers_on(run_dir), "no trainer left on the run", timeout=60)
    stopped = checkpoint_updates(run_dir / "checkpoint_last.pt")
    assert stopped < 60
    rerun = _two_nodes(config, corpus / "prepared/bin", tmp_path / "runs", 29749)
    outputs = [node.communicate(timeout=900)[0] for node in rerun]
    assert [node.returncode for node in rerun] == [0, 0], outputs
    record = run_json(run_dir)
    assert record["status"] == "done" and record["resumed_from_updates"] == stopped
    assert record["num_updates"] == 60
