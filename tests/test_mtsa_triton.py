"""The fused Triton kernel (``mtsa_core(kernel="triton")``) against the literal float64 references.

Without a GPU the kernels run on CPU tensors under Triton's interpreter, which must be switched on before
``triton`` is first imported: this module sets ``TRITON_INTERPRET=1`` at collection unless a CUDA device is
present (then the same tests run the compiled kernels on it; set ``TRITON_INTERPRET=1`` to interpret there too).
"""

import contextlib
import math
import os
import subprocess
import sys

import pytest
import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from mtsa_fairseq.modules import mtsa_triton  # noqa: E402  (after TRITON_INTERPRET)
from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention  # noqa: E402
from mtsa_fairseq.modules.mtsa_core import allowed_mask, mtsa_core  # noqa: E402
from mtsa_fairseq.modules.mtsa_reference import mtsa_literal  # noqa: E402

# the interpreter evaluates with numpy, which warns where IEEE arithmetic gives inf or NaN as intended (sigmoid's
# exp of a large negative score; the NaN keys of test_blocks_a_direction_excludes_are_skipped)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
DEVICE = "cuda" if ON_GPU else "cpu"
B, H, L, DK, DV = 2, 2, 33, 12, 20  # three query and key blocks of 16 under the interpreter; padded head dims
# the largest tile a kernel may use: fixed under the interpreter, autotuned among _TILES on a GPU
BLOCK = max(max(t[:2]) for t in mtsa_triton._TILES) if ON_GPU else mtsa_triton._config(DK, DV)["BLOCK_M"]


@pytest.fixture(autouse=True)
def _one_tile_per_test(request, monkeypatch):
    """On a GPU the n-th test of the session runs tile n mod 10 of ``_TILES`` (one config: no tuning) instead of
    autotuning ten compiled tiles for every new shape, which took minutes over this file on an H100; so the
    file covers every tile, and the benchmarks do the tuning. Under the interpreter the tiles are fixed anyway."""
    if not ON_GPU:
        return
    index = request.session.items.index(request.node) % len(mtsa_triton._TILES)
    for tuner in (mtsa_triton._FWD, mtsa_triton._BWD_KV, mtsa_triton._BWD_Q):
        monkeypatch.setattr(tuner, "configs", [tuner.configs[index]])


@contextlib.contextmanager
def _deterministic_algorithms(enabled: bool):
    """``torch.use_deterministic_algorithms(enabled)`` (warning only) inside, the previous setting after."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def make_inputs(length=L, dv=DV, scale=1.0):
    """float64 leaves ``q, k, v, E_S`` (the references' inputs)."""
    q = torch.randn(B, H, length, DK, dtype=torch.float64) * scale
    k = torch.randn(B, H, length, DK, dtype=torch.float64) * scale
    v = torch.randn(B, H, length, dv, dtype=torch.float64)
    s2t = torch.rand(B, H, length, dv, dtype=torch.float64) + 0.05
    return [t.requires_grad_() for t in (q, k, v, s2t)]


def padding(length=L):
    pad = torch.zeros(B, length, dtype=torch.bool)
    pad[0, :5] = True  # left-padded (fairseq sources)
    pad[1, length - 6:] = True  # right-padded (targets)
    return pad


def on_device(tensors, dtype=torch.float32):
    return [t.detach().to(DEVICE, dtype).requires_grad_() for t in tensors]


def max_rel(x, ref):
    """Largest absolute error relative to the reference's largest magnitude."""
    return ((x.detach().double().cpu() - ref.detach()).abs().max() / ref.detach().abs().max()).item()


def compare(out, ref, inputs, ref_inputs, tol):
    """Output and the gradients of every input, all to ``tol`` (max-norm relative)."""
    grad = torch.randn_like(ref)
    assert max_rel(out, ref) < tol
    grads = torch.autograd.grad(out, inputs, grad.to(out.device, out.dtype))
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad)
    for g, r in zip(grads, ref_grads):
        assert torch.isfinite(g).all()
        assert max_rel(g, r) < tol


