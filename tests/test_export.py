"""fairseq's export checks (its tests/test_export.py and TestJitSequenceGenerator) for the MTSA layers and
translation models: ``torch.jit.script``, saved and loaded, computes what the eager modules compute; and
``torch.compile(fullgraph=True)`` captures an MTSA layer without a graph break."""

import importlib
import itertools
import math
from pathlib import Path
from unittest import mock

import pytest
import torch
from fairseq import options, tasks
from fairseq.sequence_generator import SequenceGenerator
from test_mtsa_attention import ENCODER_OPTIONS
from torch import Tensor, nn

import mtsa_fairseq.plugin
from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention
from mtsa_fairseq.modules.mtsa_core import mtsa_core, mtsa_core_scripted

core = importlib.import_module("mtsa_fairseq.modules.mtsa_core")  # the module (the package exports the function)
USER_DIR = str(Path(mtsa_fairseq.plugin.__file__).parent)
OPTIONS = [  # the encoder forms, the linear hidden activation (once a lambda) and the decoder's causal forms
    *ENCODER_OPTIONS,
    dict(s2t_hidden_activation="linear", bi_directional=True),
    dict(causal=True),
    dict(causal=True, s2t_activation="sigmoid", s2t_input="k", s2t_hidden_activation="tanh"),
]


def max_rel(x: Tensor, ref: Tensor) -> float:
    """The largest difference relative to the largest magnitude (gradients at large input scales span orders of
    magnitude, and float32 rounding scales with the largest)."""
    return ((x - ref).abs().max() / ref.abs().max()).item()


def save_and_load(scripted: torch.jit.ScriptModule, path: Path) -> torch.jit.ScriptModule:
    torch.jit.save(scripted, str(path))
    return torch.jit.load(str(path))


def future_mask(length: int) -> Tensor:
    """fairseq's ``buffered_future_mask``: -inf strictly above the diagonal."""
    return torch.triu(torch.full((length, length), float("-inf")), 1)


def module_inputs(m: MTSAMultiheadAttention, scale: float = 1.0) -> tuple[Tensor, dict]:
    """``T x B x C`` inputs and keyword arguments: left padding for the encoder form (fairseq's sources), right
    padding and the future mask for the causal form (targets)."""
    x = torch.randn(7, 3, m.embed_dim) * scale
    pad = torch.zeros(3, 7, dtype=torch.bool)
    if m.causal:
        pad[1, 5:] = True
        return x, dict(key_padding_mask=pad, attn_mask=future_mask(7))
    pad[1, :2] = True
    return x, dict(key_padding_mask=pad)


# ---------------------------------------------------------------- the scripted core


@pytest.mark.parametrize("direction", [None, "bi", "forward"])
@pytest.mark.parametrize("s2t_activation", ["exp", "sigmoid"])
@pytest.mark.parametrize("extreme", [False, True])
def test_scripted_core_matches_mtsa_core(direction, s2t_activation, extreme):
    """With and without padding. With scores and source2token logits spanning 50 and more, float32 products
    underflow and both recompute those rows in log space; the forward form also decodes the last two queries
    against the whole prefix (incremental decoding)."""
    scripted = torch.jit.script(mtsa_core_scripted)
    q, k = (torch.randn(3, 4, 9, 5) * (30 if extreme else 1) for _ in range(2))
    v, s2t = torch.randn(3, 4, 9, 6), -50 * torch.rand(3, 4, 9, 6) if extreme else torch.randn(3, 4, 9, 6)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1, :3] = True
    pad[2, 7:] = True
    queries = [9, 2] if direction == "forward" else [9]
    for q_len, key_padding_mask in itertools.product(queries, (pad, None)):
        args = (q[:, :, 9 - q_len:], k, v, s2t, key_padding_mask, direction)
        with mock.patch.object(core, "_log_space_rows", wraps=core._log_space_rows) as log_space:
            ref = mtsa_core(*args, s2t_activation=s2t_activation)
        assert log_space.called == extreme
        out = scripted(*args, s2t_activation=s2t_activation)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)  # float32 rounding of differently masked SDPA


def test_scripted_underflow_thresholds_are_finfo():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert core._sqrt_tiny(dtype) == math.sqrt(torch.finfo(dtype).tiny)


# ---------------------------------------------------------------- the scripted attention module


@pytest.mark.parametrize("kwargs", OPTIONS)
def test_scripted_module_matches_eager(kwargs, tmp_path):
    m = MTSAMultiheadAttention(16, 4, dropout=0.1, **kwargs).eval()
    scripted = save_and_load(torch.jit.script(m), tmp_path / "mtsa.pt")
    for scale in (1.0, 100.0):
        x, masks = module_inputs(m, scale)
        with torch.no_grad(), mock.patch.object(core, "_log_space_rows", wraps=core._log_space_rows) as log_space:
            ref = m(x, x, x, **masks)[0]
            # at 100 rows underflow and are recomputed in log space, unless tanh bounds the source2token logits
            assert log_space.called == (scale > 1 and kwargs.get("s2t_hidden_activation") != "tanh")
            torch.testing.assert_close(scripted(x, x, x, **masks)[0], ref, rtol=1e-5, atol=1e-4)


