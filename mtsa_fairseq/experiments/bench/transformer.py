"""``transformer_mtsa_wmt_en_de`` vs ``transformer_wmt_en_de``, measured side by side in one run
(docs/benchmark-transformer.md):

1. Encoder: one forward+backward pass of the 6-layer encoder (training mode) on ``--batch`` sentences of length L
   without padding; time: median of ``--repeats`` passes after a warm-up, the models alternating pass by pass;
   peak memory: one fresh subprocess per (model, L).
2. Training throughput: full models, label-smoothed cross-entropy and an Adam step (as fairseq's ``--amp`` in
   float16/bfloat16) on the same synthetic batches of ``--train-max-tokens``, alternating; target tokens per second.

With ``--profile N``, torch.profiler's host (CPU) self time per aten operator over N more encoder passes per
model, per length: where the time difference goes.

Writes ``--markdown``, ``--json`` and ``--plot`` after every length and again with the training row.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mtsa_fairseq.experiments.bench import measure
from mtsa_fairseq.experiments.files import write_atomic, write_json
from mtsa_fairseq.experiments.plotting import pyplot, save_figure
from mtsa_fairseq.experiments.tables import markdown_table

if TYPE_CHECKING:
    from fairseq.criterions import FairseqCriterion
    from fairseq.models import FairseqEncoderDecoderModel

MODELS = {"transformer": "transformer_wmt_en_de", "mtsa": "transformer_mtsa_wmt_en_de"}
LONGEST_SENTENCE = 100  # training sentences' lengths are drawn in [4, 100]


def build_model(arch: str, vocab: int, device: str, dtype: str,
                kernel: str = "auto") -> tuple[FairseqEncoderDecoderModel, FairseqCriterion]:
    """The model of ``arch`` (its MTSA layers on ``kernel``) and its criterion, built through fairseq's own parser,
    arch defaults and translation task over a synthetic joined dictionary of ``vocab`` entries."""
    import torch
    from fairseq import options, tasks

    import mtsa_fairseq.plugin  # the package is imported already, so --user-dir registers nothing

    with tempfile.TemporaryDirectory() as data:
        for lang in ("en", "de"):
            Path(data, f"dict.{lang}.txt").write_text("".join(f"tok{i} 1\n" for i in range(vocab - 4)))
        argv = [data, "--user-dir", str(Path(mtsa_fairseq.__file__).parent), "--arch", arch, "-s", "en", "-t", "de",
                "--task", "translation", "--share-all-embeddings", "--criterion", "label_smoothed_cross_entropy",
                "--label-smoothing", "0.1", *(["--mtsa-kernel", kernel] if "mtsa" in arch else [])]
        args = options.parse_args_and_arch(options.get_training_parser(), argv)
        task = tasks.setup_task(args)
        model = task.build_model(args)
        criterion = task.build_criterion(args)
    return model.to(device=device, dtype=getattr(torch, dtype)).train(), criterion


def _encoder_pass(model, tokens, lengths) -> None:
    model.zero_grad(set_to_none=True)
    out = model.encoder(tokens, src_lengths=lengths)["encoder_out"][0]
    out.float().sum().backward()


def _source_batch(batch: int, length: int, vocab: int, device: str, seed: int):
    import torch

    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab, (batch, length), generator=generator)
    tokens[:, -1] = 2  # eos
    return tokens.to(device), torch.full((batch,), length, device=device)


def peak_memory_mb(name: str, length: int, args: argparse.Namespace) -> float:
    """Growth of peak memory during one encoder forward+backward pass (run in a fresh process)."""
    model, _ = build_model(MODELS[name], args.vocab, args.device, args.dtype, args.kernel)
    warm_up = measure.warm_up_length(length, args.device)
    _encoder_pass(model, *_source_batch(args.batch, warm_up, args.vocab, args.device, 0))
    tokens, lengths = _source_batch(args.batch, length, args.vocab, args.device, 1)
    model.zero_grad(set_to_none=True)
    return measure.peak_growth_mb(lambda: _encoder_pass(model, tokens, lengths), args.device)


def encoder_times_ms(models: dict, length: int, args: argparse.Namespace) -> dict[str, float]:
    """Median forward+backward time per model, the models taking turns pass by pass."""
    tokens, lengths = _source_batch(args.batch, length, args.vocab, args.device, 1)
    steps = {name: lambda _, model=model: _encoder_pass(model, tokens, lengths) for name, (model, _) in models.items()}
    return measure.median_ms(measure.timed_rounds(steps, args.repeats, args.device))


def operator_times_ms(models: dict, length: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Per model the host self time of each aten operator in one encoder pass (milliseconds, the mean of
    ``args.profile`` profiled passes, the models alternating pass by pass)."""
    from torch.profiler import ProfilerActivity, profile

    tokens, lengths = _source_batch(args.batch, length, args.vocab, args.device, 1)
    times: dict[str, dict[str, float]] = {name: {} for name in models}
    for _ in range(args.profile):
        for name, (model, _) in models.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                _encoder_pass(model, tokens, lengths)
                measure.synchronize(args.device)
            for event in prof.key_averages():
                if event.key.startswith("aten::") and event.self_cpu_time_total > 0:
                    spent = times[name].get(event.key, 0.0)
                    times[name][event.key] = spent + event.self_cpu_time_total / args.profile / 1000
    return times


