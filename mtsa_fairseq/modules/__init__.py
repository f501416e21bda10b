from .mtsa_attention import MTSAMultiheadAttention
from .mtsa_core import mtsa_core
from .sentence_mtsa import SentenceMTSA

__all__ = ["MTSAMultiheadAttention", "SentenceMTSA", "mtsa_core"]
