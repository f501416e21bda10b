"""Slurm jobs through submitit (docs/experiment.md, Slurm): one job per seed, one task per GPU (one per node on CPU),
requeued on a timeout or a preemption. Task 0 holds the run's lock, writes ``train.log`` and keeps ``run.json``; a run
recorded ``requeued`` is trusted only after asking Slurm (:func:`job_state`) what became of its job."""

from __future__ import annotations

import contextlib
import getpass
import signal
import subprocess
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import DelayedSubmission, UncompletedJobError

from mtsa_fairseq.experiments.errors import LaunchError
from mtsa_fairseq.experiments.processes import RunLock, UpdateProgress, interruptions_held, run_logged, to_stderr
from mtsa_fairseq.experiments.runs import checkpoint_updates, close_session, finish_session, previous_run, session
from mtsa_fairseq.experiments.translation.plan import SLURM_SIGNAL_DELAY_S, Plan, SeedRun

# Slurm job states (squeue(1), "JOB STATE CODES") in which the job may still run: a launcher must not submit
# the seed again. Every other state (COMPLETED, CANCELLED, FAILED, TIMEOUT, PREEMPTED, NODE_FAIL, ...) is final.
LIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING",
    "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED", "RESV_DEL_HOLD",
})
_QUERY_TIMEOUT_S = 60
# Slurm sends the time-limit warning to every process of the job step, fairseq-train included, whose default
# action for it is to die: fairseq-train ignores it, so that submitit's handler in the launcher decides. The launcher
# holds it while it reads checkpoints: out of requeues, the handler raises UncompletedJobError, a RuntimeError, which
# a checkpoint reader would take for an unreadable file (training on past the limit, checkpoint_last.pt moved aside).
_LAUNCHER_SIGNALS = (signal.SIGUSR2,)


class SeedJob(submitit.helpers.Checkpointable):
    """The job of one seed (picklable: submitit runs it on the allocated nodes)."""

    def __init__(self, run_dir: Path, command: list[str], env: dict[str, str], max_update: int, label: str,
                 cpu: bool = False):
        self.run_dir, self.command, self.env, self.max_update = Path(run_dir), command, env, max_update
        self.label, self.cpu = label, cpu

    def __call__(self) -> int:
        """Train (task 0 under the run's lock, recording run.json); returns fairseq's exit status (0)."""
        job = submitit.JobEnvironment()
        try:
            returncode, peak_mb, output = self._train(job)
        except UncompletedJobError as err:  # submitit's signal handler: out of requeues (--slurm-requeues)
            if self._status() != "done":
                close_session(self.run_dir, "failed", error=f"Slurm job {job.job_id}: {err}")
            raise
        if job.global_rank != 0:
            if returncode != 0:
                raise LaunchError(f"{self.run_dir}: fairseq-train exited with {returncode}")
            return returncode
        if returncode == -signal.SIGTERM:  # Slurm ends the job's processes: requeue, preemption or scancel
            close_session(self.run_dir, "requeued", peak_mb)
            raise LaunchError(f"{self.run_dir}: fairseq-train was stopped by SIGTERM (a requeue, a preemption or a "
                              "cancellation); run.json says requeued until the launcher asks Slurm")
        record = finish_session(self.run_dir, returncode, peak_mb, output=output)
        if record["status"] != "done":
            raise LaunchError(f"{self.run_dir}: {record['error']}")
        return returncode

    def _train(self, job: submitit.JobEnvironment) -> tuple[int, float | None, str]:
        """fairseq-train's exit status, peak memory in MB and output; (0, None, "") for a finished checkpoint, which
        every task sees and skips fairseq for. Task 0 holds the run's lock and records the session."""
        with contextlib.ExitStack() as stack:
            with interruptions_held(_LAUNCHER_SIGNALS):
                finished = (checkpoint_updates(self.run_dir / "checkpoint_last.pt") or 0) >= self.max_update
                if not finished and job.global_rank == 0:
                    lock = stack.enter_context(RunLock(self.run_dir / ".lock", f"run {self.run_dir}")
                                               .acquire(LaunchError))
                    started = stack.enter_context(session(self.run_dir, None, self.label, to_stderr, self.cpu,
                                                          slurm_job=job.job_id))
            if finished:
                return 0, None, ""
            if job.global_rank != 0:
                return run_logged(self.command, None, self.env, ignored=_LAUNCHER_SIGNALS)
            progress = UpdateProgress(self.label, self.max_update, started.resumed_from, write=to_stderr)
            return run_logged(self.command, self.run_dir / "train.log", self.env, lock, on_line=progress,
                              ignored=_LAUNCHER_SIGNALS)

    def _status(self) -> str | None:
        """The status run.json records, None without a readable one."""
        return (previous_run(self.run_dir) or {}).get("status")

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        """Called by submitit on a timeout or a preemption: mark the running session requeued; the same job
        resumes it."""
        if self._status() == "running":
            close_session(self.run_dir, "requeued")
        return super().checkpoint(*args, **kwargs)


def job_name(plan_: Plan, run: SeedRun) -> str:
    """The Slurm job name of one seed (``<config>.seed<k>``)."""
    return f"{plan_.config.name}.seed{run.seed}"


def job_parameters(plan_: Plan, run: SeedRun) -> dict[str, Any]:
    """submitit's ``update_parameters`` for one seed: the world size, threads, time limit and Slurm options
    (the number of requeues after a timeout is the executor's, ``--slurm-requeues``)."""
    options = plan_.options
    parameters: dict[str, Any] = {
        "name": job_name(plan_, run), "nodes": plan_.nnodes,
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
    return executor.submit(SeedJob(run.run_dir, run.command, plan_.env, run.record["max_update"], run.label,
                                   plan_.cpu))


def _query(command: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=_QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise LaunchError(f"could not ask Slurm ({command[0]}): {err}") from None


def job_state(job_id: str) -> str | None:
    """What Slurm says of job ``job_id``: its state (``PENDING``, ``RUNNING``, ``CANCELLED``, ...), or None when neither
    the controller (``scontrol``, which keeps finished jobs for ``MinJobAge``) nor the accounting database (``sacct``)
    knows it. A controller that does not answer is a :class:`LaunchError`: then nothing can be decided."""
    proc = _query(["scontrol", "--oneliner", "show", "job", str(job_id)])
    if proc.returncode == 0:
        for field in proc.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
    elif "Invalid job id" not in proc.stderr:
        raise LaunchError(f"could not ask Slurm about job {job_id}: {_last_line(proc)}")
    accounted = _query(["sacct", "--noheader", "--parsable2", "--allocations", "--jobs", str(job_id),
                        "--format", "State"])
    lines = accounted.stdout.splitlines() if accounted.returncode == 0 else []
    return lines[-1].split()[0] if lines and lines[-1].strip() else None  # "CANCELLED by 0": its first word


def live_jobs(name: str) -> list[tuple[str, str]]:
    """This user's queued or running jobs called ``name``, as (job id, state), from ``squeue``."""
    proc = _query(["squeue", "--noheader", "--user", getpass.getuser(), "--name", name, "--format", "%i %T"])
    if proc.returncode != 0:
        raise LaunchError(f"could not ask Slurm about jobs named {name}: {_last_line(proc)}")
    return [(job, state) for job, state in (line.split() for line in proc.stdout.splitlines() if line.strip())]


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"
