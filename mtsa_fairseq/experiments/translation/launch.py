"""Train several seeds of one config with ``fairseq-train``, resumably, locally, under torchrun or on Slurm.

Each seed trains in ``SAVE_ROOT/<config name>/seed<k>/`` (contract 2): fairseq's checkpoints,
``train.log`` (fairseq's output, appended over resumed sessions) and ``run.json`` (status, command, wall
time, updates, throughput, peak memory, the checkpoint to score). A run is done when fairseq exited 0 and
``checkpoint_last.pt`` reached ``--max-update``; launching again skips done runs and restarts the others
in the same directory, where fairseq restores ``checkpoint_last.pt`` itself.

Everything is checked (config, data, seeds, world size, every fairseq option against fairseq's parser)
by :func:`plan` before anything is written; :func:`execute` then trains or writes sbatch scripts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtsa_fairseq.contracts import MANIFEST_SCHEMA, RUN_SCHEMA, read_json, read_run
from mtsa_fairseq.experiments.processes import RunLock, UpdateProgress, run_logged
from mtsa_fairseq.experiments.translation.checkpoint_average import (
    EPOCH_CHECKPOINT,
    UPDATE_CHECKPOINT,
    AverageError,
    average_checkpoints,
    save_checkpoint,
)
from mtsa_fairseq.experiments.translation.train_config import (
    LAUNCHER_OPTIONS,
    USER_DIR,
    ConfigError,
    TrainConfig,
    check_averaging,
    fairseq_args,
    load_config,
    option_origins,
    parse_fairseq_train,
)

LAUNCHERS = ("local", "torchrun", "slurm")
# fairseq on CPU under torchrun: its own torchrun detection divides by the GPU count, and an explicit
# env:// init with its default rank 0 would give every process rank 0; rank -1 lets torch read RANK.
TORCHRUN_CPU_ARGS = (
    "--distributed-init-method", "env://", "--distributed-rank", "-1", "--distributed-no-spawn",
    "--ddp-backend", "legacy_ddp", "--distributed-backend", "gloo",
)
_WPS = re.compile(r"\| train_inner \| .*\bwps=([0-9.]+)")
_LOGGED_UPDATES = re.compile(r"\bnum_updates[= ](\d+)")
_INDEX_MAGIC = b"MMIDIDX\x00\x00"


class LaunchError(ValueError):
    """Bad launcher input; the message names the problem."""


# ------------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class DataSource:
    """The ``--data`` directory: a prepared directory with ``manifest.json`` (contract 1) or a data-bin."""

    given: Path
    data_bin: Path
    source_lang: str | None = None
    target_lang: str | None = None


def resolve_data(path: str | Path) -> DataSource:
    """Find the fairseq data-bin of ``path`` and check it has a dictionary."""
    given = Path(path).absolute()
    if not given.is_dir():
        raise LaunchError(f"data directory {given} does not exist")
    manifest_path = given / "manifest.json"
    source = target = None
    data_bin = given
    if manifest_path.is_file():
        manifest = read_json(manifest_path, MANIFEST_SCHEMA, "manifest", LaunchError)
        if not isinstance(manifest.get("data_bin"), str):
            raise LaunchError(f"{manifest_path} names no data_bin")
        data_bin = given / manifest["data_bin"]
        source, target = manifest.get("source_lang"), manifest.get("target_lang")
    if not data_bin.is_dir():
        raise LaunchError(f"data-bin directory {data_bin} does not exist")
    langs = [lang for lang in (source, target) if lang]
    missing = [f"dict.{lang}.txt" for lang in langs if not (data_bin / f"dict.{lang}.txt").is_file()]
    if missing or not any(data_bin.glob("dict.*.txt")):
        raise LaunchError(f"{data_bin} has no fairseq dictionary ({', '.join(missing) or 'dict.*.txt'}): "
                          "give a fairseq-preprocess output or a prepared data directory")
    return DataSource(given, data_bin, source, target)


def _language_pair(data_bin: Path, subset: str, source: str | None, target: str | None) -> tuple[str, str]:
    if source and target:
        return source, target
    pairs = {p.name.split(".")[1] for p in data_bin.glob(f"{subset}.*-*.*.idx")}
    if len(pairs) != 1:
        raise LaunchError(f"cannot tell the language pair of {data_bin} from its '{subset}' files "
                          f"(found {sorted(pairs) or 'none'}); set source-lang/target-lang in the config")
    src, tgt = pairs.pop().split("-")
    return src, tgt


def _shards(data_bin: Path, subset: str, src: str, tgt: str) -> list[str]:
    """``train``, ``train1``, ... as fairseq's translation task loads them."""
    shards = []
    while True:
        name = subset if not shards else f"{subset}{len(shards)}"
        prefix = data_bin / f"{name}.{src}-{tgt}"
        files = [Path(f"{prefix}.{lang}.{ext}") for lang in (src, tgt) for ext in ("idx", "bin")]
        if not all(f.is_file() for f in files):
            break
        shards.append(name)
    if not shards:
        raise LaunchError(f"{data_bin} has no binarised '{subset}' subset for {src}-{tgt} (mmap .idx/.bin files)")
    return shards