def test_scripted_module_checks_its_inputs():
    m = torch.jit.script(MTSAMultiheadAttention(16, 4, causal=True))
    x = torch.randn(5, 2, 16)
    with pytest.raises(torch.jit.Error, match="future mask"):
        m(x, x, x, attn_mask=torch.zeros(5, 5))
    with pytest.raises(torch.jit.Error, match="self-attention"):
        m(x, torch.randn(5, 2, 16), x)


def test_scripted_module_trains():
    """The scripted path differentiates plain operations: without dropout its gradients are the eager ones, and
    at input scale 100, where rows are recomputed in log space, they stay finite (float32 gradients there are far
    from float64 ones, in eager mode too)."""
    m = MTSAMultiheadAttention(16, 4, s2t_hidden_activation="relu").train()
    scripted = torch.jit.script(m)
    # k_proj.bias left out: its gradient is 0 in exact maths (it shifts each query's scores by a constant)
    params, scripted_params = (dict(module.named_parameters()) for module in (m, scripted))
    names = [name for name in params if name != "k_proj.bias"]
    x, masks = module_inputs(m)
    grads = torch.autograd.grad(scripted(x, x, x, **masks)[0].pow(2).sum(), [scripted_params[n] for n in names])
    ref = torch.autograd.grad(m(x, x, x, **masks)[0].pow(2).sum(), [params[n] for n in names])
    for name, g, r in zip(names, grads, ref):
        assert max_rel(g, r) < 1e-5, name
    x, masks = module_inputs(m, 100.0)
    with mock.patch.object(core, "_log_space_rows", wraps=core._log_space_rows) as log_space:
        m(x, x, x, **masks)
    assert log_space.called
    grads = torch.autograd.grad(scripted(x, x, x, **masks)[0].pow(2).sum(), list(scripted.parameters()))
    assert all(torch.isfinite(g).all() for g in grads)
    m.dropout_module.p = 0.3
    scripted = torch.jit.script(m)
    out = scripted(x, x, x, **masks)[0]
    assert torch.isfinite(out).all() and not torch.equal(out, scripted(x, x, x, **masks)[0])


class _Decode(nn.Module):
    """Feeds ``x`` one position at a time through ``attn`` with one cache, inside TorchScript (a dict handed
    over from Python would be a copy, and the cache lost)."""

    def __init__(self, attn: MTSAMultiheadAttention):
        super().__init__()
        self.attn = attn

    def forward(self, x: Tensor, pad: Tensor) -> Tensor:
        state: dict[str, dict[str, Tensor | None]] = {}
        steps: list[Tensor] = []
        for t in range(x.shape[0]):
            xt = x[t:t + 1]
            steps.append(self.attn(xt, xt, xt, key_padding_mask=pad[:, t:t + 1], incremental_state=state)[0])
        return torch.cat(steps)


def test_scripted_causal_module_decodes_incrementally():
    m = MTSAMultiheadAttention(16, 4, causal=True).eval()
    x, masks = module_inputs(m)
    with torch.no_grad():
        full = m(x, x, x, **masks)[0]
        steps = torch.jit.script(_Decode(m))(x, masks["key_padding_mask"])
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-5)


# ---------------------------------------------------------------- scripted translation models and beam search


def build(tmp_path: Path, *extra: str):
    """``transformer_mtsa_tiny`` (encoder MTSA) over a 48-entry joined dictionary, in eval mode."""
    for lang in ("en", "de"):
        (tmp_path / f"dict.{lang}.txt").write_text("".join(f"w{i} 1\n" for i in range(44)))
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [str(tmp_path), "--user-dir", USER_DIR, "--arch", "transformer_mtsa_tiny", "--share-all-embeddings",
         "--task", "translation", "-s", "en", "-t", "de", *extra],
    )
    task = tasks.setup_task(args)
    return task, task.build_model(args).eval()


