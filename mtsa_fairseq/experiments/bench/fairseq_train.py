"""Training throughput and peak memory of ``fairseq-train`` itself, MTSA against the Transformer, side by side.

Writes a synthetic data-bin shaped like WMT14 En-De (a joined dictionary of ``--vocab`` symbols, sentence lengths
drawn as bench_transformer draws them), then trains every ``--archs`` system (an architecture, optionally with
fairseq-train options of its own: ``"transformer_mtsa_wmt_en_de --mtsa-kernel sdpa-joint"``) for ``--updates``
updates at each ``--max-tokens``, each run in a fresh process, the systems alternating (ABBA) over ``--repeats``.
Throughput: the median of fairseq's ``wps`` over the log intervals after ``--skip-updates``; peak memory: torch's
peak GPU allocation over the run; ratios: each system's over the first's, printed with every option of the runs.
``--profile START END`` also writes, beside each run's log, where the time of updates START to END went (host, GPU
kernels, launches and synchronisations, Python hot spots; docs/kernel.md).

  mtsa-bench-fairseq-train --device cuda --precision fp16 --max-tokens 4096 8192 --markdown bench.md
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mtsa_fairseq.experiments.bench.measure import processor_name, status_kb, synchronize
from mtsa_fairseq.experiments.fairseq_train import USER_DIR
from mtsa_fairseq.experiments.files import write_atomic, write_json
from mtsa_fairseq.experiments.tables import markdown_table

if TYPE_CHECKING:
    import torch

ARCHS = ("transformer_wmt_en_de", "transformer_mtsa_wmt_en_de")
# the Transformer paper's base recipe as fairseq's WMT14 example trains it (optimiser, schedule, criterion)
TRAIN_OPTIONS = (
    "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
    "--lr", "7e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000", "--warmup-init-lr", "1e-7",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1",
    "--no-save", "--disable-validation", "--log-format", "simple", "--num-workers", "0", "--seed", "1",
)
_INNER = re.compile(r"\bnum_updates=(\d+)\b.*?\bwps=([\d.]+)|\bwps=([\d.]+)\b.*?\bnum_updates=(\d+)\b")


def write_data_bin(out: Path, vocab: int, pairs: int, seed: int = 1) -> None:
    """A fairseq data-bin ``out`` with a ``train`` split of ``pairs`` random sentence pairs (src -> tgt)."""
    import torch
    from fairseq.data import Dictionary, indexed_dataset

    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    out.mkdir(parents=True, exist_ok=True)
    for lang in ("src", "tgt"):
        dictionary.save(str(out / f"dict.{lang}.txt"))
    generator = torch.Generator().manual_seed(seed)
    src_len = (torch.randn(pairs, generator=generator) * 12 + 27).round().clamp(4, 100)
    tgt_len = (src_len * (0.8 + 0.45 * torch.rand(pairs, generator=generator))).round().clamp(4, 100)
    for lang, lengths in (("src", src_len), ("tgt", tgt_len)):
        prefix = str(out / f"train.src-tgt.{lang}")
        builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=len(dictionary))
        for n in lengths.long().tolist():
            ids = torch.randint(dictionary.nspecial, len(dictionary), (n,), generator=generator)
            builder.add_item(torch.cat([ids, torch.tensor([dictionary.eos()])]).int())
        builder.finalize(prefix + ".idx")


def split_system(system: str) -> tuple[str, list[str]]:
    """``ARCH [options]`` as the architecture and its fairseq-train options; ValueError when it is not that."""
    words = shlex.split(system)
    if not words or words[0].startswith("-"):
        raise ValueError("a system starts with its architecture")
    return words[0], words[1:]


def fairseq_args(args: argparse.Namespace, data: Path, system: str, max_tokens: int) -> list[str]:
    """The fairseq-train command line of one run of ``system`` (``ARCH [options]``), without the program name."""
    arch, options = split_system(system)
    cmd = [str(data), "--task", "translation", "--source-lang", "src", "--target-lang", "tgt", "--arch", arch,
           *TRAIN_OPTIONS, "--max-tokens", str(max_tokens), "--max-update", str(args.updates),
           "--log-interval", str(args.log_interval), "--user-dir", USER_DIR, *options]
    if args.device == "cpu":
        cmd.append("--cpu")
    if args.precision != "fp32":
        cmd.append(f"--{args.precision}")
    return cmd


def throughput(log: str, skip_updates: int) -> float:
    """Median ``wps`` of the fairseq ``train_inner`` log lines past ``skip_updates`` updates."""
    values = []
    for match in (_INNER.search(line) for line in log.splitlines() if "train_inner" in line):
        if match:
            updates, wps = (match.group(1), match.group(2)) if match.group(1) else (match.group(4), match.group(3))
            if int(updates) > skip_updates:
                values.append(float(wps))
    if not values:
        raise RuntimeError(f"no training log line past update {skip_updates} (raise --updates)")
    return statistics.median(values)


def train_once(args: argparse.Namespace, script: Path, data: Path, system: str, max_tokens: int, run: int) -> dict:
    """One fairseq-train run by ``script --child`` in a fresh process: its throughput and peak memory (its log kept
    in ``--logs``)."""
    spec = {"argv": fairseq_args(args, data, system, max_tokens)}
    name = re.sub(r"[^\w.=+-]+", "_", system)  # the architecture alone stays as it is, options join it with _
    stem = f"{name}-{max_tokens}-run{run}"
    if not args.cudnn_attention:
        spec["cudnn_attention"] = False
    if args.profile is not None:
        spec["profile"] = args.profile
        spec["report"] = str(args.logs / f"{stem}.profile.txt")
    child = [sys.executable, str(script), "--child", json.dumps(spec)]
    proc = subprocess.run(child, capture_output=True, text=True)
    if args.logs is not None:
        write_atomic(args.logs / f"{stem}.log", proc.stdout + proc.stderr)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
        raise RuntimeError(f"{system} at --max-tokens {max_tokens} failed (exit status {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    # fairseq's log lines reach stderr or stdout depending on who set up logging first
    return {"tok_s": throughput(proc.stdout + proc.stderr, args.skip_updates),
            "peak_mb": json.loads(lines[-1])["peak_mb"]}


def profile_updates(first: int, last: int, report: Path, cuda: bool) -> None:
    """Profile fairseq's updates ``first`` to ``last`` (counted from 1) of this process and write ``report``."""
    import torch
    from fairseq.trainer import Trainer

    train_step = Trainer.train_step
    state = {"update": 0, "inside": 0.0}
    host = cProfile.Profile()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    kernels = torch.profiler.profile(activities=activities)
    device = "cuda" if cuda else "cpu"

    def profiled(self, *args, **kwargs):
        state["update"] += 1
        if state["update"] == first:
            synchronize(device)
            state["start"] = time.perf_counter()
            kernels.start()
            host.enable()
        entered = time.perf_counter()
        try:
            return train_step(self, *args, **kwargs)
        finally:
            if first <= state["update"] <= last:
                state["inside"] += time.perf_counter() - entered
            if state["update"] == last:
                host.disable()
                synchronize(device)
                kernels.stop()
                wall = time.perf_counter() - state["start"]
                write_atomic(report, profile_report(kernels, host, wall, state["inside"], last - first + 1))

    Trainer.train_step = profiled


