"""Evaluate a trained sentence encoder on one split: accuracy, or Pearson r / Spearman rho / MSE (SICK), as one JSON
result with the per-example predictions (for the significance tools). The model, task options (``--cv-fold``
included) and data directory come from the checkpoint. The data directory can be overridden, the fold only where the
checkpoint records none: another fold than its held-out one is in its training data and is refused, as is data whose
dictionary or labels are not those the checkpoint was trained with (by its run.json, else by the task)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mtsa_fairseq.contracts import SENTENCE_RESULT_SCHEMA, check_dictionaries, not_found, relative_path, run_beside
from mtsa_fairseq.experiments.files import write_json


class EvaluationError(ValueError):
    """A checkpoint, data directory or split that cannot be evaluated; the message says why."""


def _option(task_cfg: Any, key: str) -> Any:
    """Option ``key`` of a checkpoint's task config: a config or, for tasks with legacy options, a Namespace."""
    return task_cfg.get(key) if hasattr(task_cfg, "keys") else getattr(task_cfg, key, None)


def _load_state(checkpoint: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    from fairseq import checkpoint_utils

    try:
        return checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint), overrides)
    except Exception as exc:  # fairseq and torch raise many kinds for a file that is not a checkpoint
        reason = ": ".join([type(exc).__name__, *str(exc).strip().splitlines()[:1]])  # torch's run over lines
        raise EvaluationError(f"cannot load checkpoint {checkpoint}: {reason}") from None


def _load(checkpoint: Path, data: Path | None, cv_fold: int | None) -> tuple[Any, Any, Any, dict[str, Any]]:
    from fairseq import checkpoint_utils

    import mtsa_fairseq.plugin  # noqa: F401  (the architectures, and what fairseq checkpoints pickle)

    if not checkpoint.is_file():
        raise EvaluationError(not_found("checkpoint", checkpoint))
    overrides: dict[str, Any] = {}
    if data is not None:
        overrides["data"] = str(data)
    state = _load_state(checkpoint, overrides)
    task_cfg = (state.get("cfg") or {}).get("task")
    held_out = _option(task_cfg, "cv_fold")
    if cv_fold is not None and held_out is not None and cv_fold != held_out:
        raise EvaluationError(f"{checkpoint} was trained on every fold but {held_out}: fold {cv_fold} is in its "
                              f"training data; evaluate it on --cv-fold {held_out}")
    if cv_fold is not None and held_out is None:  # a checkpoint that does not record its fold
        overrides["cv_fold"] = cv_fold
        state = _load_state(checkpoint, overrides)
        task_cfg = (state.get("cfg") or {}).get("task")
    task_name = _option(task_cfg, "_name")
    if task_name not in (None, "sentence_encoding"):  # before building: a translation task would look for its files
        raise EvaluationError(f"{checkpoint} is a {task_name} checkpoint, not a sentence_encoding one")
    data_dir = data if data is not None else _option(task_cfg, "data")
    if data_dir:  # before building, naming the file: the task's own check (on loading) names no file
        check_dictionaries(run_beside(checkpoint, EvaluationError), checkpoint, Path(data_dir), EvaluationError)
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides=overrides,
                                                                          state=state)
    except RuntimeError as exc:  # a checkpoint older than the task's ids check: the model has other shapes
        if not str(exc).startswith("Error(s) in loading state_dict"):
            raise
        first = [line.strip() for line in str(exc).splitlines()[1:2]]  # the first of torch's mismatches
        raise EvaluationError(": ".join([f"{checkpoint} does not match the data in {data_dir} (another dictionary or "
                                         "dataset than it was trained on)", *first])) from None
    if getattr(cfg.task, "_name", None) != "sentence_encoding" and not hasattr(task, "kind"):
        raise EvaluationError(f"{checkpoint} is not a sentence_encoding checkpoint")
    return models[0], cfg, task, state


def evaluate(checkpoint: str | Path, split: str = "test", data: str | Path | None = None, cv_fold: int | None = None,
             batch_size: int = 128, use_cuda: bool = False) -> dict[str, Any]:
    """Predictions and metrics of ``checkpoint`` on ``split`` (for cross-validation data: the held-out fold);
    ``checkpoint`` and ``data`` absolute until :func:`write_result` writes it."""
    import torch
    from scipy import stats

    from mtsa_fairseq.criterions.sentence_encoding import expected_score

    model, cfg, task, state = _load(Path(checkpoint), Path(data) if data else None, cv_fold)
    model.eval()
    if use_cuda:
        model.cuda()
    try:
        task.load_dataset(split)
    except FileNotFoundError as exc:
        raise EvaluationError(str(exc)) from exc
    dataset = task.dataset(split)
    iterator = task.get_batch_iterator(dataset, max_sentences=batch_size, ignore_invalid_inputs=False,
                                       seed=1).next_epoch_itr(shuffle=False)
    predictions: list[Any] = [None] * len(dataset)
    gold: list[Any] = [None] * len(dataset)
    for sample in iterator:
        if use_cuda:
            sample = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in sample.items()}
            sample["net_input"] = {k: v.cuda() for k, v in sample["net_input"].items()}
        with torch.no_grad():
            logits = model(**sample["net_input"]).float()
        values = expected_score(logits) if task.kind == "relatedness" else logits.argmax(dim=-1)
        for index, value, target in zip(sample["id"].tolist(), values.tolist(), sample["target"].tolist()):
            predictions[index], gold[index] = value, target
    metrics: dict[str, float]
    if task.kind == "relatedness":
        pred, ref = np.asarray(predictions, dtype=np.float64), np.asarray(gold, dtype=np.float64)
        metrics = {"pearson": float(stats.pearsonr(pred, ref)[0]), "spearman": float(stats.spearmanr(pred, ref)[0]),
                   "mse": float(np.mean((pred - ref) ** 2))}
    else:
        metrics = {"accuracy": 100.0 * float(np.mean(np.asarray(predictions) == np.asarray(gold)))}
    params = sum(p.numel() for p in model.parameters())
    return {
        "schema": SENTENCE_RESULT_SCHEMA, "checkpoint": str(Path(checkpoint).resolve()),
        "data": str(Path(task.args.data).resolve()), "dataset": task.manifest.get("dataset"), "kind": task.kind,
        "split": split, "cv_fold": getattr(task.args, "cv_fold", None), "arch": cfg.model.arch,
        "seed": cfg.common.seed, "num_updates": int(state.get("optimizer_history", [{}])[-1].get("num_updates", 0)),
        "num_examples": len(dataset), "num_params": params,
        "num_params_without_embeddings": params - model.embedding.trainable.numel(),
        "metrics": metrics, "predictions": predictions, "references": gold,
    }


def write_result(path: str | Path, result: dict[str, Any]) -> None:
    """Write a result of :func:`evaluate` to ``path``, its ``checkpoint`` and ``data`` relative to its folder."""
    folder = Path(path).parent
    write_json(path, {**result, **{key: relative_path(result[key], folder) for key in ("checkpoint", "data")}})
