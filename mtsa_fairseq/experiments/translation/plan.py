"""Planning a launch: every input (config, data, seeds, world size, every fairseq option against fairseq's own
parser) is checked by :func:`plan` before anything is written."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtsa_fairseq.contracts import RUN_SCHEMA
from mtsa_fairseq.experiments.errors import ConfigError, LaunchError
from mtsa_fairseq.experiments.fairseq_train import USER_DIR, option_origins, parse_fairseq_train
from mtsa_fairseq.experiments.processes import find_executable
from mtsa_fairseq.experiments.translation.train_config import (
    LAUNCHER_OPTIONS,
    TrainConfig,
    check_averaging,
    fairseq_args,
    load_config,
)
from mtsa_fairseq.experiments.translation.training_view import (
    DataSource,
    TrainView,
    language_pair,
    resolve_data,
    subset_shards,
)

LAUNCHERS = ("local", "torchrun", "slurm")
SLURM_TIME = 4320  # minutes a Slurm job may run before it is requeued (and resumes)
SLURM_REQUEUES = 10  # requeues after a timeout before a seed's job gives up
SLURM_SIGNAL_DELAY_S = 90  # Slurm warns a job (submitit's USR2) this long before its time limit; it then requeues
MIN_SLURM_TIME = 3  # minutes: a job trains at least as long as the warning ahead of its limit
# fairseq on CPU under torchrun: its own torchrun detection divides by the GPU count, and an explicit
# env:// init with its default rank 0 would give every process rank 0; rank -1 lets torch read RANK.
TORCHRUN_CPU_ARGS = (
    "--distributed-init-method", "env://", "--distributed-rank", "-1", "--distributed-no-spawn",
    "--ddp-backend", "legacy_ddp", "--distributed-backend", "gloo",
)


@dataclass(frozen=True)
class LaunchOptions:
    """How to launch (the command-line options of ``scripts/train_seeds.py`` besides config/data/seeds)."""

    launcher: str = "local"
    cpu: bool = False
    nproc_per_node: int | None = None
    nnodes: int | None = None
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 29500
    threads: int | None = None
    average_last: int | None = None
    extra_args: tuple[str, ...] = ()
    slurm_partition: str | None = None
    slurm_time: int = SLURM_TIME
    slurm_requeues: int = SLURM_REQUEUES
    slurm_args: tuple[str, ...] = ()


@dataclass
class SeedRun:
    """One seed's run: where it lives, its command and its run.json fields."""

    seed: int
    run_dir: Path
    command: list[str]
    record: dict[str, Any]
    log_name: str = "train.log"

    @property
    def label(self) -> str:
        """How progress lines name the run (``<config> seed <k>``)."""
        return f"{self.record['config']} seed {self.seed}"


@dataclass
class Plan:
    """Everything :func:`execute` does, fully checked."""

    config: TrainConfig
    options: LaunchOptions
    nnodes: int
    nproc_per_node: int
    cpu: bool
    env: dict[str, str]
    runs: list[SeedRun]
    view: TrainView | None = None
    warnings: list[str] = field(default_factory=list)


