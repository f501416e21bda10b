"""mtsa-fairseq: Multi-mask Tensorized Self-Attention (MTSA), DiSAN and Fast-DiSA for fairseq.

Use as ``fairseq-train --user-dir <path to this package> --arch transformer_mtsa_wmt_en_de ...``.
"""

from .checkpoint_safety import allow_fairseq_checkpoints
from .models import transformer_mtsa  # noqa: F401  (registers the models)

allow_fairseq_checkpoints()

__version__ = "0.1.0"