def _read_index(path: Path) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Header, sizes and byte pointers of a fairseq mmap ``.idx`` file."""
    raw = path.read_bytes()
    head = 9 + 8 + 1
    if raw[:9] != _INDEX_MAGIC or len(raw) < head + 8:
        raise LaunchError(f"{path} is not a fairseq mmap index (fairseq-preprocess --dataset-impl mmap)")
    (count,) = struct.unpack("<Q", raw[head:head + 8])
    if len(raw) != head + 8 + 12 * count:
        raise LaunchError(f"{path}: unsupported index layout ({len(raw)} bytes for {count} items)")
    sizes = np.frombuffer(raw, dtype=np.int32, count=count, offset=head + 8)
    pointers = np.frombuffer(raw, dtype=np.int64, count=count, offset=head + 8 + 4 * count)
    return raw[:head], sizes, pointers


@dataclass(frozen=True)
class TrainView:
    """A data directory in which the training subset holds only pairs of at most ``max_length`` tokens per
    side (EOS included); every other file is a link to the original data-bin. The ``.bin`` token files are
    shared: only the ``.idx`` files of the training subset are rewritten."""

    source: Path
    path: Path
    subset: str
    src: str
    tgt: str
    max_length: int

    def stamp(self) -> dict[str, Any]:
        return {"source": str(self.source), "subset": self.subset, "pair": f"{self.src}-{self.tgt}",
                "max_length": self.max_length}

    def check_reusable(self) -> bool:
        """Whether the view already exists (built from the same data); raises if built from other data."""
        stamp_path = self.path / "view.json"
        if not stamp_path.is_file():
            return False
        recorded = {k: v for k, v in json.loads(stamp_path.read_text()).items() if k in self.stamp()}
        if recorded != self.stamp():
            raise LaunchError(f"{self.path} was built from other data ({recorded}); use another --save-root")
        return True

    def build(self, log: Callable[[str], None]) -> None:
        """Write the view (atomically: a temporary directory renamed into place) unless it exists."""
        if self.check_reusable():
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        shards = _shards(self.source, self.subset, self.src, self.tgt)
        filtered = {f"{s}.{self.src}-{self.tgt}.{lang}.idx" for s in shards for lang in (self.src, self.tgt)}
        for entry in sorted(self.source.iterdir()):
            if entry.is_file() and entry.name not in filtered:
                (tmp / entry.name).symlink_to(entry.resolve())
        kept_total = pairs_total = 0
        for shard in shards:
            prefix = f"{shard}.{self.src}-{self.tgt}"
            src_head, src_sizes, src_ptr = _read_index(self.source / f"{prefix}.{self.src}.idx")
            tgt_head, tgt_sizes, tgt_ptr = _read_index(self.source / f"{prefix}.{self.tgt}.idx")
            if len(src_sizes) != len(tgt_sizes):
                raise LaunchError(f"{self.source}/{prefix}: {len(src_sizes)} source and {len(tgt_sizes)} target lines")
            keep = (src_sizes <= self.max_length) & (tgt_sizes <= self.max_length)
            for lang, head, sizes, pointers in ((self.src, src_head, src_sizes, src_ptr),
                                                (self.tgt, tgt_head, tgt_sizes, tgt_ptr)):
                with open(tmp / f"{prefix}.{lang}.idx", "wb") as out:
                    out.write(head + struct.pack("<Q", int(keep.sum())))
                    out.write(sizes[keep].tobytes())
                    out.write(pointers[keep].tobytes())
            kept_total += int(keep.sum())
            pairs_total += len(keep)
        stamp = {**self.stamp(), "kept": kept_total, "pairs": pairs_total}
        (tmp / "view.json").write_text(json.dumps(stamp, indent=1) + "\n")
        try:
            tmp.rename(self.path)
        except OSError:  # built meanwhile by another launcher (another node): use that one
            shutil.rmtree(tmp, ignore_errors=True)
            self.check_reusable()
            return
        log(f"train length filter: kept {kept_total} of {pairs_total} '{self.subset}' pairs with at most "
            f"{self.max_length} tokens per side -> {self.path}")


# ------------------------------------------------------------------------------------------------ plan


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
    submit: bool = False


@dataclass
class SeedRun:
    """One seed's run: where it lives, its command and its run.json fields."""

    seed: int
    run_dir: Path
    command: list[str]
    record: dict[str, Any]
    log_name: str = "train.log"