def profile_report(kernels: torch.profiler.profile, host: cProfile.Profile, wall: float, inside: float,
                   updates: int) -> str:
    """A ``--profile`` report: per-update times and counts, then the torch.profiler and cProfile tables."""
    events = kernels.key_averages()
    # kernels only: fairseq's record_function ranges also appear on the GPU timeline, as user annotations
    device_us = sum(e.self_device_time_total for e in events
                    if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False))
    calls = {e.key: e.count for e in events}
    per = 1000.0 / updates
    lines = [
        f"updates profiled: {updates} (both profilers on: times are inflated by their overhead)",
        f"wall per update: {wall * per:.1f} ms, of which inside Trainer.train_step (host): {inside * per:.1f} ms",
        f"GPU kernel time per update: {device_us / 1000 / updates:.1f} ms",
        *(f"{name} per update: {calls.get(name, 0) / updates:.1f}" for name in (
            "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaStreamSynchronize",
            "cudaDeviceSynchronize", "cudaMemcpyAsync", "aten::item", "aten::_local_scalar_dense", "aten::nonzero")),
        "", "torch.profiler, by self CPU time:",
        events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60),
    ]
    if device_us:
        lines += ["torch.profiler, by CUDA time:",
                  events.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=60)]
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(host, stream=text).sort_stats(order).print_stats(35)
        lines += [f"cProfile of the host, by {order}:", without_import_roots(text.getvalue())]
    return "\n".join(lines) + "\n"


def without_import_roots(text: str) -> str:
    """``text`` with every source file named from the directory it is imported from (``sys.path``'s and the
    plugin's), e.g. ``mtsa_fairseq/modules/mtsa_core.py`` or ``fairseq/trainer.py``: no machine's path."""
    roots = {str(Path(USER_DIR).parent), *sys.path}
    for root in sorted((r for r in roots if os.path.isabs(r) and r.rstrip(os.sep)), key=len, reverse=True):
        text = text.replace(root.rstrip(os.sep) + os.sep, "")
    return text


