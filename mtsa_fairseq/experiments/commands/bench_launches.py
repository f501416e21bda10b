"""Operators, host synchronisations and time of one training step, MTSA against fairseq's Transformer, side by
side (docs/benchmark-launches.md): per encoder layer (``--levels layer``, called as fairseq's encoder calls its second
and later layers, an MTSA layer in its encoder's shared pass) and per model (``model``: ``transformer_wmt_en_de``
against ``transformer_mtsa_wmt_en_de``, ``--layers-per-stack`` encoder and decoder layers), on ``--batch`` sequences
of ``--length`` tokens of width ``--dim``, with one left-padded sequence and without (``--paddings``), at each of
``--dropouts``.

``--layers``: ``transformer`` (fairseq's); ``mtsa`` (``--mtsa-kernel auto``, one row per ``--s2t-activations``
form); ``mtsa-sdpa-joint``, ``mtsa-dense``, ``mtsa-triton``, the kernel fixed (``sdpa-joint`` at dropout 0 only,
``triton`` CUDA). A step (forward, then backward from ones) is counted after warm-up steps; time: the median of
``--rounds`` steps, all rows taking turns in each round, in this process and, with ``--processes N``, in N - 1
fresh ones after it: the time ratios are then the mean over the processes with its 95% interval.

  mtsa-bench-launches --threads 1 --json launches.json --markdown launches.md
  mtsa-bench-launches --device cuda --dtype float16 --batch 128 --length 32 --dim 512 --heads 8 \\
      --layers transformer mtsa mtsa-triton
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mtsa_fairseq.experiments.bench import measure
from mtsa_fairseq.experiments.processes import run_command

S2T_ACTIVATIONS = ("scaled_sigmoid", "sigmoid", "exp", "scaled_exp")  # mtsa_attention's, without importing torch
LAYERS = ("transformer", "mtsa", "mtsa-sdpa-joint", "mtsa-dense", "mtsa-triton")  # launches.build_layer's names
PADDINGS = ("padded", "unpadded")


def build_parser() -> argparse.ArgumentParser:
    """The command line (``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs="+", choices=LAYERS, default=["transformer", "mtsa"],
                        help="the layers, the first the time ratios' reference")
    parser.add_argument("--levels", nargs="+", choices=("layer", "model"), default=["layer", "model"],
                        help="encoder layers, whole models, or both")
    parser.add_argument("--s2t-activations", nargs="+", choices=S2T_ACTIVATIONS, default=["scaled_sigmoid"],
                        help="MTSA's --mtsa-s2t-activation forms (default: the models' default)")
    parser.add_argument("--paddings", nargs="+", choices=PADDINGS, default=list(PADDINGS),
                        help="batches with one left-padded sequence, without padding, or both")
    parser.add_argument("--layers-per-stack", type=int, default=6, help="encoder and decoder layers of a model")
    parser.add_argument("--batch", type=int, default=2, help="sequences per batch")
    parser.add_argument("--length", type=int, default=16, help="tokens per sequence")
    parser.add_argument("--dim", type=int, default=64, help="model width (head width: dim / heads)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.1],
                        help="attention dropouts (fairseq's --attention-dropout)")
    parser.add_argument("--rounds", type=int, default=100, help="timed steps per layer (the median is reported)")
    parser.add_argument("--processes", type=int, default=1,
                        help="time the rows in this many processes, one after another, and give each time ratio as "
                             "its mean over them with a 95%% interval: on a CPU a ratio moves more from process to "
                             "process than from round to round")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="parameter and activation dtype")
    parser.add_argument("--json", type=Path, help="write the counts (also per operator) and times here")
    parser.add_argument("--markdown", type=Path, help="write the Markdown table (with a line of settings) here")
    parser.add_argument("--times-only", action="store_true", help=argparse.SUPPRESS)  # internal: one more process
    return parser


def _main() -> None:
    parser = build_parser()
    argv = sys.argv[1:]
    args = parser.parse_args(argv)
    measure.check_positive(parser, args, skip=("dropouts",))
    if args.dim % args.heads:
        parser.error(f"--dim {args.dim} is not divisible by --heads {args.heads}")
    if not all(0.0 <= p < 1.0 for p in args.dropouts):
        parser.error("--dropouts must be in [0, 1)")
    if "mtsa-sdpa-joint" in args.layers and 0 not in args.dropouts:
        parser.error("mtsa-sdpa-joint has no attention dropout: give 0 among --dropouts")
    measure.check_outputs(parser, args.json, args.markdown, what="directory")
    measure.check_device(parser, args.device)
    measure.check_triton(parser, args.layers, args.device)
    from mtsa_fairseq.experiments.bench import launches

    launches.run(args, Path(__file__), argv)


def main() -> None:
    """The command: one line, never a traceback, for a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(_main, resumes=False)


if __name__ == "__main__":
    main()
