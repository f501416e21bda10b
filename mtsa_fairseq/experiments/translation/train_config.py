"""Training configurations: one YAML file per (setup, system) in ``configs/``, mapped to ``fairseq-train`` options.

A config holds the run's identity (``name`` = file stem, ``system``, ``setup``), what it assumes (``hardware``), how
to pick the checkpoint to score (``average_last``), an optional training-only length filter (``train_max_length``,
t2t's ``max_length``) and the ``fairseq`` options (as :mod:`~mtsa_fairseq.experiments.fairseq_train` turns them into
arguments), each checked against ``fairseq-train``'s own parser; a key given twice in one mapping is an error."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtsa_fairseq.experiments.errors import ConfigError
from mtsa_fairseq.experiments.fairseq_train import (
    option_origins,
    options_to_args,
    parse_fairseq_train,
    read_config_file,
)

SYSTEMS = ("transformer", "mtsa")
REQUIRED_KEYS = ("name", "system", "setup", "description", "hardware", "average_last", "fairseq")
OPTIONAL_KEYS = ("train_max_length",)
HARDWARE_KEYS = ("nodes", "gpus_per_node")
# options the launcher sets per run or per process; a config or --extra-args must not set them
LAUNCHER_OPTIONS = (
    "save-dir", "seed", "user-dir", "distributed-world-size", "distributed-rank", "distributed-init-method",
    "distributed-port", "distributed-no-spawn", "distributed-num-procs", "device-id", "local-rank", "local_rank",
)
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class TrainConfig:
    """A validated training config."""

    path: Path
    name: str
    system: str
    setup: str
    description: str
    nodes: int
    gpus_per_node: int
    average_last: int
    train_max_length: int | None
    fairseq: dict[str, Any]

    @property
    def arch(self) -> str:
        return self.fairseq["arch"]

    @property
    def max_update(self) -> int:
        return self.fairseq["max-update"]

    @property
    def cpu(self) -> bool:
        return bool(self.fairseq.get("cpu"))


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fairseq_section(where: str, section: Any) -> dict[str, Any]:
    if not isinstance(section, dict) or not section:
        raise ConfigError(f"{where}: 'fairseq' must be a non-empty mapping of fairseq-train options")
    for key, value in section.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise ConfigError(f"{where}: fairseq option key {key!r} must be an option name without leading dashes")
        if key in LAUNCHER_OPTIONS:
            raise ConfigError(f"{where}: fairseq option '{key}' is set by the launcher; remove it from the config")
        scalars = (str, int, float, bool, type(None))
        if isinstance(value, list):
            if not value or not all(isinstance(v, scalars) and not isinstance(v, bool) and v is not None
                                    for v in value):
                raise ConfigError(f"{where}: fairseq option '{key}': a list must hold one or more plain values")
        elif not isinstance(value, scalars):
            raise ConfigError(f"{where}: fairseq option '{key}': value must be a scalar, a list, true/false or null")
    if not isinstance(section.get("arch"), str):
        raise ConfigError(f"{where}: fairseq option 'arch' is required (a string)")
    if not _int(section.get("max-update")) or section["max-update"] <= 0:
        raise ConfigError(f"{where}: fairseq option 'max-update' is required (a positive integer): "
                          "a run is done when its last checkpoint reaches it")
    if section.get("log-format", "simple") != "simple":
        raise ConfigError(f"{where}: fairseq option 'log-format' must be 'simple' (the launcher reads the "
                          "training throughput from fairseq's simple log lines)")
    return dict(section)


def config_from_dict(raw: Any, path: Path) -> TrainConfig:
    """Validate a parsed config (``path`` names it in messages and fixes the expected ``name``)."""
    where = str(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a config must be a YAML mapping")
    unknown = [k for k in raw if k not in REQUIRED_KEYS + OPTIONAL_KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)})")
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r}")
    name = raw["name"]
    if not isinstance(name, str) or not _NAME.match(name) or name != path.stem:
        raise ConfigError(f"{where}: 'name' must equal the file stem {path.stem!r}, got {name!r}")
    if raw["system"] not in SYSTEMS:
        raise ConfigError(f"{where}: 'system' must be one of {', '.join(SYSTEMS)}, got {raw['system']!r}")
    for key in ("setup", "description"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise ConfigError(f"{where}: {key!r} must be a non-empty string")
    hardware = raw["hardware"]
    if not isinstance(hardware, dict) or sorted(hardware) != sorted(HARDWARE_KEYS):
        raise ConfigError(f"{where}: 'hardware' must be a mapping with exactly the keys {', '.join(HARDWARE_KEYS)}")
    if not _int(hardware["nodes"]) or hardware["nodes"] < 1:
        raise ConfigError(f"{where}: 'hardware.nodes' must be an integer >= 1")
    if not _int(hardware["gpus_per_node"]) or hardware["gpus_per_node"] < 0:
        raise ConfigError(f"{where}: 'hardware.gpus_per_node' must be an integer >= 0 (0 = CPU)")
    average_last = raw["average_last"]
    if not _int(average_last) or average_last < 0:
        raise ConfigError(f"{where}: 'average_last' must be an integer >= 0 (0 = score the last checkpoint)")
    max_length = raw.get("train_max_length")
    if max_length is not None and (not _int(max_length) or max_length < 1):
        raise ConfigError(f"{where}: 'train_max_length' must be null or an integer >= 1")
    fairseq = _check_fairseq_section(where, raw["fairseq"])
    is_mtsa_arch = fairseq["arch"].startswith("transformer_mtsa")
    if is_mtsa_arch != (raw["system"] == "mtsa"):
        raise ConfigError(f"{where}: system {raw['system']!r} does not match arch {fairseq['arch']!r}")
    if bool(fairseq.get("cpu")) != (hardware["gpus_per_node"] == 0):
        raise ConfigError(f"{where}: 'hardware.gpus_per_node' is 0 exactly when the fairseq option 'cpu' is true")
    config = TrainConfig(
        path=path, name=name, system=raw["system"], setup=raw["setup"], description=raw["description"],
        nodes=hardware["nodes"], gpus_per_node=hardware["gpus_per_node"], average_last=average_last,
        train_max_length=max_length, fairseq=fairseq,
    )
    check_averaging(config.average_last, fairseq.get("save-interval-updates"), fairseq.get("keep-interval-updates"),
                    config.max_update, where)
    return config


def check_averaging(average_last: int, save_interval_updates: Any, keep_interval_updates: Any, max_update: int,
                    where: str) -> None:
    """Averaging the last N interval checkpoints needs fairseq to write and keep at least N of them, the
    newest at the final update."""
    if average_last <= 0:
        return
    if not _int(save_interval_updates) or save_interval_updates <= 0:
        raise ConfigError(f"{where}: averaging the last {average_last} checkpoints needs the fairseq option "
                          "'save-interval-updates' (a positive integer)")
    if not _int(keep_interval_updates) or not (keep_interval_updates == -1 or keep_interval_updates >= average_last):
        raise ConfigError(f"{where}: averaging the last {average_last} checkpoints needs the fairseq option "
                          f"'keep-interval-updates' >= {average_last} (or -1 = keep all)")
    if max_update % save_interval_updates:
        raise ConfigError(f"{where}: 'max-update' ({max_update}) must be a multiple of 'save-interval-updates' "
                          f"({save_interval_updates}) so that the newest averaged checkpoint is the final one")
    if max_update // save_interval_updates < average_last:
        raise ConfigError(f"{where}: training writes only {max_update // save_interval_updates} interval "
                          f"checkpoints, fewer than average_last = {average_last}")


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a config file (structure only; see :func:`check_with_fairseq` for option names)."""
    return config_from_dict(read_config_file(path), Path(path))


def fairseq_args(config: TrainConfig) -> list[str]:
    """The config's ``fairseq-train`` options (without the data directory and per-run options)."""
    return options_to_args(config.fairseq)


def check_with_fairseq(config: TrainConfig, data: str = "DATA") -> argparse.Namespace:
    """Check every option of ``config`` against ``fairseq-train``'s parser; return the parsed namespace."""
    return parse_fairseq_train(data, fairseq_args(config), option_origins(config.path, config.fairseq),
                               config.fairseq)
