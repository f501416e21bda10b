"""Stacked MTSA encoder: the API's ``stacking_mtsa`` (docs/reference.md §2.5), built from :class:`SentenceMTSA`."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .disan import MultiDimSource2Token
from .per_head import glorot_
from .sentence_mtsa import SentenceMTSA

LAYER_NORM_EPS = 1e-6  # reference §2.5


class StackedMTSALayer(nn.Module):
    """One layer of ``stacking_mtsa`` (reference §2.5), post-LN, FFN sub-block first; the MTSA sub-block is the
    accelerated path's configuration (reference §2.3): no fusion gate, q/k/v/s2t from ``x``, one-layer s2t,
    bias-free linear ``v``, output layer ``relu(dense(., hn))`` and that path's shared dropout masks."""

    def __init__(self, hidden_dim: int, num_heads: int = 8, dropout: float = 0.2, attn_dropout: float = 0.2,
                 dense_dropout: float = 0.1, use_direction: bool = True, attn_self: bool = False,
                 activation_name: str = "relu", token2token: str = "exp"):
        super().__init__()
        self.dropout, self.dense_dropout = dropout, dense_dropout
        self.ffn = glorot_(nn.Linear(hidden_dim, hidden_dim))
        self.ffn_norm = nn.LayerNorm(hidden_dim, eps=LAYER_NORM_EPS)
        self.attn = SentenceMTSA(
            hidden_dim, hidden_dim, num_heads=num_heads, attn_dropout=attn_dropout, dense_dropout=dense_dropout,
            use_direction=use_direction, attn_self=attn_self, use_fusion_gate=False, token2token=token2token,
            attn_input="x", s2t_hidden_layer=False, activation_name=activation_name, activate_v=False,
            output_dim=hidden_dim, shared_input_dropout=True,
        )
        self.attn.v_proj.bias = None  # fused bias-free q/k/v projection (reference §2.3)
        self.attn_norm = nn.LayerNorm(hidden_dim, eps=LAYER_NORM_EPS)

    def ffn_block(self, x: Tensor) -> Tensor:
        """``relu(dense(x))`` with input dropout (the sub-layer before its residual)."""
        return F.relu(self.ffn(F.dropout(x, self.dense_dropout, self.training)))

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """``x [B, L, hn]`` -> ``[B, L, hn]``; ``key_padding_mask`` bool ``[B, L]`` (True = pad)."""
        x = self.ffn_norm(x + F.dropout(self.ffn_block(x), self.dropout, self.training))
        y = self.attn(x, key_padding_mask)
        return self.attn_norm(x + F.dropout(y, self.dropout, self.training))


class StackedMTSA(nn.Module):
    """``stacking_mtsa`` (reference §2.5, with its defaults): ``num_layers`` :class:`StackedMTSALayer` s over
    ``x [B, L, hn]`` (``input_dim`` must equal ``hidden_dim``, None meaning ``input_dim``), optionally (``pool``)
    pooled like the baselines (reference §2.6, hidden activation ``pool_activation``). ``dropout`` is ``1 -
    residual_keep``; ``dense_dropout`` also applies to the pooling. Padded rows of the per-token output are zeroed."""

    def __init__(self, input_dim: int, hidden_dim: int | None = None, num_heads: int = 8, num_layers: int = 10,
                 dropout: float = 0.2, attn_dropout: float = 0.2, dense_dropout: float = 0.1,
                 use_direction: bool = True, attn_self: bool = False, activation_name: str = "relu",
                 token2token: str = "exp", pool: bool = True, pool_activation: str = "elu"):
        super().__init__()
        hidden_dim = input_dim if hidden_dim is None else hidden_dim
        if input_dim != hidden_dim:
            raise ValueError(f"StackedMTSA needs input_dim == hidden_dim (residual connections), got {input_dim} != "
                             f"{hidden_dim}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.output_dim = hidden_dim
        self.layers = nn.ModuleList(StackedMTSALayer(hidden_dim, num_heads, dropout, attn_dropout, dense_dropout,
                                                     use_direction, attn_self, activation_name, token2token)
                                    for _ in range(num_layers))
        self.pool = MultiDimSource2Token(hidden_dim, pool_activation, dense_dropout) if pool else None

    def encode_tokens(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Per-token outputs ``[B, L, hn]`` (pad rows 0)."""
        if x.shape[-1] != self.output_dim:
            raise ValueError(f"expected input width {self.output_dim}, got {x.shape[-1]}")
        mask = None if key_padding_mask is None else key_padding_mask.bool()  # computed once for all layers
        for layer in self.layers:
            x = layer(x, mask)
        return x if mask is None else x.masked_fill(mask[..., None], 0.0)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """``x [B, L, hn]`` -> ``[B, hn]`` with pooling, else ``[B, L, hn]``."""
        tokens = self.encode_tokens(x, key_padding_mask)
        return tokens if self.pool is None else self.pool(tokens, key_padding_mask)
