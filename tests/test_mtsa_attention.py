"""MTSAMultiheadAttention (mtsa_fairseq/modules/mtsa_attention.py), the NMT MTSA of docs/reference.md §1, against
its literal forms: encoder and causal (decoder) self-attention."""

import math

import pytest
import torch
from fairseq.modules import MultiheadAttention

from mtsa_fairseq.experiments.bench.launches import OperatorCount
from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention
from mtsa_fairseq.modules.mtsa_reference import mtsa_literal

pytestmark = pytest.mark.any_device


def n_params(module):
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- NMT MTSA (docs/reference.md §1)


def test_nmt_parameter_count_matches_paper_shapes():
    base = MultiheadAttention(512, 8, self_attention=True)
    mtsa = MTSAMultiheadAttention(512, 8)
    assert n_params(mtsa) - n_params(base) == 8 * (64 * 64 + 64) == 33_280
    hidden = MTSAMultiheadAttention(512, 8, s2t_hidden_activation="relu")
    assert n_params(hidden) - n_params(base) == 2 * 33_280
    assert torch.all(MTSAMultiheadAttention(512, 8, s2t_bias_init=5.0).s2t.bias == 5.0)
    names = {n for n, _ in mtsa.named_parameters()}
    assert {"q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"} <= names


def nmt_literal(m: MTSAMultiheadAttention, x, pad):
    """The module's forward spelled out from reference §1.2 with the module's own weights."""
    length, batch, _ = x.shape
    heads = lambda t: t.view(length, batch, m.num_heads, m.head_dim).permute(1, 2, 0, 3)  # noqa: E731
    q, k, v = heads(m.q_proj(x)), heads(m.k_proj(x)), heads(m.v_proj(x))
    src = v if m.s2t_input == "v" else k
    if m.s2t_hidden is not None:
        hidden = {"relu": torch.relu, "tanh": torch.tanh}[m.s2t_hidden_activation]
        src = hidden(torch.einsum("bhld,hde->bhle", src, m.s2t_hidden.weight) + m.s2t_hidden.bias[:, None])
    logits = torch.einsum("bhld,hde->bhle", src, m.s2t.weight) + m.s2t.bias[:, None]
    if m.s2t_activation.startswith("scaled_"):
        logits = logits / math.sqrt(m.head_dim)
    e_s = torch.sigmoid(logits) if m.s2t_activation.endswith("sigmoid") else torch.exp(logits)
    out = mtsa_literal(q, k, v, e_s, pad, m.direction, True, "exp")
    return m.out_proj(out.permute(2, 0, 1, 3).reshape(length, batch, -1))


ENCODER_OPTIONS = [  # the encoder forms of MTSAMultiheadAttention's source2token and mask options
    {},
    dict(s2t_input="k"),
    dict(s2t_activation="sigmoid"),
    dict(s2t_activation="exp"),
    dict(s2t_activation="scaled_exp", s2t_bias_init=5.0),
    dict(s2t_hidden_activation="relu"),
    dict(s2t_hidden_activation="tanh", bi_directional=True),
    dict(bi_directional=True),
]


@pytest.mark.parametrize("kwargs", ENCODER_OPTIONS)
def test_nmt_module_matches_literal(kwargs):
    m = MTSAMultiheadAttention(16, 4, **kwargs).double().eval()
    x = torch.randn(7, 3, 16, dtype=torch.float64)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, :2] = True
    out, weights = m(x, x, x, key_padding_mask=pad, need_weights=False)
    assert weights is None and out.shape == x.shape
    torch.testing.assert_close(out, nmt_literal(m, x, pad), rtol=0, atol=1e-10)


