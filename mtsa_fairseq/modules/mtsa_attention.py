"""MTSA as a drop-in for fairseq's ``MultiheadAttention`` in the NMT setting (docs/reference.md §1): the q/k/v/out
projections are fairseq's own (inherited, same parameter names); MTSA replaces only the scaled dot-product core and
adds one per-head source2token dense layer ``d_v -> d_v`` with bias: ``H * (d_v * d_v + d_v)`` parameters (33,280
for d_model 512 and 8 heads, reference §1.6)."""

from __future__ import annotations

import math
import weakref
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

from .mtsa_core import EXP_KERNELS, SharedPass, head_directions, mtsa_core, mtsa_core_scripted
from .per_head import PerHeadLinear, activation

S2T_INPUTS = ("v", "k")
S2T_ACTIVATIONS = ("scaled_sigmoid", "sigmoid", "exp", "scaled_exp")
_SHARED: ContextVar[SharedPass | None] = ContextVar("mtsa_shared_pass", default=None)


class shared_pass:  # lower case: called like a function, as contextlib.nullcontext
    """``with shared_pass(shared):`` the MTSA layers called within (outside TorchScript and torch.compile) share
    ``shared``: mtsa_core's ``shared``, whose ``first_underflowed()`` the caller must act on. A class rather than a
    generator: three Python calls per use instead of six (a model uses it once per encoder and decoder pass)."""

    def __init__(self, shared: SharedPass) -> None:
        self.shared = shared

    def __enter__(self) -> SharedPass:
        self._token = _SHARED.set(self.shared)
        return self.shared

    def __exit__(self, *exc: object) -> None:
        _SHARED.reset(self._token)