def _world(config: TrainConfig, options: LaunchOptions, cpu: bool, dry_run: bool) -> tuple[int, int]:
    """(nnodes, nproc_per_node), checked against the launcher."""
    nnodes = options.nnodes if options.nnodes is not None else (1 if cpu else config.nodes)
    nproc = options.nproc_per_node if options.nproc_per_node is not None else (1 if cpu else config.gpus_per_node)
    if nnodes < 1 or nproc < 1:
        raise LaunchError(f"world size must be positive, got --nnodes {nnodes} --nproc-per-node {nproc}")
    if not 0 <= options.node_rank < nnodes:
        raise LaunchError(f"--node-rank {options.node_rank} is outside 0..{nnodes - 1} for {nnodes} node(s)")
    if options.launcher == "local":
        if nnodes > 1:
            raise LaunchError(f"world size inconsistent with --launcher local: it runs on one node, not {nnodes} "
                              "(use --launcher torchrun or slurm)")
        if cpu and nproc > 1:
            raise LaunchError(f"world size inconsistent with --launcher local: on CPU it runs one process, not "
                              f"{nproc} (use --launcher torchrun for several CPU processes)")
        if options.master_addr or options.node_rank:
            raise LaunchError("--master-addr/--node-rank are for --launcher torchrun")
    if options.launcher == "torchrun" and nnodes > 1 and not options.master_addr:
        raise LaunchError(f"--launcher torchrun with {nnodes} nodes needs --master-addr (the rank-0 node)")
    if options.launcher == "slurm" and cpu and nnodes * nproc > 1:
        raise LaunchError(f"--launcher slurm --cpu runs one task on one node, not {nnodes} node(s) x {nproc}; use "
                          "GPU nodes, or --launcher torchrun for several CPU processes")
    if options.launcher == "slurm" and (options.master_addr or options.node_rank):
        raise LaunchError("--master-addr/--node-rank are for --launcher torchrun; Slurm assigns nodes itself")
    if not cpu and options.launcher in ("local", "torchrun") and not dry_run:
        import torch

        available = torch.cuda.device_count()
        if available < nproc:
            raise LaunchError(f"world size inconsistent with this machine: {nproc} GPU process(es) per node "
                              f"requested, {available} GPU(s) visible (pass --cpu or --nproc-per-node)")
    return nnodes, nproc


def _check_extra_args(extra: list[str]) -> None:
    for token in extra:
        name = token.split("=")[0]
        if name.startswith("--") and name[2:] in LAUNCHER_OPTIONS:
            raise LaunchError(f"--extra-args: {name} is set by the launcher")
        if name in ("--arch", "-a"):  # run.json and the reports name the config's system
            raise LaunchError("--extra-args: --arch is the config's (its system); write another config for another")


def _tokens_per_update(max_tokens: Any, update_freq: Any, world: int) -> int | None:
    if max_tokens is None:
        return None
    freq = update_freq[0] if isinstance(update_freq, list) else update_freq or 1
    return int(max_tokens) * int(freq) * world


def plan(config_path: str | Path, data: str | Path, seeds: list[int], save_root: str | Path,
         options: LaunchOptions, dry_run: bool = False) -> Plan:
    """Check everything and build the commands; writes nothing."""
    try:
        config = load_config(config_path)
    except ConfigError as err:
        raise LaunchError(str(err)) from None
    _check_options(options, seeds)
    source = resolve_data(data)
    extra = list(options.extra_args)
    _check_extra_args(extra)
    cpu = options.cpu or config.cpu
    nnodes, nproc = _world(config, options, cpu, dry_run)
    if options.launcher == "slurm" and not dry_run and shutil.which("sbatch") is None:
        raise LaunchError("--launcher slurm submits with sbatch, which is not on PATH (run it on a Slurm login node)")
    base_args = [*fairseq_args(config), *_language_args(config, source),
                 *(["--cpu"] if options.cpu and not config.cpu else [])]
    namespace, average_last = _parse_and_check(config, source, base_args, extra, options)
    config_root = Path(save_root).absolute() / config.name
    view = _train_view(config, source, namespace, config_root)
    env = {"PYTHONUNBUFFERED": "1"}
    if options.threads:
        env.update(OMP_NUM_THREADS=str(options.threads), MKL_NUM_THREADS=str(options.threads))
    fairseq_train = find_executable("fairseq-train")
    runs = []
    for seed in seeds:
        run_dir = config_root / f"seed{seed}"
        command = [fairseq_train, str(view.path if view else source.data_bin), "--user-dir", USER_DIR, *base_args,
                   "--seed", str(seed), "--save-dir", str(run_dir)]
        command = [*_launched(command, options, cpu, nnodes, nproc, seed), *extra]
        checkpoint = run_dir / (f"checkpoint_avg_last{average_last}.pt" if average_last else "checkpoint_last.pt")
        record = {
            "schema": RUN_SCHEMA, "config": config.name, "system": config.system, "setup": config.setup,
            "arch": namespace.arch, "seed": seed, "status": "pending", "command": command,
            "data": str(source.given), "checkpoint": str(checkpoint), "num_updates": None,
            "wall_seconds": 0.0, "train_target_tokens_per_second": None, "peak_rss_mb": None,
            "max_update": namespace.max_update, "average_last": average_last,
            "train_args": [*base_args, "--seed", str(seed), *extra],
            "save_interval_updates": namespace.save_interval_updates, "launcher": options.launcher,
            "world_size": nnodes * nproc, "config_path": str(Path(config_path).absolute()),
            "dictionaries": source.dictionaries,
        }
        log_name = "train.log" if options.node_rank == 0 else f"train.node{options.node_rank}.log"
        runs.append(SeedRun(seed, run_dir, command, record, log_name))
    warnings = _batch_warnings(config, namespace, nnodes * nproc)
    return Plan(config, options, nnodes, nproc, cpu, env, runs, view, warnings)


