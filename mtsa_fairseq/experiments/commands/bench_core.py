"""Peak memory and time of one forward+backward pass of self-attention, side by side:

* ``mtsa``: :class:`MTSAMultiheadAttention` (projections + source2token + ``mtsa_core`` with ``kernel="auto"``,
  which for this module's exp token2token is two SDPA calls on every device);
* ``mtsa-sdpa``, ``mtsa-sdpa-joint`` and ``mtsa-triton``: the same module with the kernel fixed (two SDPA calls,
  one over the joined values, the fused kernel; ``mtsa-triton`` needs CUDA);
* ``naive``: the same module's projections with the authors' ``[B, H, L, L]`` algorithm (``mtsa_naive``);
* ``mha``: fairseq's ``MultiheadAttention``;
* ``mha-flash``: the MTSA module's q/k/v/out projections around one fused ``scaled_dot_product_attention``
  call, i.e. multi-head attention on the flash kernel: the cost the Triton kernel aims at.

With ``--core`` the projections are left out: the ``mtsa-*`` kernels and ``mha-flash`` then time
``mtsa_core`` (source2token logits given, sigmoid) and ``scaled_dot_product_attention`` alone on per-head
``[B, H, L, d]`` tensors without padding, so that multi-head attention runs on PyTorch's flash kernel.

Each (method, length) runs in a fresh subprocess. Peak memory: on CPU the growth of the resident set's
high-water mark during one forward+backward pass (reset through ``/proc/self/clear_refs`` once weights,
inputs and libraries are in place), on CUDA the growth of ``max_memory_allocated``. Time: the median of
``--repeats`` passes after that one, which serves as their warm-up. Writes a Markdown table.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from mtsa_fairseq.experiments.files import write_atomic
from mtsa_fairseq.experiments.processes import run_command

METHODS = ("mtsa", "mtsa-sdpa", "mtsa-sdpa-joint", "mtsa-triton", "naive", "mha", "mha-flash")
CORE_METHODS = ("mtsa-sdpa", "mtsa-sdpa-joint", "mtsa-triton", "mha-flash")
KERNEL_OF = {"mtsa-sdpa": "sdpa", "mtsa-sdpa-joint": "sdpa-joint", "mtsa-triton": "triton"}
DEFAULT_METHODS = {"cpu": ("mtsa", "naive", "mha"), "cuda": ("mtsa-sdpa", "mtsa-triton", "mha-flash", "mha"),
                   "core": ("mtsa-sdpa", "mtsa-triton", "mha-flash")}


def measure(method: str, length: int, args: argparse.Namespace) -> dict:
    """Peak memory (MiB) and median time (ms) of one forward+backward pass of ``method`` at ``length``."""
    if args.core:
        return measure_core(method, length, args)

    import torch
    import torch.nn.functional as F
    from fairseq.modules import MultiheadAttention

    from mtsa_fairseq.experiments.bench.measure import warm_up_length
    from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention
    from mtsa_fairseq.modules.mtsa_reference import mtsa_naive

    batch, dim, heads, device = args.batch, args.dim, args.heads, args.device
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    if method == "mha":
        module = MultiheadAttention(dim, heads, self_attention=True)
    else:
        kernel = KERNEL_OF.get(method, "auto")
        module = MTSAMultiheadAttention(dim, heads, kernel=kernel)
    module = module.to(device=device, dtype=dtype)

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
        x = torch.randn(n, batch, dim, device=device, dtype=dtype, requires_grad=True)
        pad = torch.zeros(batch, n, dtype=torch.bool, device=device)
        pad[-1, : n // 8] = True  # one left-padded row, as fairseq batches sources
        return x, pad

    def one_pass(x, pad):
        x.grad = None
        module.zero_grad(set_to_none=True)
        step(x, pad).float().sum().backward()

    module.train()
    one_pass(*inputs(warm_up_length(length, device)))
    module.zero_grad(set_to_none=True)
    x, pad = inputs(length)
    return _peak_and_time(lambda: one_pass(x, pad), device, args.repeats)


def measure_core(method: str, length: int, args: argparse.Namespace) -> dict:
    """:func:`measure` of the attention core alone on per-head tensors (``--core``)."""
    import torch
    import torch.nn.functional as F

    from mtsa_fairseq.experiments.bench.measure import warm_up_length
    from mtsa_fairseq.modules.mtsa_core import mtsa_core

    dtype, device = getattr(torch, args.dtype), args.device
    kernel = KERNEL_OF.get(method)

    def inputs(n):
        shape = (args.batch, args.heads, n, args.dim // args.heads)
        return [torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(4)]

    def one_pass(tensors):
        for t in tensors:
            t.grad = None
        q, k, v, s2t = tensors
        if kernel is None:  # mha-flash
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = mtsa_core(q, k, v, s2t, kernel=kernel, s2t_activation="sigmoid")
        out.float().sum().backward()

    torch.manual_seed(0)
    one_pass(inputs(warm_up_length(length, device)))
    tensors = inputs(length)
    return _peak_and_time(lambda: one_pass(tensors), device, args.repeats)


def _peak_and_time(one_pass: Callable[[], None], device: str, repeats: int) -> dict:
    """Peak memory growth of one pass, then the median time of ``repeats`` more (that pass their warm-up)."""
    from mtsa_fairseq.experiments.bench.measure import peak_growth_mb, timed_rounds

    peak_mb = peak_growth_mb(one_pass, device)
    seconds = timed_rounds({"pass": lambda _: one_pass()}, repeats, device, warmup=False)["pass"]
    return {"peak_mb": peak_mb, "ms": 1000 * statistics.median(seconds)}


def measure_isolated(method: str, length: int, args: argparse.Namespace) -> dict:
    """:func:`measure` in a fresh process (``--one``); exits with the child's error if it fails."""
    from mtsa_fairseq.experiments.bench.measure import CellFailed, run_isolated

    options = ["--one", f"{method}:{length}", "--batch", str(args.batch), "--dim", str(args.dim), "--heads",
               str(args.heads), "--repeats", str(args.repeats), "--device", args.device, "--dtype", args.dtype]
    try:
        return run_isolated(__file__, options + (["--core"] if args.core else []), f"{method} at L={length}")
    except CellFailed as error:
        sys.exit(f"error: {error}")


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096],
                        help="sequence lengths L")
    parser.add_argument("--batch", type=int, default=2, help="sequences per batch")
    parser.add_argument("--dim", type=int, default=512, help="model width (head width: dim / heads)")
    parser.add_argument("--heads", type=int, default=8, help="attention heads")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per cell (the median is reported)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="parameter and activation dtype")
    parser.add_argument("--methods", nargs="+", choices=METHODS,
                        help="default: mtsa naive mha on CPU; mtsa-sdpa mtsa-triton mha-flash mha on CUDA")
    parser.add_argument("--markdown", type=Path, help="write the Markdown table (with a line of settings) here")
    parser.add_argument("--core", action="store_true",
                        help="time the attention cores alone on per-head tensors (CUDA; the mtsa-* kernels and "
                             "mha-flash)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: "method:length", run in a subprocess
    return parser


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    from mtsa_fairseq.experiments.bench.measure import can_measure, check_positive, device_name, emit, progress

    check_positive(parser, args)
    if args.one:
        method, length = args.one.split(":")
        emit(measure(method, int(length), args))
        return
    if args.markdown is not None and not args.markdown.parent.is_dir():
        parser.error(f"--markdown directory {args.markdown.parent} does not exist")

    import torch

    from mtsa_fairseq.modules.mtsa_core import triton_available

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if not can_measure(args.device):
        parser.error(f"cannot measure peak memory on {args.device} here (CPU needs Linux's /proc/self/clear_refs)")
    args.methods = args.methods or list(DEFAULT_METHODS["core" if args.core else "cuda" if cuda else "cpu"])
    if args.core and (not cuda or set(args.methods) - set(CORE_METHODS)):
        parser.error(f"--core needs --device cuda and only the methods {', '.join(CORE_METHODS)}")
    if "mtsa-triton" in args.methods and not (cuda and triton_available()):
        parser.error("mtsa-triton needs --device cuda and the triton package (pip install mtsa-fairseq[triton])")

    where = device_name(args.device) if cuda else (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    what = (f"attention cores alone on [B, H, L, {args.dim // args.heads}] tensors, no padding" if args.core
            else f"d_model {args.dim}")
    meta = (f"torch {torch.__version__}, {where}, {args.dtype}, batch {args.batch}, {what}, "
            f"{args.heads} heads, forward+backward, median of {args.repeats}")
    rows = []
    start = time.monotonic()
    for done, length in enumerate(args.lengths, 1):
        row = {"L": length}
        for method in args.methods:
            row[method] = measure_isolated(method, length, args)
            print(f"{progress(done, len(args.lengths), start)} L={length:5d} {method:11s} "
                  f"peak {row[method]['peak_mb']:9.1f} MB  {row[method]['ms']:9.1f} ms",
                  flush=True)
        rows.append(row)
        if args.markdown:  # after every length: an interrupted run keeps the rows measured
            write_atomic(args.markdown, f"{meta}\n\n{table(rows, args.methods)}\n")
    print(table(rows, args.methods))


def table(rows: list[dict], methods: list[str]) -> str:
    """The Markdown table of ``rows``: each method's peak memory and time, and their ratios to the baseline's
    (``mha-flash``, else ``mha``, when measured)."""
    header = ["L"] + [f"{m} MB" for m in methods] + [f"{m} ms" for m in methods]
    base = "mha-flash" if "mha-flash" in methods else "mha"
    ratio_cols = [m for m in methods if m != base] if base in methods else []
    header += [f"{m}/{base} mem" for m in ratio_cols] + [f"{m}/{base} time" for m in ratio_cols]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(row["L"])]
        cells += [f"{row[m]['peak_mb']:.1f}" for m in methods] + [f"{row[m]['ms']:.1f}" for m in methods]
        cells += [f"{row[m]['peak_mb'] / max(row[base]['peak_mb'], 1e-9):.2f}" for m in ratio_cols]
        cells += [f"{row[m]['ms'] / row[base]['ms']:.2f}" for m in ratio_cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main, resumes=False)


if __name__ == "__main__":
    main()