def test_nmt_projections_joined_or_through_hooked_modules_give_the_same_values_and_gradients():
    """Where autograd records, the module projects q, k and v in one product; a projection with a forward hook
    (fairseq's quant noise registers one) is called as a module, so that the hook runs, and so are all three
    without autograd."""
    m = MTSAMultiheadAttention(16, 4).double().train()
    x = torch.randn(7, 3, 16, dtype=torch.float64)
    joined = m(x, x, x)[0]
    joined_grads = torch.autograd.grad(joined.sum(), list(m.parameters()))
    calls = []
    m.k_proj.register_forward_pre_hook(lambda module, args: calls.append(module))
    hooked = m(x, x, x)[0]
    assert calls == [m.k_proj]
    torch.testing.assert_close(hooked, joined, rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad(hooked.sum(), list(m.parameters())), joined_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    m.k_proj._forward_pre_hooks.clear()
    with torch.no_grad(), OperatorCount() as inference:  # no backward to save in: the weights are not copied
        torch.testing.assert_close(m(x, x, x)[0], joined, rtol=0, atol=1e-12)
    with OperatorCount() as training:
        m(x, x, x)
    assert (inference.operators["addmm"], inference.operators["cat"]) == (4, 0)
    assert (training.operators["addmm"], training.operators["cat"]) == (2, 2)
    noised = MTSAMultiheadAttention(16, 4, q_noise=0.5, qn_block_size=4).train()
    x = x.float()
    with_noise = noised(x, x, x)[0]
    for proj in (noised.q_proj, noised.k_proj, noised.v_proj):
        proj._forward_pre_hooks.clear()
    assert not torch.allclose(with_noise, noised(x, x, x)[0])


def test_nmt_module_padding_invariance_and_no_nan():
    m = MTSAMultiheadAttention(16, 4, s2t_activation="exp").eval()
    x = torch.randn(6, 1, 16)
    out, _ = m(x, x, x)
    padded = torch.cat([torch.randn(3, 1, 16) * 50, x], 0)  # left padding, as fairseq sources
    pad = torch.tensor([[True] * 3 + [False] * 6])
    out_padded, _ = m(padded, padded, padded, key_padding_mask=pad)
    torch.testing.assert_close(out_padded[3:], out, rtol=0, atol=1e-5)


def test_nmt_module_dropout_and_half_precision():
    m = MTSAMultiheadAttention(32, 4, dropout=0.3)
    x = torch.randn(10, 2, 32)
    m.eval()
    torch.testing.assert_close(m(x, x, x)[0], m(x, x, x)[0])
    m.train()
    assert not torch.allclose(m(x, x, x)[0], m(x, x, x)[0])
    mb = MTSAMultiheadAttention(32, 4).to(torch.bfloat16).eval()
    xb = x.bfloat16() * 30
    out, _ = mb(xb, xb, xb)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_nmt_module_rejects_bad_options():
    with pytest.raises(ValueError, match="even number of heads"):
        MTSAMultiheadAttention(15, 3, bi_directional=True)
    with pytest.raises(ValueError, match="s2t_input"):
        MTSAMultiheadAttention(16, 4, s2t_input="q")
    with pytest.raises(ValueError, match="s2t_activation"):
        MTSAMultiheadAttention(16, 4, s2t_activation="tanh")
    with pytest.raises(ValueError, match="unknown activation"):
        MTSAMultiheadAttention(16, 4, s2t_hidden_activation="swish")
    with pytest.raises(ValueError, match="token2token form is exp; 'flex' computes the sigmoid form only"):
        MTSAMultiheadAttention(16, 4, kernel="flex")  # at construction, not at the first forward
    m = MTSAMultiheadAttention(16, 4)
    x = torch.randn(5, 2, 16)
    with pytest.raises(ValueError, match="self-attention"):
        m(x, torch.randn(5, 2, 16), x)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        m(x, x, x, attn_mask=torch.zeros(5, 5))


# ---------------------------------------------------------------- causal MTSA (decoder self-attention)


def future_mask(length, dtype=torch.float64):
    """fairseq's ``buffered_future_mask``: -inf strictly above the diagonal."""
    return torch.triu(torch.full((length, length), float("-inf"), dtype=dtype), 1)


def decode_incrementally(m, x, pad=None, chunks=None, state=None):
    """Feed ``x`` (T x B x C) through ``m`` in steps of ``chunks`` positions with one cache."""
    state = {} if state is None else state
    outs, start = [], 0
    for size in chunks or [1] * x.shape[0]:
        xt = x[start:start + size]
        mask = None if pad is None else pad[:, start:start + size]
        outs.append(m(xt, xt, xt, key_padding_mask=mask, incremental_state=state)[0])
        start += size
    return torch.cat(outs), state


@pytest.mark.parametrize(
    "kwargs", [{}, dict(s2t_input="k"), dict(s2t_activation="sigmoid", s2t_hidden_activation="relu")]
)
def test_causal_module_matches_literal_and_incremental(kwargs):
    m = MTSAMultiheadAttention(16, 4, causal=True, **kwargs).double().eval()
    assert m.direction == "forward"
    x = torch.randn(7, 3, 16, dtype=torch.float64)
    full, _ = m(x, x, x, attn_mask=future_mask(7))
    torch.testing.assert_close(full, nmt_literal(m, x, None), rtol=0, atol=1e-10)
    for chunks in ([1] * 7, [3, 1, 2, 1]):  # one token per step, and several at a time
        steps, state = decode_incrementally(m, x, chunks=chunks)
        torch.testing.assert_close(steps, full, rtol=0, atol=1e-10)
    cache = m._get_input_buffer(state)
    assert {name: tuple(t.shape) for name, t in cache.items() if t is not None} == {
        "prev_key": (3, 4, 7, 4), "prev_value": (3, 4, 7, 4), "prev_s2t": (3, 4, 7, 4)
    }


def test_causal_module_float32_cache_equals_full_forward_to_1e5():
    m = MTSAMultiheadAttention(64, 8, causal=True, s2t_bias_init=5.0).eval()
    x = torch.randn(20, 4, 64) * 3
    full, _ = m(x, x, x, attn_mask=future_mask(20, torch.float32))
    steps, _ = decode_incrementally(m, x)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-5)


