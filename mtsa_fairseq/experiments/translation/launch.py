"""Train several seeds of one config with ``fairseq-train``, resumably, locally, under torchrun or on Slurm
(docs/experiment.md, 2. Training): each seed in ``SAVE_ROOT/<config name>/seed<k>/`` (contract 2), done when fairseq
exited 0 at ``--max-update``; launching again skips done runs and resumes the others from ``checkpoint_last.pt``.
:func:`~.plan.plan` checks everything before anything is written; :func:`execute` trains or submits Slurm jobs."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtsa_fairseq.experiments.errors import LaunchError
from mtsa_fairseq.experiments.processes import RunLock, UpdateProgress, run_logged, to_stderr
from mtsa_fairseq.experiments.runs import carried_seconds, is_done, previous_run, session, write_run
from mtsa_fairseq.experiments.translation import slurm
from mtsa_fairseq.experiments.translation.plan import Plan, SeedRun


def execute(plan_: Plan, dry_run: bool = False, log: Callable[[str], None] = print) -> int:
    """Train (or submit a Slurm job for) every seed of ``plan_``; returns the number of failed runs."""
    for warning in plan_.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    max_update = plan_.runs[0].record["max_update"]
    for run in plan_.runs:
        previous = previous_run(run.run_dir)
        _check_not_past(run, previous, max_update)
        _check_same_training(run, previous, max_update)
    if dry_run:
        if plan_.view is not None and not plan_.view.path.exists():
            log(f"# would build the length-filtered training data {plan_.view.path}")
        for run in plan_.runs:
            if is_done(previous_run(run.run_dir), max_update):
                log(f"# seed {run.seed}: done, would be skipped")
            else:
                if plan_.options.launcher == "slurm":
                    log(f"# seed {run.seed}: Slurm job {json.dumps(slurm.job_parameters(plan_, run))}, every task:")
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
            failed += _submit(plan_, run, previous, log)
        elif plan_.options.node_rank > 0:
            run.run_dir.mkdir(parents=True, exist_ok=True)
            log(f"seed {run.seed}: node {plan_.options.node_rank} joining: {shlex.join(run.command)}")
            with _lock_run(run.run_dir, f".lock.node{plan_.options.node_rank}") as lock:  # node 0 holds .lock
                returncode, _, _ = run_logged(run.command, run.run_dir / run.log_name, plan_.env, lock)
            failed += returncode != 0
        else:
            failed += _train(plan_, run, log)
    return failed


def _check_not_past(run: SeedRun, previous: dict[str, Any] | None, max_update: int) -> None:
    """Refuse a run directory trained past the plan's budget: "done" there would score checkpoints of another
    budget as this one's (a smaller budget's runs go on training from their last checkpoint instead)."""
    updates = (previous or {}).get("num_updates") or 0
    if updates > max_update:
        raise LaunchError(f"seed {run.seed}: {run.run_dir} holds a run trained to {updates:,} updates, past this "
                          f"plan's --max-update {max_update:,}; use another --out or --save-root for a smaller budget")


# options that may change between a run's sessions: the budget (a larger one trains on) and the device flag
_RESUMABLE_WITH_OTHER = ("--max-update", "--cpu")


def _training_options(args: list[str]) -> dict[str, str]:
    """fairseq-train options (``--name``, ``--name=value`` or ``--name`` and the words up to the next option) that
    define what a run trains."""
    options: dict[str, str] = {}
    name = None
    for word in args:
        if word.startswith("--"):
            name, _, value = word.partition("=")
            options[name] = value
        elif name is not None:
            options[name] = f"{options[name]} {word}".strip()
    return {key: value for key, value in options.items() if key not in _RESUMABLE_WITH_OTHER}


def _check_same_training(run: SeedRun, previous: dict[str, Any] | None, max_update: int) -> None:
    """Refuse to resume, or to take as done, a run trained on other data (dictionaries) or with other training
    options than the plan's (a changed config or --extra-args): its checkpoints would continue under the new ones
    (the budget and --cpu may change). A finished run scored with another ``average_last`` is refused too."""
    if not previous:
        return
    was_dicts, now_dicts = previous.get("dictionaries") or {}, run.record["dictionaries"]
    other = next((name for name in sorted(was_dicts) if was_dicts[name] != now_dicts.get(name)), None)
    if other is not None and (run.run_dir / "checkpoint_last.pt").exists():  # a checkpoint trained on them
        raise LaunchError(f"seed {run.seed}: {run.run_dir} was trained with another {other} than "
                          f"{run.record['data']} has (its run.json records the dictionaries); use another --out or "
                          "--save-root, or the data it was trained with")
    was_average, now_average = previous.get("average_last") or 0, run.record["average_last"] or 0
    if is_done(previous, max_update) and was_average != now_average:
        raise LaunchError(f"seed {run.seed}: {run.run_dir} is done, scored at {previous.get('checkpoint')} "
                          f"(average_last {was_average}), where this plan asks for average_last {now_average}; "
                          "average its kept checkpoints with mtsa-average-checkpoints, or use another --out or "
                          "--save-root")
    if previous.get("train_args") is None:  # recorded before train_args
        return
    was, now = _training_options(previous["train_args"]), _training_options(run.record["train_args"])
    changed = [f"{key} {was[key] or '(set)'} -> {now[key] or '(set)'}" if key in was and key in now
               else f"{key} {'added' if key in now else 'removed'}"
               for key in sorted(was.keys() | now.keys()) if was.get(key) != now.get(key)]
    if changed:
        raise LaunchError(f"seed {run.seed}: {run.run_dir} was trained with other fairseq-train options "
                          f"({'; '.join(changed[:3])}{'; ...' if len(changed) > 3 else ''}); use another --out or "
                          "--save-root, or the config it was trained with")


def _submit(plan_: Plan, run: SeedRun, previous: dict[str, Any] | None, log: Callable[[str], None]) -> int:
    """Submit one seed's Slurm job unless Slurm still has one for it (run.json's word is checked with Slurm)."""
    history = list((previous or {}).get("slurm_history", []))
    if previous and previous.get("status") in ("running", "submitted", "requeued"):
        try:
            job_id, state = _slurm_job(plan_, run, previous)
        except LaunchError as err:
            log(f"seed {run.seed}: run.json says {previous['status']}, and {err}; not resubmitted")
            return 1
        if state in slurm.LIVE_STATES:
            log(f"seed {run.seed}: Slurm job {job_id} is {state}; not resubmitted")
            return 0
        ended = f"ended {state}" if state else "is unknown to Slurm"
        log(f"seed {run.seed}: run.json says {previous['status']}, but Slurm job {job_id or '(no id)'} {ended}; "
            "resubmitting")
        history.append({"slurm_job": job_id, "state": state or "UNKNOWN", "status": previous["status"]})
    run.run_dir.mkdir(parents=True, exist_ok=True)
    record = {**run.record, "status": "submitted",
              "wall_seconds": carried_seconds(previous, run.run_dir / run.log_name),
              "peak_rss_mb": (previous or {}).get("peak_rss_mb"), **({"slurm_history": history} if history else {})}
    write_run(run.run_dir, record)  # before submitting: the job's own "running" must not be overwritten
    try:
        job = slurm.submit(plan_, run)
    except Exception as err:  # sbatch refused the job (partition, account, limits): one line, the run stays
        write_run(run.run_dir, {**record, "status": "failed", "error": f"submission: {err}"})
        log(f"seed {run.seed}: submission failed: {str(err).strip().splitlines()[-1]}")
        return 1
    current = previous_run(run.run_dir)
    if current is not None and current.get("status") == "submitted":  # else the job runs and recorded its id
        write_run(run.run_dir, {**current, "slurm_job": job.job_id})
    log(f"seed {run.seed}: submitted Slurm job {job.job_id} (logs in {run.run_dir / 'slurm'})")
    return 0


def _slurm_job(plan_: Plan, run: SeedRun, previous: dict[str, Any]) -> tuple[str | None, str | None]:
    """The job a queued or running record stands for and Slurm's state of it (None: Slurm does not know it). A
    record without a job id (a submission cut short) is looked up by job name among this user's jobs."""
    job_id = previous.get("slurm_job")
    if job_id:
        return str(job_id), slurm.job_state(str(job_id))
    live = slurm.live_jobs(slurm.job_name(plan_, run))
    return live[0] if live else (None, None)


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
        return _train_locked(plan_, run, lock, log)


