"""End to end: release-format files -> prepare_sentence_data.py -> fairseq-train --task sentence_encoding ->
evaluate_sentence.py / sentence_experiment.py, for every task kind, on small synthetic files (and on real slices
from ../shared/data when it exists)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from process_helpers import trainers_on, wait_for

from mtsa_fairseq.checkpoint_safety import load_checkpoint
from mtsa_fairseq.contracts import read_run
from mtsa_fairseq.experiments.fairseq_train import options_to_args, parse_fairseq_train
from mtsa_fairseq.experiments.processes import RunLock
from mtsa_fairseq.experiments.runs import checkpoint_updates, write_run
from mtsa_fairseq.experiments.sentence.runs import ExperimentError, load_task_config

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
BIN = Path(sys.executable).parent
FAIRSEQ_TRAIN = (str(BIN / "fairseq-train"),)  # the console entry point, as users launch it
CONFIGS = sorted((ROOT / "configs" / "sentence").rglob("*.yaml"))
TINY = ["--embed-dim", "16", "--encoder-hidden-dim", "8", "--classifier-hidden-dim", "8", "--cpu", "--num-workers", "0",
        "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "10", "--disable-validation"]
COARSE = {"ABBR": "abbreviation", "DESC": "how", "ENTY": "what", "HUM": "who", "LOC": "where", "NUM": "when"}
FILLER = "the a river city dog music old red long first book tree house".split()


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*args], capture_output=True, text=True, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args[:3]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def prepare(dataset: str, raw: Path, out: Path, *extra: str) -> Path:
    run(sys.executable, str(ROOT / "scripts/prepare_sentence_data.py"), dataset, "--input", str(raw), "--out",
        str(out), *extra)
    return out


def train(data: Path, save: Path, arch: str, *extra: str, updates: int = 20, validate: int | None = None,
          launcher: tuple[str, ...] = FAIRSEQ_TRAIN) -> Path:
    args = [*launcher, str(data), "--user-dir", str(ROOT / "mtsa_fairseq"), "--task",
            "sentence_encoding", "--arch", arch, "--criterion", "sentence_encoding", "--optimizer", "adam",
            "--lr", "0.005", "--batch-size", "16", "--max-update", str(updates), "--save-dir", str(save), *TINY]
    if validate:
        args.remove("--disable-validation")
        args += ["--validate-interval-updates", str(validate), "--save-interval-updates", str(validate)]
    run(*args, *extra)
    return save


def evaluate(checkpoint: Path, out: Path, *extra: str) -> dict:
    run(sys.executable, str(ROOT / "scripts/evaluate_sentence.py"), "--checkpoint", str(checkpoint), "--result",
        str(out), *extra)
    return json.loads(out.read_text())


# ---------------------------------------------------------------------------------------------- raw files


def trec_lines(n: int, rng: random.Random) -> list[str]:
    """TREC-format questions whose coarse class is given away by the first word."""
    lines = []
    for _ in range(n):
        coarse = rng.choice(sorted(COARSE))
        words = [COARSE[coarse]] + rng.sample(FILLER, rng.randint(2, 6)) + ["?"]
        lines.append(f"{coarse}:other {' '.join(words)}")
    return lines


@pytest.fixture(scope="module")
def trec_data(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("trec_raw")
    rng = random.Random(0)
    (raw / "train_5500.label").write_text("\n".join(trec_lines(400, rng)) + "\n", encoding="latin-1")
    (raw / "TREC_10.label").write_text("\n".join(trec_lines(60, rng)) + "\n", encoding="latin-1")
    return prepare("trec", raw, tmp_path_factory.mktemp("trec") / "data")


def write_snli(path: Path, n: int, rng: random.Random) -> None:
    labels = ["entailment", "neutral", "contradiction", "-"]
    with path.open("w") as f:
        for _ in range(n):
            p, h = rng.sample(FILLER, 4), rng.sample(FILLER, 3)
            f.write(json.dumps({"gold_label": rng.choice(labels),
                                "sentence1_binary_parse": "( ( " + " ".join(p[:2]) + " ) ( " + " ".join(p[2:]) + " ) )",
                                "sentence2_binary_parse": "( " + " ".join(h) + " )"}) + "\n")


def write_sick(path: Path, n: int, rng: random.Random, start: int) -> None:
    rows = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    for i in range(n):
        rows.append(f"{start + i}\t{' '.join(rng.sample(FILLER, 5))}\t{' '.join(rng.sample(FILLER, 4))}\t"
                    f"{rng.uniform(1, 5):.1f}\tNEUTRAL")
    path.write_text("\n".join(rows) + "\n")


# ---------------------------------------------------------------------------------------------- tasks


def test_single_sentence_classification_learns_and_evaluates(trec_data, tmp_path):
    save = train(trec_data, tmp_path / "run", "mtsa_encoder", updates=60, validate=30)
    assert (save / "checkpoint_best.pt").is_file()
    result = evaluate(save / "checkpoint_best.pt", tmp_path / "test.json")
    assert result["dataset"] == "trec" and result["split"] == "test" and result["num_examples"] == 60
    assert len(result["predictions"]) == len(result["references"]) == 60
    accuracy = 100.0 * sum(p == r for p, r in zip(result["predictions"], result["references"])) / 60
    assert result["metrics"]["accuracy"] == pytest.approx(accuracy)
    assert accuracy >= 90.0  # the first word gives the class away; 60 updates learn it
    assert result["num_updates"] == 60 and result["arch"] == "mtsa_encoder"


@pytest.mark.parametrize("arch", ["disan_encoder", "fast_disa_encoder", "bilstm_encoder", "multi_head_encoder"])
def test_every_encoder_trains_through_fairseq_train(trec_data, tmp_path, arch):
    save = train(trec_data, tmp_path / "run", arch, "--encoder-heads", "2", updates=4)
    result = evaluate(save / "checkpoint_last.pt", tmp_path / "test.json", "--split", "valid")
    assert result["split"] == "valid" and 0.0 <= result["metrics"]["accuracy"] <= 100.0


def test_pairs_by_separate_encoding(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    rng = random.Random(1)
    for name, n in (("train", 120), ("dev", 30), ("test", 30)):
        write_snli(raw / f"snli_1.0_{name}.jsonl", n, rng)
    data = prepare("snli", raw, tmp_path / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    save = train(data, tmp_path / "run", "disan_encoder", "--classifier-highway", updates=6)
    result = evaluate(save / "checkpoint_last.pt", tmp_path / "test.json")
    assert result["kind"] == "pair" and result["num_examples"] == manifest["splits"]["test"] < 30  # '-' dropped
    assert set(result["predictions"]) <= {0, 1, 2}


def test_relatedness_regression_reports_pearson_spearman_mse(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    rng = random.Random(2)
    write_sick(raw / "SICK_train.txt", 150, rng, 1)
    write_sick(raw / "SICK_trial.txt", 30, rng, 1000)
    write_sick(raw / "SICK_test_annotated.txt", 40, rng, 2000)
    data = prepare("sick", raw, tmp_path / "data")
    save = train(data, tmp_path / "run", "bilstm_encoder", "--best-checkpoint-metric", "pearson",
                 "--maximize-best-checkpoint-metric", "--classifier-activation", "sigmoid", updates=10, validate=5)
    result = evaluate(save / "checkpoint_best.pt", tmp_path / "test.json")
    assert result["kind"] == "relatedness" and result["num_examples"] == 40
    assert set(result["metrics"]) == {"pearson", "spearman", "mse"}
    assert all(1.0 <= p <= 5.0 for p in result["predictions"])
    assert -1.0 <= result["metrics"]["pearson"] <= 1.0 and result["metrics"]["mse"] > 0
    out = tmp_path / "exp"  # the experiment on SICK's config: Pearson r leads, Spearman rho and MSE beside it
    run(sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config",
        str(ROOT / "configs/sentence/sick.yaml"), "--data", str(data), "--archs", "bilstm_encoder", "--seeds", "1",
        "2", "--out", str(out), "--cpu", "--threads", "1", "--max-update", "10", "--extra-args",
        "--embed-dim 16 --encoder-hidden-dim 8 --classifier-hidden-dim 8 --validate-interval-updates 5 "
        "--save-interval-updates 5")
    report = json.loads((out / "report.json").read_text())
    assert report["metric"] == "pearson" and set(report["other_metrics"]) == {"spearman", "mse"}
    assert len(report["other_metrics"]["mse"]["archs"]["bilstm_encoder"]["values"]) == 2
    assert "test mse:" in (out / "report.md").read_text()


def test_cross_validation_folds(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    rng = random.Random(3)
    (raw / "custrev.pos").write_text("\n".join("great " + " ".join(rng.sample(FILLER, 4)) for _ in range(60)) + "\n")
    (raw / "custrev.neg").write_text("\n".join("awful " + " ".join(rng.sample(FILLER, 4)) for _ in range(40)) + "\n")
    data = prepare("cr", raw, tmp_path / "data")
    folds = [int(x) for x in (data / "train.fold").read_text().split()]
    missing = run(*FAIRSEQ_TRAIN, str(data), "--user-dir", str(ROOT / "mtsa_fairseq"), "--task",
                  "sentence_encoding", "--arch", "mtsa_encoder", "--batch-size", "8", "--max-update", "1",
                  "--save-dir", str(tmp_path / "bad"), *TINY, check=False)
    assert missing.returncode != 0 and "pass --cv-fold K" in missing.stdout + missing.stderr
    save = train(data, tmp_path / "run", "mtsa_encoder", "--cv-fold", "3", updates=4)
    result = evaluate(save / "checkpoint_last.pt", tmp_path / "fold3.json", "--split", "valid")
    assert result["cv_fold"] == 3 and result["num_examples"] == folds.count(3) == 10
    other = evaluate(save / "checkpoint_last.pt", tmp_path / "fold5.json", "--split", "valid", "--cv-fold", "5")
    assert other["cv_fold"] == 5 and other["num_examples"] == folds.count(5)
    # the experiment over folds: each run held out on its fold, the report pairs the architectures by fold
    config = tmp_path / "cr_small.yaml"
    config.write_text(
        "name: cr_small\ndataset: cr\nmetric: accuracy\ndescription: test\nfairseq:\n"
        "  criterion: sentence_encoding\n  optimizer: adam\n  lr: 0.005\n  batch-size: 16\n  max-update: 6\n"
        "  validate-interval-updates: 3\n  save-interval-updates: 3\n  best-checkpoint-metric: accuracy\n"
        "  maximize-best-checkpoint-metric: true\n  embed-dim: 16\n  encoder-hidden-dim: 8\n"
        "  classifier-hidden-dim: 8\n  num-workers: 0\n  log-format: simple\n  no-epoch-checkpoints: true\n")
    run(sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config", str(config), "--data", str(data),
        "--archs", "mtsa_encoder", "multi_cnn_encoder", "--seeds", "1", "--folds", "0", "1", "--out",
        str(tmp_path / "exp"), "--cpu")
    report = json.loads((tmp_path / "exp" / "report.json").read_text())
    assert {(r["arch"], r["fold"], r["split"]) for r in report["runs"]} == {
        (a, f, "valid") for a in ("mtsa_encoder", "multi_cnn_encoder") for f in (0, 1)}
    cv = report["cross_validation"]
    for arch in ("mtsa_encoder", "multi_cnn_encoder"):
        runs = [r for r in report["runs"] if r["arch"] == arch]
        assert cv["archs"][arch]["runs"] == 2
        assert cv["archs"][arch]["last"]["mean"] == pytest.approx(sum(r["dev_curve"][-1][1] for r in runs) / 2)
        assert cv["archs"][arch]["best"]["mean"] == pytest.approx(sum(r["metrics"]["accuracy"] for r in runs) / 2)
    assert set(cv["paired_vs_reference"]["multi_cnn_encoder"]) == {"best", "chosen", "last"}
    assert "### Cross-validation" in (tmp_path / "exp" / "report.md").read_text()


# ---------------------------------------------------------------------------------------------- driver


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


def test_experiment_and_evaluation_reject_bad_input(trec_data, tmp_path):
    bad = run(sys.executable, str(ROOT / "scripts/evaluate_sentence.py"), "--checkpoint", str(tmp_path / "no.pt"),
              check=False)
    assert bad.returncode != 0 and "error: checkpoint not found" in bad.stderr
    (tmp_path / "text.pt").write_text("not a checkpoint\n")
    bad = run(sys.executable, str(ROOT / "scripts/evaluate_sentence.py"), "--checkpoint", str(tmp_path / "text.pt"),
              check=False)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith("error: cannot load checkpoint")
    assert "Traceback" not in bad.stderr
    wrong = run(sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config",
                str(ROOT / "configs/sentence/sst5.yaml"), "--data", str(trec_data), "--archs", "mtsa_encoder",
                "--out", str(tmp_path / "x"), check=False)
    assert wrong.returncode != 0 and "holds 'trec'" in wrong.stderr and not (tmp_path / "x").exists()
    not_sentence = run(sys.executable, str(ROOT / "scripts/sentence_experiment.py"), "--config",
                       str(ROOT / "configs/sentence/trec.yaml"), "--data", str(trec_data), "--archs",
                       "transformer_mtsa", "--out", str(tmp_path / "y"), check=False)
    assert not_sentence.returncode != 0 and "not sentence-encoder architectures" in not_sentence.stderr
    config = tmp_path / "c.yaml"
    config.write_text("name: c\ndataset: trec\nmetric: accuracy\ndescription: x\nfairseq: {seed: 3, max-update: 1}\n")
    with pytest.raises(ExperimentError, match="sets \\['seed'\\]"):
        load_task_config(config)


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


def test_sst_phrase_training_on_real_trees(tmp_path):
    if not (SHARED / "sst_ptb").is_dir():
        pytest.skip("../shared/data/sst_ptb is not available")
    data = prepare("sst5", SHARED / "sst_ptb", tmp_path / "data", "--max-examples", "40")
    save = train(data, tmp_path / "run", "mtsa_encoder", "--classifier-no-output-bias", updates=4)
    result = evaluate(save / "checkpoint_last.pt", tmp_path / "test.json")
    assert result["dataset"] == "sst5" and result["num_examples"] == 40 and set(result["predictions"]) <= set(range(5))


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


def test_an_unloadable_checkpoint_error_says_why_when_its_exception_does_not(tmp_path, monkeypatch):
    from fairseq import checkpoint_utils

    from mtsa_fairseq.experiments.sentence.evaluation import EvaluationError, evaluate

    def fail(*_args, **_kwargs):
        raise EOFError()

    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu", fail)
    (tmp_path / "checkpoint_best.pt").write_bytes(b"")
    with pytest.raises(EvaluationError) as err:
        evaluate(tmp_path / "checkpoint_best.pt")
    assert str(err.value) == f"cannot load checkpoint {tmp_path / 'checkpoint_best.pt'}: EOFError"


@pytest.mark.parametrize("launcher", [FAIRSEQ_TRAIN, (sys.executable, "-m", "fairseq_cli.train")],
                         ids=["entry-point", "module"])
def test_a_resumed_run_stops_early_where_an_uninterrupted_one_does(trec_data, tmp_path, launcher):
    # lr 0: the dev accuracy of update 1 is never beaten, so patience 3 stops after the validation of update 4
    args = ("multi_cnn_encoder", "--lr", "0", "--patience", "3", "--best-checkpoint-metric", "accuracy",
            "--maximize-best-checkpoint-metric")
    whole = train(trec_data, tmp_path / "whole", *args, updates=400, validate=1, launcher=launcher)
    part = train(trec_data, tmp_path / "part", *args, updates=3, validate=1, launcher=launcher)
    train(trec_data, part, *args, updates=400, validate=1, launcher=launcher)  # resumes with 2 validations counted
    assert checkpoint_updates(whole / "checkpoint_last.pt") == checkpoint_updates(part / "checkpoint_last.pt") == 4


@pytest.mark.parametrize("arch", ["mtsa_encoder", "disan_encoder"])
def test_a_resumed_run_equals_an_uninterrupted_one(trec_data, tmp_path, arch):
    # dropout everywhere; stopped mid-epoch at update 10, resumed across the end of epoch 1 (about 23 updates)
    args = (arch, "--dropout", "0.3", "--attention-dropout", "0.1", "--seed", "3")
    whole = train(trec_data, tmp_path / "whole", *args, updates=30, validate=5)
    part = train(trec_data, tmp_path / "part", *args, updates=10, validate=5)
    train(trec_data, part, *args, updates=30, validate=5)
    states = [load_checkpoint(run / "checkpoint_last.pt")["model"] for run in (whole, part)]
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][name], states[1][name]) for name in states[0])


SMALL = ("name: small\ndataset: trec\nmetric: accuracy\ndescription: test\nfairseq:\n  criterion: sentence_encoding\n"
         "  optimizer: adam\n  lr: 0.005\n  batch-size: 16\n  max-update: {updates}\n  save-interval-updates: 5\n"
         "  best-checkpoint-metric: accuracy\n  maximize-best-checkpoint-metric: true\n  embed-dim: 16\n"
         "  encoder-hidden-dim: 8\n  classifier-hidden-dim: 8\n  num-workers: 0\n  log-format: simple\n")


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
    (["--lrs", "1e-3", "1e-3"], "--lrs must be positive and must not repeat"),
    (["--lrs", "0"], "--lrs must be positive and must not repeat"),
    (["--lrs", "1e-3", "--extra-args", "--lr 5e-4"], "--extra-args must not set --lr: the search sets it per run"),
])
def test_lr_search_usage_errors(trec_data, tmp_path, args, message):
    proc = run(sys.executable, str(ROOT / "scripts/sentence_lr_search.py"), "--config",
               str(ROOT / "configs/sentence/trec-random-init.yaml"), "--data", str(trec_data), "--archs",
               "mtsa_encoder", "--out", str(tmp_path / "out"), *args, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(f"error: {message}")
    assert not (tmp_path / "out").exists()


def test_a_sentence_result_names_its_checkpoint_and_data_from_its_folder(tmp_path):
    from mtsa_fairseq.experiments.sentence.evaluation import write_result

    (tmp_path / "exp" / "results").mkdir(parents=True)
    result = {"checkpoint": str(tmp_path / "exp/runs/mtsa_encoder/seed1/checkpoint_best.pt"),
              "data": str(tmp_path / "data/sick"), "metrics": {"pearson": 0.8}}
    write_result(tmp_path / "exp/results/mtsa_encoder_seed1.json", result)
    assert json.loads((tmp_path / "exp/results/mtsa_encoder_seed1.json").read_text()) == {
        "checkpoint": "../runs/mtsa_encoder/seed1/checkpoint_best.pt", "data": "../../data/sick",
        "metrics": {"pearson": 0.8}}
