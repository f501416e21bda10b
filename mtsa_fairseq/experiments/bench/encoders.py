"""Time and peak memory of one forward+backward pass of each sentence encoder vs sequence length, as in the MTSA paper's
Figure 1 / DiSAN's Table 1 (docs/benchmark-encoders.md): batch 64, 300 channels, training mode, each
``sentence_encoder`` architecture as ``fairseq-train --arch`` builds it (without embedding and classifier), pooled. Per
length, peak memory is measured first, one pass in a fresh process per encoder whose address space may grow by at most
``--memory-limit-gb``; an encoder that runs out of memory (OOM) or took longer than ``--max-seconds`` is not run at
longer lengths. Time: median of ``--repeats`` passes, the encoders taking turns, after a warm-up round. The JSON is
rewritten after every length; ``--from-json`` merges the JSON of several runs into one table and plot without measuring.
"""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mtsa_fairseq.experiments.bench import measure
from mtsa_fairseq.experiments.files import write_json
from mtsa_fairseq.experiments.plotting import pyplot, save_figure
from mtsa_fairseq.experiments.tables import markdown_table

if TYPE_CHECKING:
    from torch import nn

ARCHS = ("mtsa_encoder", "fast_disa_encoder", "stacked_mtsa_encoder", "disan_encoder", "disan_undirected_encoder",
            "bilstm_encoder", "multi_cnn_encoder", "hrchy_cnn_encoder", "multi_head_encoder")
OOM = "OOM"
RECORD_KEYS = ("settings", "encoders", "rows")


class RecordError(ValueError):
    """A ``--from-json`` file that is not an mtsa-bench-encoders ``--json`` record."""


def build(arch: str, dim: int) -> nn.Module:
    """The encoder of ``--arch arch`` with ``--embed-dim dim`` and no dropout: ``[B, L, dim] -> [B, out]``."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from mtsa_fairseq.models.sentence_encoder import build_encoder

    args = argparse.Namespace(embed_dim=dim)
    ARCH_CONFIG_REGISTRY[arch](args)
    return build_encoder(args)


def _pass(model, x) -> None:
    model.zero_grad(set_to_none=True)
    model(x, None).sum().backward()


def _inputs(batch: int, length: int, dim: int, device: str):
    import torch

    return torch.randn(batch, length, dim, device=device, generator=torch.Generator(device).manual_seed(length))


def memory_mb(name: str, length: int, args: argparse.Namespace) -> float | str:
    """Peak memory growth of one pass (MiB), or ``"OOM"`` when the allocation fails."""
    import torch

    model = build(name, args.dim).to(args.device).train()
    _pass(model, _inputs(args.batch, 8, args.dim, args.device))  # library initialisation
    x = _inputs(args.batch, length, args.dim, args.device)
    if args.device == "cpu" and args.memory_limit_gb:
        measure.limit_address_space_growth(args.memory_limit_gb)
    try:
        return measure.peak_growth_mb(lambda: _pass(model, x), args.device)
    except (torch.OutOfMemoryError, MemoryError):
        return OOM
    except RuntimeError as error:  # the CPU allocator under RLIMIT_AS
        if "can't allocate memory" in str(error) or "not enough memory" in str(error):
            return OOM
        raise


def times_ms(models: dict, length: int, args: argparse.Namespace, warmup: bool) -> dict[str, float]:
    """Median forward+backward time per encoder, the encoders taking turns pass by pass."""
    x = _inputs(args.batch, length, args.dim, args.device)
    steps = {name: lambda _, model=model: _pass(model, x) for name, model in models.items()}
    return measure.median_ms(measure.timed_rounds(steps, args.repeats, args.device, warmup=warmup))


def markdown(result: dict) -> str:
    """The settings, then a table of times and one of peak memory (OOM, or — where not run)."""
    names, lines = result["encoders"], [result["settings"]]
    for key, unit, spec in (("ms", "ms", ".1f"), ("mb", "MB", ".0f")):
        header = ["L"] + [f"{n.removesuffix('_encoder')} {unit}" for n in names]
        rows = ([str(r["L"])] + [_cell(r[key].get(n), spec, r["mb"].get(n)) for n in names] for r in result["rows"])
        lines += ["", *markdown_table(header, rows)]
    return "\n".join(lines)


def _cell(value: float | str | None, spec: str, memory: float | str | None = None) -> str:
    if value is None:
        return OOM if memory == OOM else "—"
    return value if isinstance(value, str) else format(value, spec)


def plot(result: dict, path: Path) -> None:
    """Time and peak memory against length, log-log, one line per encoder."""
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.6))
    for name in result["encoders"]:
        for ax, key in zip(axes, ("ms", "mb")):
            points = [(r["L"], r[key][name]) for r in result["rows"] if isinstance(r[key].get(name), float)]
            if points:
                ax.plot(*zip(*points), "o-", label=name.removesuffix("_encoder"), markersize=4)
    for ax, title in zip(axes, ["forward+backward time (ms)", "peak memory growth (MB)"]):
        ax.set(xscale="log", yscale="log", xlabel="sequence length L", title=title)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, loc="upper left")
    fig.suptitle(textwrap.fill(result["settings"], 160), fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def read_record(path: Path) -> dict:
    """A ``--json`` record of this benchmark; anything else raises :class:`RecordError` naming ``path``."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RecordError(f"{path} is not valid JSON: {error}") from None
    if not (isinstance(record, dict) and all(key in record for key in RECORD_KEYS)
            and isinstance(record["rows"], list)
            and all(isinstance(row, dict) and {"L", "ms", "mb"} <= row.keys() for row in record["rows"])):
        raise RecordError(f"{path} is not an mtsa-bench-encoders --json record (an object of "
                          f"{', '.join(RECORD_KEYS)}, each row with L, ms and mb)")
    return record


