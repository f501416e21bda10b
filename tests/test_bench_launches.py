"""What a training step of the MTSA layer dispatches: the operator counter itself, no host synchronisation in an
encoder's shared pass (one, the underflow check, in a layer called on its own), the additive mask both SDPA calls
share, the core's forward operator by operator, an encoder layer's operators against fairseq's, and
``mtsa-bench-launches`` at a tiny size. Times are the command's to report, never asserted here."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention

from mtsa_fairseq.experiments.bench import launches
from mtsa_fairseq.experiments.bench.launches import OperatorCount, PythonCalls, count_step
from mtsa_fairseq.experiments.commands import bench_launches
from mtsa_fairseq.modules import mtsa_attention
from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention, shared_pass
from mtsa_fairseq.modules.mtsa_core import SharedPass, mtsa_core

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_launches.py"
L, B, C, H = 10, 3, 32, 4


def layer_input(padded: bool):
    x = torch.randn(L, B, C, requires_grad=True)
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[1, :3] = True
    return x, pad if padded else None


def test_the_counter_counts_kernels_not_views_or_allocations_and_synchronisations_apart():
    t = torch.randn(4, 6)
    with OperatorCount() as count:
        u = (t * 2).view(6, 4).t() + 1
        torch.empty_like(u)
        if bool(u.any()):
            u.nonzero()
    assert count.operators == {"mul": 1, "add": 1, "any": 1}
    assert count.syncs == {"_local_scalar_dense": 1, "nonzero": 1}


def _double(t):
    return t * 2


def test_the_python_counter_counts_functions_by_name_and_calls_into_c():
    t = torch.randn(3)
    with PythonCalls() as calls:
        _double(_double(t)).sum()
    assert calls.functions == {f"{__name__}._double": 2}
    assert calls.into_c == 1  # .sum(); ``*`` is a slot, not a call
    with PythonCalls() as calls:
        torch.sigmoid(t).sum()
    assert not calls.functions and calls.into_c == 2


def test_count_step_counts_the_backward_apart_from_the_forward():
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(2, 5)
    counts = count_step(lambda: torch.sigmoid(x @ w))
    assert counts["forward"]["by_name"] == {"mm": 1, "sigmoid": 1} and counts["forward"]["syncs"] == 0
    assert counts["backward"]["by_name"]["sigmoid_backward"] == 1 and "sigmoid" not in counts["backward"]["by_name"]


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_an_mtsa_training_step_synchronises_the_host_only_on_its_own(padded):
    """In an encoder's shared pass the layer reads nothing; on its own it reads one number, the smallest denominator;
    the backward reads none, and fairseq's attention none at all."""
    x, pad = layer_input(padded)
    mtsa = MTSAMultiheadAttention(C, H, dropout=0.1).train()
    mha = MultiheadAttention(C, H, dropout=0.1, self_attention=True).train()
    counts = count_step(lambda: mtsa(x, x, x, key_padding_mask=pad)[0])
    assert counts["forward"]["syncs_by_name"] == {"_local_scalar_dense": 1}
    assert counts["backward"]["syncs"] == 0
    with shared_pass(SharedPass()) as shared:
        counts = count_step(lambda: mtsa(x, x, x, key_padding_mask=pad)[0])
    assert counts["forward"]["syncs"] == counts["backward"]["syncs"] == 0 and len(shared.dens) == 1
    counts = count_step(lambda: mha(x, x, x, key_padding_mask=pad, need_weights=False)[0])
    assert counts["forward"]["syncs"] == counts["backward"]["syncs"] == 0


