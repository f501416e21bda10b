#!/usr/bin/env python
"""Peak memory and time of one forward+backward pass of self-attention, side by side:

* ``mtsa``: :class:`MTSAMultiheadAttention` (projections + source2token + ``mtsa_core``, exp path);
* ``naive``: the same module's projections with the authors' ``[B, H, L, L]`` algorithm (``mtsa_naive``);
* ``mha``: fairseq's ``MultiheadAttention``.

Each (method, length) runs in a fresh subprocess: peak memory is the growth of the process's maximum
resident set during one forward+backward pass (inputs and weights allocated before), time is the
median of ``--repeats`` passes after one warm-up. Writes a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("mtsa", "naive", "mha")


def measure(method: str, length: int, batch: int, dim: int, heads: int, repeats: int) -> dict:
    import torch
    from fairseq.modules import MultiheadAttention

    from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention
    from mtsa_fairseq.modules.mtsa_reference import mtsa_naive

    torch.manual_seed(0)
    if method == "mha":
        module = MultiheadAttention(dim, heads, self_attention=True)
    else:
        module = MTSAMultiheadAttention(dim, heads)

    def step(x, pad):
        n = x.shape[0]
        if method != "naive":
            return module(x, x, x, key_padding_mask=pad)[0]

        def split(t):
            return t.view(n, batch, heads, dim // heads).permute(1, 2, 0, 3)

        q, k, v = split(module.q_proj(x)), split(module.k_proj(x)), split(module.v_proj(x))
        out = mtsa_naive(q, k, v, module.source2token(v, pad), pad)
        return module.out_proj(out.permute(2, 0, 1, 3).reshape(n, batch, dim))

    def inputs(n):
        x = torch.randn(n, batch, dim, requires_grad=True)
        pad = torch.zeros(batch, n, dtype=torch.bool)
        pad[-1, : n // 8] = True  # one left-padded row, as fairseq batches sources
        return x, pad

    module.train()
    step(*inputs(16)).sum().backward()  # one-time library initialisation, outside the measurement
    module.zero_grad(set_to_none=True)
    x, pad = inputs(length)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step(x, pad).sum().backward()
    peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    times = []
    for _ in range(repeats):
        x.grad = None
        module.zero_grad(set_to_none=True)
        start = time.perf_counter()
        step(x, pad).sum().backward()
        times.append(time.perf_counter() - start)
    return {"peak_mb": peak_mb, "ms": 1000 * statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--out", type=Path, help="write the Markdown table (with a line of settings) here")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: "method:length", run in a subprocess
    args = parser.parse_args()
    if args.one:
        method, length = args.one.split(":")
        print(json.dumps(measure(method, int(length), args.batch, args.dim, args.heads, args.repeats)))
        return
    if args.out is not None and not args.out.parent.is_dir():
        parser.error(f"--out directory {args.out.parent} does not exist")

    import torch

    from mtsa_fairseq.benchmarking import progress

    rows = []
    start = time.monotonic()
    for done, length in enumerate(args.lengths, 1):
        row = {"L": length}
        for method in args.methods:
            cmd = [sys.executable, __file__, "--one", f"{method}:{length}", "--batch", str(args.batch),
                   "--dim", str(args.dim), "--heads", str(args.heads), "--repeats", str(args.repeats)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"{method} at L={length} failed:\n{proc.stderr[-2000:]}")
            row[method] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{progress(done, len(args.lengths), start)} L={length:5d} {method:6s} "
                  f"peak {row[method]['peak_mb']:9.1f} MB  {row[method]['ms']:9.1f} ms",
                  flush=True)
        rows.append(row)

    header = ["L"] + [f"{m} MB" for m in args.methods] + [f"{m} ms" for m in args.methods]
    ratio_cols = [m for m in args.methods if m != "mha"] if "mha" in args.methods else []
    header += [f"{m}/mha mem" for m in ratio_cols] + [f"{m}/mha time" for m in ratio_cols]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(row["L"])]
        cells += [f"{row[m]['peak_mb']:.1f}" for m in args.methods] + [f"{row[m]['ms']:.1f}" for m in args.methods]
        cells += [f"{row[m]['peak_mb'] / max(row['mha']['peak_mb'], 1e-9):.2f}" for m in ratio_cols]
        cells += [f"{row[m]['ms'] / row['mha']['ms']:.2f}" for m in ratio_cols]
        lines.append("| " + " | ".join(cells) + " |")
    meta = (f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} threads, batch {args.batch}, d_model {args.dim}, {args.heads} heads, "
            f"forward+backward, median of {args.repeats}")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(f"{meta}\n\n{table}\n")


if __name__ == "__main__":
    main()
