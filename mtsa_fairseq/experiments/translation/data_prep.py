"""Prepare a raw parallel corpus for fairseq (``scripts/prepare_data.py``): normalise, filter, sentencepiece, binarise
into the prepared data directory (``manifest.json``, ``bin/``, ``spm.model``, ``raw/``; :func:`build_manifest`).
Reading, normalisation (:func:`normalize`) and the training-only filters: docs/experiment.md (1. Data)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import sentencepiece as spm

from mtsa_fairseq.contracts import MANIFEST_SCHEMA, checksums, iter_lines, not_found, open_binary
from mtsa_fairseq.experiments.errors import DataError
from mtsa_fairseq.experiments.files import publish_dir, staging_dir
from mtsa_fairseq.experiments.processes import child_options, stop_group
from mtsa_fairseq.experiments.translation.training_view import read_index

NORMALIZATIONS = ("nfkc", "nfc", "none")
MODEL_TYPES = ("unigram", "bpe")
_NAME = re.compile(r"[^\W_][\w.-]*")  # letters of any script, digits, then also "._-"
_CHUNK = 10_000
_PROGRESS_EVERY = 1_000_000

# Cc (U+0000-001F, U+007F-009F): the whitespace ones become spaces, the others (and the BOM) are deleted.
_CONTROL = {c: (" " if chr(c).isspace() else None) for c in (*range(0x20), *range(0x7F, 0xA0))}
_CONTROL[0xFEFF] = None


@dataclass(frozen=True)
class Corpus:
    """A parallel corpus: two line-aligned files."""

    src: Path
    tgt: Path


@dataclass(frozen=True)
class NamedCorpus:
    """A named test set: becomes fairseq subset ``test``, ``test1``, ... in the order given."""

    name: str
    src: Path
    tgt: Path


@dataclass
class PrepareConfig:
    """Everything :func:`prepare` needs. Exactly one of ``valid`` and ``valid_every`` is set."""

    source_lang: str
    target_lang: str
    train: list[Corpus]
    out: Path
    valid: Corpus | None = None
    valid_every: int | None = None
    tests: list[NamedCorpus] = field(default_factory=list)
    vocab_size: int = 32_000
    model_type: str = "unigram"
    character_coverage: float = 1.0
    spm_input_sentence_size: int = 10_000_000
    max_tokens: int = 256
    max_ratio: float | None = None
    normalization: str = "nfkc"
    workers: int = 1
    seed: int = 1
    overwrite: bool = False


@dataclass
class TrainStats:
    """Training pairs read (held-out valid pairs excluded), kept, and dropped by reason."""

    lines: int = 0
    dropped_empty: int = 0
    dropped_too_long: int = 0
    dropped_ratio: int = 0

    @property
    def kept(self) -> int:
        return self.lines - self.dropped_empty - self.dropped_too_long - self.dropped_ratio


# ----------------------------------------------------------------------------------------------- text
def normalize(text: str, form: str = "nfkc") -> str:
    """Normalise one line (docs/experiment.md, 1. Data); ``form`` is ``nfkc``, ``nfc`` or ``none``."""
    if form not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {form!r}; choose from {', '.join(NORMALIZATIONS)}")
    text = text.translate(_CONTROL)
    if form != "none":
        text = unicodedata.normalize(form.upper(), text)
    return " ".join(text.split())


def filter_reason(src_len: int, tgt_len: int, max_tokens: int, max_ratio: float | None) -> str | None:
    """Why a training pair of ``src_len`` / ``tgt_len`` pieces is dropped (empty, too_long, ratio), or None."""
    if src_len == 0 or tgt_len == 0:
        return "empty"
    if src_len > max_tokens or tgt_len > max_tokens:
        return "too_long"
    if max_ratio is not None and max(src_len, tgt_len) > max_ratio * min(src_len, tgt_len):
        return "ratio"
    return None


# ------------------------------------------------------------------------------------------ reading
def count_lines(path: Path) -> int:
    """Number of lines as :func:`iter_lines` yields them; a line that is not UTF-8 raises DataError naming it."""
    return sum(1 for _ in iter_lines(path, DataError))


def check_pair(src: Path, tgt: Path, what: str) -> int:
    """Check that both files exist, are non-empty and have the same number of lines; return that number."""
    counts = []
    for path in (src, tgt):
        if not path.is_file():
            raise DataError(f"{what}: {not_found('file', path)}")
        n = count_lines(path)
        if n == 0:
            raise DataError(f"{what}: empty file: {path}")
        counts.append(n)
    if counts[0] != counts[1]:
        raise DataError(f"{what}: misaligned line counts: {src} has {counts[0]} lines, {tgt} has {counts[1]}")
    return counts[0]


# --------------------------------------------------------------------------------------- validation
def _check_dir_target(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise DataError(f"--out {out} exists and is not empty; pass --overwrite to replace it")
        if not (out / "manifest.json").is_file():
            raise DataError(f"--overwrite refuses to replace {out}: it is not a prepared data directory "
                            "(no manifest.json)")


def check_options(cfg: PrepareConfig) -> None:
    """Raise :class:`DataError` for option values that no input makes right (the command's usage errors)."""
    for flag, lang in (("--source-lang", cfg.source_lang), ("--target-lang", cfg.target_lang)):
        if not _NAME.fullmatch(lang):
            raise DataError(f"{flag} {lang!r} is not a valid language code (letters, digits, '.', '_', '-')")
    if cfg.source_lang == cfg.target_lang:
        raise DataError(f"--source-lang and --target-lang are both {cfg.source_lang!r}")
    if not cfg.train:
        raise DataError("no --train corpus given")
    if (cfg.valid is None) == (cfg.valid_every is None):
        raise DataError("give exactly one of --valid and --valid-from-train")
    if cfg.valid_every is not None and cfg.valid_every < 2:
        raise DataError(f"--valid-from-train must be at least 2, got {cfg.valid_every}")
    for flag, value, low in (("--vocab-size", cfg.vocab_size, 1), ("--max-tokens-per-sentence", cfg.max_tokens, 1),
                             ("--spm-input-sentence-size", cfg.spm_input_sentence_size, 1),
                             ("--workers", cfg.workers, 1), ("--seed", cfg.seed, 0)):
        if value < low:
            raise DataError(f"{flag} must be at least {low}, got {value}")
    if cfg.max_ratio is not None and cfg.max_ratio < 1:
        raise DataError(f"--max-length-ratio must be at least 1, got {cfg.max_ratio}")
    if not 0.98 <= cfg.character_coverage <= 1.0:  # sentencepiece's own bounds
        raise DataError(f"--character-coverage must be in [0.98, 1.0], got {cfg.character_coverage}")
    if cfg.model_type not in MODEL_TYPES:
        raise DataError(f"--model-type must be one of {', '.join(MODEL_TYPES)}, got {cfg.model_type!r}")
    if cfg.normalization not in NORMALIZATIONS:
        raise DataError(f"--normalization must be one of {', '.join(NORMALIZATIONS)}, got {cfg.normalization!r}")
    names = [t.name for t in cfg.tests]
    for name in names:
        if not _NAME.fullmatch(name):
            raise DataError(f"--test name {name!r} must be letters, digits, '.', '_', '-' (it names raw/ files)")
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise DataError(f"duplicate --test name: {', '.join(dupes)}")


def validate(cfg: PrepareConfig) -> dict[str, int]:
    """Check everything that can be checked before writing (:func:`check_options`, the output directory, the
    files); return line counts by split name: ``train`` (all training pairs, held-out valid ones included),
    ``valid``, and each test name."""
    check_options(cfg)
    _check_dir_target(cfg.out, cfg.overwrite)

    counts = {"train": sum(check_pair(c.src, c.tgt, "--train") for c in cfg.train)}
    if cfg.valid is not None:
        counts["valid"] = check_pair(cfg.valid.src, cfg.valid.tgt, "--valid")
    else:
        counts["valid"] = counts["train"] // cfg.valid_every
        if counts["valid"] == 0:
            raise DataError(f"--valid-from-train {cfg.valid_every} holds out nothing: the training data has only "
                            f"{counts['train']} lines")
    for t in cfg.tests:
        counts[t.name] = check_pair(t.src, t.tgt, f"--test {t.name}")
    return counts


# ------------------------------------------------------------------------------------ normalisation
def _open_out(path: Path) -> TextIO:
    return open(path, "w", encoding="utf-8", newline="\n")


def normalize_train(corpora: list[Corpus], form: str, out: tuple[Path, Path], valid_every: int | None = None,
                    valid_out: tuple[Path, Path] | None = None,
                    log: Callable[[str], None] = print) -> tuple[TrainStats, int]:
    """Normalise the concatenated training corpora into ``out``, dropping pairs with an empty side; with ``valid_every``
    = N, every N-th pair goes, unfiltered, to ``valid_out``. Returns the training statistics and the pairs held out."""
    stats, held_out, index = TrainStats(), 0, 0
    with ExitStack() as stack:
        train_files = [stack.enter_context(_open_out(p)) for p in out]
        valid_files = [stack.enter_context(_open_out(p)) for p in valid_out or ()]
        for corpus in corpora:
            for raw_src, raw_tgt in zip(iter_lines(corpus.src, DataError), iter_lines(corpus.tgt, DataError)):
                index += 1
                if index % _PROGRESS_EVERY == 0:
                    log(f"[prepare] normalised {index:,} training pairs")
                src, tgt = normalize(raw_src, form), normalize(raw_tgt, form)
                if valid_every is not None and index % valid_every == 0:
                    held_out += 1
                    files = valid_files
                else:
                    stats.lines += 1
                    if not src or not tgt:
                        stats.dropped_empty += 1
                        continue
                    files = train_files
                files[0].write(src + "\n")
                files[1].write(tgt + "\n")
    return stats, held_out


def normalize_file(src: Path, dst: Path, form: str) -> None:
    """Normalise every line of ``src`` into ``dst``; no line is dropped."""
    with _open_out(dst) as f:
        for line in iter_lines(src, DataError):
            f.write(normalize(line, form) + "\n")


def copy_decompressed(src: Path, dst: Path) -> None:
    """Copy ``src`` byte for byte, decompressing gzip."""
    with open_binary(src) as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


# ------------------------------------------------------------------------------------ sentencepiece
def train_sentencepiece(inputs: list[Path], model_prefix: Path, vocab_size: int, model_type: str = "unigram",
                        character_coverage: float = 1.0, input_sentence_size: int = 10_000_000, workers: int = 1,
                        seed: int = 1) -> spm.SentencePieceProcessor:
    """Train one sentencepiece model on all lines of ``inputs`` (sampled down to ``input_sentence_size``)."""
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            input=[str(p) for p in inputs], model_prefix=str(model_prefix), vocab_size=vocab_size,
            model_type=model_type, character_coverage=character_coverage,
            input_sentence_size=input_sentence_size, shuffle_input_sentence=True, num_threads=workers,
            normalization_rule_name="identity", minloglevel=1,
        )
    except RuntimeError as e:
        message = str(e)
        if m := re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", message):
            raise DataError(f"--vocab-size {m[1]} is too large for this training data: sentencepiece "
                            f"({model_type}) allows at most {m[2]}") from e
        raise DataError(f"sentencepiece training failed: {message.splitlines()[0] if message else e!r}") from e
    return spm.SentencePieceProcessor(model_file=f"{model_prefix}.model")