@dataclass
class Plan:
    """Everything :func:`execute` does, fully checked."""

    config: TrainConfig
    options: LaunchOptions
    nnodes: int
    nproc_per_node: int
    env: dict[str, str]
    runs: list[SeedRun]
    view: TrainView | None = None
    warnings: list[str] = field(default_factory=list)


def find_executable(name: str) -> str:
    """``name`` next to this interpreter (its virtual environment), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise LaunchError(f"{name} not found (next to {sys.executable} or on PATH)")
    return found


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
    if options.launcher == "slurm" and cpu:
        raise LaunchError("--launcher slurm trains on GPUs (one task per GPU); drop --cpu or use a GPU config")
    if options.launcher == "slurm" and (options.master_addr or options.node_rank):
        raise LaunchError("--master-addr/--node-rank are for --launcher torchrun; Slurm assigns nodes itself")
    if not cpu and options.launcher in ("local", "torchrun") and not dry_run:
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
    if options.submit and options.launcher != "slurm":
        raise LaunchError("--submit is for --launcher slurm")
    if options.submit and not dry_run and shutil.which("sbatch") is None:
        raise LaunchError("--submit needs sbatch on PATH")
    source = resolve_data(data)
    extra = list(options.extra_args)
    _check_extra_args(extra)
    cpu = options.cpu or config.cpu
    nnodes, nproc = _world(config, options, cpu, dry_run)
    world = nnodes * nproc

    lang_args: list[str] = []
    for key, lang in (("source-lang", source.source_lang), ("target-lang", source.target_lang)):
        if lang is None:
            continue
        if config.fairseq.get(key) not in (None, lang):
            raise LaunchError(f"{config.path}: {key} {config.fairseq[key]!r} differs from the data's {lang!r}")
        if key not in config.fairseq:
            lang_args += [f"--{key}", lang]
    base_args = [*fairseq_args(config), *lang_args, *(["--cpu"] if options.cpu and not config.cpu else [])]
    origins = option_origins(config.path, config.fairseq, extra)
    try:
        namespace = parse_fairseq_train(str(source.data_bin), [*base_args, *extra], origins)
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

    config_root = Path(save_root).absolute() / config.name
    view = None
    train_data = source.data_bin
    translation = namespace.task == "translation"
    if translation or config.train_max_length is not None:  # the binarised subsets fairseq will look for
        src, tgt = _language_pair(source.data_bin, namespace.train_subset, source.source_lang or namespace.source_lang,
                                  source.target_lang or namespace.target_lang)
        _shards(source.data_bin, namespace.train_subset, src, tgt)
        if translation and not namespace.disable_validation:
            for subset in namespace.valid_subset.split(","):
                _shards(source.data_bin, subset, src, tgt)
    if config.train_max_length is not None:
        view = TrainView(source.data_bin.resolve(), config_root / f"train-maxlen{config.train_max_length}",
                         namespace.train_subset, src, tgt, config.train_max_length)
        view.check_reusable()
        train_data = view.path

    warnings = []
    assumed_world = 1 if config.cpu else config.nodes * config.gpus_per_node
    assumed = _tokens_per_update(config.fairseq.get("max-tokens"), config.fairseq.get("update-freq"), assumed_world)
    actual = _tokens_per_update(namespace.max_tokens, namespace.update_freq, world)
    if assumed and actual and assumed != actual:
        warnings.append(f"effective batch is {actual} tokens per update ({world} process(es)), the config assumes "
                        f"{assumed} ({assumed_world}); keep max-tokens x update-freq x processes equal, e.g. "
                        f"--extra-args \"--update-freq N\"")

    env = {"PYTHONUNBUFFERED": "1"}
    if options.threads:
        env.update(OMP_NUM_THREADS=str(options.threads), MKL_NUM_THREADS=str(options.threads))
    fairseq_train = find_executable("fairseq-train")
    runs = []
    for seed in seeds:
        run_dir = config_root / f"seed{seed}"
        command = [fairseq_train, str(train_data), "--user-dir", USER_DIR, *base_args, "--seed", str(seed),
                   "--save-dir", str(run_dir)]
        if options.launcher == "local":
            if not cpu:  # fairseq spawns one process per GPU up to this size
                command += ["--distributed-world-size", str(nproc)]
        elif options.launcher == "torchrun":
            prefix = [find_executable("torchrun"), "--nproc_per_node", str(nproc)]
            if nnodes > 1:
                prefix += ["--nnodes", str(nnodes), "--node_rank", str(options.node_rank),
                           "--master_addr", str(options.master_addr)]
            prefix += ["--master_port", str(options.master_port)]
            # on GPUs fairseq reads torchrun's RANK/WORLD_SIZE/MASTER_* itself (env:// init, GPU = rank % GPUs)
            command = [*prefix, *command, "--distributed-world-size", str(world)]
            if cpu:
                command += list(TORCHRUN_CPU_ARGS)
        else:  # slurm: one task per GPU, fairseq reads SLURM_* and initialises on the first node at this port
            command += ["--distributed-world-size", str(world),
                        "--distributed-port", str(options.master_port + seed)]
        command += extra
        checkpoint = run_dir / (f"checkpoint_avg_last{average_last}.pt" if average_last else "checkpoint_last.pt")
        record = {
            "schema": RUN_SCHEMA, "config": config.name, "system": config.system, "setup": config.setup,
            "arch": namespace.arch, "seed": seed, "status": "pending", "command": command,
            "data": str(source.given), "checkpoint": str(checkpoint), "num_updates": None,
            "wall_seconds": 0.0, "train_target_tokens_per_second": None, "peak_rss_mb": None,
            "max_update": namespace.max_update, "average_last": average_last,
            "save_interval_updates": namespace.save_interval_updates, "launcher": options.launcher,
            "world_size": world, "config_path": str(Path(config_path).absolute()),
        }
        log_name = "train.log" if options.node_rank == 0 else f"train.node{options.node_rank}.log"
        runs.append(SeedRun(seed, run_dir, command, record, log_name))
    return Plan(config, options, nnodes, nproc, env, runs, view, warnings)


# -------------------------------------------------------------------------------------------- run files


def previous_run(run_dir: Path) -> dict[str, Any] | None:
    """A run directory's run.json, or None if it has none or an unreadable one (then the run starts over:
    unlike scoring, which needs a valid record, the launcher can always rebuild it)."""
    try:
        return read_run(run_dir, LaunchError)
    except LaunchError:
        return None


def write_run(run_dir: Path, record: dict[str, Any]) -> None:
    """Write run.json atomically."""
    path = Path(run_dir) / "run.json"
    tmp = path.with_name(f".run.json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)


def checkpoint_updates(path: Path) -> int | None:
    """Updates recorded in a fairseq checkpoint (None if it does not exist or cannot be read)."""
    if not Path(path).is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(state["optimizer_history"][-1]["num_updates"])
    except Exception:  # a checkpoint being written, truncated or foreign: treated as absent
        return None


def mean_train_wps(log_text: str) -> float | None:
    """Mean of fairseq's ``wps`` (target tokens per second) over the logged training intervals."""
    values = [float(v) for v in _WPS.findall(log_text)]
    return sum(values) / len(values) if values else None


