"""fairseq models of the plugin. fairseq loads their checkpoints with ``torch.load(weights_only=True)``: the
classes those checkpoints pickle are allow-listed with the models (see ``checkpoint_safety``).
``MTSA_CUDNN_ATTENTION=0`` in the environment keeps every SDPA call of a process that loads the plugin (both systems'
attention) off cuDNN, which builds a graph for every new batch shape (docs/benchmark-gpu.md); ``1`` or unset leaves
torch's choice. Launchers pass the environment on, so it reaches every training process."""

import os

import torch

from ..checkpoint_safety import allow_fairseq_checkpoints

allow_fairseq_checkpoints()
_cudnn_attention = os.environ.get("MTSA_CUDNN_ATTENTION", "1")
if _cudnn_attention not in ("0", "1"):
    raise ValueError(f"MTSA_CUDNN_ATTENTION must be 0 (cuDNN attention off) or 1, not {_cudnn_attention!r}")
if _cudnn_attention == "0":
    torch.backends.cuda.enable_cudnn_sdp(False)
