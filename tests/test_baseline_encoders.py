"""Baseline sentence encoders of the DiSAN paper (mtsa_fairseq/modules/baseline_encoders.py), and the stacked MTSA
encoder under their common interface (its own tests: test_stacked_mtsa.py)."""

import math

import pytest
import torch

from mtsa_fairseq.modules.baseline_encoders import (
    BiLSTMEncoder,
    HierarchicalCNNEncoder,
    MultiCNNEncoder,
    MultiHeadEncoder,
    ProjectedMultiHeadEncoder,
    authors_positional_encoding,
    sinusoidal_encoding,
)
from mtsa_fairseq.modules.mtsa_reference import multi_head_literal
from mtsa_fairseq.modules.stacked_mtsa import StackedMTSA

D = 8

ENCODERS = {
    "bilstm": (lambda: BiLSTMEncoder(D, hidden_dim=6), 12),
    "multi_cnn": (lambda: MultiCNNEncoder(D, kernel_sizes=(3, 4, 5), channels=4), 12),
    "hrchy_cnn": (lambda: HierarchicalCNNEncoder(D, hidden_dim=6, num_layers=3, kernel_size=3), 6),
    "hrchy_cnn_same_width": (lambda: HierarchicalCNNEncoder(D, hidden_dim=D), D),
    "multi_head": (lambda: MultiHeadEncoder(D, num_heads=4, head_dim=3), 12),
    "multi_head_with_dropout": (lambda: MultiHeadEncoder(D, num_heads=2, head_dim=5, dropout=0.3), 10),
    "multi_head_proj": (lambda: ProjectedMultiHeadEncoder(D, num_heads=4), D),
    "multi_head_proj_8x3": (lambda: ProjectedMultiHeadEncoder(D, num_heads=8, head_dim=3), 24),
    "stacked_mtsa": (lambda: StackedMTSA(D, num_heads=4, num_layers=3, dropout=0.0, attn_dropout=0.0,
                                         dense_dropout=0.0), D),
}


def build(name):
    torch.manual_seed(0)
    factory, width = ENCODERS[name]
    return factory().double(), width


@pytest.mark.parametrize("name", ENCODERS)
def test_output_shape_and_width(name):
    model, width = build(name)
    assert model.output_dim == width
    x = torch.randn(3, 7, D, dtype=torch.float64)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    mask[1, :2] = True
    mask[2, 5:] = True
    assert model(x, mask).shape == (3, width)
    assert model(x).shape == (3, width)


@pytest.mark.parametrize("name", ENCODERS)
def test_padding_invariance(name):
    """The same sentence alone, left-padded and right-padded (large random pads) encodes identically."""
    model, _ = build(name)
    model.eval()
    n, pad = 5, 3
    sentence = torch.randn(1, n, D, dtype=torch.float64)
    x = 1e3 * torch.randn(2, n + pad, D, dtype=torch.float64)
    x[0, pad:] = sentence[0]  # left padded
    x[1, :n] = sentence[0]  # right padded
    mask = torch.zeros(2, n + pad, dtype=torch.bool)
    mask[0, :pad] = True
    mask[1, n:] = True
    with torch.no_grad():
        alone = model(sentence)
        padded = model(x, mask)
    torch.testing.assert_close(padded[0], alone[0], rtol=0, atol=1e-8)
    torch.testing.assert_close(padded[1], alone[0], rtol=0, atol=1e-8)