@pytest.mark.parametrize("padding,stock,mtsa,calls", [
    ("padded", 57, 63, {"transformer": (88, 18), "mtsa": (97, 18)}),
    ("unpadded", 54, 63, {"transformer": (80, 18), "mtsa": (96, 18)}),
])
def test_an_encoder_layer_dispatches_at_most_1_3_times_fairseqs_operators(padding, stock, mtsa, calls):
    """The default options (exp token2token, scaled sigmoid source2token, ``--mtsa-kernel auto``) as the benchmark
    counts them: a later layer of an encoder pass (the key mask built once per pass), forward and backward. Exact
    counts, so that an added operator or Python call (forward, backward) fails here."""
    args = argparse.Namespace(dim=C, heads=H, batch=B, length=L, device="cpu", dtype="float32")
    totals, python = {}, {}
    for name in ("transformer", "mtsa"):
        layer = launches.build_layer(name, 0.0, "scaled_sigmoid", args)
        inputs = launches._step_input("layer", padding, args)
        forward, context = launches._forward("layer", layer, inputs)
        with context():
            forward()
        counts = count_step(forward, python_calls=True, context=context)
        assert counts["forward"]["syncs"] == counts["backward"]["syncs"] == 0
        totals[name] = counts["forward"]["operators"] + counts["backward"]["operators"]
        python[name] = counts["forward"]["python_calls"], counts["backward"]["python_calls"]
    assert totals == {"transformer": stock, "mtsa": mtsa}
    assert totals["mtsa"] <= 1.3 * totals["transformer"] or padding == "unpadded"
    assert python == calls


@pytest.mark.parametrize("padding,calls", [("padded", {"transformer": 561, "mtsa": 603}),
                                           ("unpadded", {"transformer": 529, "mtsa": 582})])
def test_a_models_python_calls_include_its_shared_passes(padding, calls):
    """Python calls of a 2 + 2-layer model's step, forward and backward, exactly: the MTSA model's include entering
    and leaving its encoder's and decoder's shared passes (three calls each), which the harness of a layer row
    enters outside the count."""
    args = argparse.Namespace(dim=64, heads=4, batch=2, length=16, device="cpu", dtype="float32", layers_per_stack=2)
    counted = {}
    for name in ("transformer", "mtsa"):
        model = launches.build_model(name, 0.0, "scaled_sigmoid", args)
        forward, context = launches._forward("model", model, launches._step_input("model", padding, args))
        forward()
        counts = count_step(forward, python_calls=True, context=context)
        counted[name] = counts["forward"]["python_calls"] + counts["backward"]["python_calls"]
        by_name = counts["forward"]["python_by_name"]
        passes = {k: v for k, v in by_name.items() if k.startswith("mtsa_fairseq.modules.mtsa_attention.shared_pass")}
        assert passes == ({} if name == "transformer" else {
            f"mtsa_fairseq.modules.mtsa_attention.shared_pass.{method}": 2
            for method in ("__init__", "__enter__", "__exit__")})
    assert counted == calls


def test_the_commands_source2token_forms_are_the_modules():
    assert bench_launches.S2T_ACTIVATIONS == mtsa_attention.S2T_ACTIVATIONS


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_both_sdpa_calls_take_one_additive_mask_with_aligned_rows(monkeypatch, dtype):
    """Given the booleans, every SDPA call would convert them (and on CUDA copy rows not aligned to 8 elements)."""
    masks, sdpa = [], F.scaled_dot_product_attention

    def recording(*args, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    x, pad = layer_input(True)
    x = x.to(dtype)
    MTSAMultiheadAttention(C, H, dropout=0.1).to(dtype).train()(x, x, x, key_padding_mask=pad)
    assert len(masks) == 2 and masks[0] is masks[1]
    bias = masks[0]
    assert bias.dtype == dtype and bias.shape == (B, 1, 1, L) and all(s % 8 == 0 for s in bias.stride()[:-1])
    assert torch.equal(bias, torch.zeros(B, 1, 1, L, dtype=dtype).masked_fill(pad[:, None, None, :], float("-inf")))


def test_the_core_forward_operator_by_operator():
    """``mtsa_core`` with key padding, no dropout (SDPA stays one fused operator on every device): the source2token
    activation and numerator values, the additive mask (keys, rows with a key, the mask itself in two), two SDPA
    calls, the guarded ratio in three, the zeroing of rows without a key, and the underflow check."""
    q, k, v, s2t = (torch.randn(2, H, 9, 8, requires_grad=True) for _ in range(4))
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, :3] = True
    counts = count_step(lambda: mtsa_core(q, k, v, s2t, pad, s2t_activation="sigmoid", training=True))
    by_name = {"sdpa" if "scaled_dot_product" in name else name: n for name, n in counts["forward"]["by_name"].items()}
    assert by_name == {"sigmoid": 1, "mul": 2, "bitwise_not": 1, "any": 1, "ge": 1, "full": 1, "masked_fill_": 1,
                       "sdpa": 2, "le": 1, "masked_fill": 1, "div": 1, "amin": 1}
    assert counts["forward"]["syncs_by_name"] == {"_local_scalar_dense": 1}