def interval_snapshots(run_dir: Path, every: int) -> list[Path]:
    """The checkpoints of ``run_dir`` taken at multiples of ``every`` updates, oldest first, one per update.

    fairseq writes ``checkpoint_<epoch>_<update>.pt`` every ``--save-interval-updates`` updates except when
    that update also ends an epoch: then the state is saved only as ``checkpoint<epoch>.pt`` (unless
    ``--no-epoch-checkpoints``) and ``checkpoint_last.pt``, so all three kinds are looked at."""
    found: dict[int, Path] = {}
    for path in sorted(Path(run_dir).glob("checkpoint*.pt"), key=lambda p: (p.name == "checkpoint_last.pt", p.name)):
        if not (UPDATE_CHECKPOINT.match(path.name) or EPOCH_CHECKPOINT.match(path.name)
                or path.name == "checkpoint_last.pt"):
            continue
        updates = checkpoint_updates(path)
        if updates and updates % every == 0:
            found.setdefault(updates, path)
    return [found[u] for u in sorted(found)]


def is_done(record: dict[str, Any] | None, max_update: int) -> bool:
    """Whether a run.json says the run finished ``max_update`` updates."""
    return bool(record) and record.get("status") == "done" and (record.get("num_updates") or 0) >= max_update


def finish_run(run_dir: Path, returncode: int, session_seconds: float, peak_rss_mb: float | None,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fill run.json after a training session: updates, throughput, time, averaging, status."""
    record = previous_run(run_dir)
    if record is None:
        raise LaunchError(f"{run_dir} has no run.json")
    log_path = Path(run_dir) / "train.log"
    log_text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    updates = checkpoint_updates(Path(run_dir) / "checkpoint_last.pt")
    if updates is None:
        logged = _LOGGED_UPDATES.findall(log_text)
        updates = int(logged[-1]) if logged else None
    peaks = [p for p in (record.get("peak_rss_mb"), peak_rss_mb) if p is not None]
    record.update(
        returncode=returncode, num_updates=updates,
        wall_seconds=round(record.get("wall_seconds", 0.0) + session_seconds, 3),
        train_target_tokens_per_second=mean_train_wps(log_text), peak_rss_mb=max(peaks) if peaks else None,
    )
    record.pop("error", None)
    if returncode != 0:
        record.update(status="failed", error=f"fairseq-train exited with {returncode} (see {log_path})")
    elif updates is None or updates < record["max_update"]:
        record.update(status="failed", error=f"training stopped at {updates} of {record['max_update']} updates")
    else:
        record["status"] = "done"
        average_last = record.get("average_last") or 0
        if average_last:
            paths = interval_snapshots(run_dir, record["save_interval_updates"])[-average_last:]
            try:
                if len(paths) < average_last:
                    raise AverageError(f"{run_dir} holds {len(paths)} checkpoints at multiples of "
                                       f"{record['save_interval_updates']} updates, fewer than {average_last}")
                save_checkpoint(average_checkpoints(paths), record["checkpoint"])
                record["averaged"] = [str(p) for p in paths]
                log(f"averaged {', '.join(p.name for p in paths)} -> {record['checkpoint']}")
            except AverageError as err:
                record.update(status="failed", error=f"averaging: {err}")
    write_run(run_dir, record)
    return record


def record_start(run_dir: Path) -> dict[str, Any]:
    """Mark a run as running (the sbatch script calls this before ``srun``)."""
    record = previous_run(run_dir)
    if record is None:
        raise LaunchError(f"{run_dir} has no run.json")
    record.update(status="running", started_at=time.time(),
                  resumed_from_updates=checkpoint_updates(Path(run_dir) / "checkpoint_last.pt") or 0)
    write_run(run_dir, record)
    return record


def record_finish(run_dir: Path, returncode: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fill run.json after ``srun`` (the sbatch script calls this); peak memory is not measurable there."""
    record = previous_run(run_dir)
    if record is None:
        raise LaunchError(f"{run_dir} has no run.json")
    started = record.get("started_at")
    return finish_run(run_dir, returncode, time.time() - started if started else 0.0, None, log)


# ---------------------------------------------------------------------------------------------- execute


def sbatch_script(plan_: Plan, run: SeedRun, train_seeds: Path) -> str:
    """The sbatch script of one seed: record start, ``srun fairseq-train``, record finish."""
    python = shlex.quote(sys.executable)
    script = shlex.quote(str(train_seeds))
    run_dir = shlex.quote(str(run.run_dir))
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={plan_.config.name}.seed{run.seed}",
        f"#SBATCH --nodes={plan_.nnodes}",
        f"#SBATCH --ntasks-per-node={plan_.nproc_per_node}",
        f"#SBATCH --gpus-per-node={plan_.nproc_per_node}",
        *([f"#SBATCH --cpus-per-task={plan_.options.threads}"] if plan_.options.threads else []),
        f"#SBATCH --output={run.run_dir}/slurm-%j.out",
        f"# {plan_.config.name}, seed {run.seed}: written by scripts/train_seeds.py --launcher slurm",
        "set -uo pipefail",
        *(f"export {k}={shlex.quote(v)}" for k, v in plan_.env.items()),
        f"cd {shlex.quote(os.getcwd())}",
        f"{python} {script} --record-start {run_dir} || exit 1",
        f"srun --kill-on-bad-exit=1 {shlex.join(run.command)} 2>&1 | tee -a {run_dir}/train.log",
        "rc=${PIPESTATUS[0]}",
        f"{python} {script} --record-finish {run_dir} --returncode \"$rc\"",
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def execute(plan_: Plan, train_seeds: Path, dry_run: bool = False, log: Callable[[str], None] = print) -> int:
    """Train (or write sbatch scripts for) every seed of ``plan_``; returns the number of failed runs."""
    for warning in plan_.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    max_update = plan_.runs[0].record["max_update"]
    if dry_run:
        if plan_.view is not None and not plan_.view.path.exists():
            log(f"# would build the length-filtered training data {plan_.view.path}")
        for run in plan_.runs:
            if is_done(previous_run(run.run_dir), max_update):
                log(f"# seed {run.seed}: done, would be skipped")
            elif plan_.options.launcher == "slurm":
                log(f"# seed {run.seed}: {run.run_dir / 'train.sbatch'}\n{sbatch_script(plan_, run, train_seeds)}")
            else:
                log(shlex.join(run.command))
        return 0
    if plan_.view is not None:
        plan_.view.path.parent.mkdir(parents=True, exist_ok=True)
        plan_.view.build(log)
    failed = 0
    for run in plan_.runs:
        previous = previous_run(run.run_dir)
        if is_done(previous, max_update):
            log(f"seed {run.seed}: done ({previous['num_updates']} updates), skipped")
            continue
        if plan_.options.launcher == "slurm":
            failed += _write_slurm(plan_, run, previous, train_seeds, log)
        elif plan_.options.node_rank > 0:
            run.run_dir.mkdir(parents=True, exist_ok=True)
            log(f"seed {run.seed}: node {plan_.options.node_rank} joining: {shlex.join(run.command)}")
            with _lock_run(run.run_dir, f".lock.node{plan_.options.node_rank}") as lock:  # node 0 holds .lock
                returncode, _, _ = run_logged(run.command, run.run_dir / run.log_name, plan_.env, lock)
            failed += returncode != 0
        else:
            failed += _train(plan_, run, log)
    return failed


def _write_slurm(plan_: Plan, run: SeedRun, previous: dict[str, Any] | None, train_seeds: Path,
                 log: Callable[[str], None]) -> int:
    if previous and previous.get("status") in ("running", "submitted"):
        log(f"seed {run.seed}: run.json says {previous['status']} (job {previous.get('slurm_job', '?')}); "
            "not resubmitted: wait for the job, or cancel it and set its status to failed")
        return 0
    run.run_dir.mkdir(parents=True, exist_ok=True)
    path = run.run_dir / "train.sbatch"
    path.write_text(sbatch_script(plan_, run, train_seeds))
    record = {**run.record, "wall_seconds": (previous or {}).get("wall_seconds", 0.0),
              "peak_rss_mb": (previous or {}).get("peak_rss_mb")}
    if plan_.options.submit:
        proc = subprocess.run(["sbatch", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            log(f"seed {run.seed}: sbatch failed: {proc.stderr.strip()}")
            write_run(run.run_dir, record)
            return 1
        job = proc.stdout.strip().split()[-1] if proc.stdout.strip() else "?"
        record.update(status="submitted", slurm_job=job)
        log(f"seed {run.seed}: submitted job {job} ({path})")
    else:
        log(f"seed {run.seed}: wrote {path} (submit with: sbatch {path})")
    write_run(run.run_dir, record)
    return 0


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _lock_run(run_dir: Path, name: str = ".lock") -> RunLock:
    """The run directory's lock, held (a live holder, e.g. a trainer left by a killed launcher: LaunchError)."""
    return RunLock(run_dir / name, f"run {run_dir}").acquire(LaunchError)


def _train(plan_: Plan, run: SeedRun, log: Callable[[str], None]) -> int:
    """Train one seed while holding its run directory's lock."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    with _lock_run(run.run_dir) as lock:
        previous = previous_run(run.run_dir)  # read again under the lock: another launcher may have finished it
        if is_done(previous, run.record["max_update"]):
            log(f"seed {run.seed}: done ({previous['num_updates']} updates), skipped")
            return 0
        return _train_locked(plan_, run, previous, lock, log)


def _train_locked(plan_: Plan, run: SeedRun, previous: dict[str, Any] | None, lock: RunLock,
                  log: Callable[[str], None]) -> int:
    resumed_from = checkpoint_updates(run.run_dir / "checkpoint_last.pt") or 0
    previous = previous or {}
    record = {**run.record, "status": "running", "resumed_from_updates": resumed_from,
              "wall_seconds": previous.get("wall_seconds", 0.0), "peak_rss_mb": previous.get("peak_rss_mb")}
    write_run(run.run_dir, record)
    if resumed_from >= record["max_update"]:  # fairseq finished but run.json was not filled in
        log(f"seed {run.seed}: checkpoint_last.pt is at {resumed_from} updates already; recording the run")
        return finish_run(run.run_dir, 0, 0.0, None, log)["status"] != "done"
    what = f"resuming from update {resumed_from}" if resumed_from else "training"
    log(f"seed {run.seed}: {what}: {shlex.join(run.command)}")
    start = time.monotonic()
    try:
        progress = UpdateProgress(f"{plan_.config.name} seed {run.seed}", record["max_update"], resumed_from,
                                  write=_to_stderr)
        returncode, peak_mb, output = run_logged(run.command, run.run_dir / run.log_name, plan_.env, lock,
                                                 on_line=progress)
    except BaseException:
        write_run(run.run_dir, {**record, "status": "interrupted",
                                "wall_seconds": record["wall_seconds"] + time.monotonic() - start})
        raise
    if resumed_from and "Loaded checkpoint" not in output:
        log(f"warning: seed {run.seed}: fairseq did not report loading {run.run_dir / 'checkpoint_last.pt'}")
    result = finish_run(run.run_dir, returncode, time.monotonic() - start, round(peak_mb, 1), log)
    log(f"seed {run.seed}: {result['status']} at {result['num_updates']} updates"
        + (f" ({result['error']})" if result.get("error") else ""))
    return result["status"] != "done"
