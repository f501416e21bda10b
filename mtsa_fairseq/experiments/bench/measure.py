"""What the benchmarks share: one measurement cell per fresh subprocess (:func:`run_isolated`, the child answering
through :func:`emit`), side-by-side timing in alternating order, peak memory of one step (CUDA's allocator statistics,
or on a Linux CPU the resident set's high-water mark, reset through ``/proc/self/clear_refs`` just before the step),
usage checks and Markdown tables. Importing it imports no torch."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

PROC_STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def check_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, skip: Iterable[str] = ()) -> None:
    """A usage error (exit 2) for any integer option, or integer in a list option, below 1, and any float not above 0
    or not finite (nan, inf), except in the options named in ``skip`` (``"dropouts"``)."""
    for name, value in vars(args).items():
        values = [] if name in skip else value if isinstance(value, list) else [value]
        if any(isinstance(v, int) and not isinstance(v, bool) and v < 1 for v in values):
            parser.error(f"--{name.replace('_', '-')} must be positive")
        if any(isinstance(v, float) and not 0 < v < math.inf for v in values):
            parser.error(f"--{name.replace('_', '-')} must be positive and finite")


def check_outputs(parser: argparse.ArgumentParser, *paths: Path | None, what: str = "output directory") -> None:
    """A usage error for the first of ``paths`` whose directory does not exist."""
    for path in paths:
        if path is not None and not path.parent.is_dir():
            parser.error(f"{what} {path.parent} does not exist")


def check_device(parser: argparse.ArgumentParser, device: str, memory: bool = False) -> None:
    """A usage error for a ``--device`` other than cpu or cuda[:N], for cuda without CUDA, and with ``memory``
    where peak memory cannot be measured."""
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        parser.error(f"--device must be cpu or cuda[:N], not {device!r}")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if parsed.type == "cuda" and (parsed.index or 0) >= torch.cuda.device_count():
        parser.error(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices")
    if memory and not can_measure(device):
        parser.error(f"cannot measure peak memory on {device} here (CPU needs Linux's /proc/self/clear_refs)")


def check_triton(parser: argparse.ArgumentParser, names: Iterable[str], device: str) -> None:
    """A usage error for ``mtsa-triton`` among ``names`` without CUDA and the triton package."""
    from mtsa_fairseq.modules.mtsa_core import triton_available

    if "mtsa-triton" in names and not (device.startswith("cuda") and triton_available()):
        parser.error("mtsa-triton needs --device cuda and the triton package (pip install mtsa-fairseq[triton])")


class CellFailed(RuntimeError):
    """A measurement cell's subprocess failed or printed no JSON result."""


def run_isolated(script: Path | str, args: list[str], cell: str) -> Any:
    """Run ``python script *args`` in a fresh process and return the JSON value (:func:`emit`) on its last line of
    stdout; :class:`CellFailed` names ``cell`` (``"mtsa at L=512"``) and the end of the child's stderr otherwise."""
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0:
        raise CellFailed(f"{cell} failed (exit status {proc.returncode}):\n{proc.stderr[-2000:]}")
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise CellFailed(f"{cell} printed no JSON result as its last line of output:\n"
                         f"{proc.stdout[-1000:]}{proc.stderr[-1000:]}") from None


def isolated(script: Path | str, args: list[str], cell: str) -> Any:
    """:func:`run_isolated`, the command exiting with the child's error when it fails."""
    try:
        return run_isolated(script, args, cell)
    except CellFailed as error:
        sys.exit(f"error: {error}")


def emit(result: Any) -> None:
    """Print ``result`` as one JSON line: a child's answer to :func:`run_isolated`."""
    print(json.dumps(result), flush=True)


def status_kb(field: str, path: Path = PROC_STATUS) -> int:
    """A field of ``/proc/self/status`` (or of ``path``) in kB, e.g. ``VmHWM``, the resident set's high-water mark."""
    return int(re.search(rf"^{field}:\s+(\d+)", path.read_text(), re.MULTILINE).group(1))


