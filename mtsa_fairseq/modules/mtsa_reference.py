"""Literal, slow implementations: the ground truth for tests and the baseline for benchmarks.

* :func:`mtsa_literal`: the paper's tensorized form, equations (10)-(12), a ``[B, H, L, L, d_v]`` feature-wise
  softmax with the authors' masks and guard (docs/reference.md §1.2, §2.2, §6); no dropout.
* :func:`mtsa_naive`: the authors' TensorFlow algorithm (reference §1.2), ``E_R`` as ``[B, H, L, L]`` with a raw
  ``exp`` (it overflows in half precision, as theirs does) and dropout ``keep = sqrt(1 - p)`` in the numerator.
* :func:`disa_naive`: DiSAN's directional attention with the full ``[B, L, L, d]`` logits (reference §4.1).
* :func:`multi_head_literal`: the authors' ``multi_head_attention`` baseline line by line (reference §4.5); no dropout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .mtsa_core import allowed_mask, positional_mask


def _token2token(q: Tensor, k: Tensor, token2token: str, mask: Tensor) -> Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    e_r = torch.exp(scores) if token2token == "exp" else torch.sigmoid(scores)
    return e_r * mask.to(e_r.dtype)


def mtsa_literal(q: Tensor, k: Tensor, v: Tensor, s2t: Tensor, key_padding_mask: Tensor | None = None,
                 direction: str | None = None, include_self: bool = True, token2token: str = "exp") -> Tensor:
    """``out[j, l] = sum_i P[j, i, l] v[i, l]``, ``P[j, i, l] = E_R[j, i] E_S[i, l] / Z[j, l]``,
    ``Z <- where(Z > 0, Z, 1)``, built as the full ``[B, H, L, L, d_v]`` tensor."""
    batch, heads, length, _ = q.shape
    mask = allowed_mask(key_padding_mask, batch, heads, length, direction, include_self, device=q.device)
    e_r = _token2token(q, k, token2token, mask)
    weights = e_r[..., :, :, None] * s2t[..., None, :, :]  # [B, H, Lq, Lk, d_v]
    z = weights.sum(dim=-2)
    z = torch.where(z > 0, z, torch.ones_like(z))
    return (weights * v[..., None, :, :]).sum(dim=-2) / z


def mtsa_naive(q: Tensor, k: Tensor, v: Tensor, s2t: Tensor, key_padding_mask: Tensor | None = None,
               direction: str | None = None, include_self: bool = True, token2token: str = "exp",
               dropout_p: float = 0.0, training: bool = False) -> Tensor:
    """The authors' ``[B, H, L, L]`` algorithm: ``(E_R' @ (v * E_S')) / guard(E_R @ E_S)``."""
    batch, heads, length, _ = q.shape
    mask = allowed_mask(key_padding_mask, batch, heads, length, direction, include_self, device=q.device)
    e_r = _token2token(q, k, token2token, mask)
    z = torch.matmul(e_r, s2t)
    z = torch.where(z > 0, z, torch.ones_like(z))
    drop = 1.0 - math.sqrt(1.0 - dropout_p)
    active = training and dropout_p > 0
    e_r_num = F.dropout(e_r, drop, training=active)
    s2t_num = F.dropout(s2t, drop, training=active)
    return torch.matmul(e_r_num, v * s2t_num) / z


def disa_naive(head: Tensor, dep: Tensor, bias: Tensor, values: Tensor, key_padding_mask: Tensor | None,
               direction: str | None) -> Tensor:
    """DiSA's token2token attention as the authors compute it (reference §4.1 steps 3-5): the full
    ``[B, L, L, d]`` logits, ``-1e30`` on illegal pairs, softmax over keys, probabilities re-masked."""
    length = values.shape[1]
    pos = torch.arange(length, device=values.device)
    rule = positional_mask(pos[:, None], pos[None, :], direction, include_self=False)
    mask = rule[None].expand(values.shape[0], length, length).clone()
    if key_padding_mask is not None:
        mask &= ~key_padding_mask[:, None, :]
    mask = mask[..., None].to(values.dtype)
    logits = 5.0 * torch.tanh((head[:, :, None, :] + dep[:, None, :, :] + bias) / 5.0)
    probs = torch.softmax(logits + (1.0 - mask) * -1e30, dim=2) * mask
    return (probs * values[:, None, :, :]).sum(dim=2)


def multi_head_literal(rep: Tensor, rep_mask: Tensor, weight: Tensor) -> Tensor:
    """The authors' ``multi_head_attention`` transcribed (reference §4.5 steps 1-4), for right-padded
    ``rep [B, L, d]`` with ``rep_mask [B, L]`` True at tokens and ``weight [3, heads, d, units]``: the positional
    encoding tiled over features, the input tiled to ``[3, heads, B*L, d]`` and multiplied by ``weight``, the
    key-and-query mask added as ``-1e30``, softmax, heads concatenated. Returns ``[B, L, heads * units]``, padded
    query rows as the code leaves them (a uniform average)."""
    bs, sl, ivec = rep.shape
    heads, units = weight.shape[1], weight.shape[3]
    seq_idxs = torch.arange(sl, dtype=rep.dtype)[:, None].expand(sl, ivec)
    feature_idxs = torch.arange(ivec, dtype=rep.dtype)[None, :].expand(sl, ivec)
    pos_enc = torch.where(feature_idxs % 2 == 0,
                          torch.sin(seq_idxs / torch.pow(10000.0, 2.0 * feature_idxs / ivec)),
                          torch.cos(seq_idxs / torch.pow(10000.0, 2.0 * (feature_idxs - 1) / ivec)))
    rep_pos = (rep + pos_enc) * rep_mask[..., None].to(rep.dtype)
    rep_tile = rep_pos[None, None].expand(3, heads, bs, sl, ivec).reshape(3, heads, bs * sl, ivec)
    maps = (rep_tile @ weight).reshape(3, heads, bs, sl, units)
    q_map, k_map, v_map = maps[0], maps[1], maps[2]
    similarity = q_map @ k_map.transpose(2, 3) / math.sqrt(units)
    multi_mask = rep_mask[None].expand(heads, bs, sl)
    mask_tile = multi_mask[:, :, None, :] & multi_mask[:, :, :, None]
    prob = torch.softmax(similarity + (1 - mask_tile.to(rep.dtype)) * -1e30, dim=-1)
    return (prob @ v_map).permute(1, 2, 0, 3).reshape(bs, sl, heads * units)
