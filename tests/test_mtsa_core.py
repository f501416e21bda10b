import itertools
import math
import os
import subprocess
import sys
import types

import pytest
import torch

from mtsa_fairseq.experiments.bench.launches import OperatorCount
from mtsa_fairseq.modules.mtsa_core import SharedPass, allowed_mask, has_allowed_key, mtsa_core
from mtsa_fairseq.modules.mtsa_reference import mtsa_literal, mtsa_naive

pytestmark = pytest.mark.any_device

B, H, L, DK, DV = 3, 4, 9, 5, 6


def make_inputs(dtype=torch.float64, b=B, h=H, length=L, requires_grad=False, scale=1.0):
    q = torch.randn(b, h, length, DK, dtype=dtype) * scale
    k = torch.randn(b, h, length, DK, dtype=dtype) * scale
    v = torch.randn(b, h, length, DV, dtype=dtype)
    s2t = torch.rand(b, h, length, DV, dtype=dtype) + 0.05
    return [t.requires_grad_(requires_grad) for t in (q, k, v, s2t)]


def padding(b=B, length=L, left=True):
    pad = torch.zeros(b, length, dtype=torch.bool)
    pad[1, : length // 3] = True  # left-padded row (fairseq sources)
    pad[2, length - 2 :] = True  # right-padded row
    if not left:
        pad[1] = False
    return pad


KERNELS = {"exp": ["auto", "sdpa", "sdpa-joint", "dense"], "sigmoid": ["auto", "dense", "flex"]}
CASES = [
    (t2t, kernel, direction, include_self, padded, chunk)
    for t2t in ("exp", "sigmoid")
    for kernel in KERNELS[t2t]
    for direction, include_self, padded, chunk in itertools.product(
        (None, "bi", "forward", "backward"), (True, False), (False, True), (None, 2)
    )
]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("t2t,kernel,direction,include_self,padded,chunk", CASES)
def test_matches_literal_float64(t2t, kernel, direction, include_self, padded, chunk):
    q, k, v, s2t = make_inputs()
    pad = padding() if padded else None
    ref = mtsa_literal(q, k, v, s2t, pad, direction, include_self, t2t)
    if kernel == "flex" and q.is_cuda:  # the compiled flex kernel has no float64: float32 against the literal
        with pytest.raises(ValueError, match="no float64"):
            mtsa_core(q, k, v, s2t, pad, direction, include_self, t2t, kernel=kernel)
        out = mtsa_core(*(t.float() for t in (q, k, v, s2t)), pad, direction, include_self, t2t, kernel=kernel,
                        query_chunk_size=chunk)
        torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)
        return
    out = mtsa_core(q, k, v, s2t, pad, direction, include_self, t2t, kernel=kernel, query_chunk_size=chunk)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("t2t", ["exp", "sigmoid"])
@pytest.mark.parametrize("direction,include_self", [(None, True), ("bi", False), (None, False)])
def test_matches_literal_float32(t2t, direction, include_self):
    q, k, v, s2t = make_inputs()
    pad = padding()
    out = mtsa_core(*(t.float() for t in (q, k, v, s2t)), pad, direction, include_self, t2t)
    ref = mtsa_literal(q, k, v, s2t, pad, direction, include_self, t2t)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)


def test_naive_matches_literal():
    q, k, v, s2t = make_inputs()
    pad = padding()
    for t2t, direction in itertools.product(("exp", "sigmoid"), (None, "bi")):
        torch.testing.assert_close(
            mtsa_naive(q, k, v, s2t, pad, direction, False, t2t),
            mtsa_literal(q, k, v, s2t, pad, direction, False, t2t), rtol=0, atol=1e-12,
        )


