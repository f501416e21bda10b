"""Everything the plugin registers with fairseq, in one import: ``import mtsa_fairseq.plugin`` (fairseq's
``--user-dir`` reaches the same modules through ``tasks/`` and ``models/``)."""

from .models import sentence_encoder, transformer_mtsa  # noqa: F401  (the models, their architectures)
from .tasks import sentence_encoding  # noqa: F401  (the task and its criterion)
