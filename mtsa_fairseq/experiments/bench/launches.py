"""What one training step of a layer asks of the host: the aten operators it dispatches (counted below autograd,
views and allocations left out), the host synchronisations among them, the Python calls it makes, and on CUDA the
kernel launches and synchronisations torch.profiler records (docs/benchmark-launches.md, Method). :func:`measure`
counts and times the layers of ``mtsa-bench-launches`` side by side, :func:`table` renders them, :func:`run` is the
command."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import scipy.stats
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from mtsa_fairseq.experiments.bench.measure import device_name, emit, isolated, median_ms, timed_rounds
from mtsa_fairseq.experiments.files import write_atomic, write_json
from mtsa_fairseq.experiments.tables import markdown_table

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

    def __torch_dispatch__(self, func: Any, types: tuple, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        if name in SYNCHRONISING:
            self.syncs[name] += 1
        elif not func.is_view and name not in VIEWS_AND_ALLOCATIONS:
            self.operators[name] += 1
        return func(*args, **(kwargs or {}))


# the frames PythonCalls leaves out: this module's (the harness's step closures and counters)
HARNESS = frozenset({__name__})


class PythonCalls:
    """Within ``with PythonCalls() as calls:``, ``calls.functions`` counts the Python functions called on this thread
    by qualified name, and ``calls.into_c`` the calls from Python into C functions and methods (every torch function
    or tensor method called from Python is one), both outside ``HARNESS``. Autograd's own threads (the CUDA
    backward's) are not seen."""

    def __init__(self) -> None:
        self.functions: Counter[str] = Counter()
        self.into_c = 0

    def __enter__(self) -> PythonCalls:
        self._previous = sys.getprofile()
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._previous)

    def _event(self, frame, event: str, arg: object) -> None:
        module = frame.f_globals.get("__name__")
        name = f"{module}.{frame.f_code.co_qualname}"
        if module in HARNESS or name in HARNESS:
            return
        if event == "call":
            self.functions[name] += 1
        elif event == "c_call":
            self.into_c += 1


Context = Callable[[], AbstractContextManager]


def _phases(counter: type, forward: Callable[[], Tensor], context: Context) -> dict[str, Any]:
    """``counter()``'s counts of ``forward()`` (run within ``context()``, which the counter does not see) and of the
    backward from ones, as ``{"forward": c, "backward": c}``."""
    with context(), counter() as forward_count:
        out = forward()
    grad = torch.ones_like(out)
    with counter() as backward_count:
        out.backward(grad)
    return {"forward": forward_count, "backward": backward_count}


def count_step(forward: Callable[[], Tensor], python_calls: bool = False,
               context: Context = contextlib.nullcontext) -> dict[str, dict[str, Any]]:
    """The operators and synchronisations of ``forward()`` (within ``context()``, entered and left outside the
    counts) and of the backward from ones (no loss adds operators):
    ``{"forward": {"operators": n, "syncs": n, "by_name": {...}, "syncs_by_name": {...}}, "backward": {...}}``;
    ``python_calls``: also ``"python_calls"``, ``"calls_into_c"`` and ``"python_by_name"``, counted in a second
    step, so that neither counter counts the other."""
    phases = {phase: {"operators": sum(c.operators.values()), "syncs": sum(c.syncs.values()),
                      "by_name": dict(sorted(c.operators.items())), "syncs_by_name": dict(sorted(c.syncs.items()))}
              for phase, c in _phases(OperatorCount, forward, context).items()}
    if python_calls:
        for phase, c in _phases(PythonCalls, forward, context).items():
            phases[phase] |= {"python_calls": sum(c.functions.values()), "calls_into_c": c.into_c,
                              "python_by_name": dict(sorted(c.functions.items()))}
    return phases


