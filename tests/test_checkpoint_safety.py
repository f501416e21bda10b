"""mtsa_fairseq.checkpoint_safety: fairseq checkpoints load under torch's ``weights_only`` default."""

import argparse
import pickle

import numpy as np
import pytest
import torch

from mtsa_fairseq.checkpoint_safety import FAIRSEQ_CHECKPOINT_GLOBALS, allow_fairseq_checkpoints, load_checkpoint


def test_one_load_keeps_the_process_wide_allow_list(tmp_path):
    """torch's ``safe_globals`` context removes on exit what it was given, even classes allowed before it."""
    path = tmp_path / "checkpoint.pt"
    torch.save({"args": argparse.Namespace(lr=0.5), "metrics": np.arange(3, dtype=np.int64)}, path)
    allow_fairseq_checkpoints()
    state = load_checkpoint(path)
    assert state["args"].lr == 0.5 and state["metrics"].tolist() == [0, 1, 2]
    allowed = torch.serialization.get_safe_globals()
    assert all(g in allowed for g in FAIRSEQ_CHECKPOINT_GLOBALS)
    assert torch.load(path, weights_only=True)["args"].lr == 0.5  # fairseq's loader, after the one load


def test_an_object_array_is_refused(tmp_path):
    path = tmp_path / "crafted.pt"
    torch.save({"extra": np.array([argparse.Namespace()], dtype=object)}, path)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(path)
