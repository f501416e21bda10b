"""Safe loading of fairseq checkpoints under torch >= 2.6 (``torch.load(weights_only=True)``): importing the plugin's
models allow-lists exactly the classes fairseq checkpoints pickle (the training ``argparse.Namespace``, numpy arrays
and scalars of the metrics state) and the numeric dtypes (:func:`load_checkpoint` allows them for one load); every
other global in a crafted file is still refused. Never set ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``; why:
docs/installation.md (Checkpoints under torch >= 2.6)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:  # numpy >= 2
    from numpy._core.multiarray import _reconstruct, scalar
except ImportError:  # numpy 1.26
    from numpy.core.multiarray import _reconstruct, scalar

NUMERIC_DTYPES = [np.dtypes.BoolDType, np.dtypes.Int32DType, np.dtypes.Int64DType, np.dtypes.Float32DType,
                  np.dtypes.Float64DType]
FAIRSEQ_CHECKPOINT_GLOBALS = [argparse.Namespace, np.ndarray, np.dtype, _reconstruct, scalar, *NUMERIC_DTYPES]


def allow_fairseq_checkpoints() -> None:
    """Add the classes fairseq checkpoints pickle to torch's ``weights_only`` allow-list."""
    torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)


def load_checkpoint(path: str | Path) -> Any:
    """``torch.load`` of a fairseq checkpoint on CPU, memory-mapped, ``weights_only`` with
    :data:`FAIRSEQ_CHECKPOINT_GLOBALS` allowed for this load: only those not yet allowed, as torch's ``safe_globals``
    removes on exit what it added, even classes :func:`allow_fairseq_checkpoints` had allowed for the process."""
    allowed = torch.serialization.get_safe_globals()
    with torch.serialization.safe_globals([g for g in FAIRSEQ_CHECKPOINT_GLOBALS if g not in allowed]):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
