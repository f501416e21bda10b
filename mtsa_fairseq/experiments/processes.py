"""Child processes that never outlive their launcher, and one writer per output (docs/experiment.md, One writer per
output): :class:`RunLock` is an exclusive ``flock`` lock that a launcher takes and its child processes inherit;
:func:`child_options` ties children to the launcher's life and :func:`terminate_on_sigterm` turns a ``kill`` of the
launcher into an exception."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mtsa_fairseq.experiments.errors import LaunchError

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_LIVE: set[subprocess.Popen] = set()  # children of run_logged still running, for stop_children


class LockBusy(RuntimeError):
    """Another live process holds the lock; the message names it."""


class RunLock:
    """An exclusive, non-blocking lock on ``path`` (created if missing; its parent must exist) on behalf of
    ``what`` (named in the busy message), held by a process in the given ``role``."""

    def __init__(self, path: str | Path, what: str, role: str = "launcher"):
        self.path, self.what, self.role = Path(path), what, role
        self.fd: int | None = None

    def acquire(self, error: type[Exception] = LockBusy) -> RunLock:
        """Take the lock; a live holder raises ``error`` with one line naming it."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise error(f"{self.what} is in use by {holder}; wait for it to finish or stop it, then rerun") \
                    from None
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # a releasing holder removed the file after we opened it: lock the new one
        self.fd = fd
        self.record_holders(**{self.role: os.getpid()})
        return self

    def record_holders(self, **pids: int) -> None:
        """Write who holds the lock (e.g. ``launcher=PID, trainer=PID``) into the lock file."""
        assert self.fd is not None, "lock not held"
        text = ", ".join(f"{name} pid {pid}" for name, pid in pids.items()) + "\n"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode(), 0)

    def release(self) -> None:
        """Remove the lock file and drop the lock (called once the children that inherited it have exited)."""
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunLock:
        return self if self.fd is not None else self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _prepare_child(ignored: tuple[int, ...]) -> None:  # runs in the child between fork and exec
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    for signum in ignored:  # an ignored signal stays ignored across exec
        signal.signal(signum, signal.SIG_IGN)


def child_options(lock: RunLock | None = None, ignored: tuple[int, ...] = ()) -> dict[str, Any]:
    """``subprocess.Popen`` keywords for a child that must not outlive its launcher and that holds ``lock``:
    a process group of its own, SIGTERM when the launcher dies (Linux), the lock's descriptor inherited, and
    the ``ignored`` signals ignored (signals meant for the launcher that also reach its children)."""
    options: dict[str, Any] = {"start_new_session": True}
    if _LIBC is not None or ignored:
        options["preexec_fn"] = functools.partial(_prepare_child, tuple(ignored))
    if lock is not None and lock.fd is not None:
        options["pass_fds"] = (lock.fd,)
    return options


class Terminated(BaseException):
    """Raised in the main thread when the process receives SIGTERM (see :func:`terminate_on_sigterm`)."""

    exit_code = 128 + signal.SIGTERM


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(f"terminated by signal {signum}")