def _check_options(options: LaunchOptions, seeds: list[int]) -> None:
    if options.launcher not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {options.launcher!r} (choose from {', '.join(LAUNCHERS)})")
    if not seeds:
        raise LaunchError("give at least one seed")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise LaunchError(f"seed {repeated[0]} is given more than once")
    if any(s < 0 for s in seeds):
        raise LaunchError("seeds must be non-negative integers")
    if options.threads is not None and options.threads < 1:
        raise LaunchError("--threads must be >= 1")
    if options.average_last is not None and options.average_last < 0:
        raise LaunchError("--average-last must be >= 0")
    if not 0 < options.master_port < 65536:
        raise LaunchError(f"--master-port {options.master_port} is not a port number")
    if options.launcher == "slurm" and options.master_port + max(seeds) >= 65536:
        raise LaunchError(f"--master-port {options.master_port} + seed {max(seeds)} is not a port number")
    slurm_defaults = (options.slurm_time, options.slurm_requeues) == (SLURM_TIME, SLURM_REQUEUES)
    if options.launcher != "slurm" and (options.slurm_partition or options.slurm_args or not slurm_defaults):
        raise LaunchError("--slurm-* options are for --launcher slurm")
    if options.slurm_time < MIN_SLURM_TIME:
        raise LaunchError(f"--slurm-time must be >= {MIN_SLURM_TIME} minutes: Slurm signals the job "
                          f"{SLURM_SIGNAL_DELAY_S} s before its limit, and it is requeued then")
    if options.slurm_requeues < 0:
        raise LaunchError("--slurm-requeues must be >= 0")
    malformed = [arg for arg in options.slurm_args if "=" not in arg or arg.startswith("=")]
    if malformed:
        raise LaunchError(f"--slurm-args: {malformed[0]!r} is not KEY=VALUE (an sbatch option without its dashes)")


def _language_args(config: TrainConfig, source: DataSource) -> list[str]:
    """``--source-lang/--target-lang`` from a prepared directory's manifest, unless the config names them (then
    they must agree)."""
    args: list[str] = []
    for key, lang in (("source-lang", source.source_lang), ("target-lang", source.target_lang)):
        if lang is None:
            continue
        if config.fairseq.get(key) not in (None, lang):
            raise LaunchError(f"{config.path}: {key} {config.fairseq[key]!r} differs from the data's {lang!r}")
        if key not in config.fairseq:
            args += [f"--{key}", lang]
    return args


