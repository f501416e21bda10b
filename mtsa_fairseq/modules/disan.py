"""DiSAN (Shen et al., AAAI 2018): directional self-attention blocks and multi-dimensional source2token pooling, as
the authors' code computes them (docs/reference.md §2.6, §4.1 with the formulas, and §6), but without their
``[B, L, L, d]`` score tensor: :func:`directional_attention` runs over query chunks, visits only the keys a
directional mask can allow and recomputes each chunk in a hand-written backward pass (peak memory: one chunk's).
:func:`mtsa_fairseq.modules.mtsa_reference.disa_naive` is the literal version."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .mtsa_core import CHUNK_ELEMENTS, positional_mask
from .per_head import activation, glorot_

DISA_DIRECTIONS = ("forward", "backward", None)
SCALE = 5.0  # the authors' scaled_tanh constant c


def disa_allowed(key_padding_mask: Tensor | None, q_pos: Tensor, k_pos: Tensor, direction: str | None) -> Tensor:
    """Boolean ``[B or 1, Lq, Lk]``: strict positional rule AND key real (reference §6, DiSAN rows)."""
    allowed = positional_mask(q_pos[:, None], k_pos[None, :], direction, include_self=False)[None]
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, k_pos]
    return allowed


def _chunks(length: int, size: int, direction: str | None, key_padding_mask: Tensor | None, device: torch.device):
    """``(q0, q1, k0, k1, allowed)`` per chunk of ``size`` queries ``q0..q1-1`` with the keys ``k0..k1-1``
    that can be legal for them (forward ``i < j``, backward ``i > j``); chunks without any are skipped."""
    pos = torch.arange(length, device=device)
    for q0 in range(0, length, size):
        q1 = min(length, q0 + size)
        k0, k1 = {"forward": (0, q1 - 1), "backward": (q0 + 1, length)}.get(direction, (0, length))
        if k0 < k1:
            yield q0, q1, k0, k1, disa_allowed(key_padding_mask, pos[q0:q1], pos[k0:k1], direction)


def _chunk_weights(head: Tensor, dep: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor]:
    """``t = tanh(z)`` and ``e = exp(5 t - 5) * allowed`` as ``[B, d, c, k]`` from ``head [B, c, d]`` and
    ``dep [B, k, d]``, already divided by 5 (``z = (h'W_2 + h'W_1 + b) / 5``). The logits ``5 t`` lie in
    ``[-5, 5]``, so the constant shift replaces softmax's running maximum and keeps ``e`` in ``(0, 1]``."""
    t = torch.tanh_(head.transpose(1, 2)[..., None] + dep.transpose(1, 2)[:, :, None, :])
    e = torch.exp_((t - 1.0).mul_(SCALE))
    return t, e.mul_(allowed[:, None].to(e.dtype))