def memory_available_gib() -> float:
    """``MemAvailable`` of Linux's ``/proc/meminfo`` in GiB (0 where it cannot be read)."""
    try:
        return status_kb("MemAvailable", Path("/proc/meminfo")) / 2**20
    except (OSError, AttributeError):
        return 0.0


def can_measure(device: str) -> bool:
    """Whether :func:`peak_growth_mb` works here (CUDA, or a CPU with ``/proc/self/status`` and a writable
    ``/proc/self/clear_refs``)."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available()
    return PROC_STATUS.exists() and os.access(CLEAR_REFS, os.W_OK)


def peak_growth_mb(step: Callable[[], None], device: str) -> float:
    """How far peak memory rises above its level before ``step()`` while it runs, in MiB. Run it in a
    fresh process per measurement: on CPU the allocator keeps freed memory, so earlier steps blur it."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    CLEAR_REFS.write_text("5")  # the high-water mark restarts at the current RSS
    before = status_kb("VmRSS")
    step()
    return (status_kb("VmHWM") - before) / 1024


def warm_up_length(length: int, device: str) -> int:
    """The length of the pass before a measurement (initialisation, compilation): on CUDA the measured length itself,
    so that Triton's autotuning (beside a 256 MB cache-flushing buffer) stays out of the peak; 16 elsewhere."""
    return length if device.startswith("cuda") else 16


def limit_address_space_growth(gib: float) -> None:
    """Let this process's address space grow by at most ``gib`` GiB from now on (Linux ``RLIMIT_AS``), so
    that a step needing more fails with an allocation error instead of waking the kernel's OOM killer."""
    import resource

    limit = status_kb("VmSize") * 1024 + int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def synchronize(device: str) -> None:
    """Wait for queued CUDA work, so that wall-clock time covers it (no-op on CPU)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_rounds(steps: dict[str, Callable[[int], None]], rounds: int, device: str,
                 warmup: bool = True) -> dict[str, list[float]]:
    """Seconds of ``steps[name](r)`` for rounds ``r = 1 .. rounds`` after a warm-up round 0 (unless ``warmup=False``),
    the steps taking turns within each round: the same machine load. The order is drawn anew every round (seeded),
    never one step twice in a row, so that each step follows every other about equally often: a step that follows
    itself finds its memory still cached, and one that always follows the same other step pays for that step's."""
    names = list(steps)
    draw = random.Random(0)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    last = None
    for r in range(0 if warmup else 1, rounds + 1):
        turn = draw.sample(names, len(names))
        if turn[0] == last:
            turn.append(turn.pop(0))
        last = turn[-1]
        for name in turn:
            synchronize(device)
            start = time.perf_counter()
            steps[name](r)
            synchronize(device)
            if r > 0:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def median_ms(seconds: dict[str, list[float]]) -> dict[str, float]:
    """The median of each name's seconds, in milliseconds."""
    return {name: 1000 * statistics.median(values) for name, values in seconds.items()}


def processor_name(device: str) -> str:
    """The GPU model, or the CPU model as Linux's /proc/cpuinfo names it (elsewhere the architecture)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            models = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    except OSError:
        models = []
    return models[0] if models else f"{platform.processor() or platform.machine()} CPU"


def device_name(device: str) -> str:
    """The GPU model, or the CPU model and torch's thread count."""
    import torch

    name, threads = processor_name(device), torch.get_num_threads()
    return name if device.startswith("cuda") else f"{name}, {threads} thread{'s' * (threads != 1)}"


def progress(done: int, total: int, start: float) -> str:
    """``[bench 3/7, 2m10s]``: how many of a benchmark's lengths are measured, and since when (``start`` from
    ``time.monotonic()``); longer sequences take longer, so no ETA is guessed."""
    seconds = int(time.monotonic() - start)
    return f"[bench {done}/{total}, {seconds // 60}m{seconds % 60:02d}s]"