def child(spec: dict) -> None:
    """fairseq-train in this process (``spec["argv"]``, optionally profiled), then the peak memory as one JSON
    line (GPU: torch's allocator peak over the run; CPU: the resident set's high-water mark)."""
    import torch
    from fairseq_cli.train import cli_main

    import mtsa_fairseq.plugin  # noqa: F401  (the package is imported already, so --user-dir registers nothing)

    argv = spec["argv"]
    sys.argv = ["fairseq-train", *argv]
    # fairseq's trainer resets the peak after every update (its gb_free); keep it for the whole run instead
    torch.cuda.reset_peak_memory_stats = lambda *args, **kwargs: None
    torch.backends.cuda.enable_cudnn_sdp(spec.get("cudnn_attention", True))
    if "profile" in spec:
        profile_updates(*spec["profile"], Path(spec["report"]), cuda="--cpu" not in argv)
    cli_main()
    if torch.cuda.is_available() and "--cpu" not in argv:
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = status_kb("VmHWM") / 1024
    print(json.dumps({"peak_mb": peak}), flush=True)
    sys.stderr.flush()
    # Leave without interpreter teardown. On an H200 machine, runs that stopped early in their second epoch, where
    # fairseq's data-buffer thread (a daemon) is still running, aborted in teardown after finishing ("terminate
    # called without an active exception"); a finished run's result must not depend on it.
    os._exit(0)


def runs_table(result: dict, names: dict[str, str] | None = None) -> list[str]:
    """Every run of a result, per batch size and system: tokens per second of each run, the median, and the median
    and peak memory as ratios to the first system's (``names``: a system's name in the table)."""
    systems, names = result["archs"], names or {}
    first = names.get(systems[0], systems[0])
    header = ["max tokens", "system", "tok/s, each run", "median", f"median / {first}", "peak MB", f"peak / {first}"]
    rows = ([f"{row['max_tokens']:,}", f"`{names.get(system, system)}`",
             ", ".join(f"{run['tok_s']:,.0f}" for run in row["runs"][system]), f"{row['tok_s'][system]:,.0f}",
             f"{row['tok_s'][system] / row['tok_s'][systems[0]]:.3f}", f"{row['peak_mb'][system]:,.0f}",
             f"{row['peak_mb'][system] / row['peak_mb'][systems[0]]:.3f}"]
            for row in result["rows"] for system in systems)
    return markdown_table(header, rows)


def markdown(result: dict) -> str:
    """The settings and :func:`runs_table`."""
    return f"{result['settings']}\n\n" + "\n".join(runs_table(result)) + "\n"


def run(args: argparse.Namespace, script: Path) -> None:
    """Every system at every ``--max-tokens`` by ``script --child``; the outputs written after every batch size."""
    import torch
    from fairseq import __version__ as fairseq_version

    device = processor_name(args.device)
    settings = (f"{device}, torch {torch.__version__}, fairseq {fairseq_version}: fairseq-train "
                f"{'in float32' if args.precision == 'fp32' else '--' + args.precision}, "
                f"{args.updates} updates per run (throughput over updates {args.skip_updates + 1}-{args.updates}), "
                f"{args.repeats} run(s) per cell, vocabulary {args.vocab}, "
                f"{'cuDNN attention as torch chooses' if args.cudnn_attention else 'cuDNN attention off'}, "
                f"options {' '.join(TRAIN_OPTIONS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data-bin"
        write_data_bin(data, args.vocab, args.pairs)
        for max_tokens in args.max_tokens:
            runs: dict[str, list[dict]] = {system: [] for system in args.archs}
            for r in range(args.repeats):
                for system in args.archs if r % 2 == 0 else args.archs[::-1]:
                    runs[system].append(train_once(args, script, data, system, max_tokens, r + 1))
                    print(f"[bench] {system} --max-tokens {max_tokens}: {runs[system][-1]}", flush=True)
            tok_s = {s: statistics.median(x["tok_s"] for x in runs[s]) for s in args.archs}
            peak = {s: statistics.median(x["peak_mb"] for x in runs[s]) for s in args.archs}
            first = args.archs[0]
            rows.append({"max_tokens": max_tokens, "tok_s": tok_s, "peak_mb": peak, "runs": runs,
                         "throughput_ratio": {s: tok_s[s] / tok_s[first] for s in args.archs[1:]},
                         "memory_ratio": {s: peak[s] / peak[first] for s in args.archs[1:]}})
            result = {"settings": settings, "archs": args.archs, "rows": rows}
            # after every row: a failure at a later batch size keeps the rows measured
            if args.markdown is not None:
                write_atomic(args.markdown, markdown(result))
            if args.json is not None:
                write_json(args.json, result)
    print(markdown(result))