@pytest.mark.parametrize("t2t", ["exp", "sigmoid"])
@pytest.mark.parametrize("direction", [None, "bi", "forward", "backward"])
@pytest.mark.parametrize("include_self", [True, False])
def test_matches_literal_float32(t2t, direction, include_self):
    ref_inputs = make_inputs()
    pad = padding()
    inputs = on_device(ref_inputs)
    out = mtsa_core(*inputs, pad.to(DEVICE), direction, include_self, t2t, kernel="triton")
    ref = mtsa_literal(*ref_inputs, pad, direction, include_self, t2t)
    compare(out, ref, inputs, ref_inputs, 1e-5)


@pytest.mark.parametrize("t2t,direction,include_self", [("exp", "bi", False), ("sigmoid", None, True)])
def test_deterministic_mode_computes_dq_in_a_second_kernel(t2t, direction, include_self, monkeypatch):
    """Under ``torch.use_deterministic_algorithms(True)`` dq comes from the per-query-block kernel instead of
    atomic sums: launched only then, and equal to the literal (as every gradient, for a q laid out as the module
    hands it over); twice the same bits."""
    launched = []
    monkeypatch.setattr(mtsa_triton, "_BWD_Q", _Spy(mtsa_triton._BWD_Q, launched))
    ref_inputs = make_inputs()
    pad = padding()
    ref = mtsa_literal(*ref_inputs, pad, direction, include_self, t2t)
    grad = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, ref_inputs, grad)
    modes, results = (False, True, True), []
    for i, deterministic in enumerate(modes):
        with _deterministic_algorithms(deterministic):
            inputs = on_device(ref_inputs)
            # q as the module hands it over: [B, L, H, d] memory viewed as [B, H, L, d]
            q = inputs[0].detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
            inputs = [q, *inputs[1:]]
            out = mtsa_core(*inputs, pad.to(DEVICE), direction, include_self, t2t, kernel="triton")
            grads = torch.autograd.grad(out, inputs, grad.to(DEVICE, out.dtype))
        assert len(launched) == sum(modes[:i + 1])
        for g, r in zip(grads, ref_grads):
            assert max_rel(g, r) < 1e-5
        results.append(grads[0])
    assert torch.equal(results[1], results[2])


class _Spy:
    """A kernel launcher that records its launches."""

    def __init__(self, kernel, launched):
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid):
        self.launched.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize(
    "t2t,direction,include_self,q_len",
    [("exp", "forward", True, 1), ("exp", "forward", True, 7), ("sigmoid", "forward", False, 20),
     ("exp", None, True, 5), ("sigmoid", "bi", True, 17)],
)
def test_fewer_queries_than_keys(t2t, direction, include_self, q_len):
    """Incremental decoding: the last ``q_len`` queries against every key equal the literal's last rows."""
    ref_inputs = make_inputs()
    pad = padding()
    inputs = on_device(ref_inputs)
    out = mtsa_core(inputs[0][:, :, -q_len:], *inputs[1:], pad.to(DEVICE), direction, include_self, t2t,
                    kernel="triton")
    ref = mtsa_literal(*ref_inputs, pad, direction, include_self, t2t)[:, :, -q_len:]
    compare(out, ref, inputs, ref_inputs, 1e-5)