def _parse_and_check(config: TrainConfig, source: DataSource, base_args: list[str], extra: list[str],
                     options: LaunchOptions) -> tuple[Any, int]:
    """fairseq-train's own parse of the whole command line, the launcher's constraints on it, and the number of
    last checkpoints to average."""
    origins = option_origins(config.path, config.fairseq, extra)
    try:
        namespace = parse_fairseq_train(str(source.data_bin), [*base_args, *extra], origins, config.fairseq)
    except ConfigError as err:
        raise LaunchError(str(err)) from None
    if namespace.log_format not in (None, "simple"):
        raise LaunchError("--extra-args: --log-format must stay 'simple' (the launcher reads throughput from it)")
    if not namespace.max_update or namespace.max_update < 0:
        raise LaunchError("--extra-args: --max-update must stay positive")
    average_last = config.average_last if options.average_last is None else options.average_last
    try:
        check_averaging(average_last, namespace.save_interval_updates, namespace.keep_interval_updates,
                        namespace.max_update, f"{config.name} (with --average-last/--extra-args)")
    except ConfigError as err:
        raise LaunchError(str(err)) from None
    return namespace, average_last


def _train_view(config: TrainConfig, source: DataSource, namespace: Any, config_root: Path) -> TrainView | None:
    """Checks that the binarised subsets fairseq will look for exist; the length-filtered view when the config
    asks for one."""
    translation = namespace.task == "translation"
    if not translation and config.train_max_length is None:
        return None
    src, tgt = language_pair(source.data_bin, namespace.train_subset, source.source_lang or namespace.source_lang,
                             source.target_lang or namespace.target_lang)
    subset_shards(source.data_bin, namespace.train_subset, src, tgt)
    if translation and not namespace.disable_validation:
        for subset in namespace.valid_subset.split(","):
            subset_shards(source.data_bin, subset, src, tgt)
    if config.train_max_length is None:
        return None
    view = TrainView(source.data_bin.resolve(), config_root / f"train-maxlen{config.train_max_length}",
                     namespace.train_subset, src, tgt, config.train_max_length)
    view.check_reusable()
    return view


def _launched(command: list[str], options: LaunchOptions, cpu: bool, nnodes: int, nproc: int,
              seed: int) -> list[str]:
    """``command`` as the launcher runs it: locally, under torchrun, or as a Slurm task."""
    world = nnodes * nproc
    # Every rank reads checkpoint_last.pt itself on a resume: fairseq's broadcast of rank 0's loaded state is
    # unpickled with torch.load(weights_only=True), which refuses the omegaconf config inside it (torch >= 2.6).
    command = command + (["--load-checkpoint-on-all-dp-ranks"] if world > 1 else [])
    if options.launcher == "local":
        return command + ([] if cpu else ["--distributed-world-size", str(nproc)])  # fairseq spawns per GPU
    if options.launcher == "torchrun":
        prefix = [find_executable("torchrun"), "--nproc_per_node", str(nproc)]
        if nnodes > 1:
            prefix += ["--nnodes", str(nnodes), "--node_rank", str(options.node_rank),
                       "--master_addr", str(options.master_addr)]
        prefix += ["--master_port", str(options.master_port)]
        # on GPUs fairseq reads torchrun's RANK/WORLD_SIZE/MASTER_* itself (env:// init, GPU = rank % GPUs)
        return [*prefix, *command, "--distributed-world-size", str(world), *(TORCHRUN_CPU_ARGS if cpu else ())]
    if cpu:  # slurm on a CPU node: one task, fairseq-train as it runs locally
        return command
    # slurm: one task per GPU, fairseq reads SLURM_* and initialises on the first node at this port
    return command + ["--distributed-world-size", str(world), "--distributed-port", str(options.master_port + seed)]


def _batch_warnings(config: TrainConfig, namespace: Any, world: int) -> list[str]:
    assumed_world = 1 if config.cpu else config.nodes * config.gpus_per_node
    assumed = _tokens_per_update(config.fairseq.get("max-tokens"), config.fairseq.get("update-freq"), assumed_world)
    actual = _tokens_per_update(namespace.max_tokens, namespace.update_freq, world)
    if assumed and actual and assumed != actual:
        return [f"effective batch is {actual} tokens per update ({world} process(es)), the config assumes "
                f"{assumed} ({assumed_world}); keep max-tokens x update-freq x processes equal, e.g. "
                f"--extra-args \"--update-freq N\""]
    return []
