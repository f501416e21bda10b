"""Peak memory of one step, for the benchmark scripts: CUDA's allocator statistics, or on a Linux CPU
the resident set's high-water mark, reset through ``/proc/self/clear_refs`` just before the step."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import torch

PROC_STATUS = Path("/proc/self/status")


def _status_kb(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", PROC_STATUS.read_text()).group(1))


def can_measure(device: str) -> bool:
    """Whether :func:`peak_growth_mb` works here (CUDA, or a CPU with ``/proc/self/status``)."""
    return torch.cuda.is_available() if device.startswith("cuda") else PROC_STATUS.exists()


def peak_growth_mb(step: Callable[[], None], device: str) -> float:
    """How far peak memory rises above its level before ``step()`` while it runs, in MiB. Run it in a
    fresh process per measurement: on CPU the allocator keeps freed memory, so earlier steps blur it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts at the current RSS
    before = _status_kb("VmRSS")
    step()
    return (_status_kb("VmHWM") - before) / 1024
