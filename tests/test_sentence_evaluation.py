"""The evaluation of sentence checkpoints (mtsa_fairseq/experiments/sentence/evaluation.py,
scripts/evaluate_sentence.py): bad input refused with an error that says why, and result files that name their
checkpoint and data relative to their own folder."""

from __future__ import annotations

import json
import sys

import pytest
from sentence_helpers import ROOT, run

from mtsa_fairseq.experiments.sentence.runs import ExperimentError, load_task_config

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands


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


def test_a_checkpoint_built_for_other_data_is_an_error_naming_both(tmp_path, monkeypatch):
    """Without a run.json beside the checkpoint, data of another dictionary (or dataset) shows when its weights
    do not fit the model built for the data."""
    from fairseq import checkpoint_utils

    from mtsa_fairseq.experiments.sentence.evaluation import EvaluationError, evaluate

    def mismatch(*_args, **_kwargs):
        raise RuntimeError("Error(s) in loading state_dict for SentenceEncoderModel:\n\tsize mismatch for "
                           "embedding.trainable: copying a param with shape torch.Size([40, 16]) from checkpoint, "
                           "the shape in current model is torch.Size([52, 16]).")

    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu",
                        lambda *_args, **_kwargs: {"cfg": {"task": {"_name": "sentence_encoding"}}})
    monkeypatch.setattr(checkpoint_utils, "load_model_ensemble_and_task", mismatch)
    (tmp_path / "checkpoint_best.pt").write_bytes(b"")
    with pytest.raises(EvaluationError) as err:
        evaluate(tmp_path / "checkpoint_best.pt", data=tmp_path / "other")
    assert str(err.value) == (
        f"{tmp_path / 'checkpoint_best.pt'} does not match the data in {tmp_path / 'other'} (another dictionary or "
        "dataset than it was trained on): size mismatch for embedding.trainable: copying a param with shape "
        "torch.Size([40, 16]) from checkpoint, the shape in current model is torch.Size([52, 16]).")


@pytest.mark.parametrize("size", ["0", "-1"])
def test_a_batch_size_below_one_is_a_usage_error(tmp_path, monkeypatch, capsys, size):
    from mtsa_fairseq.experiments.commands import evaluate_sentence

    monkeypatch.setattr(sys, "argv", ["mtsa-evaluate-sentence", "--checkpoint", str(tmp_path / "c.pt"),
                                      "--batch-size", size])
    with pytest.raises(SystemExit) as exc:
        evaluate_sentence.main()
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("error: --batch-size must be positive")


def test_a_sentence_result_names_its_checkpoint_and_data_from_its_folder(tmp_path):
    from mtsa_fairseq.experiments.sentence.evaluation import write_result

    (tmp_path / "exp" / "results").mkdir(parents=True)
    result = {"checkpoint": str(tmp_path / "exp/runs/mtsa_encoder/seed1/checkpoint_best.pt"),
              "data": str(tmp_path / "data/sick"), "metrics": {"pearson": 0.8}}
    write_result(tmp_path / "exp/results/mtsa_encoder_seed1.json", result)
    assert json.loads((tmp_path / "exp/results/mtsa_encoder_seed1.json").read_text()) == {
        "checkpoint": "../runs/mtsa_encoder/seed1/checkpoint_best.pt", "data": "../../data/sick",
        "metrics": {"pearson": 0.8}}