def test_causal_module_is_causal_and_handles_right_padding():
    m = MTSAMultiheadAttention(16, 4, causal=True).double().eval()
    x = torch.randn(8, 2, 16, dtype=torch.float64)
    out, _ = m(x, x, x, attn_mask=future_mask(8))
    later = x.clone()
    later[5:] += torch.randn(3, 2, 16, dtype=torch.float64) * 10
    out_later, _ = m(later, later, later, attn_mask=future_mask(8))
    torch.testing.assert_close(out_later[:5], out[:5], rtol=0, atol=1e-12)
    assert (out_later[5:] - out[5:]).abs().max() > 1e-3
    pad = torch.zeros(2, 8, dtype=torch.bool)
    pad[1, 6:] = True  # targets are right-padded
    padded, _ = m(x, x, x, key_padding_mask=pad, attn_mask=future_mask(8))
    torch.testing.assert_close(padded, nmt_literal(m, x, pad), rtol=0, atol=1e-10)
    steps, _ = decode_incrementally(m, x, pad=pad, chunks=[2, 3, 3])
    torch.testing.assert_close(steps, padded, rtol=0, atol=1e-10)


def test_causal_module_cache_follows_beam_reordering():
    m = MTSAMultiheadAttention(16, 4, causal=True).double().eval()
    x = torch.randn(6, 3, 16, dtype=torch.float64)
    _, state = decode_incrementally(m, x[:4])
    order = torch.tensor([2, 0, 0])
    m.reorder_incremental_state(state, order)  # fairseq's, inherited: index_select on dim 0
    rest = x[4:, order]
    tail, _ = decode_incrementally(m, rest, state=state)
    state_free = torch.cat([x[:4, order], rest])
    full, _ = m(state_free, state_free, state_free, attn_mask=future_mask(6))
    torch.testing.assert_close(tail, full[4:], rtol=0, atol=1e-10)


def test_causal_module_rejects_what_it_cannot_honour():
    with pytest.raises(ValueError, match="sigmoid source2token"):
        MTSAMultiheadAttention(16, 4, causal=True, s2t_activation="exp")
    with pytest.raises(ValueError, match="bi_directional"):
        MTSAMultiheadAttention(16, 4, causal=True, bi_directional=True)
    m = MTSAMultiheadAttention(16, 4, causal=True)
    x = torch.randn(5, 2, 16)
    with pytest.raises(ValueError, match="future mask"):
        m(x, x, x, attn_mask=torch.zeros(5, 5))
    with pytest.raises(ValueError, match="future mask"):
        m(x, x, x, attn_mask=future_mask(4, torch.float32))
    bool_mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    torch.testing.assert_close(m(x, x, x, attn_mask=bool_mask)[0], m(x, x, x)[0])
    with pytest.raises(NotImplementedError, match="causal=True"):
        MTSAMultiheadAttention(16, 4)(x, x, x, incremental_state={})
