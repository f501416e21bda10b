"""mtsa-fairseq: Multi-mask Tensorized Self-Attention (MTSA), DiSAN and Fast-DiSA for fairseq.

Use as ``fairseq-train --user-dir DIR --arch transformer_mtsa_wmt_en_de ...`` (translation) or ``fairseq-train DATA
--user-dir DIR --task sentence_encoding --arch mtsa_encoder ...`` (sentence encoders), DIR being this package's
directory (``python -m mtsa_fairseq`` prints it).
``--user-dir`` imports this package, then every module of ``tasks/`` and ``models/``, which register the plugin
(as ``import mtsa_fairseq.plugin`` does); the package itself loads neither torch nor fairseq, so the experiment
commands (``mtsa_fairseq.experiments``) start at once."""

from . import quiet_imports  # noqa: F401  (before anything imports fairseq)

__version__ = "0.1.0"
