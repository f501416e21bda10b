"""Train several seeds of one config with ``fairseq-train``, resumably, locally, under torchrun or on Slurm.

Each seed trains in ``SAVE_ROOT/<config name>/seed<k>/`` (contract 2): fairseq's checkpoints,
``train.log`` (fairseq's output, appended over resumed sessions) and ``run.json`` (status, command, wall
time, updates, throughput, peak memory, the checkpoint to score). A run is done when fairseq exited 0 and
``checkpoint_last.pt`` reached ``--max-update``; launching again skips done runs and restarts the others
in the same directory, where fairseq restores ``checkpoint_last.pt`` itself.

Everything is checked (config, data, seeds, world size, every fairseq option against fairseq's parser)
by :func:`plan` before anything is written; :func:`execute` then trains or writes sbatch scripts.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtsa_fairseq.experiments.processes import RunLock, UpdateProgress, run_logged
from mtsa_fairseq.experiments.runs import (
    checkpoint_updates,
    finish_run,
    is_done,
    previous_run,
    write_run,
)
from mtsa_fairseq.experiments.translation.plan import Plan, SeedRun
from mtsa_fairseq.experiments.translation.training_view import LaunchError


def sbatch_script(plan_: Plan, run: SeedRun, train_seeds: Path) -> str:
    """The sbatch script of one seed: record start, ``srun fairseq-train``, record finish."""
    python = shlex.quote(sys.executable)
    script = shlex.quote(str(train_seeds))
    run_dir = shlex.quote(str(run.run_dir))
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={plan_.config.name}.seed{run.seed}",
        f"#SBATCH --nodes={plan_.nnodes}",
        f"#SBATCH --ntasks-per-node={plan_.nproc_per_node}",
        f"#SBATCH --gpus-per-node={plan_.nproc_per_node}",
        *([f"#SBATCH --cpus-per-task={plan_.options.threads}"] if plan_.options.threads else []),
        f"#SBATCH --output={run.run_dir}/slurm-%j.out",
        f"# {plan_.config.name}, seed {run.seed}: written by scripts/train_seeds.py --launcher slurm",
        "set -uo pipefail",
        *(f"export {k}={shlex.quote(v)}" for k, v in plan_.env.items()),
        f"cd {shlex.quote(os.getcwd())}",
        f"{python} {script} --record-start {run_dir} || exit 1",
        f"srun --kill-on-bad-exit=1 {shlex.join(run.command)} 2>&1 | tee -a {run_dir}/train.log",
        "rc=${PIPESTATUS[0]}",
        f"{python} {script} --record-finish {run_dir} --returncode \"$rc\"",
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def execute(plan_: Plan, train_seeds: Path, dry_run: bool = False, log: Callable[[str], None] = print) -> int:
    """Train (or write sbatch scripts for) every seed of ``plan_``; returns the number of failed runs."""
    for warning in plan_.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    max_update = plan_.runs[0].record["max_update"]
    if dry_run:
        if plan_.view is not None and not plan_.view.path.exists():
            log(f"# would build the length-filtered training data {plan_.view.path}")
        for run in plan_.runs:
            if is_done(previous_run(run.run_dir), max_update):
                log(f"# seed {run.seed}: done, would be skipped")
            elif plan_.options.launcher == "slurm":
                log(f"# seed {run.seed}: {run.run_dir / 'train.sbatch'}\n{sbatch_script(plan_, run, train_seeds)}")
            else:
                log(shlex.join(run.command))
        return 0
    if plan_.view is not None:
        plan_.view.path.parent.mkdir(parents=True, exist_ok=True)
        plan_.view.build(log)
    failed = 0
    for run in plan_.runs:
        previous = previous_run(run.run_dir)
        if is_done(previous, max_update):
            log(f"seed {run.seed}: done ({previous['num_updates']} updates), skipped")
            continue
        if plan_.options.launcher == "slurm":
            failed += _write_slurm(plan_, run, previous, train_seeds, log)
        elif plan_.options.node_rank > 0:
            run.run_dir.mkdir(parents=True, exist_ok=True)
            log(f"seed {run.seed}: node {plan_.options.node_rank} joining: {shlex.join(run.command)}")
            with _lock_run(run.run_dir, f".lock.node{plan_.options.node_rank}") as lock:  # node 0 holds .lock
                returncode, _, _ = run_logged(run.command, run.run_dir / run.log_name, plan_.env, lock)
            failed += returncode != 0
        else:
            failed += _train(plan_, run, log)
    return failed


def _write_slurm(plan_: Plan, run: SeedRun, previous: dict[str, Any] | None, train_seeds: Path,
                 log: Callable[[str], None]) -> int:
    if previous and previous.get("status") in ("running", "submitted"):
        log(f"seed {run.seed}: run.json says {previous['status']} (job {previous.get('slurm_job', '?')}); "
            "not resubmitted: wait for the job, or cancel it and set its status to failed")
        return 0
    run.run_dir.mkdir(parents=True, exist_ok=True)
    path = run.run_dir / "train.sbatch"
    path.write_text(sbatch_script(plan_, run, train_seeds))
    record = {**run.record, "wall_seconds": (previous or {}).get("wall_seconds", 0.0),
              "peak_rss_mb": (previous or {}).get("peak_rss_mb")}
    if plan_.options.submit:
        proc = subprocess.run(["sbatch", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            log(f"seed {run.seed}: sbatch failed: {proc.stderr.strip()}")
            write_run(run.run_dir, record)
            return 1
        job = proc.stdout.strip().split()[-1] if proc.stdout.strip() else "?"
        record.update(status="submitted", slurm_job=job)
        log(f"seed {run.seed}: submitted job {job} ({path})")
    else:
        log(f"seed {run.seed}: wrote {path} (submit with: sbatch {path})")
    write_run(run.run_dir, record)
    return 0


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _lock_run(run_dir: Path, name: str = ".lock") -> RunLock:
    """The run directory's lock, held (a live holder, e.g. a trainer left by a killed launcher: LaunchError)."""
    return RunLock(run_dir / name, f"run {run_dir}").acquire(LaunchError)