def merge(paths: list[Path]) -> dict:
    """One result from several ``--json`` files: rows by length (a later file's row replaces an earlier
    one's), encoders in order of appearance, the settings of each file."""
    results = [read_record(path) for path in paths]
    rows = {row["L"]: row for result in results for row in result["rows"]}
    return {
        "settings": "; ".join(dict.fromkeys(f"L = {', '.join(str(r['L']) for r in result['rows'])}: "
                                             f"{result['settings']}" for result in results)),
        "encoders": list(dict.fromkeys(name for result in results for name in result["encoders"])),
        "rows": [rows[length] for length in sorted(rows)],
        "stopped": {name: why for result in results for name, why in result.get("stopped", {}).items()},
        "merged_from": [str(path) for path in paths],
    }


def run(args: argparse.Namespace, script: Path) -> None:
    """Per length each encoder's memory by ``script --memory-of``, then the times; ``--json`` per length."""
    import torch

    torch.manual_seed(0)
    models = {name: build(name, args.dim).to(args.device).train() for name in args.archs}
    limit = f", memory growth limit {args.memory_limit_gb} GiB" if args.memory_limit_gb and args.device == "cpu" else ""
    result = {
        "settings": f"{measure.device_name(args.device)}, torch {torch.__version__}; batch {args.batch}, "
                    f"{args.dim} channels, forward+backward, median of {args.repeats}{limit}",
        "encoders": list(args.archs), "rows": [], "stopped": {},
    }
    options = ["--batch", str(args.batch), "--dim", str(args.dim), "--device", args.device]
    if args.memory_limit_gb:
        options += ["--memory-limit-gb", str(args.memory_limit_gb)]
    start = time.monotonic()
    for i, length in enumerate(args.lengths):
        mb = {name: measure.isolated(script, ["--memory-of", f"{name}:{length}", *options],
                                     f"memory of {name} at L={length}") for name in models}
        for name in [n for n in models if mb[n] == OOM]:
            del models[name]  # and so not run at longer lengths either
            result["stopped"][name] = f"out of memory at L = {length}"
        ms = times_ms(models, length, args, warmup=i == 0) if models else {}
        for name in [n for n in models if args.max_seconds and ms[n] > 1000 * args.max_seconds]:
            del models[name]
            result["stopped"][name] = f"a pass took {ms[name] / 1000:.0f} s > {args.max_seconds:g} s at L = {length}"
        result["rows"].append({"L": length, "ms": ms, "mb": mb})
        print(f"{measure.progress(i + 1, len(args.lengths), start)} L={length:5d} " + "  ".join(
            f"{n.removesuffix('_encoder')} " + (OOM if mb[n] == OOM else f"{ms[n]:.0f} ms {mb[n]:.0f} MB")
            for n in mb), flush=True)
        if args.json:
            write_json(args.json, result, indent=2)
    report(result, args.plot)


def report(result: dict, plot_path: Path | None) -> None:
    """Print the tables and why encoders stopped; plot to ``plot_path``."""
    print(markdown(result))
    for name, why in result["stopped"].items():
        print(f"{name}: not run at longer lengths ({why})")
    if plot_path:
        plot(result, plot_path)
