"""Slurm jobs through submitit: one job per seed, one task per GPU, requeued on a timeout or a preemption.

Every task of the job runs the seed's ``fairseq-train`` command (fairseq reads ``SLURM_*`` and initialises
on the first node at ``--distributed-port``). Task 0 also holds the run directory's lock, appends fairseq's
output to ``train.log`` and keeps ``run.json``. When Slurm signals a timeout or a preemption, submitit calls
:meth:`SeedJob.checkpoint` and requeues the same job: the same command then resumes from
``checkpoint_last.pt``, as rerunning ``mtsa-train-seeds`` does.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import DelayedSubmission

from mtsa_fairseq.experiments.errors import LaunchError
from mtsa_fairseq.experiments.processes import RunLock, run_logged
from mtsa_fairseq.experiments.runs import checkpoint_updates, previous_run, record_finish, record_start, write_run
from mtsa_fairseq.experiments.translation.plan import SLURM_SIGNAL_DELAY_S, Plan, SeedRun


class SeedJob(submitit.helpers.Checkpointable):
    """The job of one seed (picklable: submitit runs it on the allocated nodes)."""

    def __init__(self, run_dir: Path, command: list[str], env: dict[str, str], max_update: int):
        self.run_dir, self.command, self.env, self.max_update = Path(run_dir), command, env, max_update

    def __call__(self) -> int:
        """Train (task 0 under the run's lock, recording run.json); returns fairseq's exit status (0)."""
        job, output = submitit.JobEnvironment(), ""
        if (checkpoint_updates(self.run_dir / "checkpoint_last.pt") or 0) >= self.max_update:
            returncode = 0  # finished before a requeue: every task sees the same checkpoint and skips fairseq
        elif job.global_rank != 0:
            returncode = run_logged(self.command, None, self.env)[0]
        else:
            with RunLock(self.run_dir / ".lock", f"run {self.run_dir}").acquire(LaunchError) as lock:
                returncode, output = self._train(lock, job.job_id)
        if job.global_rank == 0:
            record = record_finish(self.run_dir, returncode, output=output)
            if record["status"] != "done":
                raise LaunchError(f"{self.run_dir}: {record['error']}")
        elif returncode != 0:
            raise LaunchError(f"{self.run_dir}: fairseq-train exited with {returncode}")
        return returncode

    def _train(self, lock: RunLock, job_id: str) -> tuple[int, str]:
        record_start(self.run_dir, slurm_job=job_id)
        try:
            returncode, _, output = run_logged(self.command, self.run_dir / "train.log", self.env, lock)
            return returncode, output
        except BaseException:  # a requeue (SystemExit from submitit's signal handler), scancel, Ctrl-C
            if (previous_run(self.run_dir) or {}).get("status") == "running":
                self._close_session("interrupted")
            raise

    def _close_session(self, status: str) -> None:
        """Set run.json's status and add this session's time to its wall_seconds."""
        record = previous_run(self.run_dir)
        if record is not None:
            record["status"] = status
            started = record.pop("started_at", None)
            if started:
                record["wall_seconds"] = round(record.get("wall_seconds", 0.0) + time.time() - started, 3)
            write_run(self.run_dir, record)

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        """Called by submitit on a timeout or a preemption: mark the run requeued; the same job resumes it."""
        self._close_session("requeued")
        return super().checkpoint(*args, **kwargs)


def job_parameters(plan_: Plan, run: SeedRun) -> dict[str, Any]:
    """submitit's ``update_parameters`` for one seed: the world size, threads, time limit and Slurm options
    (the number of requeues after a timeout is the executor's, ``--slurm-requeues``)."""
    options = plan_.options
    parameters: dict[str, Any] = {
        "name": f"{plan_.config.name}.seed{run.seed}", "nodes": plan_.nnodes,
        "tasks_per_node": plan_.nproc_per_node, "gpus_per_node": 0 if plan_.cpu else plan_.nproc_per_node,
        "timeout_min": options.slurm_time, "slurm_signal_delay_s": SLURM_SIGNAL_DELAY_S,
    }
    if options.threads:
        parameters["cpus_per_task"] = options.threads
    if options.slurm_partition:
        parameters["slurm_partition"] = options.slurm_partition
    if options.slurm_args:
        parameters["slurm_additional_parameters"] = dict(arg.split("=", 1) for arg in options.slurm_args)
    return parameters


def submit(plan_: Plan, run: SeedRun, cluster: str = "slurm") -> submitit.Job:
    """Submit one seed's job (``cluster="local"`` runs it on this machine, as submitit's local executor does)."""
    requeues = plan_.options.slurm_requeues
    executor = submitit.AutoExecutor(folder=run.run_dir / "slurm", cluster=cluster,
                                     slurm_max_num_timeout=requeues, local_max_num_timeout=requeues)
    executor.update_parameters(**job_parameters(plan_, run))
    return executor.submit(SeedJob(run.run_dir, run.command, plan_.env, run.record["max_update"]))
