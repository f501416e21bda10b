"""Train several seeds of one training config (configs/*.yaml) with fairseq-train, resumably: each seed in
SAVE_ROOT/<config name>/seed<k>/ (checkpoints, train.log, run.json); running the same command again skips finished
seeds and resumes the others from their checkpoint_last.pt.

  scripts/train_seeds.py --config configs/setup1_mtsa.yaml --data data/wmt14 --seeds 1 2 3 --save-root runs
"""

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from mtsa_fairseq.experiments.errors import LaunchError
from mtsa_fairseq.experiments.processes import run_command
from mtsa_fairseq.experiments.translation.launch import execute
from mtsa_fairseq.experiments.translation.plan import (
    LAUNCHERS,
    MIN_SLURM_TIME,
    SLURM_REQUEUES,
    SLURM_SIGNAL_DELAY_S,
    SLURM_TIME,
    LaunchOptions,
    plan,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True, help="training config (YAML, see configs/)")
    parser.add_argument("--data", type=Path, required=True,
                        help="prepared data directory (its manifest.json names the data-bin) or a fairseq data-bin")
    parser.add_argument("--seeds", type=int, nargs="+", required=True,
                        help="seeds to train, one run each (passed as --seed)")
    parser.add_argument("--save-root", type=Path, required=True,
                        help="root of the run directories <config name>/seed<k>/")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local",
                        help="local: one fairseq-train per seed, in turn; torchrun: torchrun per seed; "
                             "slurm: submit one Slurm job per seed through submitit, requeued (and resumed) after a "
                             "timeout or a preemption; a rerun asks Slurm about the jobs that run.json says are "
                             "queued or running, and resubmits the ones that ended (default: local)")
    parser.add_argument("--nproc-per-node", type=int,
                        help="processes (GPUs) per node (default: the config's hardware.gpus_per_node; 1 on CPU)")
    parser.add_argument("--nnodes", type=int, help="nodes (default: the config's hardware.nodes; 1 on CPU)")
    parser.add_argument("--node-rank", type=int, default=0, help="this node's rank for torchrun (default: 0)")
    parser.add_argument("--master-addr", help="address of the rank-0 node for multi-node torchrun")
    parser.add_argument("--master-port", type=int, default=29500,
                        help="rendezvous port for torchrun; for slurm the port is this + seed (default: 29500)")
    parser.add_argument("--cpu", action="store_true",
                        help="train on CPU (adds --cpu to fairseq-train); with --launcher slurm, one task on a CPU "
                             "node, no GPU requested")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS/MKL_NUM_THREADS for the training processes")
    parser.add_argument("--average-last", type=int,
                        help="average the last N checkpoints saved every --save-interval-updates after "
                             "training and score that "
                             "(default: the config's average_last; 0 = checkpoint_last.pt)")
    parser.add_argument("--extra-args", default="",
                        help='more fairseq-train options, appended after the config\'s, e.g. "--update-freq 4"')
    parser.add_argument("--dry-run", action="store_true",
                        help="print the commands (and Slurm job parameters), write nothing")
    parser.add_argument("--slurm-partition", help="with --launcher slurm: the partition to submit to")
    parser.add_argument("--slurm-time", type=int, default=SLURM_TIME, metavar="MINUTES",
                        help=f"with --launcher slurm: time limit per job, at least {MIN_SLURM_TIME}; Slurm signals "
                             f"the job {SLURM_SIGNAL_DELAY_S} s before it, and the job is requeued and resumes from "
                             f"checkpoint_last.pt (default: {SLURM_TIME})")
    parser.add_argument("--slurm-requeues", type=int, default=SLURM_REQUEUES,
                        help=f"with --launcher slurm: timeouts after which a job is not requeued again "
                             f"(default: {SLURM_REQUEUES})")
    parser.add_argument("--slurm-args", nargs="+", default=[], metavar="KEY=VALUE",
                        help="with --launcher slurm: more sbatch options without their dashes, e.g. account=nlp "
                             "constraint=volta32gb")
    return parser


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    try:
        extra = tuple(shlex.split(args.extra_args))
    except ValueError as err:
        parser.error(f"--extra-args: {err}")
    given = {field.name: getattr(args, field.name) for field in dataclasses.fields(LaunchOptions)}  # same names
    options = LaunchOptions(**{**given, "extra_args": extra, "slurm_args": tuple(args.slurm_args)})
    the_plan = plan(args.config, args.data, args.seeds, args.save_root, options, dry_run=args.dry_run)
    failed = execute(the_plan, dry_run=args.dry_run)
    if failed:
        sys.exit(f"error: {failed} run(s) did not finish (see their run.json and train.log)")


def main() -> None:
    """The command: SIGTERM and Ctrl-C stop it after its children, with one line (exit 143 / 130)."""
    run_command(_main, errors=(LaunchError,))


if __name__ == "__main__":
    main()
