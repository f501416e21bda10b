"""Run records: ``run.json`` of each seed (contract 2), read tolerantly by the launcher, what the launcher
learns from a run directory (checkpoint updates, throughput in the log, interval snapshots), and the one lifecycle
of a training session that the local launcher, the Slurm job and the sentence experiment share (:func:`session`):
its start (resume point, earlier record, CPU kernels), its interruption or requeue, and its finish."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtsa_fairseq.contracts import read_run, run_record_to_write
from mtsa_fairseq.experiments.checkpoint_average import (
    EPOCH_CHECKPOINT,
    UPDATE_CHECKPOINT,
    AverageError,
    average_checkpoints,
    save_checkpoint,
)
from mtsa_fairseq.experiments.errors import LaunchError
from mtsa_fairseq.experiments.files import atomic_path, write_json
from mtsa_fairseq.experiments.processes import interruptions_held

_WPS = re.compile(r"\| train_inner \| .*\bwps=([0-9.]+)")
_TRAIN_LOSS = re.compile(r"\| train(?:_inner)? \| .*?\bloss[= ](-?[0-9.]+(?:e[-+]?[0-9]+)?|-?inf|nan)\b")
DIVERGENCE_RATIO = 1.5  # a run whose last training loss exceeds its first by this factor diverged
_LOGGED_UPDATES = re.compile(r"\bnum_updates[= ](\d+)")
FAIRSEQ_EARLY_STOP = "early stop since valid performance hasn't improved"  # fairseq_cli.train, --patience


def previous_run(run_dir: Path) -> dict[str, Any] | None:
    """A run directory's run.json, or None if it has none or an unreadable one (then the run starts over:
    unlike scoring, which needs a valid record, the launcher can always rebuild it)."""
    try:
        return read_run(run_dir, LaunchError)
    except LaunchError:
        return None


def write_run(run_dir: Path, record: dict[str, Any]) -> None:
    """Write run.json atomically (a failed write leaves the previous record whole), its paths relative to
    ``run_dir`` (:func:`~mtsa_fairseq.contracts.run_record_to_write`)."""
    write_json(Path(run_dir) / "run.json", run_record_to_write(run_dir, record))


def carried_seconds(previous: dict[str, Any] | None, log_path: Path) -> float:
    """The training time a run's earlier sessions took: run.json's ``wall_seconds``, plus, when the last session
    never recorded its end (status still ``running``: its launcher was killed outright, by SIGKILL or a machine
    stopping), that session's time from its ``started_at`` to the last write to its log ``log_path``."""
    previous = previous or {}
    seconds = float(previous.get("wall_seconds") or 0.0)
    started = previous.get("started_at")
    if previous.get("status") == "running" and isinstance(started, (int, float)):
        try:
            seconds += max(0.0, Path(log_path).stat().st_mtime - started)
        except OSError:  # no log: nothing ran that can be timed
            pass
    return round(seconds, 3)


def checkpoint_updates(path: Path) -> int | None:
    """Updates recorded in a fairseq checkpoint (None if it does not exist or cannot be read)."""
    from mtsa_fairseq.checkpoint_safety import load_checkpoint

    if not Path(path).is_file():
        return None
    try:
        state = load_checkpoint(path)
        return int(state["optimizer_history"][-1]["num_updates"])
    except Exception:  # a checkpoint being written, truncated or foreign: treated as absent
        return None


def mean_train_wps(log_text: str) -> float | None:
    """Mean of fairseq's ``wps`` (target tokens per second) over the logged training intervals."""
    values = [float(v) for v in _WPS.findall(log_text)]
    return sum(values) / len(values) if values else None