@pytest.mark.slow  # a fresh process that imports torch and fairseq
def test_tiny_benchmark_writes_every_level_layer_and_padding(tmp_path):
    out_json, out_md = tmp_path / "launches.json", tmp_path / "launches.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--batch", "2", "--length", "6", "--dim", "16", "--heads", "2",
                           "--layers-per-stack", "2", "--rounds", "1", "--processes", "2", "--json", str(out_json),
                           "--markdown", str(out_md)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out_json.read_text())
    assert report["settings"] == {"levels": ["layer", "model"], "s2t_activations": ["scaled_sigmoid"],
                                  "paddings": ["padded", "unpadded"], "layers_per_stack": 2, "batch": 2, "length": 6,
                                  "dim": 16, "heads": 2, "dropouts": [0.0, 0.1], "rounds": 1, "processes": 2,
                                  "threads": None, "device": "cpu", "dtype": "float32"}
    rows = report["rows"]
    assert all(len(r["ms_per_process"]) == 2 and r["ms"] == sum(r["ms_per_process"]) / 2 for r in rows)
    assert all(r["forward"]["python_calls"] > 0 for r in rows)
    assert [(r["level"], r["layer"], r["dropout"], r["padding"]) for r in rows] == [
        (level, layer, dropout, padding) for level in ("layer", "model") for layer in ("transformer", "mtsa")
        for dropout in (0.0, 0.1) for padding in ("padded", "unpadded")]
    assert all(r["forward"]["operators"] > 0 and r["backward"]["operators"] > 0 and r["ms"] > 0 for r in rows)
    assert [r["forward"]["syncs"] + r["backward"]["syncs"] for r in rows if r["level"] == "layer"] == [0] * 8
    models = {(r["layer"], r["padding"]): r["forward"]["syncs"] for r in rows if r["level"] == "model"}
    assert all(models["mtsa", padding] < models["transformer", padding] for padding in ("padded", "unpadded"))
    text = out_md.read_text()
    assert "| level | layer | source2token | attention dropout | padding | operators, forward | backward |" in text
    assert text.startswith("torch ") and "batch 2, length 6, d_model 16, 2 heads, models of 2 + 2 layers" in text
    assert "steps taken in turns in each of 2 processes" in text
    first = next(line for line in text.splitlines() if line.startswith("| layer | transformer |"))
    assert first.endswith("| 1.000 (1.000-1.000) |")  # the reference's ratio to itself, in every process


@pytest.mark.parametrize("option, message", [
    (("--layers", "mtsa-sdpa-joint", "--dropouts", "0.1"), "give 0 among --dropouts"),
    (("--device", "foo"), "error: --device must be cpu or cuda[:N], not 'foo'"),
    (("--dim", "10", "--heads", "3"), "error: --dim 10 is not divisible by --heads 3"),
    (("--dropouts", "nan"), "error: --dropouts must be in [0, 1)"),
])
def test_usage_errors(option, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), *option], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(message)


def test_the_joint_kernel_is_measured_at_dropout_0_only_and_paddings_are_chosen():
    args = argparse.Namespace(levels=["layer"], layers=["transformer", "mtsa-sdpa-joint"], s2t_activations=["sigmoid"],
                              dropouts=[0.0, 0.1], paddings=["unpadded"], batch=2, length=6, dim=16, heads=2, rounds=1,
                              device="cpu", dtype="float32", layers_per_stack=1)
    rows = launches.measure(args)
    assert [(r["layer"], r["dropout"], r["padding"]) for r in rows] == [
        ("transformer", 0.0, "unpadded"), ("transformer", 0.1, "unpadded"), ("mtsa-sdpa-joint", 0.0, "unpadded")]
