"""The multi-mask tensorized self-attention (MTSA) core, as a pure function over per-head tensors.

Semantics follow the authors' code (docs/reference.md §1.2, §2.2, §6 and §8). For a batch element and head, query
``j``, key ``i`` and feature ``l``::

    E_R[j, i] = exp(q_j . k_i / sqrt(d_k))      (token2token="exp", the NMT experiments)
              | sigmoid(q_j . k_i / sqrt(d_k))  (token2token="sigmoid", the sentence encoders)
    E_R[j, i] = 0 where key i is padding or the positional mask forbids (j, i)
    Z[j, l]   = sum_i E_R[j, i] * E_S[i, l]                   (never dropped)
    N[j, l]   = sum_i E_R'[j, i] * E_S'[i, l] * v[i, l]
    out[j, l] = N[j, l] / (Z[j, l] if Z[j, l] > 0 else 1)

``E_R'`` and ``E_S'`` are independent inverted dropouts with keep probability ``sqrt(1 - p)`` (reference §1.2
step 6, §8.3). This equals the feature-wise softmax of the paper's equations (10)-(12): ``out[j, l] = sum_i
P[j, i, l] v[i, l]`` with ``P[j, i, l] ∝ E_R[j, i] E_S[i, l]``. ``E_S`` may come as the source2token logits ``S``
(``s2t_activation="exp"`` or ``"sigmoid"``); ``exp(S)`` is then shifted by its maximum over real keys per (batch,
head, feature), a constant that cancels (reference §8.4).

Every kernel computes these values and is tested against the float64 references (reference §8.2): ``"sdpa"``,
``"sdpa-joint"``, ``"dense"`` (for exp SDPA's products by matrix products), ``"flex"``, ``"triton"``
(:mod:`.mtsa_triton`) and, under TorchScript, :func:`mtsa_core_scripted`; the output has the inputs' dtype. What
each computes, which runs when, the log-space recomputation of rows whose products underflow, and export:
docs/kernel.md.

Rows with no allowed key (strict masks at sequence ends, all-padding sequences) return 0, never NaN. Padded
*queries* are not masked (as in the NMT code); callers zero them when they need to.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .per_head import stable_exp

DIRECTIONS = (None, "bi", "forward", "backward")
TOKEN2TOKEN = ("exp", "sigmoid")
KERNELS = ("auto", "sdpa", "sdpa-joint", "dense", "flex", "triton")
EXP_KERNELS = tuple(k for k in KERNELS if k != "flex")  # those of token2token="exp" (flex: sigmoid only)
E_S_ACTIVATIONS = (None, "exp", "sigmoid")  # E_S from s2t: as given, exp(S) or sigmoid(S)
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FLEX_MIN_WIDTH = 16  # the smallest q/k/v head width compiled FlexAttention takes
# Upper bound on the elements of one query chunk's mask / score tensor ([B, H, chunk, L]; DiSA's [B, chunk, L, d])
CHUNK_ELEMENTS = 1 << 24


def head_directions(num_heads: int, direction: str | None) -> list[tuple[slice, str | None]]:
    """Split heads into groups sharing one positional rule: ``"bi"`` gives the first half
    ``"forward"`` and the second half ``"backward"`` (reference §1.2 step 2, §2.4)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if direction == "bi":
        if num_heads % 2:
            raise ValueError(
                f"direction='bi' needs an even number of heads (forward and backward halves), got {num_heads}"
            )
        half = num_heads // 2
        return [(slice(0, half), "forward"), (slice(half, num_heads), "backward")]
    return [(slice(0, num_heads), direction)]


def positional_mask(j: Tensor, i: Tensor, direction: str | None, include_self: bool) -> Tensor | None:
    """Element-wise ``allowed[j, i]`` for broadcastable query positions ``j`` and key positions ``i``
    (reference §6): forward ``i <= j`` (``i < j`` without self), backward ``i >= j`` (``i > j``),
    no direction ``i != j`` without self. ``None`` means every pair is allowed."""
    if direction is not None:  # (TorchScript compares an optional string only once it is known not to be None)
        if direction == "forward":
            return i <= j if include_self else i < j
        if direction == "backward":
            return i >= j if include_self else i > j
    return None if include_self else i != j


def has_allowed_key(key_padding_mask: Tensor | None, batch: int, length: int, direction: str | None,
                    include_self: bool, device: torch.device | None = None) -> Tensor:
    """``[B, L]``: whether query j has at least one allowed key, counted in O(L) with cumulative sums."""
    real = (
        torch.ones(batch, length, dtype=torch.long, device=device)
        if key_padding_mask is None
        else (~key_padding_mask).long()
    )
    if direction == "forward":
        count = real.cumsum(-1)
    elif direction == "backward":
        count = real.flip(-1).cumsum(-1).flip(-1)
    else:
        count = real.sum(-1, keepdim=True).expand(batch, length)
    return (count if include_self else count - real) > 0