class PieceEncoder:
    """Encode lines to space-separated pieces; unknown characters become ``<unk>`` (fairseq's unknown word)."""

    def __init__(self, sp: spm.SentencePieceProcessor, workers: int = 1):
        self.sp, self.workers = sp, workers
        self.pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        self.pieces[sp.unk_id()] = "<unk>"

    def encode(self, lines: list[str]) -> list[list[str]]:
        ids = self.sp.encode(lines, num_threads=self.workers)
        return [[self.pieces[i] for i in sent] for sent in ids]


def _chunks(path: Path) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in iter_lines(path):
        chunk.append(line)
        if len(chunk) >= _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def encode_file(encoder: PieceEncoder, src: Path, dst: Path) -> None:
    """Encode every line of ``src`` into ``dst``; an empty line stays empty."""
    with _open_out(dst) as f:
        for chunk in _chunks(src):
            f.writelines(" ".join(pieces) + "\n" for pieces in encoder.encode(chunk))


def encode_train(encoder: PieceEncoder, src: tuple[Path, Path], dst: tuple[Path, Path], stats: TrainStats,
                 max_tokens: int, max_ratio: float | None, log: Callable[[str], None] = print) -> None:
    """Encode the normalised training pairs and apply the length filters, counting drops in ``stats``."""
    done = 0
    with _open_out(dst[0]) as fsrc, _open_out(dst[1]) as ftgt:
        for chunk_src, chunk_tgt in zip(_chunks(src[0]), _chunks(src[1])):
            for s, t in zip(encoder.encode(chunk_src), encoder.encode(chunk_tgt)):
                reason = filter_reason(len(s), len(t), max_tokens, max_ratio)
                if reason is None:
                    fsrc.write(" ".join(s) + "\n")
                    ftgt.write(" ".join(t) + "\n")
                else:
                    setattr(stats, f"dropped_{reason}", getattr(stats, f"dropped_{reason}") + 1)
            before, done = done, done + len(chunk_src)
            if done // _PROGRESS_EVERY > before // _PROGRESS_EVERY:
                log(f"[prepare] encoded {done:,} training pairs")