@pytest.mark.skipif(ON_GPU, reason="on a GPU autotuning picks the tiles; under the interpreter this test sets them")
@pytest.mark.parametrize("tiles", [(32, 16), (16, 32)])
@pytest.mark.parametrize(
    "t2t,direction,include_self,q_len,deterministic",
    [("exp", "bi", False, L, False), ("sigmoid", "forward", True, L, True), ("exp", "backward", True, 20, False),
     ("sigmoid", "forward", False, 7, True)],
)
def test_unequal_query_and_key_blocks(tiles, t2t, direction, include_self, q_len, deterministic, monkeypatch):
    """Query and key blocks of different sizes, as autotuning picks them on a GPU (e.g. 128 x 64 or 32 x 64),
    which square tiles cannot tell apart: the directional block ranges, incremental decoding and both dq
    kernels against the literal."""
    config = mtsa_triton._config
    monkeypatch.setattr(mtsa_triton, "_config", lambda dk, dv: {**config(dk, dv), "BLOCK_M": tiles[0],
                                                                 "BLOCK_N": tiles[1]})
    ref_inputs = make_inputs()
    pad = padding()
    inputs = on_device(ref_inputs)
    with _deterministic_algorithms(deterministic):
        out = mtsa_core(inputs[0][:, :, -q_len:], *inputs[1:], pad.to(DEVICE), direction, include_self, t2t,
                        kernel="triton")
        ref = mtsa_literal(*ref_inputs, pad, direction, include_self, t2t)[:, :, -q_len:]
        compare(out, ref, inputs, ref_inputs, 1e-5)


def test_causal_module_decodes_incrementally():
    """The decoder's self-attention on the kernel: full causal forward = step-by-step decoding with the
    cache = the float64 module."""
    m = MTSAMultiheadAttention(32, 4, causal=True, kernel="triton").eval()
    m64 = MTSAMultiheadAttention(32, 4, causal=True).double().eval()
    m64.load_state_dict(m.state_dict())
    m = m.to(DEVICE)
    x = torch.randn(9, 2, 32).to(DEVICE)
    x64 = x.cpu().double()
    mask = torch.triu(torch.full((9, 9), float("-inf")), 1)
    full, _ = m(x, x, x, attn_mask=mask.to(DEVICE))
    ref, _ = m64(x64, x64, x64, attn_mask=mask.double())
    assert max_rel(full, ref) < 1e-5
    state, steps = {}, []
    for t in range(9):
        xt = x[t:t + 1]
        steps.append(m(xt, xt, xt, incremental_state=state)[0])
    assert max_rel(torch.cat(steps), ref) < 1e-5


def test_gradient_with_any_strides():
    """The output's gradient may arrive with any strides (a caller's permute): the same gradients as a
    contiguous one, equal to the literal's."""
    ref_inputs = make_inputs()
    pad = padding()
    inputs = on_device(ref_inputs)
    out = mtsa_core(*inputs, pad.to(DEVICE), None, True, "exp", kernel="triton")
    ref = mtsa_literal(*ref_inputs, pad, None, True, "exp")
    grad = torch.randn(B, L, H, DV, dtype=torch.float64).permute(0, 2, 1, 3)  # [B, H, L, d_v], not contiguous
    grads = torch.autograd.grad(out, inputs, grad.to(DEVICE, out.dtype))
    for g, r in zip(grads, torch.autograd.grad(ref, ref_inputs, grad)):
        assert max_rel(g, r) < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_module_gradients_match_float64(causal):
    """``MTSAMultiheadAttention`` training on the kernel: the gradients of its input and of every parameter
    equal the float64 module's (the module hands the kernel a permuted output gradient)."""
    m64 = MTSAMultiheadAttention(32, 4, causal=causal).double()
    m = MTSAMultiheadAttention(32, 4, causal=causal, kernel="triton")
    m.load_state_dict(m64.state_dict())
    m = m.to(DEVICE)
    x64 = torch.randn(L, B, 32, dtype=torch.float64, requires_grad=True)
    x = x64.detach().float().to(DEVICE).requires_grad_()
    pad, mask = (None, torch.triu(torch.full((L, L), float("-inf")), 1)) if causal else (padding(), None)
    out = m(x, x, x, key_padding_mask=None if causal else pad.to(DEVICE),
            attn_mask=None if mask is None else mask.to(DEVICE))[0]
    ref = m64(x64, x64, x64, key_padding_mask=pad, attn_mask=None if mask is None else mask.double())[0]
    assert max_rel(out, ref) < 1e-5
    grad = torch.randn_like(ref)
    (out * grad.to(DEVICE, out.dtype)).sum().backward()
    (ref * grad).sum().backward()
    for (name, p), p64 in zip(m.named_parameters(), m64.parameters()):
        if name != "k_proj.bias":  # 0 in exact arithmetic (a key bias shifts each query's scores equally)
            assert max_rel(p.grad, p64.grad) < 1e-5, name
    assert max_rel(x.grad, x64.grad) < 1e-5


