"""Child processes that never outlive their launcher, and one writer per output.

:class:`RunLock` is an exclusive lock that a launcher takes and its child processes inherit.

``fcntl.flock`` locks belong to the open file, so a child started with the lock's descriptor in
``pass_fds`` holds the lock too: it stays held until the launcher *and* every child that inherited it have
exited, whatever killed them (``kill -9`` included), and the kernel drops it when they are gone, so a lock
left by a dead process never needs cleaning up. The lock file records who holds it, for the error message.

Children are also tied to the launcher's life: :func:`child_options` starts them in a process group of
their own (so the launcher can stop a trainer's whole tree with ``os.killpg``) and, on Linux, asks the kernel
to send them SIGTERM when the launcher dies (``kill -9`` included); :func:`terminate_on_sigterm` turns a
plain ``kill`` of the launcher into an exception, so that the handlers that stop children run, as Ctrl-C's
KeyboardInterrupt does.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_LIVE: set[subprocess.Popen] = set()  # children of run_logged still running, for stop_children


class LockBusy(RuntimeError):
    """Another live process holds the lock; the message names it."""


class RunLock:
    """An exclusive, non-blocking lock on ``path`` (created if missing; its parent must exist)."""

    def __init__(self, path: str | Path, what: str):
        self.path, self.what = Path(path), what
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise LockBusy(f"{self.what} is in use by {holder}; wait for it to finish or stop it, then rerun") from None
        self.fd = fd
        self.record_holders(launcher=os.getpid())
        return self

    def record_holders(self, **pids: int) -> None:
        """Write who holds the lock (e.g. ``launcher=PID, trainer=PID``) into the lock file."""
        assert self.fd is not None, "lock not held"
        text = ", ".join(f"{name} pid {pid}" for name, pid in pids.items()) + "\n"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # other holders (children) keep the lock until they exit
            self.fd = None

    def __enter__(self) -> RunLock:
        return self if self.fd is not None else self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def child_options(lock: RunLock | None = None) -> dict[str, Any]:
    """``subprocess.Popen`` keywords for a child that must not outlive its launcher and that holds ``lock``:
    a process group of its own, SIGTERM when the launcher dies (Linux), the lock's descriptor inherited."""
    options: dict[str, Any] = {"start_new_session": True}
    if _LIBC is not None:
        options["preexec_fn"] = _die_with_parent
    if lock is not None and lock.fd is not None:
        options["pass_fds"] = (lock.fd,)
    return options


class Terminated(BaseException):
    """Raised in the main thread when the process receives SIGTERM (see :func:`terminate_on_sigterm`)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(f"terminated by signal {signum}")


def terminate_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Terminated` in the main thread (Python's default exits without cleanup)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def run_logged(command: list[str], log_path: Path, env: Mapping[str, str] | None = None, lock: RunLock | None = None,
               echo: bool = True) -> tuple[int, float, str]:
    """Run ``command`` holding ``lock``, appending its output to ``log_path`` (and to stdout if ``echo``).

    Any exception here (Ctrl-C, :class:`Terminated`) stops the child's whole process group (SIGTERM, then
    SIGKILL after 30 s) before it propagates. Returns the exit status, the peak resident set in MB of the
    largest process of the child's tree (``ru_maxrss``) and the output of this session."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            errors="replace", env={**os.environ, **(env or {})}, **child_options(lock))
    if lock is not None:
        lock.record_holders(launcher=os.getpid(), trainer=proc.pid)
    _LIVE.add(proc)
    lines = []
    try:
        with open(log_path, "a", encoding="utf-8") as log:
            assert proc.stdout is not None
            for line in proc.stdout:
                if echo:
                    sys.stdout.write(line)
                log.write(line)
                log.flush()
                lines.append(line)
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        stop_group(proc)
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