@pytest.mark.parametrize("name", ENCODERS)
def test_gradients_reach_every_parameter(name):
    model, _ = build(name)
    model.train()
    x = torch.randn(3, 6, D, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[0, :2] = True
    mask[2, 4:] = True
    out = model(x, mask)
    (out * torch.randn_like(out)).sum().backward()
    for pname, param in model.named_parameters():
        assert param.grad is not None, pname
        assert torch.isfinite(param.grad).all(), pname
        assert param.grad.abs().sum() > 0, pname
    assert torch.isfinite(x.grad).all()
    assert torch.all(x.grad[0, :2] == 0) and torch.all(x.grad[2, 4:] == 0)  # pads feed nothing


@pytest.mark.parametrize("name", ENCODERS)
def test_fully_padded_rows_are_finite(name):
    model, width = build(name)
    x = torch.randn(2, 5, D, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1] = True
    out = model(x, mask)
    assert torch.isfinite(out).all()
    assert torch.all(out[1] == 0)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    for pname, param in model.named_parameters():
        assert param.grad is None or torch.isfinite(param.grad).all(), pname


def test_sinusoidal_encoding_values():
    pe = sinusoidal_encoding(torch.arange(4)[None], 6, torch.float64)[0]
    p, i = 3, 1
    assert pe[p, 2 * i].item() == pytest.approx(torch.sin(torch.tensor(p / 10000 ** (2 * i / 6))).item())
    assert pe[p, 2 * i + 1].item() == pytest.approx(torch.cos(torch.tensor(p / 10000 ** (2 * i / 6))).item())
    assert sinusoidal_encoding(torch.arange(3)[None], 5, torch.float64).shape == (1, 3, 5)


def test_authors_positional_encoding_doubles_vaswani_exponent():
    pe = authors_positional_encoding(torch.arange(4)[None], 6, torch.float64)[0]
    p = 3
    for f in (0, 2, 4):
        assert pe[p, f].item() == pytest.approx(math.sin(p / 10000 ** (2 * f / 6)))
        assert pe[p, f + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * f / 6)))


def _right_padded(lengths, length=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), length, D, dtype=torch.float64, generator=g)
    pad = torch.arange(length)[None, :] >= torch.tensor(lengths)[:, None]
    return x, pad


def test_multi_head_equals_the_authors_code():
    """Per token (real rows) and pooled, against the literal float64 transcription of ``multi_head_attention``."""
    torch.manual_seed(1)
    model = MultiHeadEncoder(D, num_heads=4, head_dim=5).double().eval()
    x, pad = _right_padded([7, 4, 1])
    literal = multi_head_literal(x, ~pad, model.weight)
    ours = model.encode_tokens(x, pad)
    torch.testing.assert_close(ours[~pad], literal[~pad], rtol=0, atol=1e-12)
    assert torch.all(ours[pad] == 0) and not torch.all(literal[pad] == 0)  # the code leaves pad rows nonzero
    torch.testing.assert_close(model(x, pad), model.pool(literal, pad), rtol=0, atol=1e-12)  # the pooling skips them


def test_multi_head_weight_and_parameters():
    """One bias-free weight [3, heads, d_in, units] with TF's glorot-uniform fans, then the pooling; 540,000
    attention parameters at the papers' 300-d input, 8 x 75."""
    model = MultiHeadEncoder(300, num_heads=8, head_dim=75)
    limit = math.sqrt(6 / (3 * 8 * (300 + 75)))
    assert model.weight.shape == (3, 8, 300, 75) and model.weight.abs().max() <= limit
    assert model.weight.std().item() == pytest.approx(limit / math.sqrt(3), rel=0.02)
    attention = [name for name, _ in model.named_parameters() if not name.startswith("pool.")]
    assert attention == ["weight"] and model.weight.numel() == 540_000


def test_multi_head_dropout_draws_a_mask_per_projection_copy():
    """Each of the 3 x heads copies of the input gets its own dropout mask. With one token and identity weights a
    head's output is its value copy of the input (times its attention probability's own dropout), so two heads
    whose probability survived show different zero patterns: one mask shared by the copies could not."""
    heads = 8
    model = MultiHeadEncoder(D, num_heads=heads, head_dim=D, dropout=0.5).double().train()
    with torch.no_grad():
        model.weight.copy_(torch.eye(D, dtype=torch.float64).expand(3, heads, D, D))
    x = torch.ones(1, 1, D, dtype=torch.float64)  # plus the encoding at position 0: every feature nonzero
    torch.manual_seed(0)
    out = model.encode_tokens(x).reshape(heads, D)
    patterns = {tuple((row == 0).tolist()) for row in out if row.abs().sum() > 0}  # within one forward pass
    assert len(patterns) > 1


def test_bilstm_real_tokens_packed_in_order():
    """Per-token outputs equal running the LSTM on the real tokens alone, wherever the pads are."""
    model, _ = build("bilstm")
    model.eval()
    x = torch.randn(1, 6, D, dtype=torch.float64)
    mask = torch.tensor([[True, False, False, True, False, True]])
    with torch.no_grad():
        got = model.encode_tokens(x, mask)
        want = model.lstm(x[:, ~mask[0]])[0]
    torch.testing.assert_close(got[:, ~mask[0]], want, rtol=0, atol=1e-12)
    assert torch.all(got[:, mask[0]] == 0)