@pytest.mark.parametrize("t2t", ["exp", "sigmoid"])
def test_dropout_moments_match_formula(t2t, monkeypatch):
    """Over 10240 draws (rows, heads, calls: a new Philox seed each), E[out] is the undropped output, and
    the variance and the cross-feature covariance match a keep = sqrt(1 - p) mask on ``E_R`` shared by
    the features, with ``Z`` undropped. Every query is the same and sees the same 4 keys, so each row is
    an independent draw; under the interpreter one block covers all 512 positions (fewer, larger steps)."""
    if not ON_GPU:
        monkeypatch.setattr(mtsa_triton, "_config", lambda d_k, d_v: dict(BLOCK_M=512, BLOCK_N=512, BLOCK_DK=16,
                                                                             BLOCK_DV=16))
    p, length, real, batch = 0.3, 512, 4, 5
    keep = math.sqrt(1 - p)
    q_row = torch.randn(DK)
    k_real, v_real, s_real = torch.randn(real, DK), torch.randn(real, 16), torch.rand(real, 16) + 0.05
    v_real[:, 1] = v_real[:, 0]  # features 0 and 1 covary through the shared mask

    def per_head(row, width):
        x = torch.zeros(batch, H, length, width)
        x[:, :, :real] = row
        return x.to(DEVICE)

    q = q_row.expand(batch, H, length, DK).contiguous().to(DEVICE)
    k, e_s, v = per_head(k_real, DK), per_head(s_real, 16), per_head(v_real, 16)
    pad = torch.zeros(batch, length, dtype=torch.bool, device=DEVICE)
    pad[:, real:] = True
    samples = torch.cat([
        mtsa_triton.mtsa_triton(q, k, e_s, v * e_s, pad, None, True, t2t, keep)[0].reshape(-1, 16).cpu()
        for _ in range(2)
    ]).double()
    s = (k_real.double() @ q_row.double()) / math.sqrt(DK)
    e_r = torch.exp(s) if t2t == "exp" else torch.sigmoid(s)
    a = e_r[:, None] * s_real.double() * v_real.double() / (e_r @ s_real.double())  # [keys, features]
    var = (a**2).sum(0) * (1 / keep - 1)
    cov01 = (a[:, 0] * a[:, 1]).sum() * (1 / keep - 1)
    emp = samples - samples.mean(0)
    assert ((samples.mean(0) - a.sum(0)).abs() < 5 * var.sqrt() / math.sqrt(len(samples))).all()
    torch.testing.assert_close(emp.pow(2).mean(0), var, rtol=0.1, atol=0)
    torch.testing.assert_close((emp[:, 0] * emp[:, 1]).mean(), cov01, rtol=0.1, atol=0)


