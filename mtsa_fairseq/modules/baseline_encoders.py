"""Baseline sentence encoders of the DiSAN paper (Shen et al., AAAI 2018, section "Baselines"), each followed by
multi-dimensional source2token pooling (docs/reference.md §2.6; hidden activation ``pool_activation``). Every encoder
has ``output_dim`` and maps ``x [B, L, input_dim]`` with ``key_padding_mask [B, L]`` (bool, True = pad, or None) to
``[B, output_dim]``; padding never influences real tokens (a sentence encodes the same alone, left- or right-padded).
``dropout`` applies to each encoder's inputs and to the pooling layers' inputs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .disan import MultiDimSource2Token


def zero_pads(x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """``x [B, L, d]`` with the rows at padded positions set to 0."""
    return x if key_padding_mask is None else x.masked_fill(key_padding_mask[..., None], 0.0)


def real_positions(key_padding_mask: Tensor | None, batch: int, length: int, device: torch.device) -> Tensor:
    """Position of every token among the real tokens of its row (``[B, L]`` long; pads get the
    position of the preceding real token, or 0), so left padding does not shift positions."""
    if key_padding_mask is None:
        return torch.arange(length, device=device).expand(batch, length)
    return ((~key_padding_mask).long().cumsum(dim=1) - 1).clamp(min=0)


def sinusoidal_encoding(positions: Tensor, dim: int, dtype: torch.dtype) -> Tensor:
    """Vaswani et al. (2017) encoding of ``positions [B, L]``: ``PE[p, 2i] = sin(p / 10000^(2i/d))``,
    ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``, shape ``[B, L, dim]``."""
    inv_freq = torch.exp(torch.arange(0, dim, 2, device=positions.device, dtype=dtype) * (-math.log(10000.0) / dim))
    angles = positions.to(dtype)[..., None] * inv_freq
    pe = positions.new_zeros(*positions.shape, dim, dtype=dtype)
    pe[..., 0::2] = torch.sin(angles)
    pe[..., 1::2] = torch.cos(angles[..., : dim // 2])
    return pe


class _PooledEncoder(nn.Module):
    """An encoder whose ``forward`` pools its :meth:`encode_tokens` output with ``self.pool``."""

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """``x [B, L, input_dim]`` -> ``[B, output_dim]``."""
        return self.pool(self.encode_tokens(x, key_padding_mask), key_padding_mask)


class BiLSTMEncoder(_PooledEncoder):
    """Bi-LSTM baseline (DiSAN paper, "Bi-LSTM": 600D, ``hidden_dim`` 300 units per direction). Real tokens of each
    row are moved to the front (in order), packed and put back in place after the LSTM, so padding never enters
    the recurrence; padded outputs are zeroed, a fully padded row encodes to 0."""

    def __init__(self, input_dim: int, hidden_dim: int = 300, dropout: float = 0.0, pool_activation: str = "elu"):
        super().__init__()
        self.dropout = dropout
        self.lstm = nn.LSTM(input_dim, hidden_dim, batch_first=True, bidirectional=True)
        self.output_dim = 2 * hidden_dim
        self.pool = MultiDimSource2Token(self.output_dim, pool_activation, dropout)

    def encode_tokens(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Per-token outputs ``[B, L, 2 * hidden_dim]`` (pad rows 0)."""
        x = F.dropout(x, self.dropout, self.training)
        if key_padding_mask is None:
            return self.lstm(x)[0]
        batch, length, dim = x.shape
        lengths = (~key_padding_mask).sum(dim=1)
        # stable sort on the pad flag: real tokens first, in their original order
        order = torch.argsort(key_padding_mask.to(torch.int64), dim=1, stable=True)
        gathered = x.gather(1, order[..., None].expand(batch, length, dim))
        packed = pack_padded_sequence(gathered, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        out, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=length)
        restored = torch.zeros_like(out).scatter(1, order[..., None].expand_as(out), out)
        return zero_pads(restored, key_padding_mask)


