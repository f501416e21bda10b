"""Helpers for the tests that kill launchers and look for their trainers (Linux: reads /proc)."""

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def processes_naming(path: Path, program: str = "fairseq-train") -> list[int]:
    """Live ``program`` processes whose command line names ``path`` (as one argument)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(a.endswith(program.encode()) for a in cmdline) and str(path).encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def trainers_on(run_dir: Path) -> list[int]:
    """Live fairseq-train processes whose command line names ``run_dir``."""
    return processes_naming(run_dir)


def children_of(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            found.append(int(proc.name))
    return found


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 600.0,
             state: Callable[[], str] | None = None) -> Any:
    """The first true value of ``condition()``, polled every 0.2 s for at most ``timeout`` seconds; a timeout
    names ``what`` and, if given, what ``state()`` then says."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f"; {state()}" if state else ""))


def trainer_list_is(run_dir: Path, pids: list[int]) -> bool:
    """Exactly one trainer, ``pids``, works on ``run_dir``."""
    return len(pids) == 1 and trainers_on(run_dir) == pids


def terminate_a_benchmark_once_it_wrote(command: list[str], output: Path) -> None:
    """Start a benchmark ``command``, stop it with SIGTERM once it has written ``output`` (after its first length),
    and check that it ended as a command that does not resume: status 143 and that one line."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: output.exists() or proc.poll() is not None, f"{output} or the end of the benchmark")
    assert output.exists(), "no output after the first length"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert err.strip().splitlines()[-1] == "interrupted: this command does not resume (rerunning it starts again)"
