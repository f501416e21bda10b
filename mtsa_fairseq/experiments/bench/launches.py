"""What one training step of a layer asks of the host: the aten operators it dispatches to the device, forward and
backward, and the host synchronisations among them; on CUDA also the kernel launches and synchronisations that
torch.profiler records.

Operators are counted below autograd (a ``TorchDispatchMode``), so backward operators are seen as the forward's are
and the count does not depend on the device's speed. An operator counts when it runs a kernel: views and
allocations (``VIEWS_AND_ALLOCATIONS``) do not. A host synchronisation is an operator whose result the host reads
(``SYNCHRONISING``: ``bool(t)``, ``t.item()``, ``t.nonzero()``), counted as that and not as an operator. Which
kernels an operator runs is the backend's choice: on CUDA an operator is one launch or a few; on the CPU
``scaled_dot_product_attention`` without dropout is one fused operator, with dropout its math fallback of several."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

# besides views (``is_view``), the operators that only alias or allocate memory: no kernel runs (fills do run one)
VIEWS_AND_ALLOCATIONS = frozenset({
    "_unsafe_view", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set_",
})
# operators whose result the host reads (``bool(t)`` and ``t.item()`` arrive as ``_local_scalar_dense``)
SYNCHRONISING = frozenset({"_local_scalar_dense", "nonzero", "equal"})
# what torch.profiler records for a kernel launch and for the host waiting for the device
CUDA_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
CUDA_SYNCHRONISATIONS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


class OperatorCount(TorchDispatchMode):
    """Within ``with OperatorCount() as count:``, ``count.operators`` counts the operators that run a kernel by
    name, and ``count.syncs`` the host synchronisations by name."""

    def __init__(self) -> None:
        super().__init__()
        self.operators: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNCHRONISING:
            self.syncs[name] += 1
        elif not func.is_view and name not in VIEWS_AND_ALLOCATIONS:
            self.operators[name] += 1
        return func(*args, **(kwargs or {}))


def count_step(forward: Callable[[], Tensor]) -> dict[str, dict[str, Any]]:
    """The operators and synchronisations of ``forward()`` and of the backward of its output (seeded with ones
    made beforehand, so that no loss adds operators): ``{"forward": {"operators": n, "syncs": n, "by_name":
    {...}, "syncs_by_name": {...}}, "backward": {...}}``."""
    phases = {}
    with OperatorCount() as count:
        out = forward()
    phases["forward"] = count
    grad = torch.ones_like(out)
    with OperatorCount() as count:
        out.backward(grad)
    phases["backward"] = count
    return {phase: {"operators": sum(c.operators.values()), "syncs": sum(c.syncs.values()),
                    "by_name": dict(sorted(c.operators.items())), "syncs_by_name": dict(sorted(c.syncs.items()))}
            for phase, c in phases.items()}


def profile_cuda_step(step: Callable[[], None]) -> dict[str, int]:
    """Kernel launches and host synchronisations of one ``step()`` on CUDA, as torch.profiler records them."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()  # the host's calls are recorded as they are made: no synchronisation of the profiler's own
    calls = Counter(event.name for event in prof.events())
    return {"launches": sum(calls[name] for name in CUDA_LAUNCHES),
            "syncs": sum(calls[name] for name in CUDA_SYNCHRONISATIONS)}