def _train(plan_: Plan, run: SeedRun, log: Callable[[str], None]) -> int:
    """Train one seed while holding its run directory's lock."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    with _lock_run(run.run_dir) as lock:
        previous = previous_run(run.run_dir)  # read again under the lock: another launcher may have finished it
        if is_done(previous, run.record["max_update"]):
            log(f"seed {run.seed}: done ({previous['num_updates']} updates), skipped")
            return 0
        return _train_locked(plan_, run, previous, lock, log)


def _train_locked(plan_: Plan, run: SeedRun, previous: dict[str, Any] | None, lock: RunLock,
                  log: Callable[[str], None]) -> int:
    resumed_from = checkpoint_updates(run.run_dir / "checkpoint_last.pt") or 0
    previous = previous or {}
    record = {**run.record, "status": "running", "resumed_from_updates": resumed_from,
              "wall_seconds": previous.get("wall_seconds", 0.0), "peak_rss_mb": previous.get("peak_rss_mb")}
    write_run(run.run_dir, record)
    if resumed_from >= record["max_update"]:  # fairseq finished but run.json was not filled in
        log(f"seed {run.seed}: checkpoint_last.pt is at {resumed_from} updates already; recording the run")
        return finish_run(run.run_dir, 0, 0.0, None, log)["status"] != "done"
    what = f"resuming from update {resumed_from}" if resumed_from else "training"
    log(f"seed {run.seed}: {what}: {shlex.join(run.command)}")
    start = time.monotonic()
    try:
        progress = UpdateProgress(f"{plan_.config.name} seed {run.seed}", record["max_update"], resumed_from,
                                  write=_to_stderr)
        returncode, peak_mb, output = run_logged(run.command, run.run_dir / run.log_name, plan_.env, lock,
                                                 on_line=progress)
    except BaseException:
        write_run(run.run_dir, {**record, "status": "interrupted",
                                "wall_seconds": record["wall_seconds"] + time.monotonic() - start})
        raise
    if resumed_from and "Loaded checkpoint" not in output:
        log(f"warning: seed {run.seed}: fairseq did not report loading {run.run_dir / 'checkpoint_last.pt'}")
    result = finish_run(run.run_dir, returncode, time.monotonic() - start, round(peak_mb, 1), log)
    log(f"seed {run.seed}: {result['status']} at {result['num_updates']} updates"
        + (f" ({result['error']})" if result.get("error") else ""))
    return result["status"] != "done"
