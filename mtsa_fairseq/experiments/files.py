"""Outputs that are whole or absent: every command's results, reports, tables and plots are written to a
temporary file in the same directory, flushed to disk and renamed over the target, so a full disk, a crash
or Ctrl-C leaves the previous file (or none), never a truncated one. A result that is empty or unreadable
(left by an older version or by hand) counts as absent, and the commands say so."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mtsa_fairseq.experiments.errors import DataError
from mtsa_fairseq.experiments.processes import RunLock


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that wants a file name (e.g. matplotlib's ``savefig``):
    when the block ends without an error the file is synced and renamed to ``path``; otherwise it is removed. An
    OSError about the temporary names ``path`` instead."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{path.suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if str(tmp) not in (str(err.filename), str(err.filename2)):
            raise
        raise OSError(err.errno, err.strerror, str(path)) from None
    finally:
        tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the rename itself reaches the disk with the directory
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8 with ``\\n`` line ends) to ``path`` whole or not at all."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_json(path: str | Path, value: Any, indent: int = 1) -> None:
    """``value`` as JSON, written atomically."""
    write_atomic(path, json.dumps(value, indent=indent) + "\n")


def readable_json(path: str | Path) -> bool:
    """Whether ``path`` holds a JSON object: a result file that can count as finished."""
    try:
        return isinstance(json.loads(Path(path).read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def staging_dir(out: Path) -> Iterator[Path]:
    """A new hidden sibling of ``out`` to build it in (the caller renames it into place; otherwise it is removed),
    under a lock that refuses a second live preparation of ``out``; killed preparations' temporaries go first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with RunLock(out.parent / f".{out.name}.lock", f"output {out}", "preparation").acquire(DataError):
        for stale in out.parent.glob(f".{out.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def publish_dir(tmp: Path, out: Path, manifest: dict) -> None:
    """Finish the staged directory ``tmp``: write its ``manifest.json``, give it a new directory's permissions
    (the umask's) and rename it to ``out``, replacing an existing ``out``."""
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    if not out.exists():
        tmp.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    out.rename(old / out.name)
    tmp.rename(out)
    shutil.rmtree(old)
