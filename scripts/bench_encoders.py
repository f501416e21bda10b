#!/usr/bin/env python
"""Time and peak memory of one forward+backward pass of each sentence encoder vs sequence length, as in
the MTSA paper's Figure 1 / DiSAN's Table 1: batch 64, 300 channels, training mode, pooled output.

Encoders: MTSA (= Fast-DiSA's released code; the SNLI block: 2 heads, sigmoid token2token, strict
forward/backward masks, fusion gate, exp two-layer source2token, 600 wide), DiSAN (forward + backward
DiSA, chunked), Bi-LSTM (600D), Multi-CNN (3/4/5-gram, 200 each), Hrchy-CNN (3 gated residual layers) and
multi-head attention (8 x 75 units, positional encoding); every per-token output is pooled by
multi-dimensional source2token attention. Time: median of ``--repeats`` passes after a warm-up, the
encoders taking turns pass by pass. Peak memory: one pass in a fresh process per (encoder, L).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ENCODERS = ("mtsa", "disan", "bilstm", "multi_cnn", "hrchy_cnn", "multi_head")


def build(name: str, dim: int):
    import torch

    from mtsa_fairseq.modules import (
        BiLSTMEncoder,
        DiSAN,
        HierarchicalCNNEncoder,
        MultiCNNEncoder,
        MultiDimSource2Token,
        MultiHeadEncoder,
        SentenceMTSA,
    )

    if name == "mtsa":
        block = SentenceMTSA(dim, 2 * dim, num_heads=2, token2token="sigmoid", activation_name="elu")
        pool = MultiDimSource2Token(2 * dim)

        class Pooled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.block, self.pool = block, pool

            def forward(self, x, mask):
                return self.pool(self.block(x, mask), mask)

        return Pooled()
    return {"disan": lambda: DiSAN(dim), "bilstm": lambda: BiLSTMEncoder(dim),
            "multi_cnn": lambda: MultiCNNEncoder(dim), "hrchy_cnn": lambda: HierarchicalCNNEncoder(dim),
            "multi_head": lambda: MultiHeadEncoder(dim, head_dim=75)}[name]()  # 8 x 75 as in the paper


def _pass(model, x) -> None:
    model.zero_grad(set_to_none=True)
    model(x, None).sum().backward()


def _inputs(batch: int, length: int, dim: int, device: str):
    import torch

    return torch.randn(batch, length, dim, device=device, generator=torch.Generator(device).manual_seed(length))


def memory_mb(name: str, length: int, args: argparse.Namespace) -> float:
    from mtsa_fairseq.benchmarking import peak_growth_mb

    model = build(name, args.dim).to(args.device).train()
    _pass(model, _inputs(args.batch, 8, args.dim, args.device))  # library initialisation
    x = _inputs(args.batch, length, args.dim, args.device)
    return peak_growth_mb(lambda: _pass(model, x), args.device)


def times_ms(models: dict, length: int, args: argparse.Namespace) -> dict[str, float]:
    """Median forward+backward time per encoder, the encoders alternating (ABBA order) pass by pass."""
    from mtsa_fairseq.benchmarking import timed_rounds

    x = _inputs(args.batch, length, args.dim, args.device)
    steps = {name: lambda _, model=model: _pass(model, x) for name, model in models.items()}
    return {name: 1000 * statistics.median(t) for name, t in timed_rounds(steps, args.repeats, args.device).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024],
                        help="sequence lengths")
    parser.add_argument("--encoders", nargs="+", choices=ENCODERS, default=list(ENCODERS), help="encoders to run")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--dim", type=int, default=300, help="input channels (word embedding size)")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per encoder and length")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--json", type=Path, help="write the raw numbers here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)  # internal: "encoder:L", in a fresh process
    args = parser.parse_args()

    import torch

    from mtsa_fairseq.benchmarking import can_measure, device_name

    if not can_measure(args.device):
        parser.error(f"cannot measure peak memory on {args.device} here (CPU needs Linux's /proc/self/status)")
    if args.memory_of:
        name, length = args.memory_of.split(":")
        print(json.dumps(memory_mb(name, int(length), args)))
        return
    for out in (args.json, args.plot):
        if out is not None and not out.parent.is_dir():
            parser.error(f"output directory {out.parent} does not exist")

    torch.manual_seed(0)
    models = {name: build(name, args.dim).to(args.device).train() for name in args.encoders}
    rows = []
    for length in args.lengths:
        ms = times_ms(models, length, args)
        mb = {}
        for name in args.encoders:
            proc = subprocess.run(
                [sys.executable, __file__, "--memory-of", f"{name}:{length}", "--batch", str(args.batch),
                 "--dim", str(args.dim), "--device", args.device], capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"error: memory of {name} at L={length} failed:\n{proc.stderr[-2000:]}")
            mb[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append({"L": length, "ms": ms, "mb": mb})
        print(f"[bench] L={length:5d} " + "  ".join(f"{n} {ms[n]:.0f} ms {mb[n]:.0f} MB" for n in args.encoders),
              flush=True)
    settings = (f"{device_name(args.device)}, torch {torch.__version__}; batch {args.batch}, {args.dim} channels, "
                "forward+backward")
    header = ["L"] + [f"{n} ms" for n in args.encoders] + [f"{n} MB" for n in args.encoders]
    lines = [settings, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [str(r["L"])] + [f"{r['ms'][n]:.1f}" for n in args.encoders]
        cells += [f"{r['mb'][n]:.0f}" for n in args.encoders]
        lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")
    if args.plot:
        import logging

        import matplotlib

        matplotlib.use("Agg")
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for name in args.encoders:
            lengths = [r["L"] for r in rows]
            axes[0].plot(lengths, [r["ms"][name] for r in rows], "o-", label=name)
            axes[1].plot(lengths, [r["mb"][name] for r in rows], "o-", label=name)
        for ax, title in zip(axes, ["forward+backward time (ms)", "peak memory growth (MB)"]):
            ax.set(xscale="log", yscale="log", xlabel="sequence length L", title=title)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(settings, fontsize=9)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
