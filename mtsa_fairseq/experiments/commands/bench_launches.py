"""Operators, host synchronisations and time of one training step of an attention layer, MTSA against fairseq's
multi-head attention, side by side.

A layer is the self-attention of an encoder layer, called as fairseq's encoder layer calls it (training mode), on
``--batch`` sequences of ``--length`` tokens of width ``--dim``, once with one left-padded sequence (a key padding
mask) and once without padding (fairseq then passes none), at each attention dropout of ``--dropouts`` (0 is
fairseq's default, as mtsa-bench-fairseq-train trains; the paper's setups use 0.1):

* ``transformer``: fairseq's ``MultiheadAttention``;
* ``mtsa``: ``MTSAMultiheadAttention`` with ``kernel="auto"`` (two SDPA calls for its exp token2token);
* ``mtsa-sdpa-joint``, ``mtsa-dense``, ``mtsa-triton``: the same with the kernel fixed (``sdpa-joint`` needs
  ``--dropouts 0``, ``triton`` CUDA).

For each a step (forward, then backward from a gradient of ones) is counted after a warm-up step: the operators
dispatched to the device and the host synchronisations (mtsa_fairseq/experiments/bench/launches.py, which also
builds the layers and measures them), on CUDA also
torch.profiler's kernel launches and synchronisations. Time: the median of ``--rounds`` steps, all layers taking
turns in each round (ABBA), in this one process. A loop that waits for its host (fairseq-train at WMT batch
sizes, docs/kernel.md) pays for every operator and synchronisation; the default size is small enough that the
CPU's time is mostly that cost.

  mtsa-bench-launches --threads 1 --json launches.json --markdown launches.md
  mtsa-bench-launches --device cuda --dtype float16 --batch 128 --length 32 --dim 512 --heads 8 \\
      --layers transformer mtsa mtsa-triton
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mtsa_fairseq.experiments.bench import measure
from mtsa_fairseq.experiments.processes import run_command

LAYERS = ("transformer", "mtsa", "mtsa-sdpa-joint", "mtsa-dense", "mtsa-triton")  # launches.build_layer's names


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs="+", choices=LAYERS, default=["transformer", "mtsa"],
                        help="the layers, the first the time ratios' reference")
    parser.add_argument("--batch", type=int, default=2, help="sequences per batch")
    parser.add_argument("--length", type=int, default=16, help="tokens per sequence")
    parser.add_argument("--dim", type=int, default=64, help="model width (head width: dim / heads)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.1],
                        help="attention dropouts (fairseq's --attention-dropout)")
    parser.add_argument("--rounds", type=int, default=100, help="timed steps per layer (the median is reported)")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="parameter and activation dtype")
    parser.add_argument("--json", type=Path, help="write the counts (also per operator) and times here")
    parser.add_argument("--markdown", type=Path, help="write the Markdown table (with a line of settings) here")
    return parser


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    measure.check_positive(parser, args)
    if not all(0.0 <= p < 1.0 for p in args.dropouts):
        parser.error("--dropouts must be in [0, 1)")
    if "mtsa-sdpa-joint" in args.layers and any(args.dropouts):
        parser.error("mtsa-sdpa-joint has no attention dropout: give --dropouts 0")
    measure.check_outputs(parser, args.json, args.markdown, what="directory")
    measure.check_device(parser, args.device)
    measure.check_triton(parser, args.layers, args.device)
    from mtsa_fairseq.experiments.bench import launches

    launches.run(args)


def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main, resumes=False)


if __name__ == "__main__":
    main()
