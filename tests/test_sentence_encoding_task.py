"""The sentence_encoding task (mtsa_fairseq/tasks/sentence_encoding.py) end to end: release-format files ->
prepare_sentence_data.py -> fairseq-train --task sentence_encoding -> evaluate_sentence.py / sentence_experiment.py,
for every task kind, on small synthetic files (and on real slices from ../shared/data when it exists), and resumed
runs that repeat the uninterrupted ones."""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import pytest
import torch
from sentence_helpers import FILLER, ROOT, prepare, run

from mtsa_fairseq.checkpoint_safety import load_checkpoint
from mtsa_fairseq.contracts import checksums
from mtsa_fairseq.experiments.runs import checkpoint_updates

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands

SHARED = ROOT.parent / "shared" / "data"
BIN = Path(sys.executable).parent
FAIRSEQ_TRAIN = (str(BIN / "fairseq-train"),)  # the console entry point, as users launch it
TINY = ["--embed-dim", "16", "--encoder-hidden-dim", "8", "--classifier-hidden-dim", "8", "--cpu", "--num-workers", "0",
        "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "10", "--disable-validation"]


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


def test_dev_and_test_batches_hold_every_example_whatever_the_multiple(trec_data):
    """fairseq drops a last batch smaller than --required-batch-size-multiple (default 8); the task batches its
    evaluation splits with a multiple of 1, so dev and test metrics count every example."""
    from fairseq import options, tasks

    import mtsa_fairseq.plugin  # noqa: F401  (--user-dir skips a package this process imported already)

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(trec_data), "--user-dir", str(ROOT / "mtsa_fairseq"), "--task", "sentence_encoding", "--arch",
        "bilstm_encoder", "--criterion", "sentence_encoding"])
    task = tasks.setup_task(args)
    for split in ("valid", "test"):
        task.load_dataset(split)
        dataset = task.dataset(split)
        assert len(dataset) % 7  # fairseq would leave some out
        for positional in (False, True):  # fairseq's trainer passes keywords; its signature allows positions
            batches = (task.get_batch_iterator(dataset, None, 14, None, False, 7) if positional else
                       task.get_batch_iterator(dataset, max_sentences=14, required_batch_size_multiple=7))
            assert sorted(i for batch in batches.frozen_batches for i in batch) == list(range(len(dataset)))


def test_a_fold_or_a_metric_the_data_lacks_is_refused(trec_data):
    from fairseq import options, tasks

    import mtsa_fairseq.plugin  # noqa: F401  (--user-dir skips a package this process imported already)

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(trec_data), "--user-dir", str(ROOT / "mtsa_fairseq"), "--task", "sentence_encoding", "--arch",
        "bilstm_encoder", "--criterion", "sentence_encoding", "--cv-fold", "0"])
    with pytest.raises(ValueError, match=f"--cv-fold 0 is out of range for {trec_data} \\(no folds\\)"):
        tasks.setup_task(args)
    args.cv_fold, args.best_checkpoint_metric = None, "pearson"  # a relatedness metric for classification data
    with pytest.raises(ValueError, match=f"--best-checkpoint-metric pearson: validation on {trec_data} \\(single "
                                         "examples\\) logs loss, accuracy"):
        tasks.setup_task(args)
    args.best_checkpoint_metric = "l2"  # logged in training only
    with pytest.raises(ValueError, match="--best-checkpoint-metric l2: validation on"):
        tasks.setup_task(args)


@pytest.mark.parametrize("arch", ["disan_encoder", "fast_disa_encoder", "bilstm_encoder", "multi_head_encoder"])
def test_every_encoder_trains_through_fairseq_train(trec_data, tmp_path, arch):
    save = train(trec_data, tmp_path / "run", arch, "--encoder-heads", "2", updates=4)
    result = evaluate(save / "checkpoint_last.pt", tmp_path / "test.json", "--split", "valid")
    assert result["split"] == "valid" and 0.0 <= result["metrics"]["accuracy"] <= 100.0