def sample(task) -> dict:
    """Left-padded sources, as fairseq's translation task batches them."""
    pad, eos = task.source_dictionary.pad(), task.source_dictionary.eos()
    rows = [[5, 9, 11, 7, 20, 6], [8, 12, 30], [14, 15, 16, 17]]
    tokens = torch.full((len(rows), 7), pad)
    for b, r in enumerate(rows):
        tokens[b, 7 - len(r) - 1:] = torch.tensor([*r, eos])
    return {"net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([len(r) + 1 for r in rows])}}


MODELS = {
    "encoder": (),
    "decoder": ("--decoder-self-attention-type", "mtsa"),
    "bi_exp_hidden": ("--mtsa-bi-directional", "--mtsa-s2t-activation", "exp", "--mtsa-s2t-hidden-activation",
                      "relu", "--mtsa-s2t-input", "k"),
}


@pytest.mark.parametrize("name", MODELS)
def test_scripted_model_forward_matches_eager(name, tmp_path):
    task, model = build(tmp_path, *MODELS[name])
    scripted = save_and_load(torch.jit.script(model), tmp_path / "model.pt")
    net_input = sample(task)["net_input"]
    prev = torch.tensor([[2, 6, 7, 8, 9], [2, 10, 11, 1, 1], [2, 12, 1, 1, 1]])  # right-padded targets
    with torch.no_grad():
        out = scripted(net_input["src_tokens"], net_input["src_lengths"], prev)[0]
        ref = model(net_input["src_tokens"], net_input["src_lengths"], prev)[0]
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["encoder", "decoder"])
def test_scripted_sequence_generator_matches_eager(name, tmp_path):
    """Beam search through fairseq's scripted SequenceGenerator (cached MTSA decoding for "decoder") yields
    the eager generator's hypotheses: tokens, positional scores and scores."""
    task, model = build(tmp_path, *MODELS[name])
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=10, min_len=3)
    scripted = save_and_load(torch.jit.script(generator), tmp_path / "generator.pt")
    with torch.no_grad():
        hypos, ref = scripted(sample(task)), generator(sample(task))
    assert len(hypos) == len(ref) == 3
    for beam, ref_beam in zip(hypos, ref):
        assert len(beam) == len(ref_beam) == 3
        for hypo, expected in zip(beam, ref_beam):
            assert torch.equal(hypo["tokens"], expected["tokens"])
            torch.testing.assert_close(hypo["positional_scores"], expected["positional_scores"], rtol=0, atol=1e-4)
            assert abs(float(hypo["score"] - expected["score"])) < 1e-6


# ---------------------------------------------------------------- torch.compile


@pytest.mark.parametrize("kwargs", [{}, dict(bi_directional=True, s2t_activation="exp"), dict(causal=True)])
@pytest.mark.parametrize("backend,training", [("eager", False), ("eager", True), ("aot_eager", True)])
def test_compile_fullgraph(kwargs, backend, training):
    """fullgraph=True fails on any graph break. At input scale 100 rows underflow: the compiled layer takes
    torch.cond's log-space branch and, without dropout, matches the eager layer, gradients included."""
    torch._dynamo.reset()
    m = MTSAMultiheadAttention(16, 4, **kwargs).train(training)
    compiled = torch.compile(m, fullgraph=True, backend=backend)
    for scale in (1.0, 100.0):
        x, masks = module_inputs(m, scale)
        x.requires_grad_(training)
        out, ref = compiled(x, x, x, **masks)[0], m(x, x, x, **masks)[0]
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
        if training:
            grad, ref_grad = (torch.autograd.grad(y.pow(2).sum(), x)[0] for y in (out, ref))
            assert max_rel(grad, ref_grad) < 1e-5
    if training:  # attention dropout, drawn in the graph
        torch._dynamo.reset()  # a dropout changed under the same code would be traced as a symbolic float
        m = MTSAMultiheadAttention(16, 4, dropout=0.2, **kwargs).train()
        out = torch.compile(m, fullgraph=True, backend=backend)(x, x, x, **masks)[0]
        assert torch.isfinite(out).all() and torch.isfinite(torch.autograd.grad(out.sum(), x)[0]).all()


def test_compile_with_graph_breaks_allowed():
    """torch.cond's branches are captured whole in the default mode too (no output shape there depends on the
    data), so the layer compiles without fullgraph=True as well."""
    torch._dynamo.reset()
    m = MTSAMultiheadAttention(16, 4).train()
    x, masks = module_inputs(m, 100.0)
    torch.testing.assert_close(torch.compile(m, backend="eager")(x, x, x, **masks)[0], m(x, x, x, **masks)[0])


@pytest.mark.slow  # inductor compiles C++ for each graph (about half a minute per length on two cores)
@pytest.mark.parametrize("backend,scales", [("inductor", (1.0, 1.0)), ("aot_eager", (1.0, 100.0))])
def test_compiled_layer_trains_on_two_lengths(backend, scales):
    """Automatic dynamic shapes: the second length recompiles with a symbolic length and must still match eager,
    forward and backward; with aot_eager its rows underflow (scale 100), so torch.cond's log-space branch runs in
    the symbolic graph. (Inductor on torch 2.13 passes that branch's backward a gradient with other strides than
    it traced: docs/kernel.md, "Export".)"""
    torch._dynamo.reset()
    m = MTSAMultiheadAttention(16, 4).train()
    compiled = torch.compile(m, backend=backend)
    for length, scale in zip((7, 11), scales):
        x = (torch.randn(length, 3, 16) * scale).requires_grad_()
        pad = torch.zeros(3, length, dtype=torch.bool)
        pad[1, :2] = True
        out, ref = compiled(x, x, x, key_padding_mask=pad)[0], m(x, x, x, key_padding_mask=pad)[0]
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
        grad, ref_grad = (torch.autograd.grad(y.pow(2).sum(), x)[0] for y in (out, ref))
        assert max_rel(grad, ref_grad) < 1e-5