@pytest.mark.parametrize(
    "t2t,direction,include_self,kernel",
    [("exp", None, True, "sdpa"), ("exp", "bi", False, "sdpa"), ("exp", None, False, "dense"),
     ("exp", None, True, "sdpa-joint"), ("exp", "bi", False, "sdpa-joint"),
     ("sigmoid", "bi", False, "dense"), ("sigmoid", None, True, "dense")],
)
def test_gradcheck(t2t, direction, include_self, kernel):
    q, k, v, s2t = make_inputs(b=2, h=2, length=5, requires_grad=True)
    pad = torch.tensor([[False] * 5, [True, True, False, False, False]])

    def fn(q, k, v, s2t):
        return mtsa_core(q, k, v, s2t, pad, direction, include_self, t2t, kernel=kernel)

    assert torch.autograd.gradcheck(fn, (q, k, v, s2t))


def test_gradients_match_literal():
    inputs = make_inputs(requires_grad=True)
    pad = padding()
    grads = torch.autograd.grad(mtsa_core(*inputs, pad, "bi", False).pow(2).sum(), inputs)
    ref = torch.autograd.grad(mtsa_literal(*inputs, pad, "bi", False).pow(2).sum(), inputs)
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-10)
        assert torch.isfinite(g).all()


@pytest.mark.parametrize("t2t", ["exp", "sigmoid"])
@pytest.mark.parametrize("direction,include_self", [(None, True), ("bi", False), ("bi", True), (None, False)])
def test_padding_invariance(t2t, direction, include_self):
    q, k, v, s2t = make_inputs(b=1)
    base = mtsa_core(q, k, v, s2t, None, direction, include_self, t2t)
    extra = 4

    def grow(t, side):
        junk = torch.randn(1, H, extra, t.shape[-1], dtype=t.dtype).abs()
        return torch.cat([junk, t], 2) if side == "left" else torch.cat([t, junk], 2)

    for side in ("left", "right"):
        pad = torch.zeros(1, L + extra, dtype=torch.bool)
        real = slice(extra, None) if side == "left" else slice(0, L)
        pad[0, :extra] = side == "left"
        pad[0, L:] = side == "right"
        out = mtsa_core(*(grow(t, side) for t in (q, k, v, s2t)), pad, direction, include_self, t2t)
        torch.testing.assert_close(out[:, :, real], base, rtol=0, atol=1e-12)