def test_a_checkpoint_on_data_whose_ids_mean_other_words_or_classes_is_refused(trec_data, tmp_path):
    """Without a run.json beside it: a dictionary of the same size with two words swapped, or other label names."""
    from fairseq import options, tasks

    import mtsa_fairseq.plugin  # noqa: F401  (--user-dir skips a package this process imported already)

    save = train(trec_data, tmp_path / "run", "bilstm_encoder", updates=2)
    state = load_checkpoint(save / "checkpoint_last.pt")
    assert state["extra_state"]["SentenceEncodingTask"]["ids_sha256"] == state["task_state"]["ids_sha256"]
    swapped, renamed = tmp_path / "swapped", tmp_path / "renamed"
    for copy in (swapped, renamed):
        shutil.copytree(trec_data, copy)
    lines = (swapped / "dict.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (swapped / "dict.txt").write_text("".join([lines[1], lines[0], *lines[2:]]), encoding="utf-8")
    manifest = json.loads((swapped / "manifest.json").read_text())
    manifest["checksums"].update(checksums(swapped, ["dict.txt"]))
    (swapped / "manifest.json").write_text(json.dumps(manifest))
    manifest = json.loads((renamed / "manifest.json").read_text())
    manifest["labels"] = manifest["labels"][::-1]
    (renamed / "manifest.json").write_text(json.dumps(manifest))

    bad = run(sys.executable, str(ROOT / "scripts/evaluate_sentence.py"), "--checkpoint",
              str(save / "checkpoint_last.pt"), "--data", str(swapped), "--result", str(tmp_path / "r.json"),
              check=False)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == (
        f"error: the checkpoint was trained on other data than {swapped}: its word or class ids mean other words or "
        "classes (dict.txt, the labels in manifest.json)")
    assert not (tmp_path / "r.json").exists()
    with pytest.raises(AssertionError, match=f"the checkpoint was trained on other data than {swapped}"):
        train(swapped, save, "bilstm_encoder", updates=4)  # a resume
    assert checkpoint_updates(save / "checkpoint_last.pt") == 2
    for data, refused in ((trec_data, False), (renamed, True), (swapped, True)):
        args = options.parse_args_and_arch(options.get_training_parser(), [
            str(data), "--user-dir", str(ROOT / "mtsa_fairseq"), "--task", "sentence_encoding", "--arch",
            "bilstm_encoder", "--criterion", "sentence_encoding"])
        task = tasks.setup_task(args)
        if refused:
            with pytest.raises(ValueError, match="the checkpoint was trained on other data than"):
                task.load_state_dict(state["task_state"])
        else:
            task.load_state_dict(state["task_state"])


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
    same = evaluate(save / "checkpoint_last.pt", tmp_path / "fold3-again.json", "--split", "valid", "--cv-fold", "3")
    assert same["cv_fold"] == 3 and same["metrics"] == result["metrics"]
    other = run(sys.executable, str(ROOT / "scripts/evaluate_sentence.py"), "--checkpoint",
                str(save / "checkpoint_last.pt"), "--result", str(tmp_path / "fold5.json"), "--split", "valid",
                "--cv-fold", "5", check=False)
    assert other.returncode == 1 and not (tmp_path / "fold5.json").exists()  # fold 5 is in its training data
    assert other.stderr.strip().splitlines()[-1] == (
        f"error: {save / 'checkpoint_last.pt'} was trained on every fold but 3: fold 5 is in its training data; "
        "evaluate it on --cv-fold 3")
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


def test_sst_phrase_training_on_real_trees(tmp_path):
    if not (SHARED / "sst_ptb").is_dir():
        pytest.skip("../shared/data/sst_ptb is not available")
    data = prepare("sst5", SHARED / "sst_ptb", tmp_path / "data", "--max-examples", "40")
    save = train(data, tmp_path / "run", "mtsa_encoder", "--classifier-no-output-bias", updates=4)
    result = evaluate(save / "checkpoint_last.pt", tmp_path / "test.json")
    assert result["dataset"] == "sst5" and result["num_examples"] == 40 and set(result["predictions"]) <= set(range(5))


# ---------------------------------------------------------------------------------------------- resumed runs


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
