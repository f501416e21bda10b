"""The sentence-encoder MTSA block (``multi_mask_tensorized_self_attn``; identical to Fast-DiSA's
``fast_directional_self_attention``): docs/reference.md §2.1, §2.2 and §5."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .mtsa_core import TOKEN2TOKEN, head_directions, mtsa_core
from .per_head import PerHeadLinear, activation, glorot_


class SentenceMTSA(nn.Module):
    """Multi-mask tensorized self-attention over ``x [B, L, d_in]`` -> ``[B, L, hn]`` (or ``output_dim``): the
    API's default path (reference §2.2) with its defaults and options under the names of reference §2.1 (per head
    ``v``, ``q``, ``k`` and source2token logits, ``mtsa_core``, fusion gate with ``v``, heads concatenated, optional
    output layer, padded rows zeroed). Every dense layer's input gets its own dropout (``dense_dropout``), per head;
    ``shared_input_dropout`` (needs ``attn_input="x"``) draws the masks as the accelerated path does (reference
    §2.3): one on ``x`` for q, k, v and every head, one for the source2token layer."""

    def __init__(self, input_dim: int, hidden_dim: int, num_heads: int = 2, attn_dropout: float = 0.0,
                 dense_dropout: float = 0.0, use_direction: bool = True, attn_self: bool = False,
                 use_fusion_gate: bool = True, token2token: str = "exp", attn_input: str = "v",
                 s2t_hidden_layer: bool = True, activation_name: str = "relu", activate_v: bool = True,
                 output_dim: int | None = None, shared_input_dropout: bool = False):
        super().__init__()
        if hidden_dim % num_heads:
            raise ValueError(f"hidden_dim ({hidden_dim}) must be divisible by num_heads ({num_heads})")
        if token2token not in TOKEN2TOKEN:
            raise ValueError(f"token2token must be one of {TOKEN2TOKEN}, got {token2token!r}")
        if attn_input not in ("v", "x"):
            raise ValueError(f"attn_input must be 'v' or 'x', got {attn_input!r}")
        if shared_input_dropout and attn_input != "x":
            raise ValueError("shared_input_dropout is the accelerated path's, which computes q, k and s2t from x: "
                             "it needs attn_input='x'")
        self.shared_input_dropout = shared_input_dropout
        self.direction = "bi" if use_direction else None
        head_directions(num_heads, self.direction)
        self.act = activation(activation_name)
        self.num_heads, self.head_dim = num_heads, hidden_dim // num_heads
        self.attn_dropout, self.dense_dropout = attn_dropout, dense_dropout
        self.attn_self, self.token2token, self.attn_input = attn_self, token2token, attn_input
        self.activate_v = activate_v
        src_dim = input_dim if attn_input == "x" else self.head_dim
        h, d = num_heads, self.head_dim
        self.v_proj = PerHeadLinear(h, input_dim, d)
        self.q_proj = PerHeadLinear(h, src_dim, d, bias=False)
        self.k_proj = PerHeadLinear(h, src_dim, d, bias=False)
        self.s2t_hidden = PerHeadLinear(h, src_dim, d) if s2t_hidden_layer else None
        self.s2t = PerHeadLinear(h, d if s2t_hidden_layer else src_dim, d)
        self.gate = PerHeadLinear(h, 2 * d, d) if use_fusion_gate else None
        self.out_layer = glorot_(nn.Linear(hidden_dim, output_dim)) if output_dim is not None else None

    def _dense(self, layer: nn.Module, x: Tensor) -> Tensor:
        return layer(F.dropout(x, self.dense_dropout, self.training))

    def _tile(self, x: Tensor) -> Tensor:
        return x[:, None].expand(x.shape[0], self.num_heads, *x.shape[1:])

    def _projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``v, q, k`` and the source2token logits, each ``[B, h, L, d]``, with the configured dropout masks."""
        if self.shared_input_dropout:  # one mask for q, k, v (all heads), one for the source2token input
            qkv_in = self._tile(F.dropout(x, self.dense_dropout, self.training))
            s2t_in = self._tile(F.dropout(x, self.dense_dropout, self.training))
            v, q, k = self.v_proj(qkv_in), self.q_proj(qkv_in), self.k_proj(qkv_in)
            t = s2t_in if self.s2t_hidden is None else self.act(self.s2t_hidden(s2t_in))
            logits = self.s2t(t) if self.s2t_hidden is None else self._dense(self.s2t, t)
            return (self.act(v) if self.activate_v else v), q, k, logits
        tiled = self._tile(x)
        v = self._dense(self.v_proj, tiled)
        if self.activate_v:
            v = self.act(v)
        src = tiled if self.attn_input == "x" else v
        q, k = self._dense(self.q_proj, src), self._dense(self.k_proj, src)
        t = src if self.s2t_hidden is None else self.act(self._dense(self.s2t_hidden, src))
        return v, q, k, self._dense(self.s2t, t)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """``x [B, L, d_in]``, ``key_padding_mask`` bool ``[B, L]`` (True = pad) -> ``[B, L, d_out]``."""
        batch, length, _ = x.shape
        v, q, k, logits = self._projections(x)
        out = mtsa_core(q, k, v, logits, key_padding_mask=key_padding_mask, direction=self.direction,
                        include_self=self.attn_self, token2token=self.token2token, dropout_p=self.attn_dropout,
                        training=self.training, s2t_activation="exp")
        if self.gate is not None:
            g = torch.sigmoid(self._dense(self.gate, torch.cat([v, out], dim=-1)))
            out = g * v + (1.0 - g) * out
        y = out.permute(0, 2, 1, 3).reshape(batch, length, self.num_heads * self.head_dim)
        if self.out_layer is not None:
            y = self.act(self._dense(self.out_layer, y))
        if key_padding_mask is not None:
            y = y.masked_fill(key_padding_mask[..., None], 0.0)
        return y