@pytest.mark.parametrize("t2t", ["exp", "sigmoid"])
@pytest.mark.parametrize("include_self", [True, False])
def test_direction_causality(t2t, include_self):
    q, k, v, s2t = make_inputs(b=1)
    out = mtsa_core(q, k, v, s2t, None, "bi", include_self, t2t)
    j = 4
    changed = [t.clone() for t in (q, k, v, s2t)]
    for t in changed:
        t[:, :, j + 1 :] = t[:, :, j + 1 :].abs() * 3 + 1  # perturb every token after j
    out2 = mtsa_core(*changed, None, "bi", include_self, t2t)
    fw, bw = slice(0, H // 2), slice(H // 2, H)
    torch.testing.assert_close(out2[:, fw, : j + 1], out[:, fw, : j + 1], rtol=0, atol=0)
    assert (out2[:, bw, : j + 1] - out[:, bw, : j + 1]).abs().max() > 1e-3  # backward heads do see them
    # the mirror image: backward heads ignore tokens before j
    changed = [t.clone() for t in (q, k, v, s2t)]
    for t in changed:
        t[:, :, :j] = t[:, :, :j].abs() * 3 + 1
    out3 = mtsa_core(*changed, None, "bi", include_self, t2t)
    torch.testing.assert_close(out3[:, bw, j:], out[:, bw, j:], rtol=0, atol=0)


@pytest.mark.parametrize("t2t,kernel", [("exp", "sdpa"), ("exp", "dense"), ("sigmoid", "dense")])
def test_fully_masked_rows_are_zero_not_nan(t2t, kernel):
    q, k, v, s2t = make_inputs(requires_grad=True)
    pad = padding()
    pad[0] = True  # an all-padding sequence
    out = mtsa_core(q, k, v, s2t, pad, "bi", False, t2t, kernel=kernel)
    assert torch.isfinite(out).all()
    assert (out[0] == 0).all()
    first, last = 3, L - 3  # row 1 is left-padded by 3, row 2 right-padded by 2
    assert (out[1, : H // 2, first] == 0).all()  # first real token: no earlier key in forward heads
    assert (out[2, H // 2 :, last] == 0).all()  # last real token: no later key in backward heads
    assert not (out[1, : H // 2, first + 1] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, s2t))
    assert bool((~has_allowed_key(pad, B, L, "forward", False))[1, first])


def test_all_padding_without_direction():
    q, k, v, s2t = make_inputs()
    pad = torch.ones(B, L, dtype=torch.bool)
    assert (mtsa_core(q, k, v, s2t, pad) == 0).all()


@pytest.mark.parametrize("t2t", ["exp", "sigmoid"])
def test_dropout_moments_match_formula(t2t):
    """E[out] equals the undropped output; Var and the cross-feature covariance match independent
    keep = sqrt(1 - p) masks on E_R (shared across features) and E_S, with an undropped Z."""
    p, n = 0.3, 40000
    keep = math.sqrt(1 - p)
    q, k, v, s2t = make_inputs(b=1, h=1, length=4)
    reps = [t.expand(n, *t.shape[1:]).contiguous() for t in (q, k, v, s2t)]
    samples = mtsa_core(*reps, None, None, True, t2t, dropout_p=p, training=True)[:, 0, 2]  # query 2
    mask = allowed_mask(None, 1, 1, 4)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(DK)
    e_r = (torch.exp(s) if t2t == "exp" else torch.sigmoid(s)) * mask
    a = (e_r[0, 0, 2][:, None] * s2t[0, 0] * v[0, 0]) / (e_r[0, 0, 2] @ s2t[0, 0])  # [keys, features]
    mean = a.sum(0)
    var = (a**2).sum(0) * p / (1 - p)
    cov01 = (a[:, 0] * a[:, 1]).sum() * (1 / keep - 1)
    emp = samples - samples.mean(0)
    se = var.sqrt() / math.sqrt(n)
    assert ((samples.mean(0) - mean).abs() < 5 * se).all()
    torch.testing.assert_close(emp.pow(2).mean(0), var, rtol=0.06, atol=0)
    torch.testing.assert_close((emp[:, 0] * emp[:, 1]).mean(), cov01, rtol=0.12, atol=0)


def test_dropout_only_in_training():
    q, k, v, s2t = make_inputs()
    ref = mtsa_core(q, k, v, s2t, padding())
    torch.testing.assert_close(mtsa_core(q, k, v, s2t, padding(), dropout_p=0.5, training=False), ref)
    a = mtsa_core(q, k, v, s2t, padding(), dropout_p=0.5, training=True)
    assert not torch.allclose(a, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_does_not_overflow(dtype):
    inputs = [t.to(dtype) for t in make_inputs(scale=6.0)]  # logits ~100: raw exp overflows
    pad = padding()
    ref = mtsa_literal(*(t.double() for t in inputs), pad, "bi", False, "exp")
    assert not torch.isfinite(mtsa_naive(*inputs, pad)).all()
    out = mtsa_core(*inputs, pad, "bi", False)
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("kernel", ["sdpa", "sdpa-joint"])
@pytest.mark.parametrize("direction,include_self", [(None, True), ("bi", False), (None, False)])
def test_exp_path_never_builds_an_l_by_l_tensor(direction, include_self, kernel, largest_tensor):
    b, h, length, d = 2, 4, 256, 8
    q, k, v, s2t = (torch.randn(b, h, length, d, requires_grad=True) for _ in range(4))
    pad = torch.zeros(b, length, dtype=torch.bool)
    pad[1, :17] = True
    with largest_tensor() as mode:
        out = mtsa_core(q, k, v, s2t.abs(), pad, direction, include_self, query_chunk_size=16, kernel=kernel)
        out.sum().backward()
    assert mode.largest < b * length * length  # not even one [B, L, L] slab, let alone [B, H, L, L]
    with largest_tensor() as naive:
        mtsa_naive(q, k, v, s2t.abs(), pad, direction, include_self).sum().backward()
    assert naive.largest >= b * h * length * length  # the check can fail


def test_auto_computes_larger_cpu_inputs_by_matrix_products(monkeypatch, largest_tensor):
    """From 2**16 scores with keys up to 256, ``"auto"`` on CPU computes exp's products as ``"dense"`` (one softmax,
    one product over the joined values): the values and gradients of the two SDPA calls, scores materialised in
    query chunks of at most CHUNK_ELEMENTS."""
    core = sys.modules[mtsa_core.__module__]
    q, k, v, s2t = (t.cpu().float().requires_grad_() for t in make_inputs(b=4, length=128))
    pad = padding(b=4, length=128)
    expected = mtsa_core(q, k, v, s2t, pad, kernel="sdpa", s2t_activation="exp")
    grads = torch.autograd.grad(expected.sum(), (q, k, v, s2t))

    def no_sdpa(*args, **kwargs):
        raise AssertionError("auto called SDPA")

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", no_sdpa)
    largest, whole = {}, core.CHUNK_ELEMENTS
    for chunk_elements in (whole, 4096):
        monkeypatch.setattr(core, "CHUNK_ELEMENTS", chunk_elements)
        with largest_tensor() as mode:
            out = mtsa_core(q, k, v, s2t, pad, s2t_activation="exp")
            torch.testing.assert_close(out, expected)
            for got, want in zip(torch.autograd.grad(out.sum(), (q, k, v, s2t)), grads):
                torch.testing.assert_close(got, want)
        largest[chunk_elements] = mode.largest
    assert largest[4096] <= 4 * H * 128 * 2 * DV  # the joined values: each chunk's scores are smaller
    assert largest[whole] == 4 * H * 128 * 128  # the check can fail: unchunked, the [B, H, L, L] scores


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(direction="bi"), "even number of heads"),
        (dict(direction="sideways"), "direction must be one of"),
        (dict(token2token="relu"), "token2token must be one of"),
        (dict(dropout_p=1.0), "dropout_p"),
        (dict(kernel="sdpa", token2token="sigmoid"), "not an exp form"),
        (dict(kernel="sdpa-joint", token2token="sigmoid"), "not an exp form"),
        (dict(kernel="sdpa-joint", dropout_p=0.1, training=True), "'sdpa-joint' has no attention dropout"),
        (dict(kernel="flex"), "for token2token='sigmoid'"),
        (dict(kernel="cuda"), "kernel must be one of"),
        (dict(s2t_activation="tanh"), "s2t_activation must be one of"),
        (dict(direction=["bi"]), "direction must be one of"),  # unhashable: past the options' cache
        (dict(token2token=["exp"]), "token2token must be one of"),
    ],
)
def test_bad_arguments(kwargs, message):
    q, k, v, s2t = make_inputs(h=3)
    with pytest.raises(ValueError, match=message):
        mtsa_core(q, k, v, s2t, **kwargs)


def test_bad_shapes():
    q, k, v, s2t = make_inputs()
    with pytest.raises(ValueError, match="key_padding_mask must be bool"):
        mtsa_core(q, k, v, s2t, torch.zeros(B, L))
    with pytest.raises(ValueError, match="v and s2t"):
        mtsa_core(q, k, v, s2t[..., :2])
    with pytest.raises(ValueError, match="more queries than keys"):
        mtsa_core(torch.cat([q, q], 2), k, v, s2t)
    with pytest.raises(ValueError, match="no incremental decoding"):  # float32: flex on CUDA has no float64
        mtsa_core(*(t.float() for t in (q[:, :, -2:], k, v, s2t)), token2token="sigmoid", kernel="flex")


@pytest.mark.parametrize("t2t,kernel", [("exp", "sdpa"), ("exp", "sdpa-joint"), ("exp", "dense"), ("sigmoid", "dense")])
@pytest.mark.parametrize("direction", [None, "bi", "forward", "backward"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("last", [1, 4])
def test_last_queries_equal_the_last_rows(t2t, kernel, direction, include_self, last):
    """Incremental decoding: queries for the last positions only give the full result's last rows."""
    q, k, v, s2t = make_inputs()
    pad = padding(left=False)
    full = mtsa_core(q, k, v, s2t, pad, direction, include_self, t2t, kernel=kernel)
    for chunk in (None, 1):
        tail = mtsa_core(q[:, :, -last:], k, v, s2t, pad, direction, include_self, t2t, kernel=kernel,
                         query_chunk_size=chunk)
        torch.testing.assert_close(tail, full[:, :, -last:], rtol=0, atol=1e-12)


# ---------------------------------------------------------------- numerics at large activations (reference §8.4)


def max_rel(x, ref):
    return ((x.detach().double() - ref.detach()).abs().max() / ref.detach().abs().max()).item()


def extreme_inputs(s2t_activation):
    """float64 leaves: scores spanning hundreds, source2token logits spanning 150 (``s2t`` as the core takes
    it) and ``E_S`` for the literal reference. In float32 every linear-space ``E_R E_S`` product of some
    (query, feature) pairs underflows."""
    q, k, v, _ = make_inputs(scale=5.0)
    logits = -150 * torch.rand(B, H, L, DV, dtype=torch.float64)
    if s2t_activation is None:  # linear weights, as large a span as float32 holds
        logits = logits / 2
    s2t = (logits if s2t_activation else logits.exp()).requires_grad_()
    return [t.requires_grad_() for t in (q, k, v)] + [s2t]


def reference_weights(s2t, s2t_activation):
    return {None: lambda x: x, "exp": torch.exp, "sigmoid": torch.sigmoid}[s2t_activation](s2t)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(
    "t2t,kernel,direction,s2t_activation",
    [("exp", "sdpa", None, "exp"), ("exp", "sdpa", "bi", "sigmoid"), ("exp", "sdpa", "forward", None),
     ("exp", "sdpa-joint", None, "exp"), ("exp", "sdpa-joint", "bi", "sigmoid"),
     ("exp", "dense", "backward", "exp"), ("sigmoid", "dense", None, "exp"), ("sigmoid", "dense", "bi", None),
     ("sigmoid", "flex", "bi", "sigmoid")],
)
def test_underflowing_products_are_recomputed_in_log_space(t2t, kernel, direction, s2t_activation):
    inputs64 = extreme_inputs(s2t_activation)
    pad = padding()
    inputs = [t.detach().float().requires_grad_(kernel != "flex") for t in inputs64]  # no flex backward on CPU
    out = mtsa_core(*inputs, pad, direction, True, t2t, kernel=kernel, s2t_activation=s2t_activation)
    q, k, v, s2t = inputs64
    ref = mtsa_literal(q, k, v, reference_weights(s2t, s2t_activation), pad, direction, True, t2t)
    assert max_rel(out, ref) < 1e-4
    if kernel == "flex":
        return
    grad = torch.randn_like(ref)
    for g, r in zip(torch.autograd.grad(out, inputs, grad.float()), torch.autograd.grad(ref, inputs64, grad)):
        assert torch.isfinite(g).all()
        assert max_rel(g, r) < 1e-4


@pytest.mark.parametrize("t2t,kernel,direction", [("exp", "sdpa", None), ("exp", "sdpa", "bi"),
                                                  ("exp", "sdpa-joint", None), ("exp", "dense", None),
                                                  ("exp", "dense", "forward"),
                                                  ("sigmoid", "dense", "bi")])
def test_a_shared_pass_reads_nothing_and_names_the_first_call_that_underflowed(t2t, kernel, direction):
    """With ``shared`` the calls read nothing on the host and equal the checked calls where nothing underflowed;
    rows without a key (left padding under forward heads) are not taken for underflow."""
    pad = padding()
    normal = [t.float().requires_grad_() for t in make_inputs()]
    extreme = [t.detach().float() for t in extreme_inputs("exp")]
    shared = SharedPass()
    with OperatorCount() as count:
        out = mtsa_core(*normal, pad, direction, True, t2t, kernel=kernel, s2t_activation="exp", shared=shared)
        out.sum().backward()
        assert shared.dens and not count.syncs
        mtsa_core(*normal, pad, direction, True, t2t, kernel=kernel, s2t_activation="exp", shared=shared)
        mtsa_core(*extreme, pad, direction, True, t2t, kernel=kernel, s2t_activation="exp", shared=shared)
        mtsa_core(*(t.detach()[:0] for t in normal), pad[:0], direction, True, t2t, kernel=kernel,
                  s2t_activation="exp", shared=shared)  # an empty batch
    assert not count.syncs
    checked = [t.detach().clone().requires_grad_() for t in normal]
    expected = mtsa_core(*checked, pad, direction, True, t2t, kernel=kernel, s2t_activation="exp")
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for a, b in zip(normal, checked):
        torch.testing.assert_close(a.grad, b.grad)
    assert shared.first_underflowed() == 2
    assert SharedPass().first_underflowed() is None


@pytest.mark.parametrize("t2t", ["exp", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_source2token_span_does_not_zero_a_feature(t2t, dtype):
    """Feature 0's source2token logits: 0 at the last key, -40 elsewhere. A forward head's first query sees
    only key 0, whose ``E_S`` relative to the maximum (e^-40) is 0 in float16: the linear-space ratio is 0 / 0
    and the guard would return 0 instead of ``v[0, 0]``."""
    q, k, v, _ = make_inputs(b=1)
    logits = torch.zeros(1, H, L, DV, dtype=torch.float64)
    logits[..., :-1, 0] = -40.0
    inputs = [t.to(dtype).requires_grad_() for t in (q, k, v, logits)]
    out = mtsa_core(*inputs, None, "forward", True, t2t, s2t_activation="exp")
    ref = mtsa_literal(*(t.detach().double() for t in inputs[:3]), inputs[3].detach().double().exp(), None,
                       "forward", True, t2t)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, :, 0, 0].double(), ref[:, :, 0, 0], rtol=0.02, atol=0)
    assert max_rel(out, ref) < 0.02
    grads = torch.autograd.grad(out.float().pow(2).sum(), inputs)
    assert all(torch.isfinite(g).all() for g in grads)


def module_pair(**kwargs):
    from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention

    m = MTSAMultiheadAttention(16, 4, **kwargs).eval()
    m64 = MTSAMultiheadAttention(16, 4, **kwargs).double().eval()
    m64.load_state_dict(m.state_dict())
    return m, m64


@pytest.mark.parametrize("scale", [30, 100])
@pytest.mark.parametrize(
    "kwargs", [{}, dict(s2t_activation="exp"), dict(s2t_activation="sigmoid", bi_directional=True),
               dict(causal=True)],
)
def test_module_at_large_input_scales_matches_float64(kwargs, scale):
    """Inputs scaled by 30 and 100 in float32: the output within 1e-3 of the float64 module (relative,
    Frobenius) and every gradient finite."""
    m, m64 = module_pair(**kwargs)
    x = (torch.randn(7, 3, 16) * scale).requires_grad_()
    pad = None if m.causal else torch.tensor([[False] * 7, [True] * 2 + [False] * 5, [False] * 6 + [True]])
    out, _ = m(x, x, x, key_padding_mask=pad)
    x64 = x.detach().double()
    ref, _ = m64(x64, x64, x64, key_padding_mask=pad)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-3
    out.pow(2).mean().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("s2t_activation", ["scaled_sigmoid", "exp"])
def test_module_half_precision_stays_finite(dtype, s2t_activation):
    """Inputs scaled by 10: source2token logits span far more than float16's e^-17."""
    m, m64 = module_pair(s2t_activation=s2t_activation)
    m = m.to(dtype)
    x = (torch.randn(20, 2, 16) * 10).to(dtype).requires_grad_()
    out, _ = m(x, x, x)
    x64 = x.detach().double()
    ref, _ = m64(x64, x64, x64)
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 0.05
    out.float().pow(2).mean().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("s2t_activation", ["scaled_sigmoid", "exp"])
def test_float16_at_scale_100_is_finite_under_loss_scaling(s2t_activation):
    """Inputs scaled by 100 in float16: the true q/k weight gradients of a summed loss reach 1e5-1e6, beyond
    float16's 65504, so they must overflow unscaled; under the power-of-two loss scale that brings the true
    gradients into range (what fairseq's --fp16 scaler settles on), every gradient is finite."""
    from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention

    m = MTSAMultiheadAttention(64, 4, s2t_activation=s2t_activation).half()
    m32 = MTSAMultiheadAttention(64, 4, s2t_activation=s2t_activation)
    m32.load_state_dict(m.state_dict())
    x16 = (torch.randn(40, 2, 64) * 100).half()
    x32 = x16.float().requires_grad_()
    m32(x32, x32, x32)[0].sum().backward()
    true_max = max([p.grad.abs().max().item() for p in m32.parameters()] + [x32.grad.abs().max().item()])
    assert true_max > torch.finfo(torch.float16).max  # the case this test is about
    scale = 2.0 ** math.floor(math.log2(8192 / true_max))
    x = x16.clone().requires_grad_()
    (m(x, x, x)[0].float().sum() * scale).backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_kernel_choice(monkeypatch):
    core = sys.modules[mtsa_core.__module__]
    q, k, v, s2t = (t.cpu() for t in make_inputs(dtype=torch.float32))  # whatever --torch-device says
    assert core._choose_kernel("auto", "exp", q, q.shape[2], False) == "sdpa"  # few scores: the two SDPA calls
    assert core._choose_kernel("auto", "sigmoid", q, q.shape[2], False) == "dense"
    # CPU, float32 or float64, keys up to 256 and 2**16 scores or more: exp's products by matrix products
    assert core._choose_kernel("auto", "exp", q.new_empty(16, 4, 32, 8), 32, True) == "dense"
    assert core._choose_kernel("auto", "exp", q.new_empty(16, 4, 32, 8).double(), 32, False) == "dense"
    assert core._choose_kernel("auto", "exp", q.new_empty(16, 4, 32, 8).bfloat16(), 32, False) == "sdpa"
    assert core._choose_kernel("auto", "exp", q.new_empty(1, 4, 512, 8), 512, False) == "sdpa"  # long: flash
    assert core._choose_kernel("sdpa", "exp", q.new_empty(16, 4, 32, 8), 32, False) == "sdpa"
    cuda_half = types.SimpleNamespace(is_cuda=True, is_cpu=False, dtype=torch.float16, shape=(16, 4, 32, 8),
                                      device=types.SimpleNamespace(type="cuda"))
    monkeypatch.setattr(core, "triton_available", lambda: True)
    assert core._choose_kernel("auto", "exp", cuda_half, 32, True) == "sdpa"  # faster than Triton on an H100
    assert core._choose_kernel("auto", "sigmoid", cuda_half, 32, True) == "triton"
    monkeypatch.undo()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="CUDA tensors"):
        mtsa_core(q, k, v, s2t, kernel="triton")
    monkeypatch.setattr(core, "triton_available", lambda: False)
    with pytest.raises(ValueError, match=r"pip install mtsa-fairseq\[triton\]"):
        mtsa_core(q, k, v, s2t, kernel="triton")


def test_imports_and_runs_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, mtsa_fairseq\n"
        "from mtsa_fairseq.modules import MTSAMultiheadAttention, mtsa_core\n"
        "x = torch.randn(5, 2, 16)\n"
        "assert torch.isfinite(MTSAMultiheadAttention(16, 4)(x, x, x)[0]).all()\n"
        "q = torch.randn(1, 2, 5, 8)\n"
        "try:\n"
        "    mtsa_core(q, q, q, q.abs(), kernel='triton')\n"
        "except ValueError as error:\n"
        "    print(error)\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pip install mtsa-fairseq[triton]" in proc.stdout