def _train_locked(plan_: Plan, run: SeedRun, lock: RunLock, log: Callable[[str], None]) -> int:
    label, max_update = f"seed {run.seed}", run.record["max_update"]
    with session(run.run_dir, run.record, label, log, plan_.cpu, run.log_name) as started:
        resumed_from = started.resumed_from
        if resumed_from >= max_update:  # fairseq finished but run.json was not filled in
            log(f"{label}: checkpoint_last.pt is at {resumed_from} updates already; recording the run")
            return started.finish(0, trained=False)["status"] != "done"
        what = f"resuming from update {resumed_from}" if resumed_from else "training"
        log(f"{label}: {what}: {shlex.join(run.command)}")
        progress = UpdateProgress(run.label, max_update, resumed_from, write=to_stderr)
        returncode, peak_mb, output = run_logged(run.command, run.run_dir / run.log_name, plan_.env, lock,
                                                 on_line=progress)
    if resumed_from and "Loaded checkpoint" not in output:
        log(f"warning: {label}: fairseq did not report loading {run.run_dir / 'checkpoint_last.pt'}")
    result = started.finish(returncode, peak_mb, output)
    updates = result["num_updates"]
    where = f"at {updates} updates" if updates is not None else "before its first update"
    log(f"{label}: {result['status']} {where}" + (f" ({result['error']})" if result.get("error") else ""))
    return result["status"] != "done"
