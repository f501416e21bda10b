"""DiSAN blocks (docs/reference.md §4): chunked directional attention vs the literal [B, L, L, d] version."""

import pytest
import torch

from mtsa_fairseq.modules.disan import DiSABlock, DiSAN, directional_attention
from mtsa_fairseq.modules.mtsa_reference import disa_naive

B, L, D = 3, 7, 5


def inputs(requires_grad=False, length=L):
    tensors = [torch.randn(B, length, D, dtype=torch.float64) * 3 for _ in range(3)]
    tensors.append(torch.randn(D, dtype=torch.float64))
    head, dep, values, bias = (t.requires_grad_(requires_grad) for t in tensors)
    return head, dep, bias, values


def padding(length=L):
    pad = torch.zeros(B, length, dtype=torch.bool)
    pad[1, :2] = True  # left padding
    pad[2, length - 3:] = True  # right padding
    return pad


@pytest.mark.parametrize("direction", ["forward", "backward", None])
@pytest.mark.parametrize("chunk", [None, 1, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_chunked_equals_naive_with_gradients(direction, chunk, padded):
    head, dep, bias, values = inputs(requires_grad=True)
    pad = padding() if padded else None
    out = directional_attention(head, dep, bias, values, pad, direction, chunk)
    ref = disa_naive(head, dep, bias, values, pad, direction)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (head, dep, bias, values), grad)
    want = torch.autograd.grad(ref, (head, dep, bias, values), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_rows_without_a_legal_key_are_zero_not_nan():
    head, dep, bias, values = inputs()
    out = directional_attention(head, dep, bias, values, padding(), "forward", 2)
    assert torch.isfinite(out).all()
    assert torch.all(out[0, 0] == 0) and torch.all(out[1, 2] == 0)  # first real token of each row
    back = directional_attention(head, dep, bias, values, padding(), "backward", 2)
    assert torch.all(back[2, L - 4] == 0)  # last real token of the right-padded row


@pytest.mark.parametrize("direction", ["forward", "backward", None])
def test_float32_matches_the_float64_reference_to_1e_6(direction):
    torch.manual_seed(0)
    head, dep, bias, values = (t.detach() for t in inputs(length=40))
    head, dep = head[..., :3].repeat(1, 1, 100), dep[..., :3].repeat(1, 1, 100)  # 300 channels
    bias, values = bias[:3].repeat(100), values[..., :3].repeat(1, 1, 100)
    pad = padding(40)
    low = [t.float().requires_grad_() for t in (head, dep, bias, values)]
    high = [t.clone().requires_grad_() for t in (head, dep, bias, values)]
    out = directional_attention(*low, pad, direction, 7)
    ref = disa_naive(*high, pad, direction)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-6)
    grad = torch.randn_like(ref) / ref.numel() ** 0.5
    got = torch.autograd.grad(out, low, grad.float())
    want = torch.autograd.grad(ref, high, grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)


def test_gradcheck_through_recomputed_chunks():
    head, dep, bias, values = inputs(requires_grad=True, length=4)
    assert torch.autograd.gradcheck(
        lambda *t: directional_attention(*t, padding(4), "backward", 1), (head, dep, bias, values)
    )


@pytest.mark.parametrize("chunked", [True, False])
def test_memory_is_bounded_by_the_chunk(chunked, largest_tensor):
    length, chunk = 64, 4
    block = DiSABlock(D, "forward", chunk_size=chunk if chunked else length)
    x = torch.randn(B, length, D, requires_grad=True)
    with largest_tensor() as mode:
        block(x, padding(length)).sum().backward()
    full = B * length * (length - 1) * D  # every query with the keys the forward mask can allow
    if chunked:
        assert mode.largest <= B * chunk * length * D < full
    else:
        assert mode.largest >= full  # the check can fail


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_block_is_directional_and_padding_invariant(direction):
    block = DiSABlock(D, direction, activation_name="relu").double().eval()
    x = torch.randn(1, 8, D, dtype=torch.float64)
    out = block(x)
    changed = x.clone()
    changed[:, 5] += 3.0
    out_changed = block(changed)
    same = slice(0, 5) if direction == "forward" else slice(6, 8)
    torch.testing.assert_close(out_changed[:, same], out[:, same], rtol=0, atol=1e-12)
    padded = torch.cat([torch.randn(1, 3, D, dtype=torch.float64) * 50, x], 1)
    pad = torch.tensor([[True] * 3 + [False] * 8])
    out_padded = block(padded, pad)
    torch.testing.assert_close(out_padded[:, 3:], out, rtol=0, atol=1e-10)
    assert torch.all(out_padded[:, :3] == 0)


def test_disan_pooling_ignores_padding_and_parameter_count():
    model = DiSAN(300, activation_name="elu")
    # reference §4.3: 2 x 451,500 (DiSA blocks) + 721,200 (source2token on 600) in the SNLI model
    assert sum(p.numel() for p in model.blocks[0].parameters()) == 451_500
    assert sum(p.numel() for p in model.parameters()) == 2 * 451_500 + 721_200
    small = DiSAN(D, directional=False).double().eval()
    assert [b.direction for b in small.blocks] == [None, None]
    x = torch.randn(2, 6, D, dtype=torch.float64)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[:, 6:] = True
    padded = torch.cat([x, torch.randn(2, 3, D, dtype=torch.float64)], 1)
    torch.testing.assert_close(small(padded, pad), small(x), rtol=0, atol=1e-10)
    assert small(x).shape == (2, 2 * D)


def test_bad_direction():
    with pytest.raises(ValueError, match="direction must be one of"):
        DiSABlock(D, "sideways")