def resume_point(run_dir: Path, log: Callable[[str], None] = print) -> tuple[int, dict[str, Any]]:
    """The update a run resumes from. An unreadable ``checkpoint_last.pt`` (fairseq fills it by copying, so a full
    disk or a crash can truncate it, and fairseq then never resumes) is moved aside (:func:`move_aside`) and the
    newest readable interval or epoch checkpoint copied into its place; with none, the run starts over. Returns the
    update and what to add to run.json (``resumed_from``, ``unreadable_checkpoint``)."""
    run_dir = Path(run_dir)
    last = run_dir / "checkpoint_last.pt"
    if not last.exists():
        return 0, {}
    updates = checkpoint_updates(last)
    if updates is not None:
        return updates, {}
    aside = move_aside(last)
    readable = []
    for path in run_dir.iterdir():
        if UPDATE_CHECKPOINT.match(path.name) or EPOCH_CHECKPOINT.match(path.name):
            found = checkpoint_updates(path)
            if found is not None:
                readable.append((found, path.stat().st_mtime, path))
    notes: dict[str, Any] = {"unreadable_checkpoint": str(aside)}
    if not readable:
        log(f"{run_dir}: checkpoint_last.pt is unreadable (moved to {aside.name}) and no other checkpoint "
            "can be read: training starts over")
        return 0, {**notes, "resumed_from": None}
    updates, _, newest = max(readable)
    with atomic_path(last) as tmp:
        shutil.copyfile(newest, tmp)
    log(f"{run_dir}: checkpoint_last.pt is unreadable (moved to {aside.name}); resuming from {newest.name} "
        f"(update {updates})")
    return updates, {**notes, "resumed_from": newest.name}


