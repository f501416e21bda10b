"""Average the parameters of several fairseq checkpoints (e.g. a run's last N interval checkpoints): floating-point
parameters are summed in float64 and cast back to their dtype, everything else (integer buffers, config, optimizer
history) is the newest checkpoint's (the most updates). Checkpoints whose run.json files record different
dictionaries, whose task states record different ids (sentence_encoding), whose models differ in arch or MTSA
options (the kernel aside), that come from different runs (seed, held-out fold) or that were saved at the same update
(the same weights twice), are refused. Checkpoints are read
with ``torch.load(weights_only=True)`` (:mod:`mtsa_fairseq.checkpoint_safety`)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

from mtsa_fairseq.contracts import IDS_KEY, run_beside

UPDATE_CHECKPOINT = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")  # --save-interval-updates
EPOCH_CHECKPOINT = re.compile(r"^checkpoint(\d+)\.pt$")  # end of an epoch


class AverageError(ValueError):
    """Checkpoints that cannot be averaged; the message names the problem."""


def last_checkpoints(directory: str | Path, n: int, kind: str = "update") -> list[Path]:
    """The last ``n`` checkpoints of a fairseq save directory, oldest first: interval checkpoints
    ``checkpoint_<epoch>_<update>.pt`` by update (``kind="update"``) or ``checkpoint<epoch>.pt`` by epoch."""
    directory = Path(directory)
    if kind not in ("update", "epoch"):
        raise ValueError(f"kind must be 'update' or 'epoch', got {kind!r}")
    if n < 1:
        raise AverageError(f"the number of checkpoints to average must be >= 1, got {n}")
    if not directory.is_dir():
        raise AverageError(f"{directory} is not a directory")
    pattern = UPDATE_CHECKPOINT if kind == "update" else EPOCH_CHECKPOINT
    found = [(int(match.groups()[-1]), path) for path in directory.iterdir() if (match := pattern.match(path.name))]
    if len(found) < n:
        names = "checkpoint_<epoch>_<update>.pt" if kind == "update" else "checkpoint<epoch>.pt"
        raise AverageError(f"{directory} has {len(found)} {names} files, fewer than the {n} to average")
    return [path for _, path in sorted(found)[-n:]]


def _load(path: Path) -> dict[str, Any]:
    from mtsa_fairseq.checkpoint_safety import load_checkpoint

    if path.is_file() and not zipfile.is_zipfile(path):  # torch's own message is advice about torch.save
        raise AverageError(f"{path} is not a checkpoint: torch.save writes a zip archive")
    try:
        state = load_checkpoint(path)
    except Exception as err:  # torch raises many kinds of errors for unreadable files
        raise AverageError(f"cannot load checkpoint {path}: {err}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise AverageError(f"{path} is not a fairseq checkpoint (no 'model' state dict)")
    return state


def _config(state: dict[str, Any], section: str) -> dict[str, Any]:
    """A loaded checkpoint's config ``section`` (``model``, ``task``, ...) as a dict: ``cfg.<section>``, a dict or
    a Namespace, else the legacy ``args``."""
    part = (state.get("cfg") or {}).get(section) or state.get("args") or {}
    return dict(part) if hasattr(part, "keys") else vars(part)


def _run_identity(state: dict[str, Any]) -> tuple[Any, Any]:
    """The seed and the held-out fold (``--cv-fold``; None for other tasks) a loaded checkpoint was trained with."""
    return _config(state, "common").get("seed"), _config(state, "task").get("cv_fold")


def num_updates(state: dict[str, Any]) -> int:
    """Updates done when a loaded fairseq checkpoint was saved (0 if it records none)."""
    history = state.get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0))


def _check_same_dictionaries(paths: list[Path]) -> None:
    """Refuse checkpoints whose run.json files (beside them) record different dictionaries: with the same sizes
    their parameters would average, meaning nothing."""
    first: tuple[Path, dict[str, str]] | None = None
    for path in paths:
        recorded = (run_beside(path, AverageError) or {}).get("dictionaries")
        if not recorded:
            continue
        if first is None:
            first = (path, recorded)
        elif recorded != first[1]:
            name = next(n for n in sorted({*recorded, *first[1]}) if recorded.get(n) != first[1].get(n))
            raise AverageError(f"{path} was trained with another {name} than {first[0]} (their run.json files "
                               "record the dictionaries): average checkpoints of one vocabulary")


def model_options(state: dict[str, Any]) -> dict[str, Any]:
    """What a loaded checkpoint's model computes with beyond its parameters' shapes: its arch and MTSA options (the
    kernel aside: every kernel gives the same values)."""
    return {key: value for key, value in _config(state, "model").items() if key == "arch" or key != "mtsa_kernel"
            and (key.startswith("mtsa_") or key.endswith("_self_attention_type"))}


def average_checkpoints(paths: list[str | Path]) -> dict[str, Any]:
    """The newest of ``paths`` with its model parameters replaced by the mean over all ``paths``."""
    import torch

    paths = [Path(p) for p in paths]
    if not paths:
        raise AverageError("no checkpoints to average")
    if len(set(p.resolve() for p in paths)) != len(paths):
        raise AverageError("a checkpoint is listed twice")
    _check_same_dictionaries(paths)
    sums: dict[str, torch.Tensor] = {}
    newest: dict[str, Any] | None = None
    keys: list[str] | None = None
    first_ids: tuple[Path, str] | None = None  # a sentence_encoding checkpoint's digest of what its ids mean
    saved_at: dict[int, Path] = {}
    first_identity: tuple[Any, Any] | None = None  # the first checkpoint's seed and held-out fold
    for path in paths:
        state = _load(path)
        model = state["model"]
        ids = (state.get("task_state") or {}).get(IDS_KEY)
        if ids is not None:
            first_ids = first_ids or (path, ids)
            if ids != first_ids[1]:
                raise AverageError(f"{path} was trained on data whose word or class ids mean other words or classes "
                                   f"than {first_ids[0]}'s (their task states record them): average checkpoints of "
                                   "one dataset")
        updates = num_updates(state)
        if updates in saved_at:
            raise AverageError(f"{path} and {saved_at[updates]} were both saved at update {updates}: the same "
                               "weights would count twice; average checkpoints of different updates")
        saved_at[updates] = path
        identity = _run_identity(state)
        first_identity = first_identity or identity
        if identity != first_identity:
            raise AverageError(f"{path} is of another run than {paths[0]} (seed and fold {identity} against "
                               f"{first_identity}): average checkpoints of one run")
        if keys is None:
            keys, options = list(model), model_options(state)
        elif set(model) != set(keys):
            diff = sorted(set(model) ^ set(keys))
            raise AverageError(f"{path} has different parameters from {paths[0]} (e.g. {diff[0]})")
        elif model_options(state) != options:
            other = model_options(state)
            key = next(k for k in sorted({*options, *other}) if options.get(k) != other.get(k))
            raise AverageError(f"{path} was trained with {key} {other.get(key)!r}, {paths[0]} with "
                               f"{options.get(key)!r}: average checkpoints of one model configuration")
        for key, value in model.items():
            if not torch.is_floating_point(value):
                continue
            if key in sums and sums[key].shape != value.shape:
                raise AverageError(f"{path}: parameter {key} has shape {tuple(value.shape)}, "
                                   f"not {tuple(sums[key].shape)}")
            total = value.to(torch.float64)
            sums[key] = sums[key] + total if key in sums else total
        if newest is None or num_updates(state) >= num_updates(newest):
            newest = state
    assert newest is not None
    newest["model"] = {key: (sums[key] / len(paths)).to(value.dtype) if key in sums else value
                       for key, value in newest["model"].items()}
    return newest


def save_checkpoint(state: dict[str, Any], output: str | Path) -> Path:
    """Write ``state`` to ``output`` atomically (a temporary file renamed into place)."""
    import torch

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp{os.getpid()}")
    try:
        torch.save(state, tmp)
        os.replace(tmp, output)
    except RuntimeError as err:  # torch.save reports a failed write (a full disk) as RuntimeError, not OSError
        full = shutil.disk_usage(output.parent).free < 2**20
        reason = "No space left on device" if full else str(err).splitlines()[0]
        raise OSError(errno.ENOSPC if full else errno.EIO, f"cannot write {output}: {reason}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return output