def profile_table(row: dict, top: int = 10) -> str:
    """The ``top`` operators of ``row["profile"]`` whose time MTSA adds most, and the totals."""
    times = row["profile"]
    names = sorted(set(times["transformer"]) | set(times["mtsa"]),
                   key=lambda op: times["transformer"].get(op, 0.0) - times["mtsa"].get(op, 0.0))
    cells = [[op, *(f"{times[m].get(op, 0.0):.2f}" for m in MODELS),
              f"{times['mtsa'].get(op, 0.0) - times['transformer'].get(op, 0.0):+.2f}"] for op in names[:top]]
    totals = [sum(times[m].values()) for m in MODELS]
    cells.append(["all operators", *(f"{t:.2f}" for t in totals), f"{totals[1] - totals[0]:+.2f}"])
    header = [f"L = {row['L']}: host self time per pass", "transformer ms", "mtsa ms", "mtsa - transformer"]
    return "\n".join(markdown_table(header, cells))


def training_batches(args: argparse.Namespace) -> list[dict]:
    """``--train-steps + 1`` batches of about ``--train-max-tokens`` target tokens each, sentence lengths
    drawn from a clipped normal (mean 27, sd 12, in [4, LONGEST_SENTENCE]: roughly WMT14 En-De in 32k pieces)."""
    import torch

    generator = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(args.train_steps + 1):
        lengths = (torch.randn(4096, generator=generator) * 12 + 27).round().clamp(4, LONGEST_SENTENCE).long().tolist()
        n, longest = 0, 0
        while n < len(lengths) and max(longest, lengths[n]) * (n + 1) <= args.train_max_tokens:
            longest = max(longest, lengths[n])
            n += 1
        src = torch.randint(4, args.vocab, (n, longest), generator=generator)
        tgt = torch.randint(4, args.vocab, (n, longest), generator=generator)
        src[:, -1] = tgt[:, -1] = 2
        prev = torch.cat([torch.full((n, 1), 2), tgt[:, :-1]], 1)
        net_input = {"src_tokens": src, "src_lengths": torch.full((n,), longest), "prev_output_tokens": prev}
        batches.append({"net_input": {key: value.to(args.device) for key, value in net_input.items()},
                        "target": tgt.to(args.device), "ntokens": n * longest, "nsentences": n})
    return batches


def training_throughput(models: dict, args: argparse.Namespace) -> dict[str, float]:
    """Target tokens per second of full training steps (loss, backward, Adam), models alternating; with ``--dtype
    float16/bfloat16`` as fairseq's ``--amp`` trains (float32 weights, autocast, float16 gradients scaled)."""
    import torch

    batches = training_batches(args)
    device_type = torch.device(args.device).type
    for model, _ in models.values():
        model.float()  # the master weights; autocast casts them per operation
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=1e-4, betas=(0.9, 0.997), eps=1e-9)
                  for name, (m, _) in models.items()}
    scalers = {name: torch.amp.GradScaler(device_type, enabled=args.dtype == "float16") for name in models}

    def train_step(name: str, batch: dict) -> None:
        model, criterion = models[name]
        optimizers[name].zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=getattr(torch, args.dtype), enabled=args.dtype != "float32"):
            loss, _, _ = criterion(model, batch)
        scalers[name].scale(loss).backward()
        scalers[name].step(optimizers[name])
        scalers[name].update()

    if args.device.startswith("cuda"):  # Triton's autotuning, once per length bucket, stays out of the timed steps
        for name in models:
            for batch in batches[1:]:
                train_step(name, batch)
    steps = {name: lambda r, name=name: train_step(name, batches[r]) for name in models}
    seconds = measure.timed_rounds(steps, len(batches) - 1, args.device)  # the first batch is the warm-up
    tokens = sum(batch["ntokens"] for batch in batches[1:])
    return {name: tokens / sum(seconds[name]) for name in models}


