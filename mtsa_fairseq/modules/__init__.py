from .baseline_encoders import (
    BiLSTMEncoder,
    HierarchicalCNNEncoder,
    MultiCNNEncoder,
    MultiHeadEncoder,
    ProjectedMultiHeadEncoder,
)
from .disan import DiSABlock, DiSAN, MultiDimSource2Token
from .mtsa_attention import MTSAMultiheadAttention
from .mtsa_core import mtsa_core
from .sentence_mtsa import SentenceMTSA
from .stacked_mtsa import StackedMTSA

__all__ = [
    "BiLSTMEncoder", "DiSABlock", "DiSAN", "HierarchicalCNNEncoder", "MTSAMultiheadAttention", "MultiCNNEncoder",
    "MultiDimSource2Token", "MultiHeadEncoder", "ProjectedMultiHeadEncoder", "SentenceMTSA", "StackedMTSA", "mtsa_core",
]
