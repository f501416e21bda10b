"""The files the pipeline's stages exchange: schema names, one checked JSON reader, one text line reader, and one
YAML reader.

``manifest.json`` (``scripts/prepare_data.py``; ``scripts/prepare_sentence_data.py`` writes its own layout),
``run.json`` (of every training run: ``mtsa-train-seeds`` and ``mtsa-sentence-experiment``) and result files
(``mtsa-score``; ``mtsa-evaluate-sentence`` for sentence tasks) each carry a ``schema`` key naming their layout and
version.

A path a record names is relative to the record's own folder (a result file's, or for ``run.json`` the run
directory), so that a tree of records reads the same wherever it is copied: :func:`relative_path` writes one,
:func:`record_path` reads one back (and takes an absolute path, which older records hold, as it is). In
``run.json`` these are ``checkpoint``, ``data``, ``config_path``, ``trained_in``, ``unreadable_checkpoint``, the
``averaged`` checkpoints, and every argument of ``command`` that names a file (written starting ``./`` or
``../``); :func:`read_run` returns them resolved, :func:`run_record_to_write` makes them relative.

Text files (corpora, references, hypotheses) are read line by line with :func:`iter_lines` at every stage, so
that data preparation, scoring and significance tests see the same lines: UTF-8 (a file that is not is refused,
naming the line), plain or gzip-compressed, lines ending at ``\\n`` only.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import yaml

MANIFEST_SCHEMA = "mtsa-fairseq.data.v1"
RUN_SCHEMA = "mtsa-fairseq.run.v1"
RESULT_SCHEMA = "mtsa-fairseq.result.v1"
SENTENCE_RESULT_SCHEMA = "mtsa-fairseq.sentence-result.v1"
SENTENCE_DATA_SCHEMA = "mtsa-fairseq.sentence-data.v1"
SENTENCE_KINDS = ("single", "pair", "relatedness")  # what one example of a sentence dataset holds
IDS_KEY = "ids_sha256"  # a sentence_encoding checkpoint's task state: SHA-256 of its dictionary words and label names
BLEU_METRICS = ("sacrebleu", "sacrebleu_lc", "tokenized_compound_split", "t2t_intl")  # the BLEU values of a result file
# sacreBLEU's BLEU options of the metrics that detokenised text alone gives (tokenized_compound_split also needs the
# target language's Moses tokeniser)
SACREBLEU_OPTIONS: dict[str, dict[str, Any]] = {"sacrebleu": {}, "sacrebleu_lc": {"lowercase": True},
                                                "t2t_intl": {"tokenize": "intl"}}
RUN_PATHS = ("checkpoint", "data", "config_path", "trained_in", "unreadable_checkpoint")  # run.json's path fields


def relative_path(path: str | Path, folder: str | Path) -> str:
    """``path`` as a record in ``folder`` names it: relative to ``folder`` (a relative ``path`` is taken from the
    current directory)."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(folder))


def record_path(value: str | Path, folder: str | Path) -> Path:
    """The file a record in ``folder`` names ``value``: relative to ``folder``, or absolute (older records)."""
    return Path(os.path.normpath(os.path.join(folder, value)))


def _names_file(argument: str) -> bool:
    """Whether a command argument in run.json is a path relative to the run directory (``.``, ``./``, ``../``)."""
    return argument in (".", "..") or argument.startswith(("./", "../"))


def _command_argument(argument: str, run_dir: Path) -> str:
    """One argument of a command as run.json holds it: a path (absolute, or ``.``, ``./``, ``../`` from the
    current directory) relative to ``run_dir``, in a form :func:`_names_file` knows; anything else as it is."""
    if not (os.path.isabs(argument) or _names_file(argument)):
        return argument
    relative = relative_path(argument, run_dir)
    return relative if _names_file(relative) else f"./{relative}"