def markdown(result: dict) -> str:
    """The settings, the encoder table and the training row."""
    header = ["L", "transformer ms", "mtsa ms", "time ratio", "transformer MB", "mtsa MB", "memory ratio"]
    rows = ([str(r["L"]), f"{r['ms']['transformer']:.1f}", f"{r['ms']['mtsa']:.1f}", f"{r['time_ratio']:.3f}",
             f"{r['mb']['transformer']:.1f}", f"{r['mb']['mtsa']:.1f}", f"{r['memory_ratio']:.3f}"]
            for r in result["encoder"])
    text = "\n".join(markdown_table(header, rows))
    text += "".join(f"\n\n{profile_table(r)}" for r in result["encoder"] if "profile" in r)
    train = result["training"]
    if train is None:
        return f"{result['settings']}\n\n{text}\n\nTraining throughput: not measured yet.\n"
    header = ["training", "transformer tok/s", "mtsa tok/s", "throughput ratio (mtsa / transformer)"]
    cells = [f"{train['steps']} steps of ~{train['max_tokens']} target tokens", f"{train['tok_s']['transformer']:.1f}",
             f"{train['tok_s']['mtsa']:.1f}", f"{train['ratio']:.3f}"]
    return "\n\n".join([result["settings"], text, "\n".join(markdown_table(header, [cells]))]) + "\n"


def plot(result: dict, path: Path) -> None:
    """Encoder time, peak memory and their ratios against length, with the targets."""
    lengths = [r["L"] for r in result["encoder"]]
    fig, axes = pyplot().subplots(1, 3, figsize=(15, 4.2))
    for name, style in (("transformer", "o-"), ("mtsa", "s-")):
        axes[0].plot(lengths, [r["ms"][name] for r in result["encoder"]], style, label=name)
        axes[1].plot(lengths, [r["mb"][name] for r in result["encoder"]], style, label=name)
    axes[2].plot(lengths, [r["time_ratio"] for r in result["encoder"]], "o-", label="time ratio")
    axes[2].plot(lengths, [r["memory_ratio"] for r in result["encoder"]], "s-", label="peak-memory ratio")
    axes[2].axhline(1.10, color="grey", ls=":", label="time target at L=128 (1.10)")
    axes[2].axhline(1.25, color="grey", ls="--", label="time bound up to L=1024 (1.25)")
    axes[2].axhline(1.30, color="black", ls="-.", lw=0.8, label="memory target at L=2048 (1.30)")
    titles = ["encoder fwd+bwd time (ms)", "encoder fwd+bwd peak memory (MB)", "mtsa / transformer"]
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="sequence length L", title=title)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    fig.suptitle(result["settings"], fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def run(args: argparse.Namespace, script: Path) -> None:
    """Per length the encoders' times, then their memory by ``script --memory-of``; then the training throughput."""
    import torch

    def write(result: dict) -> str:
        table = markdown(result)
        if args.markdown:
            write_atomic(args.markdown, table)
        if args.json:
            write_json(args.json, result, indent=2)
        if args.plot:
            plot(result, args.plot)
        return table

    torch.manual_seed(0)
    models = {name: build_model(arch, args.vocab, args.device, args.dtype, args.kernel)
              for name, arch in MODELS.items()}
    settings = (f"{measure.device_name(args.device)}, torch {torch.__version__}, {args.dtype}; encoder batch "
                f"{args.batch}, median of {args.repeats}; vocab {args.vocab}; mtsa_core kernel {args.kernel}")
    encoder: list[dict] = []
    result = {"settings": settings, "encoder": encoder, "training": None}
    options = ["--batch", str(args.batch), "--vocab", str(args.vocab), "--device", args.device, "--dtype", args.dtype,
               "--kernel", args.kernel] + (["--threads", str(args.threads)] if args.threads else [])
    start = time.monotonic()
    for done, length in enumerate(args.lengths, 1):
        ms = encoder_times_ms(models, length, args)
        mb = {name: measure.isolated(script, ["--memory-of", f"{name}:{length}", *options],
                             f"memory measurement of {name} at L={length}") for name in MODELS}
        row = {"L": length, "ms": ms, "mb": mb, "time_ratio": ms["mtsa"] / ms["transformer"],
               "memory_ratio": mb["mtsa"] / mb["transformer"]}
        if args.profile:
            row["profile"] = operator_times_ms(models, length, args)
        encoder.append(row)
        print(f"{measure.progress(done, len(args.lengths), start)} L={length:5d}  "
              f"time {ms['transformer']:9.1f} / {ms['mtsa']:9.1f} ms (x{row['time_ratio']:.3f})"
              f"  peak {mb['transformer']:8.1f} / {mb['mtsa']:8.1f} MB (x{row['memory_ratio']:.3f})", flush=True)
        write(result)
    tok_s = training_throughput(models, args)
    print(f"[bench] training {tok_s['transformer']:.1f} / {tok_s['mtsa']:.1f} target tokens/s", flush=True)
    result["training"] = {"steps": args.train_steps, "max_tokens": args.train_max_tokens, "tok_s": tok_s,
                          "ratio": tok_s["mtsa"] / tok_s["transformer"]}
    print(write(result))
