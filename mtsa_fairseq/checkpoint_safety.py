"""Safe loading of fairseq checkpoints under torch >= 2.6 (``torch.load(weights_only=True)``).

fairseq's ``checkpoint_utils.load_checkpoint_to_cpu`` calls ``torch.load`` without ``weights_only``,
which torch now defaults to True; its checkpoints pickle the training ``argparse.Namespace``. Importing
the plugin allow-lists exactly the classes fairseq checkpoints need, so every other global (an
arbitrary callable in a crafted file) is still refused. Never set ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``.
"""

from __future__ import annotations

import argparse

import torch

FAIRSEQ_CHECKPOINT_GLOBALS = [argparse.Namespace]


def allow_fairseq_checkpoints() -> None:
    """Add the classes fairseq checkpoints pickle to torch's ``weights_only`` allow-list."""
    torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)
