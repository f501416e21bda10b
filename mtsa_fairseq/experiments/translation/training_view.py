"""The data a launch trains on: ``--data`` resolved to a data-bin, and the length-filtered training view
(the training subset's ``.idx`` files rewritten, every other file linked)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtsa_fairseq.contracts import MANIFEST_SCHEMA, check_checksums, checksums, read_json
from mtsa_fairseq.experiments.errors import LaunchError

_INDEX_MAGIC = b"MMIDIDX\x00\x00"


@dataclass(frozen=True)
class DataSource:
    """The ``--data`` directory: a prepared directory with ``manifest.json`` (contract 1) or a data-bin;
    ``dictionaries`` maps each ``dict.<lang>.txt`` to its SHA-256, which run.json records."""

    given: Path
    data_bin: Path
    source_lang: str | None = None
    target_lang: str | None = None
    dictionaries: dict[str, str] = field(default_factory=dict)


def resolve_data(path: str | Path) -> DataSource:
    """Find the fairseq data-bin of ``path`` and check it has a dictionary and, if prepared, that its files are
    those its manifest recorded."""
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
        check_checksums(given, manifest.get("checksums", {}), LaunchError)
    if not data_bin.is_dir():
        raise LaunchError(f"data-bin directory {data_bin} does not exist")
    langs = [lang for lang in (source, target) if lang]
    missing = [f"dict.{lang}.txt" for lang in langs if not (data_bin / f"dict.{lang}.txt").is_file()]
    if missing or not any(data_bin.glob("dict.*.txt")):
        raise LaunchError(f"{data_bin} has no fairseq dictionary ({', '.join(missing) or 'dict.*.txt'}): "
                          "give a fairseq-preprocess output or a prepared data directory")
    found = checksums(data_bin, [p.name for p in data_bin.glob("dict.*.txt")])
    return DataSource(given, data_bin, source, target, {name: entry["sha256"] for name, entry in found.items()})


def language_pair(data_bin: Path, subset: str, source: str | None, target: str | None) -> tuple[str, str]:
    if source and target:
        return source, target
    pairs = {p.name.split(".")[1] for p in data_bin.glob(f"{subset}.*-*.*.idx")}
    if len(pairs) != 1:
        raise LaunchError(f"cannot tell the language pair of {data_bin} from its '{subset}' files "
                          f"(found {sorted(pairs) or 'none'}); set source-lang/target-lang in the config")
    src, tgt = pairs.pop().split("-")
    return src, tgt


def subset_shards(data_bin: Path, subset: str, src: str, tgt: str) -> list[str]:
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


def read_index(path: Path) -> tuple[bytes, np.ndarray, np.ndarray]:
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
    """A data directory whose training subset holds only pairs of at most ``max_length`` tokens per side (EOS
    included): its ``.idx`` files rewritten, every other file (the ``.bin`` token files too) a link to the data-bin."""

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
        shards = subset_shards(self.source, self.subset, self.src, self.tgt)
        filtered = {f"{s}.{self.src}-{self.tgt}.{lang}.idx" for s in shards for lang in (self.src, self.tgt)}
        for entry in sorted(self.source.iterdir()):
            if entry.is_file() and entry.name not in filtered:
                (tmp / entry.name).symlink_to(entry.resolve())
        kept_total = pairs_total = 0
        for shard in shards:
            prefix = f"{shard}.{self.src}-{self.tgt}"
            src_head, src_sizes, src_ptr = read_index(self.source / f"{prefix}.{self.src}.idx")
            tgt_head, tgt_sizes, tgt_ptr = read_index(self.source / f"{prefix}.{self.tgt}.idx")
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
