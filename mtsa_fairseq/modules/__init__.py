from .disan import DiSABlock, DiSAN, MultiDimSource2Token
from .mtsa_attention import MTSAMultiheadAttention
from .mtsa_core import mtsa_core
from .sentence_mtsa import SentenceMTSA

__all__ = ["DiSABlock", "DiSAN", "MTSAMultiheadAttention", "MultiDimSource2Token", "SentenceMTSA", "mtsa_core"]
