"""SentenceMTSA (mtsa_fairseq/modules/sentence_mtsa.py), the API's MTSA block of docs/reference.md §2, against its
non-accelerated path spelled out one head at a time."""

import functools
import math

import pytest
import torch

from mtsa_fairseq.modules.sentence_mtsa import SentenceMTSA

pytestmark = pytest.mark.any_device


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def test_sentence_parameter_count_snli():
    m = SentenceMTSA(300, 600, num_heads=2, token2token="sigmoid", activation_name="elu")
    assert n_params(m) == 1_262_400  # reference §3.1 item 7
    assert n_params(SentenceMTSA(300, 600, use_fusion_gate=False, s2t_hidden_layer=False)) == 2 * (
        90_300 + 2 * 90_000 + 90_300
    )


def sentence_literal(m: SentenceMTSA, x, pad):
    """The API's non-accelerated path (reference §2.2), one head at a time, with the API's mask
    (query and key both real) and the [B, H, L, L, d] feature-wise softmax."""
    act = m.act
    outs = []
    real = ~pad

    def dense(layer, t, c):
        return t @ layer.weight[c] + (layer.bias[c] if layer.bias is not None else 0)

    for c in range(m.num_heads):
        lin = functools.partial(dense, c=c)
        v = lin(m.v_proj, x)
        v = act(v) if m.activate_v else v
        src = x if m.attn_input == "x" else v
        q, k = lin(m.q_proj, src), lin(m.k_proj, src)
        t = src if m.s2t_hidden is None else act(lin(m.s2t_hidden, src))
        e_s = torch.exp(lin(m.s2t, t)) * real[..., None]
        length = x.shape[1]
        j, i = torch.arange(length)[:, None], torch.arange(length)[None, :]
        if m.direction == "bi":
            forward = c < m.num_heads // 2
            rule = (i <= j if forward else i >= j) if m.attn_self else (i < j if forward else i > j)
        else:
            rule = torch.ones(length, length, dtype=torch.bool) if m.attn_self else i != j
        mask = rule[None] & real[:, None, :] & real[:, :, None]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(m.head_dim)
        e_r = (torch.exp(s) if m.token2token == "exp" else torch.sigmoid(s)) * mask
        w = e_r[..., None] * e_s[:, None, :, :]
        z = w.sum(2)
        head = (w * v[:, None, :, :]).sum(2) / torch.where(z > 0, z, torch.ones_like(z))
        if m.gate is not None:
            g = torch.sigmoid(lin(m.gate, torch.cat([v, head], -1)))
            head = g * v + (1 - g) * head
        outs.append(head)
    y = torch.cat(outs, -1)
    if m.out_layer is not None:
        y = act(m.out_layer(y))
    return y * real[..., None]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(token2token="sigmoid", activation_name="elu"),  # SNLI configuration
        dict(token2token="exp"),
        dict(use_direction=False),
        dict(attn_self=True),
        dict(attn_input="x", s2t_hidden_layer=False, activate_v=False),
        dict(use_fusion_gate=False, output_dim=10, num_heads=4),
    ],
)
def test_sentence_module_matches_literal(kwargs):
    m = SentenceMTSA(6, 8, **kwargs).double().eval()
    x = torch.randn(3, 7, 6, dtype=torch.float64)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, 5:] = True
    pad[2, :2] = True
    torch.testing.assert_close(m(x, pad), sentence_literal(m, x, pad), rtol=0, atol=1e-10)


def test_sentence_module_pad_rows_zero_and_causality():
    m = SentenceMTSA(6, 8, num_heads=2, token2token="sigmoid").eval()
    x = torch.randn(1, 9, 6)
    pad = torch.zeros(1, 9, dtype=torch.bool)
    out = m(x, pad)
    x2 = x.clone()
    x2[:, 5:] = torch.randn(1, 4, 6) * 3
    out2 = m(x2, pad)
    torch.testing.assert_close(out2[:, :5, :4], out[:, :5, :4], rtol=0, atol=1e-6)  # forward head: rounding only
    assert (out2[:, :5, 4:] - out[:, :5, 4:]).abs().max() > 1e-3  # backward head sees the change
    padded = torch.cat([x, torch.randn(1, 3, 6)], 1)
    pad_more = torch.tensor([[False] * 9 + [True] * 3])
    out3 = m(padded, pad_more)
    assert (out3[:, 9:] == 0).all()
    torch.testing.assert_close(out3[:, :9], out, rtol=0, atol=1e-6)


def test_sentence_module_dropout_train_only_and_errors():
    m = SentenceMTSA(6, 8, attn_dropout=0.2, dense_dropout=0.3)
    x = torch.randn(2, 5, 6)
    assert not torch.allclose(m(x), m(x))
    m.eval()
    torch.testing.assert_close(m(x), m(x))
    with pytest.raises(ValueError, match="divisible"):
        SentenceMTSA(6, 9, num_heads=2)
    with pytest.raises(ValueError, match="even number of heads"):
        SentenceMTSA(6, 9, num_heads=3)