@pytest.mark.parametrize("t2t,direction,include_self", [("exp", "bi", True), ("sigmoid", None, False)])
def test_dropout_is_reproducible_and_the_backward_uses_the_forward_mask(t2t, direction, include_self):
    """The mask depends only on torch's seed. Read it off with ``NV = I`` and ``E_S = 1`` (then
    ``out[j, i] = E_R[j, i] D[j, i] / keep / Z[j]``), and the dropped output and all its gradients equal the
    literal float64 formula of reference §8.3 with that mask."""
    keep = math.sqrt(1 - 0.4)
    length = DV
    q, k, v, s2t = make_inputs(length=length)
    pad = padding(length)
    eye = torch.eye(length, dtype=torch.float32).expand(B, H, length, length).contiguous().to(DEVICE)
    torch.manual_seed(11)
    probe, _ = mtsa_triton.mtsa_triton(*on_device([q, k]), torch.ones_like(eye), eye, pad.to(DEVICE), direction,
                                       include_self, t2t, keep)
    kept = (probe != 0).cpu()
    inputs = on_device([q, k, s2t, v * s2t])
    torch.manual_seed(11)
    out, _ = mtsa_triton.mtsa_triton(*inputs, pad.to(DEVICE), direction, include_self, t2t, keep)
    torch.manual_seed(11)
    again, _ = mtsa_triton.mtsa_triton(*inputs, pad.to(DEVICE), direction, include_self, t2t, keep)
    torch.manual_seed(12)
    other, _ = mtsa_triton.mtsa_triton(*inputs, pad.to(DEVICE), direction, include_self, t2t, keep)
    assert torch.equal(out, again) and not torch.equal(out, other)

    ref_inputs = [t.detach().clone().requires_grad_() for t in (q, k, s2t, v * s2t)]
    scores = ref_inputs[0] @ ref_inputs[1].transpose(-1, -2) / math.sqrt(DK)
    mask = allowed_mask(pad, B, H, length, direction, include_self)
    e_r = (torch.exp(scores) if t2t == "exp" else torch.sigmoid(scores)) * mask
    assert 0.2 < 1 - kept[mask].double().mean() < 0.35  # drop = 1 - sqrt(0.6) = 0.225 of the allowed pairs
    z = e_r @ ref_inputs[2]
    ref = (e_r * kept / keep) @ ref_inputs[3] / torch.where(z > 0, z, torch.ones_like(z))
    compare(out, ref, inputs, ref_inputs, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    """Logits around 100 (raw exp overflows in half precision) stay finite and close to float64."""
    ref_inputs = make_inputs(scale=6.0)
    pad = padding()
    inputs = on_device(ref_inputs, dtype)
    out = mtsa_core(*inputs, pad.to(DEVICE), "bi", False, kernel="triton")
    assert out.dtype == dtype
    ref = mtsa_literal(*(t.detach().to(dtype).double().requires_grad_() for t in ref_inputs), pad, "bi", False)
    assert torch.isfinite(out).all() and max_rel(out, ref) < 0.03
    grads = torch.autograd.grad(out.float().pow(2).sum(), inputs)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("t2t,direction", [("exp", None), ("exp", "bi"), ("sigmoid", "forward")])
def test_underflowing_products_are_recomputed_in_log_space(t2t, direction):
    """Scores spanning hundreds and source2token logits spanning 150 in float32: ``E_R E_S`` underflows
    for many (query, feature) pairs, and those rows are recomputed in log space (mtsa_core)."""
    q, k, v, _ = make_inputs(scale=5.0)
    logits = (-150 * torch.rand(B, H, L, DV, dtype=torch.float64)).requires_grad_()
    pad = padding()
    inputs = on_device([q, k, v, logits])
    out = mtsa_core(*inputs, pad.to(DEVICE), direction, True, t2t, kernel="triton", s2t_activation="exp")
    ref = mtsa_literal(q, k, v, logits.exp(), pad, direction, True, t2t)
    compare(out, ref, inputs, [q, k, v, logits], 1e-4)


@pytest.mark.parametrize("include_self", [True, False])
def test_blocks_a_direction_excludes_are_skipped(include_self):
    """NaN in keys, values and E_S beyond the first block leave forward heads' first query block untouched
    (and NaN before the last block, backward heads' last query block): those key blocks are never loaded,
    in the forward pass and in dq's backward."""
    length = 3 * BLOCK
    q, k, v, s2t = on_device(make_inputs(length=length))
    clean = mtsa_core(q, k, v, s2t, None, "bi", include_self, kernel="triton")
    fw, bw = slice(0, H // 2), slice(H // 2, H)
    for heads, rows, poisoned in ((fw, slice(0, BLOCK), slice(BLOCK, None)),
                                  (bw, slice(2 * BLOCK, None), slice(0, 2 * BLOCK))):
        bad = [t.detach().clone() for t in (k, v, s2t)]
        for t in bad:
            t[:, :, poisoned] = float("nan")
        q_leaf = q.detach().clone().requires_grad_()
        out = mtsa_core(q_leaf, *bad, None, "bi", include_self, kernel="triton")
        torch.testing.assert_close(out[:, heads, rows], clean[:, heads, rows], rtol=0, atol=0)
        (grad,) = torch.autograd.grad(out[:, heads, rows].sum(), q_leaf)
        assert torch.isfinite(grad[:, heads, rows]).all()


def test_no_l_by_l_tensor(largest_tensor):
    """Forward and backward, with dropout: nothing of ``[B, H, L, L]`` size (the interpreter's byte copies of
    the ``[B, H, L, d]`` arguments included)."""
    length = 64
    q, k, v, s2t = on_device(make_inputs(length=length, dv=4))
    pad = padding(length).to(DEVICE)
    with largest_tensor() as mode:
        mtsa_core(q, k, v, s2t, pad, "bi", False, kernel="triton", dropout_p=0.1, training=True).sum().backward()
    assert mode.largest < B * H * length * length


COMPILE = """
import os
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mtsa_fairseq.modules import mtsa_triton as mt

every = dict(DIRECTIONAL=True, INCLUDE_SELF=False, EXP=True, DROPOUT=True, HAS_PAD=True, PRECISION=None,
             WIDEN_BF16=False, FUSED_DQ=True, BLOCK_M=128, BLOCK_N=64, BLOCK_DK=64, BLOCK_DV=64)
for fn, fp32 in ((mt._fwd_kernel, "Z M"), (mt._output_grads_kernel, "Z"), (mt._bwd_kv_kernel, "M DQ"),
                 (mt._bwd_q_kernel, "M")):
    consts = {name: value for name, value in every.items() if name in fn.arg_names}

    def kind(name):
        if name in consts:
            return "constexpr"
        if name == "PAD":
            return "*u8"
        if name.isupper() and name not in ("H", "LQ", "LK", "DK", "DV", "LEN_BUCKET"):
            return "*fp32" if name in fp32.split() else "*fp16"
        return {"keep": "fp32", "scale": "fp32", "seed": "i64"}.get(name, "i32")
    source = ASTSource(fn, {name: kind(name) for name in fn.arg_names}, constexprs=consts)
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8, num_stages=3))
# the autotuners built for CUDA: every tile for heads up to 64 wide, tiles of at most 64 above; dq zeroed per trial
for tuner in (mt._FWD, mt._BWD_KV, mt._BWD_Q):
    tuner.nargs = {}  # set by a launch
    assert [c.kwargs["BLOCK_M"] for c in tuner.configs] == [t[0] for t in mt._TILES]  # what _one_tile_per_test picks
    assert len(tuner.prune_configs(dict(BLOCK_DK=64, BLOCK_DV=64))) == len(mt._TILES)
    wide = tuner.prune_configs(dict(BLOCK_DK=128, BLOCK_DV=64))
    assert wide and all(max(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) <= 64 for c in wide)
assert mt._BWD_KV.reset_to_zero == ["DQ"]
print("compiled")
"""


@pytest.mark.skipif(ON_GPU, reason="on a GPU every other test compiles the kernels")
def test_kernels_compile_for_a_gpu(tmp_path):
    """The interpreter accepts more than the compiler: compile the four kernels (fp16, every mask, dropout
    and the atomic dq on) down to sm_90 machine code with the ptxas that ships in Triton's wheel, no GPU
    needed; and build their CUDA autotuners."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, timeout=1500, env=env)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
