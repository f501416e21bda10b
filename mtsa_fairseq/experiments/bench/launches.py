"""What one training step of a layer asks of the host: the aten operators it dispatches to the device, forward and
backward, and the host synchronisations among them; on CUDA also the kernel launches and synchronisations that
torch.profiler records.

Operators are counted below autograd (a ``TorchDispatchMode``), so backward operators are seen as the forward's are
and the count does not depend on the device's speed. An operator counts when it runs a kernel: views and
allocations (``VIEWS_AND_ALLOCATIONS``) do not. A host synchronisation is an operator whose result the host reads
(``SYNCHRONISING``: ``bool(t)``, ``t.item()``, ``t.nonzero()``), counted as that and not as an operator. Which
kernels an operator runs is the backend's choice: on CUDA an operator is one launch or a few; on the CPU
``scaled_dot_product_attention`` without dropout is one fused operator, with dropout its math fallback of several.
:func:`measure` counts and times the attention layers of ``mtsa-bench-launches`` side by side, :func:`table`
renders them, :func:`run` is the command's measurement and output."""

from __future__ import annotations

import argparse
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from mtsa_fairseq.experiments.bench.measure import device_name, markdown_table, median_ms, timed_rounds
from mtsa_fairseq.experiments.files import write_atomic, write_json

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


PADDINGS = ("padded", "unpadded")


def build_layer(name: str, dropout: float, args: argparse.Namespace):
    """The attention module ``name`` with attention dropout ``dropout`` on ``args.device`` in ``args.dtype``, in
    training mode."""
    from fairseq.modules import MultiheadAttention

    from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention

    torch.manual_seed(0)
    if name == "transformer":
        module = MultiheadAttention(args.dim, args.heads, dropout=dropout, self_attention=True)
    else:
        kernel = name.removeprefix("mtsa-") if name != "mtsa" else "auto"
        module = MTSAMultiheadAttention(args.dim, args.heads, dropout=dropout, kernel=kernel)
    return module.to(device=args.device, dtype=getattr(torch, args.dtype)).train()


def layer_input(padding: str, args: argparse.Namespace):
    """``x [L, B, dim]`` (requiring its gradient) and the key padding mask (None without padding)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(args.length, args.batch, args.dim, generator=generator).to(args.device, getattr(torch, args.dtype))
    if padding == "unpadded":
        return x.requires_grad_(), None
    pad = torch.zeros(args.batch, args.length, dtype=torch.bool)
    pad[-1, : max(1, args.length // 4)] = True  # left-padded, as fairseq batches sources
    return x.requires_grad_(), pad.to(args.device)


def measure(args: argparse.Namespace) -> list[dict]:
    """One row per (layer, dropout, padding): operator and synchronisation counts of a step, on CUDA the
    profiler's, and the median time of ``args.rounds`` steps taken in turns."""
    cuda = args.device.startswith("cuda")
    rows, steps = [], {}
    for name, dropout in itertools.product(args.layers, args.dropouts):
        module = build_layer(name, dropout, args)
        for padding in PADDINGS:
            x, pad = layer_input(padding, args)

            def forward(module=module, x=x, pad=pad):
                return module(x, x, x, key_padding_mask=pad, need_weights=False)[0]

            def step(_round: int = 0, forward=forward, x=x, module=module):
                x.grad = None
                module.zero_grad(set_to_none=True)
                out = forward()
                out.backward(torch.ones_like(out))

            step()  # warm-up: lazy initialisation, kernel compilation and autotuning stay out of the counts
            x.grad = None
            module.zero_grad(set_to_none=True)  # as fairseq's optimiser leaves them: no gradient to add to
            row = {"layer": name, "dropout": dropout, "padding": padding, **count_step(forward)}
            if cuda:
                row["cuda"] = profile_cuda_step(step)
            rows.append(row)
            steps[_cell(row)] = step
    ms = median_ms(timed_rounds(steps, args.rounds, args.device))
    for row in rows:
        row["ms"] = ms[_cell(row)]
    return rows


def _cell(row: dict) -> str:
    return f"{row['layer']}, dropout {row['dropout']}, {row['padding']}"


def table(rows: list[dict], cuda: bool) -> str:
    """The Markdown table of ``rows``, time as a ratio to the first layer's at the same dropout and padding."""
    header = ["layer", "attention dropout", "padding", "operators, forward", "backward", "total", "host syncs"]
    header += ["CUDA launches", "CUDA syncs"] if cuda else []
    header += ["ms per step", f"time / {rows[0]['layer']}"]
    first = {(row["dropout"], row["padding"]): row for row in rows if row["layer"] == rows[0]["layer"]}
    lines = []
    for row in rows:
        forward, backward = row["forward"]["operators"], row["backward"]["operators"]
        cells = [row["layer"], str(row["dropout"]), row["padding"], str(forward), str(backward),
                 str(forward + backward), str(row["forward"]["syncs"] + row["backward"]["syncs"])]
        cells += [str(row["cuda"]["launches"]), str(row["cuda"]["syncs"])] if cuda else []
        cells += [f"{row['ms']:.2f}", f"{row['ms'] / first[row['dropout'], row['padding']]['ms']:.3f}"]
        lines.append(cells)
    return markdown_table(header, lines)


def run(args: argparse.Namespace) -> None:
    """``mtsa-bench-launches``: measure, write ``--json`` and ``--markdown``, print the table with its settings."""
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = measure(args)
    settings = {name: getattr(args, name) for name in ("batch", "length", "dim", "heads", "dropouts", "rounds",
                                                      "threads", "device", "dtype")}
    meta = (f"torch {torch.__version__}, {device_name(args.device)}, {args.dtype}, batch {args.batch}, length "
            f"{args.length}, d_model {args.dim}, {args.heads} heads, training step (forward + backward), time the "
            f"median of {args.rounds} steps taken in turns")
    text = table(rows, args.device.startswith("cuda"))
    if args.json:
        write_json(args.json, {"torch": torch.__version__, "device": device_name(args.device), "settings": settings,
                               "rows": rows})
    if args.markdown:
        write_atomic(args.markdown, f"{meta}\n\n{text}\n")
    print(meta, text, sep="\n\n")