class _DirectionalAttention(torch.autograd.Function):
    """``s`` of :func:`directional_attention` over query chunks and only the keys a chunk's queries may
    attend to; backward recomputes each chunk and forms the gradients from matrix-vector products, so at
    most two ``[B, d, c, k]`` tensors exist at a time."""

    @staticmethod
    def forward(ctx, head: Tensor, dep: Tensor, bias: Tensor, values: Tensor, key_padding_mask: Tensor | None,
                direction: str | None, size: int) -> Tensor:
        dtype = functools.reduce(torch.promote_types, (head.dtype, dep.dtype, bias.dtype, values.dtype))
        head_s = (head.to(dtype) + bias.to(dtype)) / SCALE
        dep_s, vals = dep.to(dtype) / SCALE, values.to(dtype)
        out, den = torch.zeros_like(vals), torch.zeros_like(vals)
        for q0, q1, k0, k1, allowed in _chunks(vals.shape[1], size, direction, key_padding_mask, vals.device):
            _, e = _chunk_weights(head_s[:, q0:q1], dep_s[:, k0:k1], allowed)
            chunk_den = e.sum(-1)  # [B, d, c]
            chunk_num = torch.matmul(e, vals[:, k0:k1].transpose(1, 2)[..., None])[..., 0]
            den[:, q0:q1] = chunk_den.transpose(1, 2)
            out[:, q0:q1] = (chunk_num / chunk_den.clamp_min(torch.finfo(dtype).tiny)).transpose(1, 2)
        ctx.save_for_backward(head_s, dep_s, vals, out, den, key_padding_mask)
        ctx.direction, ctx.size = direction, size
        ctx.dtypes = (head.dtype, dep.dtype, bias.dtype, values.dtype)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        head_s, dep_s, vals, out, den, key_padding_mask = ctx.saved_tensors
        # a_j = g_j / den_j (0 for rows without a legal key); dL/df_ji = e_ji a_j (v_i - s_j)
        a = torch.where(den > 0, grad_out.to(vals.dtype) / den.clamp_min(torch.finfo(vals.dtype).tiny), 0.0)
        grad_z_head, grad_z_dep, grad_vals = torch.zeros_like(head_s), torch.zeros_like(dep_s), torch.zeros_like(vals)
        for q0, q1, k0, k1, allowed in _chunks(vals.shape[1], ctx.size, ctx.direction, key_padding_mask,
                                               vals.device):
            t, e = _chunk_weights(head_s[:, q0:q1], dep_s[:, k0:k1], allowed)
            a_c = a[:, q0:q1].transpose(1, 2)  # [B, d, c]
            s_c = out[:, q0:q1].transpose(1, 2)
            v_k = vals[:, k0:k1].transpose(1, 2)  # [B, d, k]
            grad_vals[:, k0:k1] += torch.matmul(a_c[:, :, None, :], e)[:, :, 0].transpose(1, 2)
            w = e.mul_(t.square_().neg_().add_(1.0))  # e (1 - t^2): through 5 tanh(z)
            wv = torch.matmul(w, v_k[..., None])[..., 0]  # sum_i w_ji v_i
            grad_z_head[:, q0:q1] += (a_c * (wv - s_c * w.sum(-1))).transpose(1, 2)
            left = torch.stack((a_c, a_c * s_c), dim=2)  # [B, d, 2, c]
            sums = torch.matmul(left, w)  # sum_j w_ji a_j and sum_j w_ji a_j s_j
            grad_z_dep[:, k0:k1] += (v_k * sums[:, :, 0] - sums[:, :, 1]).transpose(1, 2)
        # z = (head + dep + bias) / 5 and f = 5 tanh(z): the factors 5 and 1/5 cancel
        grads = (grad_z_head, grad_z_dep, grad_z_head.sum((0, 1)), grad_vals)
        return (*(g.to(d) for g, d in zip(grads, ctx.dtypes)), None, None, None)