def allowed_mask(key_padding_mask: Tensor | None, batch: int, num_heads: int, length: int, direction: str | None = None,
                 include_self: bool = True, device: torch.device | None = None) -> Tensor:
    """The full boolean ``[B, H, L, L]`` mask (True = query j may attend key i). For references and tests;
    :func:`mtsa_core` never builds it."""
    pos = torch.arange(length, device=device)
    mask = torch.ones(batch, num_heads, length, length, dtype=torch.bool, device=device)
    for heads, mode in head_directions(num_heads, direction):
        rule = positional_mask(pos[:, None], pos[None, :], mode, include_self)
        if rule is not None:
            mask[:, heads] &= rule
    if key_padding_mask is not None:
        mask &= ~key_padding_mask[:, None, None, :].to(device=mask.device)
    return mask


class SharedPass:
    """What the :func:`mtsa_core` calls of one encoder pass share when given as ``shared``: the SDPA mask of the
    pass's key padding mask, built once, and every call's denominators, which :meth:`first_underflowed` checks for
    underflow after the pass with one host read, where each call on its own would read once (docs/kernel.md).
    ``every_row_has_key``: the caller knows that no sequence is padding only (no row to zero)."""

    def __init__(self, every_row_has_key: bool = False) -> None:
        self.dens: list[Tensor] = []
        self.every_row_has_key = every_row_has_key
        self._mask: tuple[Tensor, torch.dtype, tuple[Tensor, Tensor | None]] | None = None

    def key_bias(self, key_padding_mask: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
        """:func:`_key_bias` of the key padding alone, built once per mask tensor and dtype."""
        if self._mask is None or self._mask[0] is not key_padding_mask or self._mask[1] != dtype:
            keys = ~key_padding_mask[:, None, None, :]
            bias = (_additive_mask(keys, dtype), None) if self.every_row_has_key else _key_bias(keys, dtype)
            self._mask = (key_padding_mask, dtype, bias)
        return self._mask[2]

    def first_underflowed(self) -> int | None:
        """The index of the first call whose linear-space products underflowed (its rows must be computed again
        without ``shared``), or None: one host read, two when a call underflowed."""
        if not self.dens:
            return None
        small = torch.stack([den.amin() < _sqrt_tiny(den.dtype) if den.numel() else den.new_zeros((), dtype=torch.bool)
                             for den in self.dens])
        return int(small.int().argmax()) if bool(small.any()) else None


class _Call(NamedTuple):
    """The masks and settings of one :func:`mtsa_core` call, which its helpers share."""

    key_padding_mask: Tensor | None
    groups: tuple[tuple[slice, str | None], ...]  # head_directions
    include_self: bool
    token2token: str
    s2t_activation: str | None
    scale: float
    keep: float  # of E_R and E_S in the numerator; 1 without dropout
    shared: SharedPass | None


def _query_chunks(batch: int, heads: int, q_len: int, k_len: int, mode: str | None,
                  chunk: int | None) -> Iterator[tuple[int, int, int, int]]:
    """Yield ``(q_start, q_end, k_start, k_end)``: query chunks and the key window they can see.
    Queries sit at key positions ``k_len - q_len ...`` (incremental decoding appends them last)."""
    size = chunk or max(1, CHUNK_ELEMENTS // max(1, batch * heads * k_len))
    offset = k_len - q_len
    for start in range(0, q_len, size):
        end = min(q_len, start + size)
        if mode == "forward":
            yield start, end, 0, offset + end
        elif mode == "backward":
            yield start, end, offset + start, k_len
        else:
            yield start, end, 0, k_len


@functools.cache
def _compiled_flex():  # pragma: no cover - needs a GPU
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def triton_available() -> bool:
    """Whether the ``triton`` package is installed (``pip install mtsa-fairseq[triton]``), without importing it."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # ValueError: a module entry without a spec (e.g. blocked as None)
        return False


_OTHER_KERNEL = ("; every kernel gives the same values, so choose another: for a checkpoint trained with "
                 "--mtsa-kernel triton, fairseq-generate or mtsa-score --model-overrides \"{'mtsa_kernel': 'auto'}\"")


def _choose_kernel(kernel: str, token2token: str, q: Tensor, k_len: int, dropout_active: bool) -> str:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "triton":
        if not triton_available():
            raise ValueError("kernel='triton' needs the triton package: pip install mtsa-fairseq[triton]"
                             + _OTHER_KERNEL)
        if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("kernel='triton' runs on CUDA tensors (on CPU only under TRITON_INTERPRET=1)"
                             + _OTHER_KERNEL)
        if q.dtype not in TRITON_DTYPES:
            raise ValueError(f"kernel='triton' takes float16, bfloat16 or float32 inputs, got {q.dtype}")
        return "triton"
    if kernel == "auto" and token2token == "sigmoid" and q.is_cuda and q.dtype in TRITON_DTYPES and triton_available():
        return "triton"  # for exp, two SDPA calls were faster and leaner on an H100 (docs/kernel.md)
    if token2token == "exp":
        if kernel == "flex":
            raise ValueError("kernel='flex' is for token2token='sigmoid'; the exp path uses SDPA")
        if kernel == "sdpa-joint" and dropout_active:
            raise ValueError("kernel='sdpa-joint' has no attention dropout (N needs its own dropped probabilities); "
                             "use kernel='sdpa' when training with dropout")
        if kernel == "auto" and _dense_is_faster(q, k_len):
            return "dense"
        return kernel if kernel in ("dense", "sdpa-joint") else "sdpa"
    if kernel in ("sdpa", "sdpa-joint"):
        raise ValueError("token2token='sigmoid' is not an exp form: plain SDPA cannot compute it")
    if kernel == "flex" and dropout_active:
        raise ValueError("kernel='flex' has no attention dropout; use kernel='dense' when training with dropout")
    if kernel == "flex" and importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        raise ValueError("kernel='flex' needs torch.nn.attention.flex_attention (torch >= 2.5)")
    if kernel == "flex" and q.is_cuda and q.dtype == torch.float64:
        raise ValueError("kernel='flex' on CUDA takes float16, bfloat16 or float32 (compiled flex has no float64)")
    return "dense" if kernel == "auto" else kernel


def _dense_is_faster(q: Tensor, k_len: int) -> bool:
    """Whether ``"auto"`` gives exp ``"dense"``: on CPU tensors in float32 or float64 with keys up to 256 and
    at least 2**16 scores, where one softmax and one product over the joined values took 0.68-0.86x the time of
    the two flash SDPA calls (docs/kernel.md, "Which kernel runs when"); eager only."""
    if not q.is_cpu or q.dtype not in (torch.float32, torch.float64):
        return False
    batch, heads, q_len, _ = q.shape
    return k_len <= 256 and batch * heads * q_len * k_len >= 1 << 16 and not torch.compiler.is_compiling()


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, s2t: Tensor, key_padding_mask: Tensor | None) -> None:
    qs, ks, vs = q.shape, k.shape, v.shape
    if len(qs) != 4 or len(ks) != 4 or ks[0] != qs[0] or ks[1] != qs[1] or ks[3] != qs[3]:
        raise ValueError(f"q and k must be [B, H, L_q, d_k] and [B, H, L, d_k], got {tuple(qs)} and {tuple(ks)}")
    if qs[2] > ks[2]:
        raise ValueError(f"more queries than keys: L_q = {qs[2]} > L = {ks[2]}")
    if len(vs) != 4 or vs[0] != ks[0] or vs[1] != ks[1] or vs[2] != ks[2] or s2t.shape != vs:
        raise ValueError(
            f"v and s2t must both be [B, H, L, d_v] matching k, got {tuple(vs)} and {tuple(s2t.shape)}"
        )
    if key_padding_mask is not None and (key_padding_mask.dtype != torch.bool
                                         or key_padding_mask.shape != (ks[0], ks[2])):
        raise ValueError(
            f"key_padding_mask must be bool [B, L] = {(ks[0], ks[2])}, "
            f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )


@functools.lru_cache(maxsize=256)
def _settings(num_heads: int, d_k: int, direction: str | None, token2token: str, s2t_activation: str | None,
              dropout_p: float, training: bool) -> tuple[tuple[tuple[slice, str | None], ...], float, float, bool]:
    """The checked options of a :func:`mtsa_core` call: ``(head_directions, scale, keep, dropout_active)``, computed
    once per distinct call (a lookup costs less host time than the checks it replaces)."""
    if token2token not in TOKEN2TOKEN:
        raise ValueError(f"token2token must be one of {TOKEN2TOKEN}, got {token2token!r}")
    if s2t_activation not in E_S_ACTIVATIONS:
        raise ValueError(f"s2t_activation must be one of {E_S_ACTIVATIONS}, got {s2t_activation!r}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    dropout_active = training and dropout_p > 0.0
    return (tuple(head_directions(num_heads, direction)), 1.0 / math.sqrt(d_k),
            math.sqrt(1.0 - dropout_p) if dropout_active else 1.0, dropout_active)


def _source2token_weights(s2t: Tensor, s2t_activation: str | None, key_padding_mask: Tensor | None) -> Tensor:
    """``E_S`` as the linear-space kernels take it: as given, ``sigmoid(S)``, or ``exp(S)`` shifted by the
    maximum over real keys per (batch, head, feature) (reference §8.4)."""
    if s2t_activation is not None:  # refined for TorchScript (positional_mask)
        if s2t_activation == "exp":
            return stable_exp(s2t, key_padding_mask)
        if s2t_activation == "sigmoid":
            return torch.sigmoid(s2t)
    return s2t


def _log_weights(s2t: Tensor, s2t_activation: str | None) -> Tensor:
    """``log E_S`` (``-inf`` where ``E_S`` is 0) from the weights or the logits."""
    if s2t_activation is not None:  # refined for TorchScript (positional_mask)
        if s2t_activation == "exp":
            return s2t
        if s2t_activation == "sigmoid":
            return F.logsigmoid(s2t)
    positive = s2t > 0
    return torch.log(torch.where(positive, s2t, torch.ones_like(s2t))).masked_fill(~positive, float("-inf"))


def _sqrt_tiny(dtype: torch.dtype) -> float:
    """``sqrt(torch.finfo(dtype).tiny)`` (TorchScript has no ``finfo``), below which a denominator's row is recomputed
    in log space (docs/kernel.md, "Large activations"): 2^-7 (float16), 2^-511 (float64), 2^-63 (float32 and bfloat16,
    which share 8 exponent bits)."""
    if dtype == torch.float16:
        return 2.0 ** -7
    if dtype == torch.float64:
        return 2.0 ** -511
    return 2.0 ** -63


def mtsa_core(
    q: Tensor, k: Tensor, v: Tensor, s2t: Tensor, key_padding_mask: Tensor | None = None, direction: str | None = None,
    include_self: bool = True, token2token: str = "exp", dropout_p: float = 0.0, training: bool = False,
    kernel: str = "auto", query_chunk_size: int | None = None, s2t_activation: str | None = None,
    shared: SharedPass | None = None,
) -> Tensor:
    """Multi-mask tensorized self-attention over per-head tensors (see the module docstring).

    Args:
        q, k: ``[B, H, L_q, d_k]`` and ``[B, H, L, d_k]``, unscaled (``1/sqrt(d_k)`` is applied here). ``L_q < L``
            is incremental decoding: the queries are the last ``L_q`` positions.
        v, s2t: ``[B, H, L, d_v]``; ``s2t`` holds the source2token weights ``E_S`` (non-negative, query-independent,
            possibly rescaled per (batch, head, feature): reference §8.4), or their logits ``S`` when
            ``s2t_activation`` is given.
        key_padding_mask: bool ``[B, L]``, True at padding keys.
        direction: None, ``"bi"`` (first H/2 heads forward, last H/2 backward), ``"forward"`` or ``"backward"``
            (all heads).
        include_self: whether query j may attend key j; without it and with ``direction=None`` only the diagonal
            is excluded.
        token2token: ``"exp"`` or ``"sigmoid"`` activation of the scaled dot products.
        dropout_p: attention dropout ``p``; ``E_R`` and ``E_S`` each keep ``sqrt(1 - p)`` in the numerator only,
            and only when ``training``.
        kernel: ``"auto"`` (``"sdpa"`` for exp, ``"dense"`` for float32 or float64 CPU tensors of at least 2**16
            scores with keys up to 256; for sigmoid ``"triton"`` on CUDA tensors when Triton is installed,
            else ``"dense"``) or one of the module docstring's kernels (``"triton"`` on CPU tensors only under
            ``TRITON_INTERPRET=1``).
        query_chunk_size: queries per chunk where masks or scores are materialised (default: keep each chunk's
            ``[B, H, chunk, L]`` tensor under 2**24 elements).
        s2t_activation: None (``s2t`` is ``E_S``), ``"exp"`` (``E_S = exp(S)``) or ``"sigmoid"`` (``E_S =
            sigmoid(S)``); with the logits, rows whose linear-space weights underflow are recomputed from ``log
            E_S`` itself.
        shared: a :class:`SharedPass` for all calls of one encoder pass: the call reads nothing on the host and
            adds its denominators to ``shared``; the caller must call it again without ``shared`` when
            ``shared.first_underflowed()`` names it (it then returned values only where nothing underflowed).

    Returns:
        ``[B, H, L_q, d_v]``; rows with no allowed key are 0.
    """
    _check_inputs(q, k, v, s2t, key_padding_mask)
    options = (q.shape[1], q.shape[3], direction, token2token, s2t_activation, dropout_p, training)
    try:
        groups, scale, keep, dropout_active = _settings(*options)
    except TypeError:  # an unhashable option (a list, say): the checks' own error, uncached
        groups, scale, keep, dropout_active = _settings.__wrapped__(*options)
    use = _choose_kernel(kernel, token2token, q, k.shape[2], dropout_active)
    if use == "flex" and q.shape[2] != k.shape[2]:
        raise ValueError("kernel='flex' needs as many queries as keys (no incremental decoding)")
    call = _Call(key_padding_mask, groups, include_self, token2token, s2t_activation, scale, keep, shared)

    e_s = _source2token_weights(s2t, s2t_activation, key_padding_mask)
    num_values, s2t_kept = _numerator_values(v, e_s, call.keep)
    if use == "triton":
        from .mtsa_triton import mtsa_triton

        out, den = mtsa_triton(q, k, e_s, num_values, key_padding_mask, direction, include_self, token2token, call.keep)
    elif use == "flex":
        out, den = _flex_sigmoid(q, k, num_values, e_s, call)
    else:
        out, den = _chunked(q, k, num_values, e_s, call, use, query_chunk_size)
    if torch.compiler.is_compiling():
        return _recompute_in_graph(out, den, q, k, v, s2t, s2t_kept, call)
    if shared is not None:  # rows without a key: SDPA's see every key, the other kernels' do not count
        lean = token2token == "exp" and use != "triton"
        shared.dens.append(den if lean else den.masked_fill(~_rows_with_keys(q, k.shape[2], call)[..., None], 1.0))
        return out
    if den.numel() == 0 or float(den.detach().amin()) >= _sqrt_tiny(q.dtype):  # one reduction, one synchronisation
        return out
    small = (den < _sqrt_tiny(q.dtype)).any(dim=-1)
    small &= _rows_with_keys(q, k.shape[2], call)
    rows = small.nonzero()
    if len(rows) == 0:
        return out
    values = v if s2t_kept is None else v * s2t_kept / call.keep
    return out.index_put(tuple(rows.T), _in_row_chunks(rows, q, k, values, s2t, call).to(out.dtype))


def _numerator_values(v: Tensor, e_s: Tensor, keep: float) -> tuple[Tensor, Tensor | None]:
    """``v * E_S'`` and the mask ``s2t_kept`` of ``E_S' = E_S * s2t_kept / keep`` (None without dropout, ``keep``
    1): one mask for all query chunks, kept for the rows recomputed in log space."""
    if keep == 1.0:
        return v * e_s, None
    e_s_kept, s2t_kept = torch.native_dropout(e_s, 1.0 - keep, True)  # one kernel for both
    return v * e_s_kept, s2t_kept


def _recompute_in_graph(out: Tensor, den: Tensor, q: Tensor, k: Tensor, v: Tensor, s2t: Tensor,
                        s2t_kept: Tensor | None, call: _Call) -> Tensor:
    """The log-space recomputation of underflowed rows in a compiled graph (docs/kernel.md, "Export"): a
    ``torch.cond`` whose branch recomputes every row, the underflowed ones with an allowed key taking the result."""
    small = (den < _sqrt_tiny(q.dtype)).any(dim=-1) & _rows_with_keys(q, k.shape[2], call)

    def recompute(q: Tensor, k: Tensor, v: Tensor, s2t: Tensor) -> Tensor:
        values = v if s2t_kept is None else v * s2t_kept / call.keep
        rows = torch.cartesian_prod(*(torch.arange(n, device=q.device) for n in out.shape[:3]))
        return _in_row_chunks(rows, q, k, values, s2t, call, checkpointed=False).view(out.shape).to(out.dtype)

    def none_underflowed(q: Tensor, k: Tensor, v: Tensor, s2t: Tensor) -> Tensor:
        return out.new_zeros(out.shape)

    # contiguous operands: both branches' gradients must have the same strides
    new = torch.cond(small.any(), recompute, none_underflowed, tuple(t.contiguous() for t in (q, k, v, s2t)))
    return torch.where(small[..., None], new, out)


def mtsa_core_scripted(q: Tensor, k: Tensor, v: Tensor, s2t: Tensor, key_padding_mask: Tensor | None = None,
                       direction: str | None = None, dropout_p: float = 0.0, training: bool = False,
                       s2t_activation: str | None = None) -> Tensor:
    """:func:`mtsa_core` with ``token2token="exp"`` and ``include_self`` (the NMT modules' form) in operations that
    TorchScript compiles (docs/kernel.md, "Export"): one SDPA pair over the whole ``[B or 1, H or 1, L_q, L]`` mask,
    underflowed rows recomputed in log space (not checkpointed). Same values as :func:`mtsa_core` up to rounding."""
    batch, num_heads, q_len, d_k = q.shape
    k_len = k.shape[2]
    keep = math.sqrt(1.0 - dropout_p) if training and dropout_p > 0.0 else 1.0
    scale = 1.0 / math.sqrt(d_k)
    e_s = _source2token_weights(s2t, s2t_activation, key_padding_mask)
    num_values, s2t_kept = _numerator_values(v, e_s, keep)
    mask = _whole_mask(key_padding_mask, num_heads, q_len, k_len, direction, q.device)
    out, den = _sdpa_ratio(q, k, num_values, e_s, None if mask is None else _key_bias(mask, q.dtype), scale, keep)
    small = (den < _sqrt_tiny(q.dtype)).any(dim=-1)
    if mask is not None:
        small = small & mask.any(dim=-1)  # rows without an allowed key stay 0
    if not bool(small.any()):
        return out
    values = v if s2t_kept is None else v * s2t_kept / keep
    rows = small.nonzero()
    allowed = torch.ones(1, 1, 1, k_len, dtype=torch.bool, device=q.device) if mask is None else mask
    allowed = allowed.expand(batch, num_heads, q_len, k_len)
    size = _rows_per_chunk(k_len, max(d_k, v.shape[-1]))
    parts: list[Tensor] = []
    for start in range(0, rows.shape[0], size):
        part = rows[start:start + size]
        parts.append(_log_space_ratio(q, k, values, s2t, part, allowed[part[:, 0], part[:, 1], part[:, 2]], "exp",
                                      s2t_activation, scale, keep))
    index: list[Tensor | None] = [rows[:, 0], rows[:, 1], rows[:, 2]]
    return out.index_put(index, torch.cat(parts).to(out.dtype))


def _whole_mask(key_padding_mask: Tensor | None, num_heads: int, q_len: int, k_len: int, direction: str | None,
                device: torch.device) -> Tensor | None:
    """The allowed keys (self included) of the last ``q_len`` queries, broadcastable to ``[B, H, L_q, L]``: key
    padding ``[B, 1, 1, L]`` and the positional rule ``[H or 1, L_q, L]`` (``"bi"``: forward on the first H/2
    heads, backward on the rest); None when every key is allowed."""
    mask: Tensor | None = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
    if direction is None:
        return mask
    pos = torch.arange(k_len, device=device)
    j, i = pos[k_len - q_len:, None], pos[None, :]
    rule = positional_mask(j, i, "forward" if direction == "bi" else direction, True)
    assert rule is not None
    if direction == "bi":
        backward = positional_mask(j, i, "backward", True)
        assert backward is not None
        rule = torch.where(torch.arange(num_heads, device=device)[:, None, None] < num_heads // 2, rule, backward)
    return rule if mask is None else mask & rule


def _rows_per_chunk(k_len: int, width: int, elements: int = CHUNK_ELEMENTS) -> int:
    """Rows per log-space chunk, whose ``[chunk, L, width]`` tensors stay under ``elements`` (a default: TorchScript
    reads no global)."""
    return max(1, elements // (k_len * width))


def _in_row_chunks(rows: Tensor, q: Tensor, k: Tensor, values: Tensor, s2t: Tensor, call: _Call,
                   checkpointed: bool = True) -> Tensor:
    """:func:`_log_space_rows` over chunks of ``rows`` whose ``[chunk, L, d]`` tensors stay under 2**24 elements,
    each checkpointed (its backward recomputes it instead of keeping them) unless told not to."""
    size = _rows_per_chunk(k.shape[2], max(k.shape[-1], values.shape[-1]))
    grad = checkpointed and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, values, s2t))
    return torch.cat([
        checkpoint(_log_space_rows, q, k, values, s2t, rows[start:start + size], call, use_reentrant=False)
        if grad else _log_space_rows(q, k, values, s2t, rows[start:start + size], call)
        for start in range(0, len(rows), size)
    ])


def _chunked(q: Tensor, k: Tensor, num_values: Tensor, e_s: Tensor, call: _Call, use: str,
             query_chunk_size: int | None) -> tuple[Tensor, Tensor]:
    """The SDPA and dense paths: ``(out, Z)``."""
    batch, num_heads, q_len, _ = q.shape
    k_len = k.shape[2]
    pad, joint, lean = call.key_padding_mask, use == "sdpa-joint", call.shared is not None
    dense = use == "dense"
    products = dense and call.token2token == "exp"  # SDPA's products by matrix products
    fits = not dense or products and query_chunk_size is None and batch * num_heads * q_len * k_len <= CHUNK_ELEMENTS

    def whole(qh: Tensor, kh: Tensor, nh: Tensor, sh: Tensor, mode: str | None) -> tuple[Tensor, Tensor] | None:
        """One SDPA pair (or dense exp's products) over all keys when the heads' mask needs no chunking: no
        positional mask, one new query that sees every earlier key, or the kernel's own causal mask; else None."""
        if not fits or not call.include_self:
            return None
        if mode is None or mode == "forward" and q_len == 1:
            bias = (None if pad is None else call.shared.key_bias(pad, q.dtype) if call.shared is not None
                    else _key_bias(~pad[:, None, None, :], q.dtype))
            return _sdpa_ratio(qh, kh, nh, sh, bias, call.scale, call.keep, joint=joint, lean=lean, matmul=products)
        if mode == "forward" and pad is None and q_len == k_len and not dense:
            return _sdpa_ratio(qh, kh, nh, sh, None, call.scale, call.keep, is_causal=True, joint=joint, lean=lean)
        return None

    if len(call.groups) == 1 and (result := whole(q, k, num_values, e_s, call.groups[0][1])) is not None:
        return result  # all heads in one call pair, no copy into an output buffer
    out = q.new_empty(batch, num_heads, q_len, num_values.shape[-1])
    den = torch.empty_like(out)
    pos = torch.arange(k_len, device=q.device)
    q_pos = pos[k_len - q_len:]
    keys_real = None if pad is None else ~pad
    for heads, mode in call.groups:
        qh, kh, nh, sh = q[:, heads], k[:, heads], num_values[:, heads], e_s[:, heads]
        if (result := whole(qh, kh, nh, sh, mode)) is not None:
            out[:, heads], den[:, heads] = result
            continue
        for q0, q1, k0, k1 in _query_chunks(batch, qh.shape[1], q_len, k_len, mode, query_chunk_size):
            mask = positional_mask(q_pos[q0:q1, None], pos[None, k0:k1], mode, call.include_self)
            mask = None if mask is None else mask[None, None]
            if keys_real is not None:
                key_mask = keys_real[:, None, None, k0:k1]
                mask = key_mask if mask is None else mask & key_mask
            args = (qh[:, :, q0:q1], kh[:, :, k0:k1], nh[:, :, k0:k1], sh[:, :, k0:k1])
            out[:, heads, q0:q1], den[:, heads, q0:q1] = (
                _dense_sigmoid(*args, mask, call.scale, call.keep) if dense and not products
                else _sdpa_ratio(*args, None if mask is None else _key_bias(mask, q.dtype), call.scale, call.keep,
                                 joint=joint, lean=lean, matmul=products)
            )
    return out, den


def _rows_with_keys(q: Tensor, k_len: int, call: _Call) -> Tensor:
    """``[B, H, L_q]``: whether each query has an allowed key (:func:`has_allowed_key` per head group)."""
    batch, num_heads, q_len, _ = q.shape
    rows = torch.empty(batch, num_heads, q_len, dtype=torch.bool, device=q.device)
    for heads, mode in call.groups:
        allowed = has_allowed_key(call.key_padding_mask, batch, k_len, mode, call.include_self, q.device)
        rows[:, heads] = allowed[:, None, -q_len:]
    return rows


def _log_space_rows(q: Tensor, k: Tensor, values: Tensor, s2t: Tensor, rows: Tensor, call: _Call) -> Tensor:
    """``out[b, h, j]`` for ``rows [n, 3]`` of ``(b, h, j)``, with a maximum per query and feature (docs/kernel.md,
    "Large activations"); ``values`` is ``v * D_S``. Returns ``[n, d_v]`` in float32 or wider."""
    b, h, j = rows.unbind(1)
    k_len = k.shape[2]
    pad = call.key_padding_mask
    allowed = torch.ones(len(rows), k_len, dtype=torch.bool, device=q.device) if pad is None else ~pad[b]
    keys = torch.arange(k_len, device=q.device)[None, :]
    pos = (j + k_len - q.shape[2])[:, None]
    for heads, mode in call.groups:
        rule = positional_mask(pos, keys, mode, call.include_self)
        if rule is not None:
            allowed = allowed & (rule | ((h < heads.start) | (h >= heads.stop))[:, None])
    return _log_space_ratio(q, k, values, s2t, rows, allowed, call.token2token, call.s2t_activation, call.scale,
                            call.keep)


def _log_space_ratio(q: Tensor, k: Tensor, values: Tensor, s2t: Tensor, rows: Tensor, allowed: Tensor, token2token: str,
                     s2t_activation: str | None, scale: float, keep: float) -> Tensor:
    """:func:`_log_space_rows` given which keys each row may attend (``allowed [n, L]``)."""
    b, h, j = rows.unbind(1)
    work = torch.promote_types(q.dtype, torch.float32)
    scores = torch.einsum("nd,nld->nl", q[b, h, j].to(work), k[b, h].to(work)) * scale
    log_r = scores if token2token == "exp" else F.logsigmoid(scores)
    log_w = log_r.masked_fill(~allowed, float("-inf"))[:, :, None] + _log_weights(s2t[b, h].to(work), s2t_activation)
    top = log_w.detach().amax(dim=1, keepdim=True)
    w = torch.exp(log_w - top.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0))
    den = w.sum(dim=1)
    w_num = w if keep == 1.0 else w * torch.empty_like(w[:, :, :1]).bernoulli_(keep).div_(keep)
    num = (w_num * values[b, h].to(work)).sum(dim=1)
    return num / torch.where(den > 0, den, torch.ones_like(den))


class _GuardedRatio(torch.autograd.Function):
    """``N / where(Z > 0, Z, 1)``, the authors' guard (reference §1.2 step 5), with the gradients of
    that expression. It saves only ``N`` and ``Z``, which the attention kernels producing them keep
    for their own backward anyway; autograd's division would also keep the guarded copy of ``Z``."""

    @staticmethod
    def forward(ctx, num: Tensor, den: Tensor) -> Tensor:
        ctx.save_for_backward(num, den)
        return num / den.masked_fill(den <= 0, 1.0)  # Z >= 0, so this is where(Z > 0, Z, 1) in three kernels

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
        num, den = ctx.saved_tensors
        zero = den <= 0
        guarded = den.masked_fill(zero, 1.0)
        grad_num = grad / guarded
        return grad_num, (grad_num * num).div_(guarded).neg_().masked_fill_(zero, 0.0)


def _guarded_ratio(num: Tensor, den: Tensor) -> Tensor:
    if torch.jit.is_scripting():
        # TorchScript cannot save a custom autograd Function, so autograd differentiates the division, whose
        # backward squares Z: entries below sqrt(tiny), whose rows the callers recompute in log space or zero,
        # divide by 1 instead, or 0 * (1 / 0) would make their zero gradient NaN
        return num / torch.where(den >= _sqrt_tiny(den.dtype), den, torch.ones_like(den))
    return _GuardedRatio.apply(num, den)


def _sdpa_ratio(q: Tensor, k: Tensor, num_values: Tensor, den_values: Tensor, bias: tuple[Tensor, Tensor | None] | None,
                scale: float, keep: float, is_causal: bool = False, joint: bool = False,
                lean: bool = False, matmul: bool = False) -> tuple[Tensor, Tensor]:
    """``(out, Z)``: ``Z = SDPA(q, k, E_S)``, ``out = SDPA(q, k, v*E_S') / Z`` with dropout (``keep < 1``) on the
    numerator's probabilities only (reference §8.3), 0 on rows without an allowed key. ``bias``: :func:`_key_bias`
    of the allowed keys; ``is_causal``: the kernel's own forward-with-self mask; ``joint`` (no dropout): one call for
    both; ``lean``: an unguarded ratio, for callers that recompute the call wherever ``Z`` underflowed; ``matmul``
    (not causal): ``P = softmax(s + mask)`` materialised, then one product with the joined values (two with
    dropout) instead of the SDPA calls."""
    attn_mask: Tensor | None = None
    has_key: Tensor | None = None
    if bias is not None:
        attn_mask, has_key = bias
    if matmul:
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
        p = torch.softmax(scores if attn_mask is None else scores.add_(attn_mask), dim=-1)
        if keep == 1.0:
            num, den = torch.matmul(p, torch.cat([num_values, den_values], dim=-1)).unflatten(-1, (2, -1)).unbind(-2)
        else:
            num, den = torch.matmul(F.dropout(p, 1.0 - keep), num_values), torch.matmul(p, den_values)
    elif joint:
        # zero columns bring q, k and the joined values to one width, which the fused (flash) kernels need;
        # they change neither the scores (the scale is given) nor the first 2 * d_v output columns
        d_v = num_values.shape[-1]
        width = max(q.shape[-1], 2 * d_v)
        q, k = (F.pad(t, (0, width - t.shape[-1])) if t.shape[-1] < width else t for t in (q, k))
        values = F.pad(torch.cat([num_values, den_values], dim=-1), (0, width - 2 * d_v))
        both = F.scaled_dot_product_attention(q, k, values, attn_mask=attn_mask, scale=scale, is_causal=is_causal)
        num, den = both[..., :d_v], both[..., d_v:2 * d_v]
    else:
        num = F.scaled_dot_product_attention(
            q, k, num_values, attn_mask=attn_mask, dropout_p=1.0 - keep, scale=scale, is_causal=is_causal
        )
        den = F.scaled_dot_product_attention(q, k, den_values, attn_mask=attn_mask, scale=scale, is_causal=is_causal)
    return _ratio(num, den, has_key, lean), den


def _ratio(num: Tensor, den: Tensor, has_key: Tensor | None, lean: bool) -> Tensor:
    """``N / Z`` times ``has_key``; ``lean``: unguarded, exact where every ``Z`` is at least sqrt(tiny), in aten's
    division, whose backward keeps ``N`` and ``Z`` (which the SDPA calls keep anyway) and runs no Python."""
    if not lean:  # (TorchScript's callers never ask for the lean ratio)
        out = _guarded_ratio(num, den)
        return out if has_key is None else out * has_key
    out = num / den
    return out if has_key is None else out.mul_(has_key)


def _key_bias(mask: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """SDPA's additive mask for the boolean allowed keys ``mask`` and ``has_key`` (``[B, 1, L_q or 1, 1]``).
    Rows without a key see every key, which keeps softmax kernels away from all -inf rows, and are zeroed by
    ``has_key``; applied whether or not such a row exists: asking would cost a host synchronisation (and a compiled
    graph cannot branch on it); on rows with keys both are the identity, in value and gradient."""
    has_key = mask.any(dim=-1, keepdim=True)
    return _additive_mask(mask >= has_key, dtype), has_key


def _additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """``allowed`` as SDPA's additive mask in ``dtype`` (0 where allowed, -inf elsewhere), built once for all calls
    and in two kernels, each row at a multiple of 8 elements as the memory-efficient CUDA kernel reads it: given the
    booleans, every SDPA call converts them and copies unaligned rows again."""
    length = allowed.shape[-1]
    shape = list(allowed.shape[:-1]) + [length + (-length) % 8]
    bias = torch.full(shape, float("-inf"), dtype=dtype, device=allowed.device)
    return bias[..., :length].masked_fill_(allowed, 0.0)


def _dense_sigmoid(q: Tensor, k: Tensor, num_values: Tensor, den_values: Tensor, mask: Tensor | None, scale: float,
                   keep: float) -> tuple[Tensor, Tensor]:
    """The authors' algorithm on one query chunk: ``E_R = sigmoid(s)`` materialised as ``[B, H, chunk, L]``."""
    e_r = torch.sigmoid(torch.matmul(q, k.transpose(-1, -2)) * scale)
    if mask is not None:
        e_r = e_r.masked_fill(~mask, 0.0)
    den = torch.matmul(e_r, den_values)
    num = torch.matmul(e_r if keep == 1.0 else F.dropout(e_r, p=1.0 - keep), num_values)
    return _guarded_ratio(num, den), den


def _flex_sigmoid(q: Tensor, k: Tensor, num_values: Tensor, den_values: Tensor, call: _Call) -> tuple[Tensor, Tensor]:
    """Sigmoid token2token through FlexAttention: ``score_mod = logsigmoid`` turns the kernel's
    softmax into ``sigmoid(s) / sum sigmoid(s)``, whose normaliser cancels in the ratio."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if q.is_cuda:  # eager flex materialises the scores; compiled, it is a fused O(L)-memory kernel
        flex_attention = _compiled_flex()

    batch, num_heads, length, _ = q.shape
    pad = call.key_padding_mask
    half = call.groups[0][0].stop

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = (kv_idx >= 0) if pad is None else ~pad[b, kv_idx]
        rules = [positional_mask(q_idx, kv_idx, mode, call.include_self) for _, mode in call.groups]
        if len(rules) == 2:
            return allowed & torch.where(h < half, rules[0], rules[1])
        return allowed if rules[0] is None else allowed & rules[0]

    block_mask = create_block_mask(mask_mod, batch, num_heads, length, length, device=q.device)
    values = torch.cat([num_values, den_values], dim=-1)  # no dropout here, so one call serves both
    d_v = num_values.shape[-1]
    # compiled flex needs head widths of at least 16: zero columns change neither the scores (the scale is
    # given) nor the first 2 * d_v output columns
    q, k, values = (F.pad(t, (0, FLEX_MIN_WIDTH - t.shape[-1])) if t.shape[-1] < FLEX_MIN_WIDTH else t
                    for t in (q, k, values))
    both = flex_attention(q, k, values, score_mod=lambda score, b, h, q_idx, kv_idx: F.logsigmoid(score),
                          block_mask=block_mask, scale=call.scale)[..., :2 * d_v]
    out = _guarded_ratio(both[..., :d_v], both[..., d_v:])
    nonempty = _rows_with_keys(q, length, call)
    return torch.where(nonempty[..., None], out, torch.zeros_like(out)), both[..., d_v:]
