"""A fused MTSA attention kernel in Triton (FlashAttention-2 style), forward and backward, as docs/kernel.md
describes it (What the Triton kernel computes; reference §8.1-§8.3): no ``[B, H, L, L]`` tensor in either
direction. Without a GPU the kernels run under ``TRITON_INTERPRET=1`` (set before this module is imported).

Three tiers, as in flash-attention: the ``@triton.jit`` kernels and the helpers they share; the launchers
``_launch_forward`` and ``_launch_backward`` (buffers, grids, tiles and their autotuning, strides, flags); and
``_MTSAFunction``, which only calls the launchers and saves what the backward reads."""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .mtsa_core import TRITON_DTYPES

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # what triton.jit below compiles for
LOG2E = tl.constexpr(math.log2(math.e))  # exp(x) = 2^(x log2(e)): the kernels use exp2


# ---------------------------------------------------------------------------------------------------------------
# Kernels: the `@triton.jit` functions (the kernels and the helpers they share).
@triton.jit
def _allowed(q_pos, k_pos, LK, forward, pad_row, DIRECTIONAL: tl.constexpr, INCLUDE_SELF: tl.constexpr,
             HAS_PAD: tl.constexpr):
    """True where query position ``q_pos [M, 1]`` may attend key ``k_pos [1, N]``: the head's rule (forward
    ``i <= j``, backward ``i >= j``, strict without self; ``i != j`` without a direction and self) and padding."""
    ok = k_pos < LK
    if DIRECTIONAL:
        if INCLUDE_SELF:
            ok = ok & tl.where(forward, k_pos <= q_pos, k_pos >= q_pos)
        else:
            ok = ok & tl.where(forward, k_pos < q_pos, k_pos > q_pos)
    elif not INCLUDE_SELF:
        ok = ok & (k_pos != q_pos)
    if HAS_PAD:
        ok = ok & (tl.load(pad_row + k_pos, mask=k_pos < LK, other=1) == 0)
    return ok


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr):
    """``a @ b`` accumulated in fp32. ``WIDEN_BF16`` (only under the interpreter, whose ``tl.dot`` multiplies
    bfloat16's raw bits) converts bfloat16 operands to fp32 first: the same products, exact in fp32."""
    if WIDEN_BF16:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _kept(seed, bh, offs_m, offs_n, LQ, LK, keep):
    """The dropout mask ``D`` of ``E_R`` in the numerator: one Philox draw per (batch, head, query, key)."""
    ids = (bh * LQ + offs_m[:, None]).to(tl.int64) * LK + offs_n[None, :]
    return tl.rand(seed, ids) < keep


@triton.jit
def _weights(s, ok, m, scale, EXP: tl.constexpr):
    """``P`` from raw dot products ``s``: ``2^(s scale log2(e) - m)`` (``m`` in log2 units) or ``sigmoid(s scale)``."""
    if EXP:
        p = tl.exp2(tl.where(ok, s * (scale * LOG2E) - m[:, None], float("-inf")))
    else:
        p = tl.where(ok, tl.sigmoid(s * scale), 0.0)
    return p