def profile_cuda_step(step: Callable[[], None]) -> dict[str, int]:
    """Kernel launches and host synchronisations of one ``step()`` on CUDA, as torch.profiler records them."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()  # the host's calls are recorded as they are made: no synchronisation of the profiler's own
    calls = Counter(event.name for event in prof.events())
    return {"launches": sum(calls[name] for name in CUDA_LAUNCHES),
            "syncs": sum(calls[name] for name in CUDA_SYNCHRONISATIONS)}


def kernel_of(name: str) -> str:
    """mtsa_core's kernel of a method name: ``mtsa`` is ``auto``, ``mtsa-<kernel>`` that kernel."""
    return name.removeprefix("mtsa-") if name != "mtsa" else "auto"


def build_layer(name: str, dropout: float, s2t_activation: str, args: argparse.Namespace) -> torch.nn.Module:
    """fairseq's encoder layer (``transformer``) or :class:`MTSAEncoderLayer` (``mtsa``, ``mtsa-<kernel>``) of width
    ``args.dim`` (FFN 4x), ``args.heads`` heads, dropout 0.1 and attention dropout ``dropout``, in training mode."""
    from fairseq.models.transformer import TransformerConfig
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    from mtsa_fairseq.models.transformer_mtsa import MTSAEncoderLayer

    cfg = TransformerConfig(dropout=0.1, attention_dropout=dropout)
    cfg.encoder.embed_dim, cfg.encoder.ffn_embed_dim, cfg.encoder.attention_heads = args.dim, 4 * args.dim, args.heads
    cfg.mtsa_kernel, cfg.mtsa_s2t_activation = kernel_of(name), s2t_activation
    torch.manual_seed(0)
    layer = TransformerEncoderLayerBase(cfg) if name == "transformer" else MTSAEncoderLayer(cfg)
    return layer.to(device=args.device, dtype=getattr(torch, args.dtype)).train()


def build_model(name: str, dropout: float, s2t_activation: str, args: argparse.Namespace) -> torch.nn.Module:
    """``transformer_wmt_en_de`` or ``transformer_mtsa_wmt_en_de`` at ``build_layer``'s sizes, ``args.layers_per_stack``
    encoder and decoder layers, a joined dictionary of 100 words, in training mode."""
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    import mtsa_fairseq.plugin  # noqa: F401  (registers the architectures)

    arch = "transformer_wmt_en_de" if name == "transformer" else "transformer_mtsa_wmt_en_de"
    sizes = {f"{side}_{key}": value for side in ("encoder", "decoder") for key, value in (
        ("embed_dim", args.dim), ("ffn_embed_dim", 4 * args.dim), ("attention_heads", args.heads),
        ("layers", args.layers_per_stack))}
    ns = argparse.Namespace(**sizes, attention_dropout=dropout, share_all_embeddings=True,
                            mtsa_kernel=kernel_of(name), mtsa_s2t_activation=s2t_activation)
    ARCH_CONFIG_REGISTRY[arch](ns)
    words = Dictionary()
    for i in range(100):
        words.add_symbol(f"w{i}")
    torch.manual_seed(0)
    task = argparse.Namespace(source_dictionary=words, target_dictionary=words)
    model = ARCH_MODEL_REGISTRY[arch].build_model(ns, task)
    return model.to(device=args.device, dtype=getattr(torch, args.dtype)).train()