# ------------------------------------------------------------------------------------------- fairseq
def binarize(workdir: Path, source_lang: str, target_lang: str, num_tests: int, workers: int) -> None:
    """Run ``fairseq-preprocess --joined-dictionary`` on ``workdir/work/{train,valid,test*}`` into ``workdir/bin``
    (paths relative to ``workdir``: fairseq splits ``--testpref`` on commas)."""
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", source_lang, "--target-lang", target_lang,
           "--trainpref", "work/train", "--validpref", "work/valid", "--destdir", "bin", "--joined-dictionary",
           "--workers", str(workers)]
    if num_tests:
        cmd += ["--testpref", ",".join(f"work/test{k}" for k in range(num_tests))]
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **child_options())
    try:
        stdout, stderr = proc.communicate()
    except BaseException:
        stop_group(proc)
        raise
    if proc.returncode != 0:
        tail = (stderr or stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise DataError(f"fairseq-preprocess failed with exit code {proc.returncode}: {tail[0]}")


def subset_name(k: int) -> str:
    """fairseq's name for the k-th ``--testpref``: test, test1, test2, ..."""
    return "test" if k == 0 else f"test{k}"


def binarized_sizes(bin_dir: Path, subset: str, source_lang: str, target_lang: str) -> tuple[int, int]:
    """Number of sentences of ``subset`` on each side of a fairseq-preprocess output directory."""
    sizes = []
    for lang in (source_lang, target_lang):
        index = bin_dir / f"{subset}.{source_lang}-{target_lang}.{lang}.idx"
        sizes.append(len(read_index(index)[1]) if index.is_file() and index.with_suffix(".bin").is_file() else 0)
    return sizes[0], sizes[1]


def dictionary_size(bin_dir: Path, lang: str) -> int:
    """Entries of fairseq's dictionary (its 4 special symbols included)."""
    with open(bin_dir / f"dict.{lang}.txt", encoding="utf-8") as f:
        return 4 + sum(1 for _ in f)


# ------------------------------------------------------------------------------------------ manifest
def build_manifest(cfg: PrepareConfig, vocab_size: int, train: TrainStats, valid_lines: int,
                   test_lines: dict[str, int], files: dict[str, dict]) -> dict:
    """The ``manifest.json`` of a prepared directory (schema ``mtsa-fairseq.data.v1``, paths relative to it):
    ``train.lines`` counts training pairs read (held-out valid pairs excluded), ``train.kept`` those binarised;
    ``tests`` maps each test name to its subset, line count and untouched text; ``checksums`` holds ``files``."""
    src, tgt = cfg.source_lang, cfg.target_lang
    return {
        "schema": MANIFEST_SCHEMA, "source_lang": src, "target_lang": tgt, "data_bin": "bin", "spm_model": "spm.model",
        "vocab_size": vocab_size, "normalization": cfg.normalization,
        "train": {"lines": train.lines, "kept": train.kept, "dropped_empty": train.dropped_empty,
                  "dropped_too_long": train.dropped_too_long, "dropped_ratio": train.dropped_ratio},
        "valid": {"lines": valid_lines, "subset": "valid"},
        "tests": {t.name: {"subset": subset_name(k), "lines": test_lines[t.name], "source": f"raw/{t.name}.{src}",
                           "reference": f"raw/{t.name}.{tgt}"} for k, t in enumerate(cfg.tests)},
        "checksums": files,
    }


# ------------------------------------------------------------------------------------------- prepare
def prepare(cfg: PrepareConfig, log: Callable[[str], None] = print) -> dict:
    """Validate, then write the prepared directory ``cfg.out`` (staged in a hidden sibling: on any error or
    interrupt ``cfg.out`` is left as it was); return its manifest."""
    counts = validate(cfg)
    src_lang, tgt_lang = cfg.source_lang, cfg.target_lang
    out = cfg.out.absolute()
    with staging_dir(out) as tmp:
        work = tmp / "work"
        (tmp / "raw").mkdir()
        work.mkdir()
        stats = _normalize_splits(cfg, tmp, counts, log)
        log(f"[prepare] training a joint sentencepiece {cfg.model_type} model, vocabulary {cfg.vocab_size:,}, "
            f"on {stats.kept:,} pairs")
        norm_train = (work / f"train.norm.{src_lang}", work / f"train.norm.{tgt_lang}")
        sp = train_sentencepiece(list(norm_train), tmp / "spm", cfg.vocab_size, cfg.model_type,
                                 cfg.character_coverage, cfg.spm_input_sentence_size, cfg.workers, cfg.seed)
        _encode_splits(cfg, work, PieceEncoder(sp, cfg.workers), stats, log)
        log(f"[prepare] fairseq-preprocess --joined-dictionary --workers {cfg.workers}")
        binarize(tmp, src_lang, tgt_lang, len(cfg.tests), cfg.workers)
        expected = {"train": stats.kept, "valid": counts["valid"]}
        expected.update({subset_name(k): counts[t.name] for k, t in enumerate(cfg.tests)})
        for subset, n in expected.items():
            sizes = binarized_sizes(tmp / "bin", subset, src_lang, tgt_lang)
            if sizes != (n, n):
                raise DataError(f"fairseq-preprocess wrote {sizes} sentences for {subset}, expected {n}")
        binarized = [f"bin/{p.name}" for p in (tmp / "bin").iterdir() if p.suffix in (".bin", ".idx", ".txt")]
        manifest = build_manifest(cfg, sp.get_piece_size(), stats, counts["valid"],
                                  {t.name: counts[t.name] for t in cfg.tests}, checksums(tmp, binarized))
        shutil.rmtree(work)
        publish_dir(tmp, out, manifest)
    _log_summary(cfg, out, stats, counts, manifest, log)
    return manifest


def _normalize_splits(cfg: PrepareConfig, tmp: Path, counts: dict[str, int], log: Callable[[str], None]) -> TrainStats:
    """Normalised text of every split into ``tmp/work`` (``<split>.norm.<lang>``), the untouched test text into
    ``tmp/raw``; returns the training statistics so far."""
    src_lang, tgt_lang = cfg.source_lang, cfg.target_lang
    work = tmp / "work"
    log(f"[prepare] normalising {counts['train']:,} training pairs ({cfg.normalization})")
    norm_train = (work / f"train.norm.{src_lang}", work / f"train.norm.{tgt_lang}")
    norm_valid = (work / f"valid.norm.{src_lang}", work / f"valid.norm.{tgt_lang}")
    stats, held_out = normalize_train(cfg.train, cfg.normalization, norm_train, cfg.valid_every,
                                      norm_valid if cfg.valid_every else None, log)
    if cfg.valid is not None:
        for path, dst in zip((cfg.valid.src, cfg.valid.tgt), norm_valid):
            normalize_file(path, dst, cfg.normalization)
    else:
        log(f"[prepare] held out every {cfg.valid_every}th training pair as valid: {held_out:,} pairs")
    for k, t in enumerate(cfg.tests):
        for path, lang in ((t.src, src_lang), (t.tgt, tgt_lang)):
            copy_decompressed(path, tmp / "raw" / f"{t.name}.{lang}")
            normalize_file(path, work / f"test{k}.norm.{lang}", cfg.normalization)
    if stats.kept == 0:
        raise DataError(f"no training pairs left: all {stats.lines} have an empty side after normalisation")
    return stats


def _encode_splits(cfg: PrepareConfig, work: Path, encoder: PieceEncoder, stats: TrainStats,
                   log: Callable[[str], None]) -> None:
    """Pieces for every split (``<split>.<lang>``); the training pairs are filtered by length here."""
    src_lang, tgt_lang = cfg.source_lang, cfg.target_lang
    log("[prepare] encoding to pieces and filtering training pairs")
    encode_train(encoder, (work / f"train.norm.{src_lang}", work / f"train.norm.{tgt_lang}"),
                 (work / f"train.{src_lang}", work / f"train.{tgt_lang}"), stats, cfg.max_tokens, cfg.max_ratio, log)
    if stats.kept == 0:
        raise DataError(f"no training pairs left after the length filters (--max-tokens-per-sentence "
                        f"{cfg.max_tokens}, --max-length-ratio {cfg.max_ratio})")
    splits = [("valid", "valid.norm")] + [(f"test{k}", f"test{k}.norm") for k in range(len(cfg.tests))]
    for split, norm in splits:
        for lang in (src_lang, tgt_lang):
            encode_file(encoder, work / f"{norm}.{lang}", work / f"{split}.{lang}")


def _log_summary(cfg: PrepareConfig, out: Path, stats: TrainStats, counts: dict[str, int], manifest: dict,
                 log: Callable[[str], None]) -> None:
    log(f"[prepare] train: {stats.lines:,} lines, kept {stats.kept:,}, dropped {stats.lines - stats.kept:,} "
        f"(empty side {stats.dropped_empty:,}, too long {stats.dropped_too_long:,}, "
        f"length ratio {stats.dropped_ratio:,})")
    log(f"[prepare] valid: {counts['valid']:,} lines, kept all")
    for k, t in enumerate(cfg.tests):
        log(f"[prepare] {subset_name(k)} ({t.name}): {counts[t.name]:,} lines, kept all")
    log(f"[prepare] vocabulary: {manifest['vocab_size']:,} sentencepiece pieces ({cfg.model_type}), "
        f"fairseq dictionary {dictionary_size(out / 'bin', cfg.source_lang):,} entries")
    log(f"[prepare] wrote {out}")