def run_record_to_write(run_dir: str | Path, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` as run.json in ``run_dir`` holds it: its paths (:data:`RUN_PATHS`, ``averaged``, the
    command's file arguments) relative to ``run_dir``."""
    run_dir = Path(run_dir)
    out = {**record, **{key: relative_path(record[key], run_dir) for key in RUN_PATHS if record.get(key)}}
    if record.get("averaged"):
        out["averaged"] = [relative_path(path, run_dir) for path in record["averaged"]]
    if record.get("command"):
        out["command"] = [_command_argument(str(argument), run_dir) for argument in record["command"]]
    return out


def read_run(run_dir: Path, error: type[Exception] = ValueError) -> dict[str, Any]:
    """``RUN_DIR/run.json`` of a training run (schema :data:`RUN_SCHEMA`) with its paths resolved (relative to
    ``run_dir`` if ``run_dir`` is); anything else raises ``error``."""
    record = read_json(Path(run_dir) / "run.json", RUN_SCHEMA, "run file", error)
    for key in RUN_PATHS:
        if record.get(key):
            record[key] = str(record_path(record[key], run_dir))
    if record.get("averaged"):
        record["averaged"] = [str(record_path(path, run_dir)) for path in record["averaged"]]
    if record.get("command"):
        record["command"] = [str(record_path(a, run_dir)) if _names_file(a) else a for a in record["command"]]
    return record


def not_found(what: str, path: str | Path) -> str:
    """The one line for a file ``path`` that is not there: ``<what> not found: <path>``, or, for a directory,
    ``<what> <path> is a directory, not a file``."""
    return f"{what} {path} is a directory, not a file" if Path(path).is_dir() else f"{what} not found: {path}"


def read_json(path: Path, schema: str, what: str, error: type[Exception]) -> dict[str, Any]:
    """A JSON object file of the given ``schema``; anything else raises ``error`` naming ``what``."""
    if not path.is_file():
        raise error(not_found(what, path))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{what} {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != schema:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise error(f"{what} {path} has schema {found!r}, expected {schema!r}")
    return data


_RESULT_REQUIRED = ("system", "test_set", "num_params", "num_sentences", "hypotheses", "references", "bleu")
# Field types of a result file, so that a seed "1" is refused rather than left out of the pairing with seed 1.
_RESULT_TYPES: dict[str, tuple[type, ...]] = {
    "system": (str,), "test_set": (str,), "setup": (str,), "seed": (int,), "num_params": (int,),
    "num_sentences": (int,), "hypotheses": (str,), "references": (str,)}
_RESULT_OPTIONAL = ("setup", "seed")


def read_result(path: Path, error: type[Exception]) -> dict[str, Any]:
    """A translation result file (:data:`RESULT_SCHEMA`) whose fields are there and of their types (``bleu`` an
    object); anything else raises ``error`` naming the file and the field."""
    data = read_json(path, RESULT_SCHEMA, "result file", error)
    missing = [key for key in _RESULT_REQUIRED if data.get(key) is None]
    if missing:
        raise error(f"{path} lacks {', '.join(missing)}")
    if not isinstance(data["bleu"], dict):
        raise error(f"{path}: bleu must be an object of BLEU values, not {type(data['bleu']).__name__}")
    for key, types in _RESULT_TYPES.items():
        value = data.get(key)
        if not (isinstance(value, types) and not isinstance(value, bool)) and not (value is None and
                                                                                    key in _RESULT_OPTIONAL):
            raise error(f"{path}: {key} must be {' or '.join(t.__name__ for t in types)}, got {value!r}")
    return data


# ------------------------------------------------------------------------------------------------ text


def checksums(root: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes": size, "sha256": hex digest}}`` of the files ``names`` (relative to ``root``), the
    identity a ``manifest.json`` records of its binarized files and dictionaries."""
    found = {}
    for name in sorted(names):
        with open(Path(root) / name, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
            found[name] = {"bytes": os.fstat(f.fileno()).st_size, "sha256": digest}
    return found


def check_checksums(root: Path, recorded: dict[str, dict[str, Any]], error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming the first file under ``root`` that differs from its ``recorded`` :func:`checksums`
    (every size first, then the digests); a manifest that recorded none (older data) checks nothing."""
    for name, entry in recorded.items():
        path = Path(root) / name
        if not path.is_file() or path.stat().st_size != entry["bytes"]:
            raise error(f"{path} changed after preparation (size differs from {Path(root) / 'manifest.json'}); "
                        "prepare the data again")
    for name, entry in checksums(root, recorded).items():
        if entry["sha256"] != recorded[name]["sha256"]:
            raise error(f"{Path(root) / name} changed after preparation (SHA-256 differs from "
                        f"{Path(root) / 'manifest.json'}); prepare the data again")


def check_dictionaries(run: dict[str, Any] | None, checkpoint: Path, data_dir: Path,
                       error: type[Exception] = ValueError) -> None:
    """Raise ``error`` when the dictionaries ``run`` (the checkpoint's run.json) recorded, their SHA-256, are not
    those of ``data_dir``: the same size or not, the token ids would mean other words. A run that recorded none
    (an older run.json) checks nothing."""
    recorded = (run or {}).get("dictionaries") or {}
    missing = [name for name in recorded if not (Path(data_dir) / name).is_file()]
    if missing:
        raise error(f"{Path(data_dir) / missing[0]} not found: {checkpoint} was trained with a {missing[0]} (its "
                    "run.json records it)")
    differs = [name for name, entry in checksums(data_dir, recorded).items() if entry["sha256"] != recorded[name]]
    if differs:
        raise error(f"{checkpoint} was trained with another {differs[0]} than {Path(data_dir) / differs[0]} "
                    "(its run.json records the dictionaries it was trained with): use it on its own data")


def run_beside(checkpoint: Path, error: type[Exception] = ValueError) -> dict[str, Any] | None:
    """The run.json in ``checkpoint``'s directory (:func:`read_run`), None where there is none."""
    return read_run(Path(checkpoint).parent, error) if (Path(checkpoint).parent / "run.json").is_file() else None


def read_sentence_manifest(data: str | Path) -> dict[str, Any]:
    """A prepared sentence dataset's ``manifest.json``, its files checked against the checksums it recorded;
    ``ValueError`` naming the problem otherwise."""
    path = Path(data) / "manifest.json"
    if not path.is_file():
        raise ValueError(f"{data} has no manifest.json (prepare it with scripts/prepare_sentence_data.py)")
    manifest = read_json(path, SENTENCE_DATA_SCHEMA, "manifest", ValueError)
    if manifest.get("kind") not in SENTENCE_KINDS:
        raise ValueError(f"{path}: kind must be one of {SENTENCE_KINDS}, got {manifest.get('kind')!r}")
    check_checksums(Path(data), manifest.get("checksums") or {})
    return manifest


def open_binary(path: Path) -> BinaryIO:
    """Open ``path`` for reading bytes, decompressing gzip (recognised by its magic bytes, whatever the name)."""
    with open(path, "rb") as f:
        is_gzip = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if is_gzip else open(path, "rb")


def _utf8(data: bytes, path: Path, line: int, error: type[Exception]) -> str:
    """``data`` (starting at line ``line`` of ``path``) decoded; invalid UTF-8 raises ``error`` naming its line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line += data.count(b"\n", 0, exc.start)
        raise error(f"{path}:{line}: not valid UTF-8") from None


def iter_lines(path: Path, error: type[Exception] = ValueError) -> Iterator[str]:
    """The lines of a UTF-8 text file, plain or gzip, without their ``\\n``.

    Lines end at ``\\n`` only: a ``\\r`` (also one before the ``\\n``) or U+2028 stays in its line, and a last line
    without ``\\n`` counts. A byte-order mark at the start of the file is removed. A line that is not valid UTF-8
    raises ``error`` with ``FILE:LINE: not valid UTF-8``, a file that cannot be read ``error`` naming it.
    """
    try:
        with open_binary(path) as f:
            for number, raw in enumerate(f, 1):
                text = _utf8(raw.removesuffix(b"\n"), path, number, error)
                yield text.removeprefix("\ufeff") if number == 1 else text
    except (OSError, EOFError, zlib.error) as exc:  # zlib.error, EOFError: a damaged or truncated gzip file
        raise error(f"cannot read {path}: {exc}") from exc


def read_lines(path: Path, error: type[Exception] = ValueError) -> list[str]:
    """All lines of ``path`` as :func:`iter_lines` yields them."""
    return list(iter_lines(path, error))


# ------------------------------------------------------------------------------------------------ YAML


class _DuplicateKey(yaml.YAMLError):
    """A mapping gives the same key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with a repeated key (keys merged in with ``<<`` may be overridden)."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    repeated = key in first
                except TypeError:  # an unhashable key, which the SafeLoader refuses
                    continue
                if repeated:
                    raise _DuplicateKey(f"key {key!r} given twice (lines {first[key]} and {line})")
                first[key] = line
        return super().construct_mapping(node, deep)


def load_yaml(path: Path) -> Any:
    """Parse a UTF-8 YAML file as ``yaml.safe_load`` does, but refuse a mapping that repeats a key.

    A repeated key, a syntax error or bytes that are not UTF-8 raise ValueError naming the file and line(s).
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    text = _utf8(data, path, 1, ValueError)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as exc:
        raise ValueError(f"{path}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        context = f"{exc.context} (line {exc.context_mark.line + 1}): " if exc.context and exc.context_mark else ""
        raise ValueError(f"{path}:{exc.problem_mark.line + 1}: not valid YAML: {context}{exc.problem}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise ValueError(f"{path}:{line}: not valid YAML: unacceptable character #x{exc.character:04x}: "
                         f"{exc.reason}") from None