def directional_attention(head: Tensor, dep: Tensor, bias: Tensor, values: Tensor, key_padding_mask: Tensor | None,
                          direction: str | None, chunk_size: int | None = None) -> Tensor:
    """``s [B, L, d]`` of a DiSA block from ``head = h' W_2``, ``dep = h' W_1``, ``bias [d]`` and ``values = h``,
    over query chunks of ``chunk_size`` queries (default: at most 2**24 scores) and only the keys a directional mask
    can allow; backward recomputes each chunk, so no ``[B, L, L, d]`` tensor ever exists."""
    if direction not in DISA_DIRECTIONS:
        raise ValueError(f"direction must be one of {DISA_DIRECTIONS}, got {direction!r}")
    batch, length, dim = values.shape
    size = chunk_size or max(1, CHUNK_ELEMENTS // max(1, batch * length * dim))
    return _DirectionalAttention.apply(head, dep, bias, values, key_padding_mask, direction, size)


class DiSABlock(nn.Module):
    """One directional self-attention block with its fusion gate (reference §4.1) on ``[B, L, dim]``:
    ``direction`` ``"forward"`` (keys ``i < j``), ``"backward"`` (``i > j``) or None (``i != j``); ``dropout``
    on the inputs of the dense layers; ``chunk_size`` queries per chunk (default: under 2**24 scores)."""

    def __init__(self, dim: int, direction: str | None = "forward", activation_name: str = "elu",
                 dropout: float = 0.0, chunk_size: int | None = None):
        super().__init__()
        if direction not in DISA_DIRECTIONS:
            raise ValueError(f"direction must be one of {DISA_DIRECTIONS}, got {direction!r}")
        self.direction, self.dropout, self.chunk_size = direction, dropout, chunk_size
        self.act = activation(activation_name)
        self.fc_h = nn.Linear(dim, dim)
        self.w_dep = nn.Linear(dim, dim, bias=False)  # W_1, applied to the keys
        self.w_head = nn.Linear(dim, dim, bias=False)  # W_2, applied to the queries
        self.f_bias = nn.Parameter(torch.zeros(dim))
        self.gate_h = nn.Linear(dim, dim)
        self.gate_s = nn.Linear(dim, dim)
        self.o_bias = nn.Parameter(torch.zeros(dim))
        for layer in (self.fc_h, self.w_dep, self.w_head, self.gate_h, self.gate_s):
            glorot_(layer)

    def _drop(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.dropout, self.training)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """``x [B, L, d]``, ``key_padding_mask`` bool ``[B, L]`` (True = pad) -> ``u [B, L, d]``."""
        h = self.act(self.fc_h(self._drop(x)))
        hd = self._drop(h)
        s = directional_attention(self.w_head(hd), self.w_dep(hd), self.f_bias, h, key_padding_mask,
                                  self.direction, self.chunk_size)
        gate = torch.sigmoid(self.gate_h(self._drop(h)) + self.gate_s(self._drop(s)) + self.o_bias)
        u = gate * h + (1.0 - gate) * s
        return u if key_padding_mask is None else u.masked_fill(key_padding_mask[..., None], 0.0)


class MultiDimSource2Token(nn.Module):
    """Multi-dimensional source2token pooling (reference §2.6): ``P = softmax_t(W_2 act(W_1 x + b_1) + b_2)``
    per feature over real positions, output ``sum_t P_t * x_t`` (``[B, d]``)."""

    def __init__(self, dim: int, activation_name: str = "elu", dropout: float = 0.0):
        super().__init__()
        self.act, self.dropout = activation(activation_name), dropout
        self.fc1, self.fc2 = nn.Linear(dim, dim), nn.Linear(dim, dim)
        for layer in (self.fc1, self.fc2):
            glorot_(layer)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        drop = lambda t: F.dropout(t, self.dropout, self.training)  # noqa: E731
        logits = self.fc2(drop(self.act(self.fc1(drop(x)))))
        if key_padding_mask is not None:
            logits = logits - 1e30 * key_padding_mask[..., None].to(logits.dtype)
        return (torch.softmax(logits, dim=1) * x).sum(dim=1)


class DiSAN(nn.Module):
    """DiSAN: forward and backward DiSA blocks (untied), concatenated, pooled by multi-dimensional
    source2token attention (reference §4.2): ``[B, L, d] -> [B, 2d]``. ``directional=False`` gives the
    papers' "DiSAN without directions" baseline (both blocks use the ``i != j`` mask)."""

    def __init__(self, dim: int, activation_name: str = "elu", dropout: float = 0.0, directional: bool = True,
                 chunk_size: int | None = None):
        super().__init__()
        directions = ("forward", "backward") if directional else (None, None)
        self.blocks = nn.ModuleList(DiSABlock(dim, d, activation_name, dropout, chunk_size) for d in directions)
        self.pool = MultiDimSource2Token(2 * dim, activation_name, dropout)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        u = torch.cat([block(x, key_padding_mask) for block in self.blocks], dim=-1)
        return self.pool(u, key_padding_mask)