def move_aside(path: Path, why: str = "unreadable") -> Path:
    """Rename ``path`` to ``<name>.<why>-<time>`` beside it (a checkpoint is never deleted); returns the new path."""
    aside = path.with_name(f"{path.name}.{why}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, aside)
    return aside


def best_repair(run_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Prepare an unreadable ``checkpoint_best.pt`` for training again from scratch (no later checkpoint can rebuild
    it; training repeats itself under its seed): it and ``checkpoint_last.pt`` (``.superseded-<time>``) are moved
    aside. Returns what to add to run.json (empty if the best checkpoint is readable or absent)."""
    best, last = Path(run_dir) / "checkpoint_best.pt", Path(run_dir) / "checkpoint_last.pt"
    if not best.exists() or checkpoint_updates(best) is not None:
        return {}
    aside = move_aside(best)
    if last.exists():
        move_aside(last, "superseded")
    log(f"checkpoint_best.pt is unreadable (moved to {aside.name}); training again from update 0 so that a best "
        "checkpoint exists")
    return {"unreadable_checkpoint": str(aside), "resumed_from": None}


def interval_snapshots(run_dir: Path, every: int) -> list[Path]:
    """The checkpoints of ``run_dir`` taken at multiples of ``every`` updates, oldest first, one per update: interval,
    epoch and last checkpoints alike (fairseq saves an interval that ends an epoch only as the epoch's and the last)."""
    found: dict[int, Path] = {}
    for path in sorted(Path(run_dir).glob("checkpoint*.pt"), key=lambda p: (p.name == "checkpoint_last.pt", p.name)):
        if not (UPDATE_CHECKPOINT.match(path.name) or EPOCH_CHECKPOINT.match(path.name)
                or path.name == "checkpoint_last.pt"):
            continue
        updates = checkpoint_updates(path)
        if updates and updates % every == 0:
            found.setdefault(updates, path)
    return [found[u] for u in sorted(found)]


def is_done(record: dict[str, Any] | None, max_update: int) -> bool:
    """Whether a run.json says the run finished ``max_update`` updates or was stopped early by fairseq's
    ``--patience``, which stops it there under any larger budget too (for a learning-rate schedule that does
    not depend on ``--max-update``, as in every config here)."""
    if not record or record.get("status") != "done":
        return False
    return (record.get("num_updates") or 0) >= max_update or bool(record.get("early_stopped"))


def close_session(run_dir: Path, status: str = "interrupted", peak_rss_mb: float | None = None,
                  **fields: Any) -> None:
    """End the session that run.json says is running: ``status`` (interrupted, requeued, failed) and ``fields``,
    its time added to ``wall_seconds``, its peak memory kept, Ctrl-C and SIGTERM held back until written. Best
    effort: it runs while an interruption or a failure propagates, which a full disk must not replace (the next
    launch reads the checkpoints, not the record)."""
    path = Path(run_dir) / "run.json"
    try:
        with interruptions_held():
            record = previous_run(run_dir)
            if record is None:
                return
            started = record.pop("started_at", None)
            if isinstance(started, (int, float)):
                record["wall_seconds"] = round((record.get("wall_seconds") or 0.0) + time.time() - started, 3)
            if peak_rss_mb is not None:
                record["peak_rss_mb"] = round(max(peak_rss_mb, record.get("peak_rss_mb") or 0.0), 1)
            write_run(run_dir, {**record, "status": status, **fields})
    except OSError as err:
        print(f"warning: could not record the interruption in {path}: {err.strerror or err}", file=sys.stderr)


def finish_session(run_dir: Path, returncode: int, peak_rss_mb: float | None = None,
                   log: Callable[[str], None] = print, output: str = "", trained: bool = True) -> dict[str, Any]:
    """Fill run.json after the session it says is running: updates, throughput, time (none without ``trained``:
    the checkpoint was found finished), averaging, status. A session whose ``output`` has fairseq's early stop
    (``--patience``) is done before ``max_update``."""
    record = previous_run(run_dir)
    if record is None:
        raise LaunchError(f"{run_dir} has no run.json")
    started = record.get("started_at")
    session_seconds = time.time() - started if trained and isinstance(started, (int, float)) else 0.0
    peak_rss_mb = None if peak_rss_mb is None else round(peak_rss_mb, 1)
    log_path = Path(run_dir) / "train.log"
    log_text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    updates = checkpoint_updates(Path(run_dir) / "checkpoint_last.pt")
    if updates is None:
        logged = _LOGGED_UPDATES.findall(log_text)
        updates = int(logged[-1]) if logged else None
    peaks = [p for p in (record.get("peak_rss_mb"), peak_rss_mb) if p is not None]
    record.update(
        returncode=returncode, num_updates=updates,
        wall_seconds=round(record.get("wall_seconds", 0.0) + session_seconds, 3),
        train_target_tokens_per_second=mean_train_wps(log_text), peak_rss_mb=max(peaks) if peaks else None,
    )
    record.pop("error", None)
    record.pop("started_at", None)
    record["early_stopped"] = returncode == 0 and FAIRSEQ_EARLY_STOP in output
    if returncode != 0:
        record.update(status="failed", error=f"fairseq-train exited with {returncode} (see {log_path})")
    elif (updates is None or updates < record["max_update"]) and not record["early_stopped"]:
        record.update(status="failed", error=f"training stopped at {updates} of {record['max_update']} updates")
    elif (loss := diverged_loss(log_text)) is not None:
        record.update(status="diverged", last_loss=loss, error=f"training diverged: its last training loss is {loss}")
    else:
        record["status"] = "done"
        average_last = record.get("average_last") or 0
        if average_last:
            paths = interval_snapshots(run_dir, record["save_interval_updates"])[-average_last:]
            try:
                if len(paths) < average_last:
                    raise AverageError(f"{run_dir} holds {len(paths)} checkpoints at multiples of "
                                       f"{record['save_interval_updates']} updates, fewer than {average_last}")
                save_checkpoint(average_checkpoints(paths), record["checkpoint"])
                record["averaged"] = [str(p) for p in paths]
                log(f"averaged {', '.join(p.name for p in paths)} -> {record['checkpoint']}")
            except (AverageError, OSError) as err:
                reason = err.strerror if isinstance(err, OSError) and err.strerror else err
                record.update(status="failed", error=f"averaging: {reason}")
    write_run(run_dir, record)
    return record


def diverged_loss(log_text: str) -> float | None:
    """The last training loss fairseq logged if the run diverged (the loss is not finite, or above
    :data:`DIVERGENCE_RATIO` times the first logged: a run that learns ends below where it started), else None."""
    losses = [float(v) for v in _TRAIN_LOSS.findall(log_text)]
    if not losses:
        return None
    last = losses[-1]
    return last if not math.isfinite(last) or last > DIVERGENCE_RATIO * losses[0] else None


def cpu_kernels() -> str:
    """The CPU kernels torch runs in this process and in the trainers it starts (``AVX512``, ``AVX2``,
    ``DEFAULT``, ...; the environment's ``ATEN_CPU_CAPABILITY`` can choose a lower set than the CPU's best). They
    fix a CPU run's rounding: the same command repeats a run bit for bit only under the same kernels."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def cpu_kernels_for_start(previous: dict[str, Any] | None, done: int, label: str,
                          log: Callable[[str], None] = print) -> list[str]:
    """``run.json``'s ``cpu_kernels`` for a CPU run's start after ``done`` updates: the kernels of the starts so
    recorded, one entry more each time they change. A change ``log``s one line naming the run (``label``)."""
    kernels, now = [*(previous or {}).get("cpu_kernels", [])] if done else [], cpu_kernels()
    if kernels[-1:] == [now]:
        return kernels
    if kernels:
        log(f"{label}: trained with torch's {kernels[-1]} CPU kernels so far, resumed with {now}: it will not repeat "
            f"an uninterrupted run bit for bit (ATEN_CPU_CAPABILITY={kernels[-1].lower()} selects {kernels[-1]})")
    return [*kernels, now]


@dataclass
class Session:
    """A training session :func:`session` has started: run.json as written at its start."""

    run_dir: Path
    record: dict[str, Any]
    log: Callable[[str], None]

    @property
    def resumed_from(self) -> int:
        """The update the session starts from (fairseq resumes from ``checkpoint_last.pt``)."""
        return self.record["resumed_from_updates"]

    def finish(self, returncode: int, peak_rss_mb: float | None = None, output: str = "",
               trained: bool = True) -> dict[str, Any]:
        """:func:`finish_session`: the finished record."""
        return finish_session(self.run_dir, returncode, peak_rss_mb, self.log, output, trained)


@contextlib.contextmanager
def session(run_dir: Path, base: dict[str, Any] | None, label: str, log: Callable[[str], None] = print,
            cpu: bool = False, log_name: str = "train.log", **fields: Any) -> Iterator[Session]:
    """Record a training session of ``run_dir`` as running for the block it guards: the update it resumes from
    (:func:`resume_point`), ``base`` (the launcher's record; None: run.json's, as a Slurm job finds it) with
    ``fields``, the earlier sessions' time and peak memory, and on CPU the kernels per start. ``label`` names the run
    in what it ``log``s. An exception leaving the block records the session interrupted and propagates; the block
    ends it with :meth:`Session.finish` or :func:`close_session`."""
    run_dir = Path(run_dir)
    done, repair = resume_point(run_dir, lambda line: log(f"{label}: {line}"))
    previous = previous_run(run_dir)
    if base is None and previous is None:
        raise LaunchError(f"{run_dir} has no run.json")
    record = {**(previous if base is None else base), **fields, **repair, "status": "running",
              "started_at": time.time(), "resumed_from_updates": done,
              "wall_seconds": carried_seconds(previous, run_dir / log_name),
              "peak_rss_mb": (previous or {}).get("peak_rss_mb")}
    if cpu:
        record["cpu_kernels"] = cpu_kernels_for_start(previous, done, label, log)
    write_run(run_dir, record)
    try:
        yield Session(run_dir, record, log)
    except BaseException:
        if (previous_run(run_dir) or {}).get("status") == "running":
            close_session(run_dir)
        raise