def _step_input(level: str, padding: str, args: argparse.Namespace) -> tuple[Any, ...]:
    """A layer's ``(x [L, B, dim] requiring its gradient, key padding mask or None)``, or a model's ``(source tokens,
    their lengths, previous target tokens)``: one left-padded sequence (fairseq pads sources on the left), or none."""
    generator = torch.Generator().manual_seed(1)
    pad = torch.zeros(args.batch, args.length, dtype=torch.bool)
    if padding == "padded":
        pad[-1, : max(1, args.length // 4)] = True
    if level == "layer":
        x = torch.randn(args.length, args.batch, args.dim, generator=generator)
        x = x.to(args.device, getattr(torch, args.dtype))
        return x.requires_grad_(), pad.to(args.device) if padding == "padded" else None
    tokens = torch.randint(4, 100, (args.batch, args.length), generator=generator).masked_fill(pad, 1)
    lengths = (~pad).sum(dim=1)
    return tokens.to(args.device), lengths.to(args.device), tokens.roll(1, dims=1).to(args.device)


def _forward(level: str, module: torch.nn.Module, inputs: tuple[Any, ...]) -> tuple[Callable[[], Tensor], Context]:
    """A layer called as fairseq's encoder calls its second and later layers, or the whole model's forward to its
    logits; and the context to call it in: for a layer its encoder's shared pass, whose key mask an earlier layer
    built (an encoder enters it once per pass: the counts leave it out), for a model none."""
    if level == "model":
        return (lambda: module(*inputs)[0]), contextlib.nullcontext
    from mtsa_fairseq.modules.mtsa_attention import shared_pass
    from mtsa_fairseq.modules.mtsa_core import SharedPass

    x, pad = inputs
    shared = SharedPass(every_row_has_key=True)
    if pad is not None:
        shared.key_bias(pad, x.dtype)

    def forward() -> Tensor:
        shared.dens.clear()
        return module(x, encoder_padding_mask=pad)
    return forward, lambda: shared_pass(shared)


def measure(args: argparse.Namespace) -> list[dict]:
    """One row per (level, layer, source2token form, dropout, padding): operator and synchronisation counts of a
    training step, on CUDA the profiler's, and the median time of ``args.rounds`` steps taken in turns."""
    cuda = args.device.startswith("cuda")
    rows, steps = [], {}
    cells = [(level, name, s2t) for level in args.levels for name in args.layers
             for s2t in (["-"] if name == "transformer" else args.s2t_activations)]
    for (level, name, s2t), dropout in itertools.product(cells, args.dropouts):
        if name == "mtsa-sdpa-joint" and dropout:  # the joint call has no attention dropout: no such cell
            continue
        module = (build_layer if level == "layer" else build_model)(name, dropout, s2t, args)
        for padding in args.paddings:
            inputs = _step_input(level, padding, args)
            forward, context = _forward(level, module, inputs)

            def step(_round: int = 0, forward=forward, context=context, inputs=inputs, module=module):
                inputs[0].grad = None
                module.zero_grad(set_to_none=True)
                with context():
                    out = forward()
                out.backward(torch.ones_like(out))

            step()  # warm-up: lazy initialisation, kernel compilation and autotuning stay out of the counts
            step()  # the optimiser leaves no gradient to add to, as below
            inputs[0].grad = None
            module.zero_grad(set_to_none=True)
            row = {"level": level, "layer": name, "s2t_activation": s2t, "dropout": dropout, "padding": padding,
                   **count_step(forward, python_calls=True, context=context)}
            if cuda:
                row["cuda"] = profile_cuda_step(step)
            rows.append(row)
            steps[_cell(row)] = step
    ms = median_ms(timed_rounds(steps, args.rounds, args.device))
    for row in rows:
        row["ms"] = ms[_cell(row)]
    return rows


def _cell(row: dict) -> str:
    return f"{row['level']} {row['layer']} {row['s2t_activation']}, dropout {row['dropout']}, {row['padding']}"


def table(rows: list[dict], cuda: bool) -> list[str]:
    """The Markdown table of ``rows`` as lines, operators and time also as ratios to the first layer's at the same
    level, dropout and padding (over several processes: their median time, the mean ratio and its 95% interval);
    Python calls are the Python functions called, forward and backward."""
    header = ["level", "layer", "source2token", "attention dropout", "padding", "operators, forward", "backward",
              "total", "operators / " + rows[0]["layer"], "host syncs", "Python calls"]
    header += ["CUDA launches", "CUDA syncs"] if cuda else []
    header += ["ms per step", f"time / {rows[0]['layer']}"]
    first = {(row["level"], row["dropout"], row["padding"]): row for row in rows if row["layer"] == rows[0]["layer"]}
    lines = []
    for row in rows:
        forward, backward = row["forward"]["operators"], row["backward"]["operators"]
        ref = first[row["level"], row["dropout"], row["padding"]]
        cells = [row["level"], row["layer"], row["s2t_activation"], str(row["dropout"]), row["padding"], str(forward),
                 str(backward), str(forward + backward),
                 f"{(forward + backward) / (ref['forward']['operators'] + ref['backward']['operators']):.3f}",
                 str(row["forward"]["syncs"] + row["backward"]["syncs"]),
                 str(row["forward"]["python_calls"] + row["backward"]["python_calls"])]
        cells += [str(row["cuda"]["launches"]), str(row["cuda"]["syncs"])] if cuda else []
        cells += [f"{row['ms']:.2f}", _time_ratio(row, ref)]
        lines.append(cells)
    return markdown_table(header, lines)


def launches_table(report: dict, names: dict[str, str] | None = None) -> list[str]:
    """:func:`table` of a ``--json`` report, as lines (``mtsa-docs-tables`` kind ``launches``; ``names`` unused)."""
    return table(report["rows"], report["settings"]["device"].startswith("cuda"))


def _times_elsewhere(args: argparse.Namespace, script: Path, argv: list[str], rows: list[dict]) -> None:
    """Time the rows again in ``args.processes - 1`` fresh processes (``script`` with this process's ``argv`` and
    ``--times-only``), one after another: each row's ``ms_per_process`` (this process's first), its ``ms`` their
    median. Each process counts before it times, as this one did, so that all time under the same conditions."""
    times = [_times(rows)]
    for process in range(2, args.processes + 1):
        times.append(isolated(script, [*argv, "--times-only"], f"process {process}"))
        if times[-1].keys() != times[0].keys():
            raise RuntimeError(f"process {process} timed other rows than the first: {sorted(times[-1])}")
        print(f"[process {process}/{args.processes}] timed", flush=True)
    for row in rows:
        row["ms_per_process"] = [per_process[_cell(row)] for per_process in times]
        row["ms"] = statistics.median(row["ms_per_process"])


def _times(rows: list[dict]) -> dict[str, float]:
    """Each row's time in ms by its cell (what ``--times-only`` prints)."""
    return {_cell(row): row["ms"] for row in rows}


def _time_ratio(row: dict, ref: dict) -> str:
    """``row``'s time over ``ref``'s; over several processes the mean of the processes' ratios, its 95% interval."""
    if "ms_per_process" not in row:
        return f"{row['ms'] / ref['ms']:.3f}"
    ratios = [a / b for a, b in zip(row["ms_per_process"], ref["ms_per_process"])]
    mean = statistics.fmean(ratios)
    half = scipy.stats.t.ppf(0.975, len(ratios) - 1) * scipy.stats.sem(ratios)
    return f"{mean:.3f} ({mean - half:.3f}-{mean + half:.3f})"


def run(args: argparse.Namespace, script: Path, argv: list[str]) -> None:
    """``mtsa-bench-launches`` with ``args`` parsed from ``argv``: measure (``--processes``: time in more processes
    through ``script``), write ``--json`` and ``--markdown``, print the table with its settings; ``--times-only``:
    print the times as JSON and write nothing."""
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = measure(args)
    if args.times_only:
        emit(_times(rows))
        return
    if args.processes > 1:
        _times_elsewhere(args, script, argv, rows)
    settings = {name: value for name, value in vars(args).items()
                if name not in ("layers", "json", "markdown", "times_only")}
    processes = f" in each of {args.processes} processes" if args.processes > 1 else ""
    meta = (f"torch {torch.__version__}, {device_name(args.device)}, {args.dtype}, batch {args.batch}, length "
            f"{args.length}, d_model {args.dim}, {args.heads} heads, models of {args.layers_per_stack} + "
            f"{args.layers_per_stack} layers, training step (forward + backward), time the median of {args.rounds} "
            f"steps taken in turns{processes}")
    text = "\n".join(table(rows, args.device.startswith("cuda")))
    if args.json:
        write_json(args.json, {"torch": torch.__version__, "device": device_name(args.device), "settings": settings,
                               "rows": rows})
    if args.markdown:
        write_atomic(args.markdown, f"{meta}\n\n{text}\n")
    print(meta, text, sep="\n\n")
