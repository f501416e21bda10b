"""Peak memory and time of one forward+backward pass of self-attention, side by side (docs/benchmark-core.md):

* ``mtsa``: :class:`MTSAMultiheadAttention` with ``kernel="auto"`` (for its exp token2token two SDPA calls, on CPU
  ``"dense"`` from 2**16 scores with keys up to 256);
* ``mtsa-sdpa``, ``mtsa-sdpa-joint``, ``mtsa-dense`` and ``mtsa-triton`` (CUDA): the same module with the kernel
  fixed;
* ``naive``: the same projections with the authors' ``[B, H, L, L]`` algorithm (``mtsa_naive``);
* ``mha``: fairseq's ``MultiheadAttention``; ``mha-flash``: the MTSA module's projections around one fused
  ``scaled_dot_product_attention`` call, the cost the Triton kernel aims at.

With ``--core`` ``mtsa``, the ``mtsa-*`` kernels and ``mha-flash`` time ``mtsa_core`` and
``scaled_dot_product_attention`` alone on per-head ``[B, H, L, d]`` tensors without padding. Peak memory: one pass
of each (method, length) in a fresh process, after a warm-up pass. Time: per length one fresh process takes
``--repeats`` passes of every method, the methods taking turns after a warm-up round (their ratios are measured
side by side), and reports each method's median. Writes a Markdown table (``--markdown``) and the raw numbers
(``--json``, whose tables ``mtsa-docs-tables`` kind ``bench-core`` prints).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mtsa_fairseq.experiments.bench import measure
from mtsa_fairseq.experiments.files import write_atomic, write_json
from mtsa_fairseq.experiments.tables import markdown_table

METHODS = ("mtsa", "mtsa-sdpa", "mtsa-sdpa-joint", "mtsa-dense", "mtsa-triton", "naive", "mha", "mha-flash")
CORE_METHODS = ("mtsa", "mtsa-sdpa", "mtsa-sdpa-joint", "mtsa-dense", "mtsa-triton", "mha-flash")
DEFAULT_METHODS = {"cpu": ("mtsa", "naive", "mha"), "cuda": ("mtsa-sdpa", "mtsa-triton", "mha-flash", "mha"),
                   "core": ("mtsa-sdpa", "mtsa-triton", "mha-flash")}


def _prepared(method: str, length: int, args: argparse.Namespace):
    """The pass of ``method`` (with ``args.core`` of the attention core alone), warmed up, and its inputs at
    ``length``."""
    one_pass, inputs = (_core if args.core else _layer)(method, args)
    one_pass(*inputs(measure.warm_up_length(length, args.device)))
    return one_pass, inputs(length)


def pass_memory(method: str, length: int, args: argparse.Namespace) -> float:
    """Peak memory growth (MiB) of one forward+backward pass of ``method`` at ``length`` after a warm-up pass; with
    ``args.core`` of the attention core alone. Call it in a fresh process."""
    one_pass, tensors = _prepared(method, length, args)
    return measure.peak_growth_mb(lambda: one_pass(*tensors), args.device)


def pass_times(length: int, args: argparse.Namespace) -> dict[str, float]:
    """The median time (ms) of ``args.repeats`` forward+backward passes of each of ``args.methods`` at ``length``,
    the methods taking turns after a warm-up round (:func:`~mtsa_fairseq.experiments.bench.measure.timed_rounds`)."""
    steps = {}
    for method in args.methods:
        one_pass, tensors = _prepared(method, length, args)
        steps[method] = lambda _, one_pass=one_pass, tensors=tensors: one_pass(*tensors)
    return measure.median_ms(measure.timed_rounds(steps, args.repeats, args.device))


def _layer(method: str, args: argparse.Namespace):
    """The pass of the self-attention module of ``method`` on ``(x, pad)``, and those inputs of a length."""
    import torch
    import torch.nn.functional as F

    from mtsa_fairseq.experiments.bench.launches import build_layer
    from mtsa_fairseq.modules.mtsa_reference import mtsa_naive

    batch, dim, heads, device = args.batch, args.dim, args.heads, args.device
    name = {"mha": "transformer", "naive": "mtsa", "mha-flash": "mtsa"}.get(method, method)
    module = build_layer(name, 0.0, "scaled_sigmoid", args).self_attn  # the encoder layer's attention

    def step(x, pad):
        n = x.shape[0]
        if method == "mha" or method.startswith("mtsa"):
            return module(x, x, x, key_padding_mask=pad)[0]

        def split(t):
            return t.view(n, batch, heads, dim // heads).permute(1, 2, 0, 3)

        q, k, v = split(module.q_proj(x)), split(module.k_proj(x)), split(module.v_proj(x))
        if method == "naive":
            s2t = module.source2token(v)
            e_s = torch.sigmoid(s2t) if module.s2t_activation.endswith("sigmoid") else torch.exp(s2t)
            out = mtsa_naive(q, k, v, e_s, pad)
        else:  # mha-flash
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad[:, None, None, :])
        return module.out_proj(out.permute(2, 0, 1, 3).reshape(n, batch, dim))

    def inputs(n):
        module.zero_grad(set_to_none=True)  # no gradient of an earlier pass in the measured one
        x = torch.randn(n, batch, dim, device=device, dtype=getattr(torch, args.dtype), requires_grad=True)
        pad = torch.zeros(batch, n, dtype=torch.bool, device=device)
        pad[-1, : n // 8] = True  # one left-padded row, as fairseq batches sources
        return x, pad

    def one_pass(x, pad):
        x.grad = None
        module.zero_grad(set_to_none=True)
        step(x, pad).float().sum().backward()

    return one_pass, inputs


def _core(method: str, args: argparse.Namespace):
    """The pass of ``mtsa_core`` (or, for ``mha-flash``, SDPA) on per-head ``q, k, v, s2t``, and those of a length."""
    import torch
    import torch.nn.functional as F

    from mtsa_fairseq.experiments.bench.launches import kernel_of
    from mtsa_fairseq.modules.mtsa_core import mtsa_core

    def inputs(n):
        shape = (args.batch, args.heads, n, args.dim // args.heads)
        return [torch.randn(shape, device=args.device, dtype=getattr(torch, args.dtype), requires_grad=True)
                for _ in range(4)]

    def one_pass(*tensors):
        for t in tensors:
            t.grad = None
        q, k, v, s2t = tensors
        if method == "mha-flash":
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = mtsa_core(q, k, v, s2t, kernel=kernel_of(method), s2t_activation="sigmoid")
        out.float().sum().backward()

    torch.manual_seed(0)
    return one_pass, inputs


def run(args: argparse.Namespace, script: Path) -> None:
    """Per length every method's time by ``script --times-at`` and each one's memory by ``script --one``;
    ``--markdown`` and ``--json`` written after every length (an interrupted run keeps the lengths measured), then
    the table printed."""
    import torch

    where = measure.device_name(args.device)
    what = (f"attention cores alone on [B, H, L, {args.dim // args.heads}] tensors, no padding" if args.core
            else f"d_model {args.dim}")
    meta = (f"torch {torch.__version__}, {where}, {args.dtype}, batch {args.batch}, {what}, "
            f"{args.heads} heads, forward+backward, median of {args.repeats} passes taken in turns")
    options = ["--batch", str(args.batch), "--dim", str(args.dim), "--heads", str(args.heads), "--repeats",
               str(args.repeats), "--device", args.device, "--dtype", args.dtype] + (["--core"] if args.core else [])
    internal = ("json", "markdown", "one", "times_at")
    settings = {name: value for name, value in vars(args).items() if name not in internal}
    result = {"settings": settings, "meta": meta, "methods": list(args.methods), "rows": []}
    start = time.monotonic()
    methods = ["--methods", *args.methods]
    for done, length in enumerate(args.lengths, 1):
        times = measure.isolated(script, ["--times-at", str(length), *methods, *options], f"the times at L={length}")
        row = {"L": length}
        for method in args.methods:
            peak_mb = measure.isolated(script, ["--one", f"{method}:{length}", *options], f"{method} at L={length}")
            row[method] = {"peak_mb": peak_mb, "ms": times[method]}
            print(f"{measure.progress(done, len(args.lengths), start)} L={length:5d} {method:11s} "
                  f"peak {peak_mb:9.1f} MB  {times[method]:9.1f} ms", flush=True)
        result["rows"].append(row)
        if args.markdown:
            write_atomic(args.markdown, markdown(result))
        if args.json:
            write_json(args.json, result, indent=2)
    print(table(result["rows"], args.methods))


def markdown(result: dict) -> str:
    """The settings line and the table of a ``--json`` record (what ``--markdown`` writes)."""
    return f"{result['meta']}\n\n{table(result['rows'], result['methods'])}\n"


def _memory_ratio(peak_mb: float, base_mb: float) -> str:
    """``peak_mb / base_mb``; "—" where either shows as 0.0 MB, below what the resident set resolves."""
    return f"{peak_mb / base_mb:.2f}" if min(peak_mb, base_mb) >= 0.05 else "—"


def table(rows: list[dict], methods: list[str]) -> str:
    """The Markdown table of ``rows``: each method's peak memory and time, and their ratios to the baseline's
    (``mha-flash``, else ``mha``, when measured)."""
    header = ["L"] + [f"{m} MB" for m in methods] + [f"{m} ms" for m in methods]
    base = "mha-flash" if "mha-flash" in methods else "mha"
    ratio_cols = [m for m in methods if m != base] if base in methods else []
    header += [f"{m}/{base} mem" for m in ratio_cols] + [f"{m}/{base} time" for m in ratio_cols]
    return "\n".join(markdown_table(header, (
        [str(row["L"])] + [f"{row[m]['peak_mb']:.1f}" for m in methods] + [f"{row[m]['ms']:.1f}" for m in methods]
        + [_memory_ratio(row[m]["peak_mb"], row[base]["peak_mb"]) for m in ratio_cols]
        + [f"{row[m]['ms'] / row[base]['ms']:.2f}" for m in ratio_cols] for row in rows)))