class MTSAMultiheadAttention(MultiheadAttention):
    """Multi-mask tensorized self-attention with fairseq's ``MultiheadAttention`` interface.

    Defaults are what the authors ran (reference §1.3): ``E_R = exp(q.k / sqrt(d_k))`` with key padding only,
    ``E_S = sigmoid((v W_c + b_c) / sqrt(d_v))`` from one per-head layer on ``v``.

    Args:
        embed_dim, num_heads, dropout, bias, q_noise, qn_block_size: as ``MultiheadAttention``; ``dropout`` is the
            attention dropout ``p`` (``keep = sqrt(1 - p)`` on ``E_R`` and ``E_S``).
        s2t_input: ``"v"`` (authors' runs, ``use_k_mtsa=False``) or ``"k"``.
        s2t_activation: ``scaled_sigmoid`` (default), ``sigmoid``, ``exp``, ``scaled_exp``; the ``scaled_`` forms
            divide the logits, bias included, by ``sqrt(d_v)``.
        s2t_bias_init: initial source2token bias (``bias_start``: 0; Setup 1 used 5).
        s2t_hidden_activation: ``None`` for the single layer the authors ran, or an activation name (``afn_extra``)
            for a hidden per-head layer (bias 0) before the output layer.
        bi_directional: forward masks on the first H/2 heads and backward on the rest, diagonal included
            (``bi_direction``; off as run).
        causal: decoder self-attention: every head sees only keys ``i <= j``, and incremental decoding caches ``k``,
            ``v`` and ``E_S`` (beyond the authors' t2t code: reference §1.5). Needs a sigmoid source2token
            activation: the exp forms are shifted by a sequence-wide maximum (reference §8.4), which would let later
            tokens underflow earlier outputs.
        kernel: passed to :func:`mtsa_core` (default ``"auto"``; the models' ``--mtsa-kernel``): one of
            ``EXP_KERNELS``, those of the exp token2token form.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True, q_noise: float = 0.0,
                 qn_block_size: int = 8, s2t_input: str = "v", s2t_activation: str = "scaled_sigmoid",
                 s2t_bias_init: float = 0.0, s2t_hidden_activation: str | None = None, bi_directional: bool = False,
                 causal: bool = False, kernel: str = "auto"):
        if s2t_input not in S2T_INPUTS:
            raise ValueError(f"s2t_input must be one of {S2T_INPUTS}, got {s2t_input!r}")
        if s2t_activation not in S2T_ACTIVATIONS:
            raise ValueError(f"s2t_activation must be one of {S2T_ACTIVATIONS}, got {s2t_activation!r}")
        if kernel not in EXP_KERNELS:
            raise ValueError(f"kernel must be one of {EXP_KERNELS} (this attention's token2token form is exp; 'flex' "
                             f"computes the sigmoid form only), got {kernel!r}")
        if causal and bi_directional:
            raise ValueError("causal attention has its own mask; bi_directional head masks would see the future")
        if causal and not s2t_activation.endswith("sigmoid"):
            raise ValueError(f"causal MTSA needs a sigmoid source2token activation, got {s2t_activation!r}: exp "
                             "weights are stabilised with a sequence-wide maximum, so later tokens could change "
                             "earlier outputs")
        self.causal = causal
        self.direction = "forward" if causal else "bi" if bi_directional else None
        head_directions(num_heads, self.direction)  # odd head counts fail here, before any allocation
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, self_attention=True, q_noise=q_noise,
                         qn_block_size=qn_block_size)
        self.s2t_input = s2t_input
        self.s2t_activation = s2t_activation
        self.s2t_scale = 1.0 / math.sqrt(self.head_dim) if s2t_activation.startswith("scaled_") else 1.0
        self.e_s_activation = "sigmoid" if s2t_activation.endswith("sigmoid") else "exp"  # mtsa_core's s2t_activation
        self.s2t_hidden_activation = s2t_hidden_activation
        self.s2t_hidden = self.s2t_hidden_fn = None
        if s2t_hidden_activation is not None:
            self.s2t_hidden_fn = activation(s2t_hidden_activation)
            self.s2t_hidden = PerHeadLinear(num_heads, self.head_dim, self.head_dim, bias_init=0.0)
        self.s2t = PerHeadLinear(num_heads, self.head_dim, self.head_dim, bias_init=s2t_bias_init)
        self.kernel = kernel

    def source2token(self, x: Tensor) -> Tensor:
        """The source2token logits ``S`` (scaled for the ``scaled_`` forms) from per-head ``x [B, H, L, d_v]``
        (reference §1.2 steps 3-4). ``E_S = sigmoid(S)`` or ``exp(S)``: ``mtsa_core`` takes the logits, so that
        it can use ``log E_S`` where ``E_S`` underflows."""
        if self.s2t_hidden is not None:
            x = self.s2t_hidden_fn(self.s2t_hidden(x))
        return self.s2t(x, scale=self.s2t_scale)

    def forward(self, query: Tensor, key: Tensor | None, value: Tensor | None, key_padding_mask: Tensor | None = None,
                incremental_state: dict[str, dict[str, Tensor | None]] | None = None, need_weights: bool = True,
                static_kv: bool = False, attn_mask: Tensor | None = None, before_softmax: bool = False,
                need_head_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Self-attention over ``query`` (``T x B x C``); returns ``(T x B x C, None)``: MTSA's weights are
        feature-wise, so there is no ``[B, L, L]`` map. A causal module takes the decoder's future mask as
        ``attn_mask`` (checked; the kernel applies it) and ``incremental_state`` (the new positions attend to the
        cached ``k``, ``v`` and ``E_S`` and themselves). Under ``torch.jit.script`` the core is
        :func:`mtsa_core_scripted` (SDPA, whatever ``kernel`` says)."""
        if key is not None and key is not query or value is not None and value is not key:
            raise ValueError("MTSAMultiheadAttention is a self-attention: pass query = key = value")
        if before_softmax or static_kv:
            raise NotImplementedError("MTSAMultiheadAttention has no before_softmax or static_kv mode")
        if not self.causal and (incremental_state is not None or attn_mask is not None):
            raise NotImplementedError("attn_mask and incremental_state need MTSAMultiheadAttention(causal=True) "
                                      "(decoder self-attention)")
        length, batch, _ = query.shape
        if attn_mask is not None:
            _check_future_mask(attn_mask, length)
        if key_padding_mask is not None and key_padding_mask.dtype != torch.bool:
            key_padding_mask = key_padding_mask.to(torch.bool)
        q, k, v = self._project(query, length, batch)
        s2t = self.source2token(v if self.s2t_input == "v" else k)
        if incremental_state is not None:
            k, v, s2t, key_padding_mask = self._extend_cache(incremental_state, k, v, s2t, key_padding_mask)
        if torch.jit.is_scripting():
            out = mtsa_core_scripted(q, k, v, s2t, key_padding_mask, self.direction, self.dropout_module.p,
                                     self.training, self.e_s_activation)
        else:
            shared = None if torch.compiler.is_compiling() else _SHARED.get()
            out = mtsa_core(q, k, v, s2t, key_padding_mask, self.direction, dropout_p=self.dropout_module.p,
                            training=self.training, kernel=self.kernel, s2t_activation=self.e_s_activation,
                            shared=shared)
        out = out.permute(2, 0, 1, 3).reshape(length, batch, self.embed_dim)
        return self.out_proj(out), None

    def _project(self, query: Tensor, length: int, batch: int) -> tuple[Tensor, Tensor, Tensor]:
        """Per-head ``q, k, v`` ``[B, H, L, d]`` (views) of ``query [L, B, C]``. Where autograd records, one matrix
        product with the three projections' weights joined: its backward makes a third of the products and one
        gradient copy where three modules make three. Without autograd (inference, where joining would only add a
        copy of the weights per call), under TorchScript, and where a forward hook is registered on a projection
        (quant noise is one), the three modules are called."""
        shape = (length, batch, self.num_heads, self.head_dim)
        if torch.jit.is_scripting():
            q, k, v = self.q_proj(query).view(shape), self.k_proj(query).view(shape), self.v_proj(query).view(shape)
        else:
            q_proj, k_proj, v_proj = self.q_proj, self.k_proj, self.v_proj  # each attribute read is a Python call
            if not torch.is_grad_enabled() or _hooked(q_proj, k_proj, v_proj):
                q, k, v = q_proj(query).view(shape), k_proj(query).view(shape), v_proj(query).view(shape)
            else:
                weight = torch.cat([q_proj.weight, k_proj.weight, v_proj.weight])
                q_bias = q_proj.bias
                bias = None if q_bias is None else torch.cat([q_bias, k_proj.bias, v_proj.bias])
                # heads split on dim 2: the gradients' stack is then [L, B, 3, H, d], contiguous as the product's
                q, k, v = F.linear(query, weight, bias).view(length, batch, 3, *shape[2:]).unbind(2)
        return q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)

    def _extend_cache(self, incremental_state: dict[str, dict[str, Tensor | None]], k: Tensor, v: Tensor, s2t: Tensor,
                      key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Append this step's ``[B, H, T, d]`` keys, values and source2token logits to the cache and return
        the whole prefix. Cached tensors are batch-first, so fairseq's ``reorder_incremental_state``
        (inherited) reorders them for beam search."""
        saved = self._get_input_buffer(incremental_state)
        prev_k = saved.get("prev_key")
        prev_v = saved.get("prev_value")
        if prev_k is not None and prev_v is not None:
            prev_s = saved.get("prev_s2t")
            if prev_s is None:  # a cache filled from outside (``prev_self_attn_state``) has no logits yet
                prev_s = self.source2token(prev_v if self.s2t_input == "v" else prev_k)
            prev_mask = saved.get("prev_key_padding_mask")
            if prev_mask is not None or key_padding_mask is not None:
                prev_mask = _no_pads(prev_k) if prev_mask is None else prev_mask.to(torch.bool)
                new_mask = _no_pads(k) if key_padding_mask is None else key_padding_mask
                key_padding_mask = torch.cat([prev_mask, new_mask], 1)
            k, v, s2t = torch.cat([prev_k, k], 2), torch.cat([prev_v, v], 2), torch.cat([prev_s, s2t], 2)
        saved["prev_key"] = k
        saved["prev_value"] = v
        saved["prev_s2t"] = s2t
        saved["prev_key_padding_mask"] = key_padding_mask
        self._set_input_buffer(incremental_state, saved)
        return k, v, s2t, key_padding_mask


def _hooked(*modules: nn.Module) -> bool:
    for module in modules:
        if module._forward_pre_hooks or module._forward_hooks:
            return True
    return False


def _no_pads(x: Tensor) -> Tensor:
    """An all-False ``[B, T]`` key padding mask for per-head ``x [B, H, T, d]``."""
    return torch.zeros(x.shape[0], x.shape[2], dtype=torch.bool, device=x.device)


def _check_future_mask(attn_mask: Tensor, length: int) -> None:
    """Accept only fairseq's decoder future mask (``-inf`` or True strictly above the diagonal):
    MTSA applies causality inside the kernel, so any other mask would be silently ignored. Eagerly the values are
    read on the host once per mask (:func:`_check_future_values_once`); a compiled graph checks only the shape: it
    cannot branch on the values."""
    if list(attn_mask.shape) != [length, length]:
        shape = ", ".join([str(size) for size in attn_mask.shape])
        raise ValueError(f"attn_mask must be the [T, T] = ({length}, {length}) future mask, got ({shape})")
    if torch.jit.is_scripting():
        _check_future_values(attn_mask, length)
    elif not torch.compiler.is_compiling():
        _check_future_values_once(attn_mask, length)


def _check_future_values(attn_mask: Tensor, length: int) -> None:
    future = torch.ones(length, length, dtype=torch.bool, device=attn_mask.device).triu(1)
    if attn_mask.dtype == torch.bool:
        ok = torch.equal(attn_mask, future)
    else:
        ok = bool(torch.where(future, torch.isneginf(attn_mask), attn_mask == 0).all())
    if not ok:
        raise ValueError("MTSAMultiheadAttention(causal=True) accepts only the decoder's future mask as attn_mask")


_CHECKED_MASK: tuple[weakref.ref, tuple] | None = None  # the last future mask found right: its base, the view


@torch.jit.unused
def _check_future_values_once(attn_mask: Tensor, length: int) -> None:
    """:func:`_check_future_values`, skipped for the view last found right while its base is alive and unchanged:
    fairseq slices each pass's mask from one buffer that every layer and pass share."""
    global _CHECKED_MASK
    base = attn_mask if attn_mask._base is None else attn_mask._base
    key = (attn_mask._version, attn_mask.storage_offset(), attn_mask.stride(), length, attn_mask.dtype)
    if _CHECKED_MASK is None or _CHECKED_MASK[0]() is not base or _CHECKED_MASK[1] != key:
        _check_future_values(attn_mask, length)
        _CHECKED_MASK = (weakref.ref(base), key)