class MultiCNNEncoder(_PooledEncoder):
    """Multi-window CNN baseline (DiSAN paper, "Multi-window CNN" after Kim (2014): windows 3, 4, 5 with 200
    filters each, 600D): "same"-padded 1-D convolutions with relu, concatenated per token. Padded positions are
    zeroed first, so they act like the convolution's own zero padding at the sentence borders."""

    def __init__(self, input_dim: int, kernel_sizes: Sequence[int] = (3, 4, 5), channels: int = 200,
                 dropout: float = 0.0, pool_activation: str = "elu"):
        super().__init__()
        self.dropout = dropout
        self.convs = nn.ModuleList(nn.Conv1d(input_dim, channels, k, padding="same") for k in kernel_sizes)
        self.output_dim = channels * len(kernel_sizes)
        self.pool = MultiDimSource2Token(self.output_dim, pool_activation, dropout)

    def encode_tokens(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Per-token outputs ``[B, L, channels * len(kernel_sizes)]`` (pad rows 0)."""
        x = zero_pads(F.dropout(x, self.dropout, self.training), key_padding_mask).transpose(1, 2)
        out = torch.cat([F.relu(conv(x)) for conv in self.convs], dim=1).transpose(1, 2)
        return zero_pads(out, key_padding_mask)


class HierarchicalCNNEncoder(_PooledEncoder):
    """Hierarchical CNN baseline (DiSAN paper, "Hrchy-CNN" after Gehring et al. (2017): 3 layers of 300D gated
    convolutions with residual connections). The input is mapped to ``hidden_dim`` by a linear layer when the
    widths differ; each layer computes ``x <- x + GLU(conv(x))`` ("same" padding, ``2 * hidden_dim`` channels),
    padded positions zeroed before every layer."""

    def __init__(self, input_dim: int, hidden_dim: int = 300, num_layers: int = 3, kernel_size: int = 3,
                 dropout: float = 0.0, pool_activation: str = "elu"):
        super().__init__()
        self.dropout = dropout
        self.input_proj = nn.Linear(input_dim, hidden_dim) if input_dim != hidden_dim else nn.Identity()
        self.convs = nn.ModuleList(nn.Conv1d(hidden_dim, 2 * hidden_dim, kernel_size, padding="same")
                                   for _ in range(num_layers))
        self.output_dim = hidden_dim
        self.pool = MultiDimSource2Token(hidden_dim, pool_activation, dropout)

    def encode_tokens(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Per-token outputs ``[B, L, hidden_dim]`` (pad rows 0)."""
        x = self.input_proj(F.dropout(x, self.dropout, self.training))
        for conv in self.convs:
            x = zero_pads(x, key_padding_mask)
            h = F.dropout(x, self.dropout, self.training).transpose(1, 2)
            x = x + F.glu(conv(h), dim=1).transpose(1, 2)
        return zero_pads(x, key_padding_mask)


def authors_positional_encoding(positions: Tensor, dim: int, dtype: torch.dtype) -> Tensor:
    """The positional encoding of the authors' multi-head baseline (reference §4.5 step 1), ``[B, L, dim]``:
    feature f even ``sin(p / 10000^(2f/dim))``, f odd ``cos(p / 10000^(2(f-1)/dim))`` (twice Vaswani et al.'s
    exponent, as the code has it)."""
    f = torch.arange(dim, device=positions.device, dtype=dtype)
    exponent = 2.0 * (f - (f % 2)) / dim
    angles = positions.to(dtype)[..., None] / torch.pow(torch.tensor(10000.0, dtype=dtype), exponent)
    return torch.where(f % 2 == 0, torch.sin(angles), torch.cos(angles))


class MultiHeadEncoder(_PooledEncoder):
    """The papers' multi-head attention baseline as the authors' code computes it (BiBloSA's ``multi_head_attention``,
    reference §4.5: ``num_heads`` 8 of ``head_dim`` 75, one bias-free weight ``W [3, heads, d_in, units]``, no output
    projection, residual or layer norm; ``dropout`` is ``1 - keep`` on the input copies, the attention probabilities
    and the pooling). Positions count real tokens and padded query rows are zeroed (reference §4.5, last paragraph)."""

    def __init__(self, input_dim: int, num_heads: int = 8, head_dim: int = 75, dropout: float = 0.0,
                 pool_activation: str = "elu"):
        super().__init__()
        self.input_dim, self.num_heads, self.head_dim, self.dropout = input_dim, num_heads, head_dim, dropout
        self.weight = nn.Parameter(torch.empty(3, num_heads, input_dim, head_dim))
        limit = math.sqrt(6.0 / (3 * num_heads * (input_dim + head_dim)))
        nn.init.uniform_(self.weight, -limit, limit)
        self.output_dim = num_heads * head_dim
        self.pool = MultiDimSource2Token(self.output_dim, pool_activation, dropout)

    def encode_tokens(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Per-token outputs ``[B, L, heads * units]`` (pad rows 0)."""
        batch, length, _ = x.shape
        positions = real_positions(key_padding_mask, batch, length, x.device)
        h = zero_pads(x + authors_positional_encoding(positions, self.input_dim, x.dtype), key_padding_mask)
        if self.training and self.dropout > 0:  # an independent mask for each of the 3 x heads copies
            copies = F.dropout(h.expand(3, self.num_heads, *h.shape), self.dropout, True)
            q, k, v = torch.einsum("mnbld,mndu->mnblu", copies, self.weight).unbind(0)
        else:
            q, k, v = torch.einsum("bld,mndu->mnblu", h, self.weight).unbind(0)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # [heads, B, L, L]
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[None, :, None, :], float("-inf"))
            scores = scores.masked_fill(key_padding_mask.all(dim=1)[None, :, None, None], 0.0)  # no NaN rows
        probs = F.dropout(torch.softmax(scores, dim=-1), self.dropout, self.training)
        out = (probs @ v).permute(1, 2, 0, 3).reshape(batch, length, self.output_dim)
        return zero_pads(out, key_padding_mask)


class ProjectedMultiHeadEncoder(_PooledEncoder):
    """The project's first multi-head baseline, from ``nn.MultiheadAttention`` (Vaswani et al.'s encoding, biased in-
    and output projections), kept for the results measured with it; :class:`MultiHeadEncoder` is the authors'. With
    ``head_dim`` (None: ``input_dim / num_heads``) the encoded input is first mapped to ``num_heads * head_dim``.
    Positions count real tokens, padded keys are masked and padded outputs zeroed (a fully padded row attends over
    its padded keys to stay NaN-free)."""

    def __init__(self, input_dim: int, num_heads: int = 8, head_dim: int | None = None, dropout: float = 0.0,
                 pool_activation: str = "elu"):
        super().__init__()
        embed_dim = input_dim if head_dim is None else num_heads * head_dim
        if embed_dim % num_heads:
            raise ValueError(f"attention width ({embed_dim}) must be divisible by num_heads ({num_heads})")
        self.input_dim, self.dropout = input_dim, dropout
        self.input_proj = nn.Linear(input_dim, embed_dim) if embed_dim != input_dim else nn.Identity()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout, batch_first=True)
        self.output_dim = embed_dim
        self.pool = MultiDimSource2Token(embed_dim, pool_activation, dropout)

    def encode_tokens(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Per-token outputs ``[B, L, num_heads * head_dim]`` (pad rows 0)."""
        batch, length, _ = x.shape
        positions = real_positions(key_padding_mask, batch, length, x.device)
        h = x + sinusoidal_encoding(positions, self.input_dim, x.dtype)
        h = self.input_proj(F.dropout(h, self.dropout, self.training))
        attn_mask = key_padding_mask
        if key_padding_mask is not None:
            attn_mask = key_padding_mask & ~key_padding_mask.all(dim=1, keepdim=True)
        out = self.attn(h, h, h, key_padding_mask=attn_mask, need_weights=False)[0]
        return zero_pads(out, key_padding_mask)
