"""mtsa-fairseq: Multi-mask Tensorized Self-Attention (MTSA), DiSAN and Fast-DiSA for fairseq.

Use as ``fairseq-train --user-dir <path to this package> --arch transformer_mtsa_wmt_en_de ...`` (translation)
or ``fairseq-train DATA --user-dir ... --task sentence_encoding --arch mtsa_encoder ...`` (sentence encoders).
"""

from . import quiet_imports  # noqa: F401  (before anything imports fairseq)
from .checkpoint_safety import allow_fairseq_checkpoints
from .criterions import sentence_encoding as _criterion  # noqa: F401  (registers the criterion)
from .models import sentence_encoder, transformer_mtsa  # noqa: F401  (registers the models)
from .tasks import sentence_encoding as _task  # noqa: F401  (registers the task)

allow_fairseq_checkpoints()

__version__ = "0.1.0"