@triton.jit
def _output_grads_kernel(DO, OUT, Z, DN, DZ, so_b, so_h, so_m, H, LQ, DV,
                         BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``dN = dO / Z`` and ``dZ = -dO out / Z`` (computed in fp32, 0 where ``Z = 0``, stored in the inputs'
    dtype) for one block of queries, from the output's gradient (any strides but the last), ``out`` and ``Z``."""
    bh = tl.program_id(0)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask = (offs_m < LQ)[:, None] & (offs_dv[None, :] < DV)
    tile = bh * LQ * DV + offs_m[:, None] * DV + offs_dv[None, :]
    do = tl.load(DO + bh // H * so_b + bh % H * so_h + offs_m[:, None] * so_m + offs_dv[None, :], mask=mask,
                 other=0.0)
    out = tl.load(OUT + tile, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(Z + tile, mask=mask, other=0.0)
    dn = do.to(tl.float32) / tl.where(z > 0, z, 1.0)
    tl.store(DN + tile, dn.to(DN.dtype.element_ty), mask=mask)
    tl.store(DZ + tile, tl.where(z > 0, -dn * out, 0.0).to(DZ.dtype.element_ty), mask=mask)


@triton.jit
def _load_output_grads(DN, DZ, bh, offs_m, offs_dv, rows, LQ, DV):
    """One query block's ``dN`` and ``dZ`` as ``_output_grads_kernel`` stored them."""
    mask = rows[:, None] & (offs_dv[None, :] < DV)
    tile = bh * LQ * DV + offs_m[:, None] * DV + offs_dv[None, :]
    return tl.load(DN + tile, mask=mask, other=0.0), tl.load(DZ + tile, mask=mask, other=0.0)


@triton.jit
def _load_block(X, b, h, s_b, s_h, s_n, offs, valid, offs_d, D):
    """Rows ``offs`` (0 where not ``valid``) and columns ``offs_d`` (0 from ``D`` on) of head ``h`` of batch
    element ``b`` of ``X`` (strides ``s_b, s_h, s_n``, the last dimension contiguous)."""
    return tl.load(X + b * s_b + h * s_h + offs[:, None] * s_n + offs_d[None, :],
                   mask=valid[:, None] & (offs_d[None, :] < D), other=0.0)


@triton.jit
def _program(H, n_forward, BLOCK: tl.constexpr):
    """This program's ``(batch x head)`` index, batch element, head, whether the head looks forward, and the
    first position of its block (of queries or keys, as the kernel's grid has them)."""
    bh = tl.program_id(0)
    h = bh % H
    return bh, bh // H, h, h < n_forward, tl.program_id(1) * BLOCK


@triton.jit
def _query_block(Q, b, h, sq_b, sq_h, sq_m, start_m, forward, LQ, LK, DK, offs_dk, DIRECTIONAL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A per-query-block kernel's start: the block's query indices, which of them are real, its ``q``, its queries'
    key positions ``[M, 1]`` and the range of keys to visit (a directional head skips the key blocks its rule excludes
    for the whole block: forward heads see keys up to the block's last query, backward heads from its first)."""
    offset = LK - LQ
    offs_m = start_m + tl.arange(0, BLOCK_M)
    rows = offs_m < LQ
    q = _load_block(Q, b, h, sq_b, sq_h, sq_m, offs_m, rows, offs_dk, DK)
    lo = 0
    hi = LK
    if DIRECTIONAL:
        last = tl.minimum(start_m + BLOCK_M, LQ) + offset
        fw = forward.to(tl.int32)
        lo = (1 - fw) * ((start_m + offset) // BLOCK_N * BLOCK_N)
        hi = fw * last + (1 - fw) * LK
    return offs_m, rows, q, (offs_m + offset)[:, None], lo, hi


@triton.jit
def _fwd_kernel(Q, K, ES, NV, PAD, OUT, Z, M,
                sq_b, sq_h, sq_m, sk_b, sk_h, sk_n, se_b, se_h, se_n, sv_b, sv_h, sv_n,
                H, LQ, LK, DK, DV, n_forward, seed, keep, scale, LEN_BUCKET,
                DIRECTIONAL: tl.constexpr, INCLUDE_SELF: tl.constexpr, EXP: tl.constexpr, DROPOUT: tl.constexpr,
                HAS_PAD: tl.constexpr, PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``out``, ``Z`` and the row maxima ``m`` (log2 units, 0 for rows without an allowed key or for sigmoid)
    for one query block of one (batch element, head), streaming its key blocks once."""
    bh, b, h, forward, start_m = _program(H, n_forward, BLOCK_M)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_m, rows, q, q_pos, lo, hi = _query_block(Q, b, h, sq_b, sq_h, sq_m, start_m, forward, LQ, LK, DK, offs_dk,
                                                  DIRECTIONAL, BLOCK_M, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    z = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    n = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keys = offs_n < LK
        k = _load_block(K, b, h, sk_b, sk_h, sk_n, offs_n, keys, offs_dk, DK)
        s = _dot(q, tl.trans(k), PRECISION, WIDEN_BF16)
        ok = _allowed(q_pos, offs_n[None, :], LK, forward, PAD + b * LK, DIRECTIONAL, INCLUDE_SELF, HAS_PAD)
        if EXP:  # online maximum in log2 units; rows that have seen no allowed key keep m = -inf
            s2 = tl.where(ok, s * (scale * LOG2E), float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s2, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s2 - m_safe[:, None])
            z = z * alpha[:, None]
            n = n * alpha[:, None]
            m_i = m_new
        else:
            p = _weights(s, ok, m_i, scale, EXP)
        es = _load_block(ES, b, h, se_b, se_h, se_n, offs_n, keys, offs_dv, DV)
        nv = _load_block(NV, b, h, sv_b, sv_h, sv_n, offs_n, keys, offs_dv, DV)
        z += _dot(p.to(es.dtype), es, PRECISION, WIDEN_BF16)
        if DROPOUT:
            p = tl.where(_kept(seed, bh, offs_m, offs_n, LQ, LK, keep), p / keep, 0.0)
        n += _dot(p.to(nv.dtype), nv, PRECISION, WIDEN_BF16)
    out = n / tl.where(z > 0, z, 1.0)
    tile = bh * LQ * DV + offs_m[:, None] * DV + offs_dv[None, :]
    store_mask = rows[:, None] & (offs_dv[None, :] < DV)
    tl.store(OUT + tile, out.to(OUT.dtype.element_ty), mask=store_mask)
    tl.store(Z + tile, z, mask=store_mask)
    if EXP:
        tl.store(M + bh * LQ + offs_m, tl.where(m_i == float("-inf"), 0.0, m_i), mask=rows)


@triton.jit
def _block_grads(q, k, es, nv, dn, dz, m, q_pos, offs_m, offs_n, bh, LQ, LK, forward, pad_row, seed, keep, scale,
                 DIRECTIONAL: tl.constexpr, INCLUDE_SELF: tl.constexpr, EXP: tl.constexpr, DROPOUT: tl.constexpr,
                 HAS_PAD: tl.constexpr, PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr):
    """Both backward kernels' step for one query block against one key block: ``P`` recomputed from the saved
    row maxima ``m``, ``P D / keep`` (the numerator's weights) and ``dS``."""
    s = _dot(q, tl.trans(k), PRECISION, WIDEN_BF16)
    ok = _allowed(q_pos, offs_n[None, :], LK, forward, pad_row, DIRECTIONAL, INCLUDE_SELF, HAS_PAD)
    p = _weights(s, ok, m, scale, EXP)
    dp_num = _dot(dn, tl.trans(nv), PRECISION, WIDEN_BF16)
    if DROPOUT:
        kept = _kept(seed, bh, offs_m, offs_n, LQ, LK, keep)
        p_num = tl.where(kept, p / keep, 0.0)
        dp_num = tl.where(kept, dp_num / keep, 0.0)
    else:
        p_num = p
    dp = dp_num + _dot(dz, tl.trans(es), PRECISION, WIDEN_BF16)
    ds = p * dp if EXP else p * (1.0 - p) * dp
    return p, p_num, ds


@triton.jit
def _bwd_kv_kernel(Q, K, ES, NV, PAD, M, DN, DZ, DKEY, DES, DNV, DQ,
                   sq_b, sq_h, sq_m, sk_b, sk_h, sk_n, se_b, se_h, se_n, sv_b, sv_h, sv_n,
                   H, LQ, LK, DK, DV, n_forward, seed, keep, scale, LEN_BUCKET,
                   DIRECTIONAL: tl.constexpr, INCLUDE_SELF: tl.constexpr, EXP: tl.constexpr, DROPOUT: tl.constexpr,
                   HAS_PAD: tl.constexpr, PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr, FUSED_DQ: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``dk``, ``dE_S``, ``dNV`` (and with ``FUSED_DQ`` its shares of ``dq``) for one key block of one (batch
    element, head)."""
    bh, b, h, forward, start_n = _program(H, n_forward, BLOCK_N)
    offset = LK - LQ
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    keys = offs_n < LK
    k = _load_block(K, b, h, sk_b, sk_h, sk_n, offs_n, keys, offs_dk, DK)
    es = _load_block(ES, b, h, se_b, se_h, se_n, offs_n, keys, offs_dv, DV)
    nv = _load_block(NV, b, h, sv_b, sv_h, sv_n, offs_n, keys, offs_dv, DV)
    lo = 0
    hi = LQ
    if DIRECTIONAL:  # forward heads: queries from the block's first key on; backward: up to its last key
        fw = forward.to(tl.int32)
        lo = fw * (tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M)
        hi = fw * LQ + (1 - fw) * tl.minimum(tl.maximum(start_n + BLOCK_N - offset, 0), LQ)
    dkey = tl.zeros([BLOCK_N, BLOCK_DK], tl.float32)
    des = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    dnv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m < LQ
        q = _load_block(Q, b, h, sq_b, sq_h, sq_m, offs_m, rows, offs_dk, DK)
        dn, dz = _load_output_grads(DN, DZ, bh, offs_m, offs_dv, rows, LQ, DV)
        m = tl.load(M + bh * LQ + offs_m, mask=rows, other=0.0)
        p, p_num, ds = _block_grads(q, k, es, nv, dn, dz, m, (offs_m + offset)[:, None], offs_m, offs_n, bh, LQ, LK,
                                    forward, PAD + b * LK, seed, keep, scale, DIRECTIONAL, INCLUDE_SELF, EXP,
                                    DROPOUT, HAS_PAD, PRECISION, WIDEN_BF16)
        dnv += _dot(tl.trans(p_num).to(nv.dtype), dn, PRECISION, WIDEN_BF16)
        des += _dot(tl.trans(p).to(es.dtype), dz, PRECISION, WIDEN_BF16)
        dkey += _dot(tl.trans(ds).to(q.dtype), q, PRECISION, WIDEN_BF16)
        if FUSED_DQ:  # this key block's share of dq, summed over the key blocks in fp32 (order not fixed)
            tl.atomic_add(DQ + bh * LQ * DK + offs_m[:, None] * DK + offs_dk[None, :],
                          _dot(ds.to(k.dtype), k, PRECISION, WIDEN_BF16) * scale,
                          mask=rows[:, None] & (offs_dk[None, :] < DK), sem="relaxed")
    tile_k = bh * LK * DK + offs_n[:, None] * DK + offs_dk[None, :]
    tile_v = bh * LK * DV + offs_n[:, None] * DV + offs_dv[None, :]
    value_mask = keys[:, None] & (offs_dv[None, :] < DV)
    tl.store(DKEY + tile_k, (dkey * scale).to(DKEY.dtype.element_ty), mask=keys[:, None] & (offs_dk[None, :] < DK))
    tl.store(DES + tile_v, des.to(DES.dtype.element_ty), mask=value_mask)
    tl.store(DNV + tile_v, dnv.to(DNV.dtype.element_ty), mask=value_mask)


@triton.jit
def _bwd_q_kernel(Q, K, ES, NV, PAD, M, DN, DZ, DQ,
                  sq_b, sq_h, sq_m, sk_b, sk_h, sk_n, se_b, se_h, se_n, sv_b, sv_h, sv_n,
                  H, LQ, LK, DK, DV, n_forward, seed, keep, scale, LEN_BUCKET,
                  DIRECTIONAL: tl.constexpr, INCLUDE_SELF: tl.constexpr, EXP: tl.constexpr, DROPOUT: tl.constexpr,
                  HAS_PAD: tl.constexpr, PRECISION: tl.constexpr, WIDEN_BF16: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``dq`` for one query block of one (batch element, head), over the key blocks in a fixed order."""
    bh, b, h, forward, start_m = _program(H, n_forward, BLOCK_M)
    offs_dk = tl.arange(0, BLOCK_DK)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_m, rows, q, q_pos, lo, hi = _query_block(Q, b, h, sq_b, sq_h, sq_m, start_m, forward, LQ, LK, DK, offs_dk,
                                                  DIRECTIONAL, BLOCK_M, BLOCK_N)
    dn, dz = _load_output_grads(DN, DZ, bh, offs_m, offs_dv, rows, LQ, DV)
    m = tl.load(M + bh * LQ + offs_m, mask=rows, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_DK], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keys = offs_n < LK
        k = _load_block(K, b, h, sk_b, sk_h, sk_n, offs_n, keys, offs_dk, DK)
        es = _load_block(ES, b, h, se_b, se_h, se_n, offs_n, keys, offs_dv, DV)
        nv = _load_block(NV, b, h, sv_b, sv_h, sv_n, offs_n, keys, offs_dv, DV)
        _, _, ds = _block_grads(q, k, es, nv, dn, dz, m, q_pos, offs_m, offs_n, bh, LQ, LK, forward, PAD + b * LK,
                                seed, keep, scale, DIRECTIONAL, INCLUDE_SELF, EXP, DROPOUT, HAS_PAD, PRECISION,
                                WIDEN_BF16)
        dq += _dot(ds.to(k.dtype), k, PRECISION, WIDEN_BF16)
    tl.store(DQ + bh * LQ * DK + offs_m[:, None] * DK + offs_dk[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=rows[:, None] & (offs_dk[None, :] < DK))


# ---------------------------------------------------------------------------------------------------------------
# Launchers: buffers, grids, tiles (autotuned on CUDA), strides and flags for the kernels above.

# CUDA tiles tried by autotuning: (BLOCK_M, BLOCK_N, num_warps, num_stages); the first two were the fixed choices
# before tuning (64 x 64 for head widths up to 64, 32 x 32 above). Heads wider than 64 keep tiles of at most 64.
_TILES = ((64, 64, 4, 2), (32, 32, 4, 2), (128, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 3), (64, 128, 8, 3),
          (128, 32, 4, 3), (32, 128, 4, 3), (64, 32, 4, 3), (32, 64, 4, 3))
# one tuning per length bucket (the next power of two), head widths, masks, dropout and dtypes (added by Triton)
_TUNING_KEY = ["LEN_BUCKET", "BLOCK_DK", "BLOCK_DV", "DIRECTIONAL", "INCLUDE_SELF", "EXP", "DROPOUT", "HAS_PAD",
               "FUSED_DQ"]


def _fitting_tiles(configs: list, named_args: dict, **kwargs) -> list:
    """Autotuning's pruning: heads wider than 64 only try tiles of at most 64 x 64."""
    if max(kwargs["BLOCK_DK"], kwargs["BLOCK_DV"]) <= 64:
        return configs
    return [c for c in configs if max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) <= 64]


def _tuned(kernel: triton.JITFunction, reset_to_zero: list[str] | None = None):
    """``kernel`` autotuned over ``_TILES`` on CUDA; as it is under the interpreter (``_config``'s tiles)."""
    if INTERPRETED:
        return kernel
    configs = [triton.Config(dict(BLOCK_M=m, BLOCK_N=n), num_warps=w, num_stages=st) for m, n, w, st in _TILES]
    key = [name for name in _TUNING_KEY if name in kernel.arg_names]
    return triton.autotune(configs, key=key, prune_configs_by=dict(early_config_prune=_fitting_tiles),
                           reset_to_zero=reset_to_zero)(kernel)


_FWD = _tuned(_fwd_kernel)
_BWD_KV = _tuned(_bwd_kv_kernel, reset_to_zero=["DQ"])  # DQ accumulates atomically: zeroed before each trial
_BWD_Q = _tuned(_bwd_q_kernel)


def _config(d_k: int, d_v: int) -> dict:
    """Head-width blocks, and under the interpreter fixed 16 x 16 tiles (on CUDA autotuning picks the tiles)."""
    dims = dict(BLOCK_DK=max(16, triton.next_power_of_2(d_k)), BLOCK_DV=max(16, triton.next_power_of_2(d_v)))
    return dict(BLOCK_M=16, BLOCK_N=16, **dims) if INTERPRETED else dims


def _grid(batch_heads: int, length: int, block: str):
    return lambda meta: (batch_heads, triton.cdiv(length, meta[block]))


def _strides(*tensors: Tensor) -> list[int]:
    return [s for t in tensors for s in t.stride()[:3]]


def _last_dim_contiguous(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class _LaunchState(NamedTuple):
    """What the backward's launches reuse from the forward's."""

    strides: list[int]  # of q, k, E_S and NV
    scalars: tuple  # heads, lengths, head widths, n_forward, dropout seed, keep, scale, length bucket
    flags: dict[str, object]  # the kernels' masks, dropout and precision switches
    config: dict[str, int]  # head-width blocks (and the tiles under the interpreter)


def _kernel_inputs(q: Tensor, k: Tensor, e_s: Tensor, num_values: Tensor,
                   pad: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The tensors the kernels read: ``q, k, E_S, NV`` with a contiguous last dimension and the key padding mask
    as uint8 (one unread element without padding)."""
    q, k, e_s, num_values = (_last_dim_contiguous(t) for t in (q, k, e_s, num_values))
    pad_u8 = torch.zeros(1, dtype=torch.uint8, device=q.device) if pad is None else pad.to(torch.uint8).contiguous()
    return q, k, e_s, num_values, pad_u8


def _launch_forward(q: Tensor, k: Tensor, e_s: Tensor, num_values: Tensor, pad_u8: Tensor, has_pad: bool,
                    n_forward: int, directional: bool, include_self: bool, exp: bool,
                    keep: float) -> tuple[Tensor, Tensor, Tensor, _LaunchState]:
    """``out``, ``Z`` (fp32) and the row maxima ``m`` (fp32, log2 units; 0 for sigmoid) of the forward kernel
    for ``_kernel_inputs``' tensors, with what the backward's launches reuse; draws the dropout seed from
    torch's generator when ``keep < 1``."""
    batch, heads, q_len, d_k = q.shape
    k_len, d_v = k.shape[2], e_s.shape[-1]
    dropout = keep < 1.0
    seed = int(torch.randint(0, 2**31 - 1, ())) if dropout else 0
    out = q.new_empty(batch, heads, q_len, d_v)
    z = torch.empty(batch, heads, q_len, d_v, dtype=torch.float32, device=q.device)
    m = torch.zeros(batch, heads, q_len, dtype=torch.float32, device=q.device)
    state = _LaunchState(
        strides=_strides(q, k, e_s, num_values),
        scalars=(heads, q_len, k_len, d_k, d_v, n_forward, seed, keep, 1.0 / math.sqrt(d_k),
                 triton.next_power_of_2(max(q_len, k_len))),
        flags=dict(DIRECTIONAL=directional, INCLUDE_SELF=include_self, EXP=exp, DROPOUT=dropout, HAS_PAD=has_pad,
                   PRECISION="ieee" if q.dtype == torch.float32 else None,
                   WIDEN_BF16=INTERPRETED and q.dtype == torch.bfloat16),
        config=_config(d_k, d_v),
    )
    _FWD[_grid(batch * heads, q_len, "BLOCK_M")](q, k, e_s, num_values, pad_u8, out, z, m, *state.strides,
                                                 *state.scalars, **state.flags, **state.config)
    return out, z, m, state


def _launch_backward(q: Tensor, k: Tensor, e_s: Tensor, num_values: Tensor, pad_u8: Tensor, out: Tensor, z: Tensor,
                     m: Tensor, grad_out: Tensor, state: _LaunchState) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients ``(dq, dk, dE_S, dNV)`` from the output's gradient and what ``_launch_forward`` took and
    gave: ``dN`` and ``dZ`` first, then the per-key-block kernel with dq summed atomically into an fp32 buffer
    (one pass, in an order that varies), or under torch's deterministic mode the per-key-block kernel without
    dq and a per-query-block kernel for dq (recomputing ``P``, in a fixed order)."""
    grad_out = _last_dim_contiguous(grad_out)  # any other strides (a caller's permute) are read as they are
    batch, heads, q_len, _ = q.shape
    k_len, d_v = k.shape[2], e_s.shape[-1]
    dn, dz = (torch.empty(batch, heads, q_len, d_v, dtype=q.dtype, device=q.device) for _ in range(2))
    block = state.config.get("BLOCK_M", 64)
    _output_grads_kernel[(batch * heads, triton.cdiv(q_len, block))](
        grad_out, out, z, dn, dz, *_strides(grad_out), heads, q_len, d_v, BLOCK_M=block,
        BLOCK_DV=state.config["BLOCK_DV"])
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    des = torch.empty(e_s.shape, dtype=e_s.dtype, device=e_s.device)
    dnv = torch.empty(num_values.shape, dtype=num_values.dtype, device=num_values.device)
    inputs = (q, k, e_s, num_values, pad_u8, m, dn, dz)
    launch = (*state.strides, *state.scalars)
    fused = not torch.are_deterministic_algorithms_enabled()
    dq = torch.zeros(q.shape, dtype=torch.float32 if fused else q.dtype, device=q.device)  # contiguous
    _BWD_KV[_grid(batch * heads, k_len, "BLOCK_N")](*inputs, dk, des, dnv, dq, *launch, **state.flags,
                                                    FUSED_DQ=fused, **state.config)
    if not fused:
        _BWD_Q[_grid(batch * heads, q_len, "BLOCK_M")](*inputs, dq, *launch, **state.flags, **state.config)
    return dq.to(q.dtype), dk, des, dnv


# ---------------------------------------------------------------------------------------------------------------
# The autograd Function and the public entry.
class _MTSAFunction(torch.autograd.Function):
    """The fused forward and backward kernels; returns ``(out, Z)`` with ``Z`` not differentiable."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, e_s: Tensor, num_values: Tensor, pad: Tensor | None, n_forward: int,
                directional: bool, include_self: bool, exp: bool, keep: float) -> tuple[Tensor, Tensor]:
        inputs = _kernel_inputs(q, k, e_s, num_values, pad)
        out, z, m, ctx.launch = _launch_forward(*inputs, pad is not None, n_forward, directional, include_self,
                                                exp, keep)
        ctx.save_for_backward(*inputs, out, z, m)
        ctx.mark_non_differentiable(z)
        return out, z

    @staticmethod
    def backward(ctx, grad_out: Tensor, _grad_z: Tensor | None) -> tuple[Tensor | None, ...]:
        return *_launch_backward(*ctx.saved_tensors, grad_out, ctx.launch), None, None, None, None, None, None


def mtsa_triton(
    q: Tensor, k: Tensor, e_s: Tensor, num_values: Tensor, key_padding_mask: Tensor | None,
    direction: str | None, include_self: bool, token2token: str, keep: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """``(out, Z)`` of the fused kernel (docs/kernel.md) for ``q [B, H, L_q, d_k]``, ``k [B, H, L, d_k]``, ``e_s``
    (``E_S``, undropped) and ``num_values`` (``v * E_S'``), both ``[B, H, L, d_v]``; ``direction`` as
    :func:`~.mtsa_core.mtsa_core`'s; ``keep < 1`` drops ``E_R`` in the numerator with that keep probability. ``Z``
    (fp32) is the denominator relative to the row maximum (exp) or as is (sigmoid)."""
    if q.dtype not in TRITON_DTYPES or {k.dtype, e_s.dtype, num_values.dtype} != {q.dtype}:
        raise ValueError(f"the Triton kernel takes fp16, bf16 or fp32 inputs of one dtype, got {q.dtype}")
    heads = q.shape[1]
    n_forward = {None: heads, "forward": heads, "backward": 0, "bi": heads // 2}[direction]
    return _MTSAFunction.apply(q, k, e_s, num_values, key_padding_mask, n_forward, direction is not None,
                               include_self, token2token == "exp", keep)