def terminate_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` in the main thread (Python's default exits without cleanup)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


@contextlib.contextmanager
def interruptions_held(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Hold ``signums`` back for the block (in the main thread), so that a record written on the way out of an
    interruption is whole when a second one arrives meanwhile (Ctrl-C twice); a held signal is delivered when the
    block ends, to the handler that was in place."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: held.append(signum)) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])


def find_executable(name: str) -> str:
    """``name`` next to this interpreter (its virtual environment), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise LaunchError(f"{name} not found (next to {sys.executable} or on PATH)")
    return found


def run_command(main: Callable[[], None], resumes: bool = True, errors: tuple[type[Exception], ...] = ()) -> None:
    """Run a command's ``main``: SIGTERM and Ctrl-C stop its children and end it with one line (saying whether a
    rerun ``resumes`` or starts again) and the shell's status for the signal (143, 130), not a traceback; an
    environment failure (full disk, vanished directory, permissions), a :class:`LockBusy` output or one of the
    command's ``errors`` (bad input) is one line and status 1."""
    terminate_on_sigterm()
    try:
        main()
    except errors as err:
        sys.exit(f"error: {err}")
    except LockBusy as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except (KeyboardInterrupt, Terminated) as err:
        code = err.exit_code if isinstance(err, Terminated) else 128 + signal.SIGINT
        print("interrupted: rerun the same command to resume" if resumes
              else "interrupted: this command does not resume (rerunning it starts again)", file=sys.stderr)
        sys.exit(code)
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        print(f"error: {err.strerror or err}{where}", file=sys.stderr)
        sys.exit(1)


def run_logged(command: list[str], log_path: Path | None, env: Mapping[str, str] | None = None,
               lock: RunLock | None = None, echo: bool = True,
               on_line: Callable[[str], None] | None = None,
               ignored: tuple[int, ...] = ()) -> tuple[int, float, str]:
    """Run ``command`` holding ``lock``, appending its output to ``log_path`` (if given) and to stdout (if
    ``echo``) and passing each line to ``on_line``; the child ignores the ``ignored`` signals and, a Python child,
    writes unbuffered (unless ``env`` says otherwise). Any exception here (Ctrl-C, :class:`Terminated`) stops the
    child's process group and logs the rest of its output before it propagates. Returns the exit status, the peak
    resident set in MB of the largest process of the child's tree (``ru_maxrss``) and the session's output."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            errors="replace", env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                            **child_options(lock, ignored))
    if lock is not None:
        lock.record_holders(launcher=os.getpid(), trainer=proc.pid)
    _LIVE.add(proc)
    lines: list[str] = []
    assert proc.stdout is not None
    with open(log_path or os.devnull, "a", encoding="utf-8") as log:

        def keep(line: str) -> None:
            if echo:  # line by line, also when stdout is a pipe
                sys.stdout.write(line)
                sys.stdout.flush()
            log.write(line)
            log.flush()
            lines.append(line)

        try:
            for line in proc.stdout:
                keep(line)
                if on_line is not None:
                    on_line(line)
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            stop_group(proc)
            for line in proc.stdout:
                keep(line)
            raise
        finally:
            _LIVE.discard(proc)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024, "".join(lines)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group of ``proc`` (started by :func:`child_options`), SIGKILL it after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def stop_children() -> None:
    """Stop every child of :func:`run_logged` still running (from the main thread, when an interruption must
    also end the children that worker threads wait for)."""
    for proc in list(_LIVE):
        stop_group(proc)


def say(line: str, stream: Any = None) -> None:
    """Write ``line`` and its newline to ``stream`` (default: stdout) in one call and flush: threads that share the
    stream print whole lines (``print`` writes the text and its end apart)."""
    stream = stream or sys.stdout
    stream.write(f"{line}\n")
    stream.flush()


def to_stderr(line: str) -> None:
    """:func:`say` ``line`` on stderr (progress lines, beside a child's output on stdout)."""
    say(line, sys.stderr)


PROGRESS_PREFIX = "[progress] "
_METER = "{n_fmt}/{total_fmt} updates ({percentage:.0f}%), {elapsed} elapsed, ETA {remaining}"
_NUM_UPDATES = re.compile(r"num_updates[= ](\d+)")


class UpdateProgress:
    """Reads fairseq-train's output lines and reports, at most every ``every`` seconds and once when the budget is
    reached, ``[progress] LABEL: 150/300 updates (50%), 01:02 elapsed, ETA 01:02`` (tqdm's meter, one line a report;
    the rate is this session's, so a resumed run's ETA leaves out the updates it started with)."""

    def __init__(self, label: str, total: int, done: int = 0, every: float = 30.0,
                 write: Callable[[str], None] = print):
        self.label, self.total, self.first, self.done, self.every, self.write = label, total, done, done, every, write
        self.start = time.monotonic()
        self.last_report: float | None = None
        self.reported_end = False

    def __call__(self, line: str) -> None:
        found = _NUM_UPDATES.findall(line)
        if not found:
            return
        self.done = int(found[-1])
        now = time.monotonic()
        end = self.done >= self.total and not self.reported_end
        if self.last_report is None or now - self.last_report >= self.every or end:
            self.last_report = now
            self.reported_end |= self.done >= self.total
            self.write(self.line(now))

    def line(self, now: float) -> str:
        meter = tqdm.format_meter(self.done, self.total, now - self.start, initial=self.first, bar_format=_METER)
        return f"{PROGRESS_PREFIX}{self.label}: {meter}"
