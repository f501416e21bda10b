"""Prepare sentence-encoder data sets (SST, TREC, CR, MPQA, SUBJ, SICK, SNLI, MultiNLI) for fairseq
(``scripts/prepare_sentence_data.py``): read a data set's standard release files, tokenise them, build one word
dictionary and write the prepared directory, whose layout, tokenisation, splits, reading rules and dropped
examples docs/sentence-tasks.md describes (The prepared directory)."""

from __future__ import annotations

import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mtsa_fairseq.contracts import SENTENCE_DATA_SCHEMA, checksums, not_found
from mtsa_fairseq.experiments.errors import DataError
from mtsa_fairseq.experiments.files import publish_dir, staging_dir

if TYPE_CHECKING:  # imported where used: the command's --help and usage errors load neither
    import torch
    from fairseq.data import Dictionary

NUM_FOLDS = 10
SPLITS = ("train", "valid", "test")
SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
_SPECIALS = frozenset(SPECIAL_SYMBOLS)

_SENTIMENT = ("negative", "positive")
_NLI = ("contradiction", "neutral", "entailment")
LABELS: dict[str, tuple[str, ...]] = {
    "sst5": ("very negative", "negative", "neutral", "positive", "very positive"), "sst2": _SENTIMENT,
    "trec": ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"), "cr": _SENTIMENT, "mpqa": _SENTIMENT,
    "subj": ("objective", "subjective"), "sick": (), "snli": _NLI, "mnli": _NLI,
}
DATASETS = tuple(LABELS)
DATASET_KINDS = {**dict.fromkeys(("sst5", "sst2", "trec", "cr", "mpqa", "subj"), "single"), "sick": "relatedness",
         "snli": "pair", "mnli": "pair"}

_SST_FILES = {"train": "train.txt", "valid": "dev.txt", "test": "test.txt"}
SPLIT_FILES: dict[str, dict[str, str]] = {  # each split's standard file, for the data sets with a fixed split
    "sst5": _SST_FILES,
    "sst2": _SST_FILES,
    "trec": {"train": "train_5500.label", "test": "TREC_10.label"},
    "sick": {"train": "SICK_train.txt", "valid": "SICK_trial.txt", "test": "SICK_test_annotated.txt"},
    "snli": {"train": "snli_1.0_train.jsonl", "valid": "snli_1.0_dev.jsonl", "test": "snli_1.0_test.jsonl"},
    "mnli": {"train": "multinli_1.0_train.jsonl", "valid": "multinli_1.0_dev_matched.jsonl",
             "test": "multinli_1.0_dev_mismatched.jsonl"},
}
CLASS_FILES: dict[str, tuple[str, str]] = {  # the cross-validation data sets' files, one per class in label order
    "cr": ("custrev.neg", "custrev.pos"),
    "mpqa": ("mpqa.neg", "mpqa.pos"),
    "subj": ("subj.objective", "subj.subjective"),
}

_TREE_TOKEN = re.compile(r"\(|\)|[^ \t\n\r\f\v()]+")  # ASCII blanks: a leaf may hold a U+00A0
_SST_BRACKETS = {"-LRB-": "(", "-RRB-": ")"}
_SPLIT_CHARS = re.compile("([-/~\"'\u2010-\u2015\u2018\u2019\u201c\u201d])")
_EDGE_PUNCTUATION = frozenset(".,!?;:()")
_SICK_COLUMNS = ("sentence_A", "sentence_B", "relatedness_score")
_NLI_FIELDS = ("sentence1_binary_parse", "sentence2_binary_parse", "gold_label")
_UNITS = {**dict.fromkeys(("sst5", "sst2"), "trees"), "trec": "questions",
          **dict.fromkeys(CLASS_FILES, "sentences"), **dict.fromkeys(("sick", "snli", "mnli"), "sentence pairs")}


@dataclass
class SentenceDataConfig:
    """Everything :func:`prepare` needs; ``None`` options take the data set's default (see :func:`resolve`)."""

    dataset: str
    out: Path
    input: Path | None = None
    train: Path | None = None
    valid: Path | None = None
    test: Path | None = None
    max_examples: int | None = None
    keep_case: bool = False
    oversample: bool | None = None
    trec_valid: str | None = None
    valid_fraction: float | None = None
    clip_percentile: float | None = None
    fold_seed: int | None = None
    split_seed: int | None = None
    overwrite: bool = False


@dataclass(frozen=True, slots=True)
class Example:
    """One example: a token tuple per side, its label line, and the file and line it comes from; ``repeat``:
    written 4 times when oversampling (SST: a full sentence or a phrase that is not neutral)."""

    sides: tuple[tuple[str, ...], ...]
    label: str
    path: Path
    line: int
    repeat: bool = False


@dataclass
class Split:
    """The examples of one split, the files they were read from, and the dropped examples by reason."""

    examples: list[Example]
    sources: list[Path]
    dropped: Counter[str] = field(default_factory=Counter)


# ------------------------------------------------------------------------------------------- options
def resolve(cfg: SentenceDataConfig) -> SentenceDataConfig:
    """A copy of ``cfg`` with the data set's defaults filled in; options that do not apply raise DataError."""
    name = cfg.dataset
    if name not in DATASETS:
        raise DataError(f"unknown data set {name!r}; choose from {', '.join(DATASETS)}")

    def only(option: str, value: object, applies: bool, where: str, default: object) -> object:
        if applies:
            return default if value is None else value
        if value is not None:
            raise DataError(f"{option} applies only to {where}, not to {name}")
        return None

    sst, cv = name in ("sst5", "sst2"), name in CLASS_FILES
    trec_valid = only("--trec-valid", cfg.trec_valid, name == "trec", "trec", "holdout")
    if trec_valid not in (None, "holdout", "test"):
        raise DataError(f"--trec-valid must be holdout or test, got {trec_valid!r}")
    held_out = trec_valid == "holdout"
    out = replace(
        cfg,
        oversample=only("--oversample", cfg.oversample, sst, "sst5, sst2", name == "sst5"),
        trec_valid=trec_valid,
        valid_fraction=only("--valid-fraction", cfg.valid_fraction, held_out, "trec with --trec-valid holdout", 0.1),
        split_seed=only("--split-seed", cfg.split_seed, held_out, "trec with --trec-valid holdout", 1234),
        clip_percentile=only("--clip-percentile", cfg.clip_percentile, name in ("snli", "mnli"), "snli, mnli", 97.0),
        fold_seed=only("--fold-seed", cfg.fold_seed, cv, ", ".join(CLASS_FILES), 1234),
    )
    if out.max_examples is not None and out.max_examples < 1:
        raise DataError(f"--max-examples must be at least 1, got {out.max_examples}")
    if out.valid_fraction is not None and not 0 < out.valid_fraction < 1:
        raise DataError(f"--valid-fraction must be between 0 and 1, got {out.valid_fraction}")
    if out.clip_percentile is not None and not 0 <= out.clip_percentile <= 100:
        raise DataError(f"--clip-percentile must be between 0 and 100, got {out.clip_percentile}")
    return out


def input_files(cfg: SentenceDataConfig) -> dict[str, list[Path]]:
    """The input files of each split (``train`` holds the class files for CR, MPQA, SUBJ): the standard files in
    ``--input``, each replaced by a ``--train/--valid/--test`` file; a missing file raises DataError."""
    overrides = {split: getattr(cfg, split) for split in SPLITS if getattr(cfg, split) is not None}
    if cfg.input is not None and not cfg.input.is_dir():
        raise DataError(f"--input {cfg.input} is not a directory")
    if cfg.dataset in CLASS_FILES:
        if overrides:
            raise DataError(f"--train/--valid/--test do not apply to {cfg.dataset} (one file per class); "
                            "give --input DIR")
        if cfg.input is None:
            raise DataError(f"{cfg.dataset} needs --input DIR with {' and '.join(CLASS_FILES[cfg.dataset])}")
        files = {"train": [cfg.input / name for name in CLASS_FILES[cfg.dataset]]}
    else:
        standard = SPLIT_FILES[cfg.dataset]
        extra = sorted(overrides.keys() - standard.keys())
        if extra:
            raise DataError(f"--{extra[0]} does not apply to {cfg.dataset}: its {extra[0]} split is not read from "
                            "a file of its own")
        files = {}
        for split, name in standard.items():
            if split in overrides:
                files[split] = [overrides[split]]
            elif cfg.input is not None:
                files[split] = [cfg.input / name]
            else:
                raise DataError(f"no {split} file: give --input DIR (with {name}) or --{split} FILE")
    for path in (p for paths in files.values() for p in paths):
        if not path.is_file():
            raise DataError(not_found("file", path))
    return files


# ------------------------------------------------------------------------------------------- reading
def numbered_lines(path: Path, latin1: bool = False) -> Iterator[tuple[int, str]]:
    """``(line number from 1, text)`` for each line of ``path`` read as docs/sentence-tasks.md says (every line
    Latin-1 with ``latin1``), its line end and a leading byte-order mark removed."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            try:
                text = raw.decode("latin-1" if latin1 else "utf-8")
            except UnicodeDecodeError:
                text = raw.decode("latin-1")
            yield number, text.removeprefix("\ufeff") if number == 1 else text


def _records(path: Path, limit: int | None, skip_blank: bool = True, latin1: bool = False,
             skip_first: bool = False) -> Iterator[tuple[int, str]]:
    """The first ``limit`` records (lines) of ``path``, blank lines skipped when ``skip_blank``."""
    count = 0
    for number, text in numbered_lines(path, latin1):
        if (skip_first and number == 1) or (skip_blank and not text.strip()):
            continue
        if limit is not None and count >= limit:
            return
        count += 1
        yield number, text


def _tokens(words: Sequence[str]) -> tuple[str, ...]:
    return tuple(map(sys.intern, words))  # interned: the big training sets repeat the same words millions of times


def parse_tree(text: str) -> tuple[list[str], list[tuple[int, int, int]]]:
    """The leaves and the nodes in preorder (root first) as ``(label, start, end)``, covering ``leaves[start:end]``,
    of one PTB tree ``(label child ...)`` / ``(label word)`` with integer labels; ValueError if it is not one tree."""
    items = _TREE_TOKEN.findall(text)
    words: list[str] = []
    nodes: list[list[int]] = []
    stack: list[int] = []
    pos = 0
    while pos < len(items):
        item = items[pos]
        if item == "(":
            if not stack and nodes:
                raise ValueError("text after the end of the tree")
            label = items[pos + 1] if pos + 1 < len(items) else ")"
            if not label.isdecimal():
                raise ValueError(f"expected an integer label after '(', found {label!r}")
            stack.append(len(nodes))
            nodes.append([int(label), len(words), -1])
            pos += 2
            if pos < len(items) and items[pos] not in ("(", ")"):  # a leaf: (label word)
                words.append(items[pos])
                if pos + 1 >= len(items) or items[pos + 1] != ")":
                    raise ValueError(f"expected ')' after the word {items[pos]!r}")
                pos += 1
        elif item == ")":
            if not stack:
                raise ValueError("unbalanced ')'")
            node = nodes[stack.pop()]
            if node[1] == len(words):
                raise ValueError("a node without words")
            node[2] = len(words)
            pos += 1
        else:
            raise ValueError(f"word {item!r} outside a leaf")
    if not nodes:
        raise ValueError("no tree")
    if stack:
        raise ValueError("unbalanced '('")
    return words, [(label, start, end) for label, start, end in nodes]


def read_sst(path: Path, train: bool, binary: bool, lowercase: bool, limit: int | None,
             dropped: Counter[str]) -> list[Example]:
    """SST trees: every node for ``train``, else the roots; SST-2 drops neutral ones (counted in ``dropped``)."""
    examples = []
    for number, text in _records(path, limit):
        try:
            leaves, nodes = parse_tree(text)
        except ValueError as e:
            raise DataError(f"{path}:{number}: malformed tree: {e}") from None
        if any(label > 4 for label, _, _ in nodes):
            raise DataError(f"{path}:{number}: a tree label is not in 0-4")
        words, offsets = [], [0]  # the tokens of leaf i are words[offsets[i]:offsets[i + 1]]
        for leaf in leaves:
            leaf = _SST_BRACKETS.get(leaf, leaf)
            words += _tokens((leaf.lower() if lowercase else leaf).split())
            offsets.append(len(words))
        for k, (label, start, end) in enumerate(nodes if train else nodes[:1]):
            if binary and label == 2:
                dropped["neutral"] += 1
                continue
            index = int(label > 2) if binary else label
            examples.append(Example((tuple(words[offsets[start]:offsets[end]]),), str(index), path, number,
                                    repeat=k == 0 or label != 2))
    return examples


def read_trec(path: Path, lowercase: bool, limit: int | None) -> list[Example]:
    """TREC questions ``COARSE:fine question`` (Latin-1); the label is the coarse class."""
    labels = LABELS["trec"]
    examples = []
    for number, text in _records(path, limit, latin1=True):
        head, _, question = text.strip().partition(" ")
        coarse, colon, fine = head.partition(":")
        if not colon or not fine:
            raise DataError(f"{path}:{number}: expected 'COARSE:fine question', found {text[:60]!r}")
        if coarse not in labels:
            raise DataError(f"{path}:{number}: unknown TREC class {coarse!r}; expected one of {', '.join(labels)}")
        words = (question.lower() if lowercase else question).split()
        examples.append(Example((_tokens(words),), str(labels.index(coarse)), path, number))
    return examples


def read_sentences(path: Path, label: int, lowercase: bool, limit: int | None) -> list[Example]:
    """One tokenised sentence per line, all of class ``label``; a blank line is an empty example."""
    return [Example((_tokens((text.lower() if lowercase else text).split()),), str(label), path, number)
            for number, text in _records(path, limit, skip_blank=False)]


def split_token(token: str) -> list[str]:
    """``token`` split around ``- / ~ " '`` and the Unicode dashes and quotes, which stay as tokens."""
    return [piece for piece in _SPLIT_CHARS.split(token) if piece]


def _split_edges(piece: str) -> list[str]:
    start, end = 0, len(piece)
    while start < end and piece[start] in _EDGE_PUNCTUATION:
        start += 1
    while end > start and piece[end - 1] in _EDGE_PUNCTUATION:
        end -= 1
    return [*piece[:start], *([piece[start:end]] if start < end else []), *piece[end:]]


def tokenize_nli(binary_parse: str, lowercase: bool = True) -> list[str]:
    """The tokens of an SNLI/MultiNLI binary parse: its words without the brackets, then :func:`split_token`."""
    text = binary_parse.lower() if lowercase else binary_parse
    return [piece for word in text.split() if word not in ("(", ")") for piece in split_token(word)]


def tokenize_sick(sentence: str, lowercase: bool = True) -> list[str]:
    """SICK tokens: whitespace split, :func:`split_token`, then ``.,!?;:()`` split off both ends of each piece."""
    text = sentence.lower() if lowercase else sentence
    return [token for word in text.split() for piece in split_token(word) for token in _split_edges(piece)]


def read_sick(path: Path, lowercase: bool, limit: int | None) -> list[Example]:
    """SICK TSV with a header naming sentence_A, sentence_B and relatedness_score; the label is the score."""
    header = next(numbered_lines(path), (1, ""))[1].split("\t")
    missing = [c for c in _SICK_COLUMNS if c not in header]
    if missing:
        raise DataError(f"{path}:1: the header line has no column {', '.join(missing)}")
    a, b, score = (header.index(c) for c in _SICK_COLUMNS)
    examples = []
    for number, text in _records(path, limit, skip_first=True):
        fields = text.split("\t")
        if len(fields) != len(header):
            raise DataError(f"{path}:{number}: expected {len(header)} tab-separated fields, found {len(fields)}")
        try:
            value = float(fields[score])
        except ValueError:
            value = math.nan
        if not 1 <= value <= 5:
            raise DataError(f"{path}:{number}: relatedness_score {fields[score]!r} is not a number in [1, 5]")
        examples.append(Example((_tokens(tokenize_sick(fields[a], lowercase)),
                                 _tokens(tokenize_sick(fields[b], lowercase))), fields[score].strip(), path, number))
    return examples


def read_nli(path: Path, lowercase: bool, limit: int | None, dropped: Counter[str]) -> list[Example]:
    """SNLI/MultiNLI JSON lines; pairs with gold_label ``-`` are dropped (counted in ``dropped``)."""
    labels = LABELS["snli"]
    examples = []
    for number, text in _records(path, limit):
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: not valid JSON: {e}") from None
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in _NLI_FIELDS):
            raise DataError(f"{path}:{number}: expected a JSON object with string fields {', '.join(_NLI_FIELDS)}")
        gold = record["gold_label"]
        if gold == "-":
            dropped["no_gold_label"] += 1
            continue
        if gold not in labels:
            raise DataError(f"{path}:{number}: unknown gold_label {gold!r}; expected one of {', '.join(labels)} or -")
        sides = tuple(_tokens(tokenize_nli(record[k], lowercase)) for k in _NLI_FIELDS[:2])
        examples.append(Example(sides, str(labels.index(gold)), path, number))
    return examples


# ------------------------------------------------------------------------------------------ assembly
def _check(examples: list[Example], train: bool, dropped: Counter[str]) -> list[Example]:
    """Refuse special symbols; drop examples with an empty side from training data, refuse them elsewhere."""
    kept = []
    for ex in examples:
        if any(not _SPECIALS.isdisjoint(side) for side in ex.sides):
            special = next(t for side in ex.sides for t in side if t in _SPECIALS)
            raise DataError(f"{ex.path}:{ex.line}: the token {special} is a reserved dictionary symbol")
        if all(ex.sides):
            kept.append(ex)
        elif train:
            dropped["empty"] += 1
        else:
            raise DataError(f"{ex.path}:{ex.line}: empty sentence (no tokens) in a {'/'.join(SPLITS[1:])} file")
    return kept


def _read_file(cfg: SentenceDataConfig, path: Path, train: bool, dropped: Counter[str],
               label: int = 0) -> list[Example]:
    if not any(text.strip() for _, text in numbered_lines(path)):
        raise DataError(f"{path}: no {_UNITS[cfg.dataset]} (the file is empty or blank)")
    lowercase, limit = not cfg.keep_case, cfg.max_examples
    if cfg.dataset in ("sst5", "sst2"):
        examples = read_sst(path, train, cfg.dataset == "sst2", lowercase, limit, dropped)
    elif cfg.dataset == "trec":
        examples = read_trec(path, lowercase, limit)
    elif cfg.dataset in CLASS_FILES:
        examples = read_sentences(path, label, lowercase, limit)
    elif cfg.dataset == "sick":
        examples = read_sick(path, lowercase, limit)
    else:
        examples = read_nli(path, lowercase, limit, dropped)
    return _check(examples, train, dropped)


def clip_length(examples: list[Example], percentile: float) -> float:
    """The ``percentile`` (linear interpolation) of the lengths of all sides of ``examples``."""
    return float(np.percentile([len(s) for ex in examples for s in ex.sides], percentile, method="linear"))


def holdout(n: int, fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of the ``round(fraction * n)`` examples held out: the first of a RandomState(seed) permutation."""
    size = round(fraction * n)
    if not 0 < size < n:
        raise DataError(f"--valid-fraction {fraction} of {n} training examples holds out {size}: need 1 to {n - 1}")
    mask = np.zeros(n, dtype=bool)
    mask[np.random.RandomState(seed).permutation(n)[:size]] = True
    return mask


def assign_folds(n: int, seed: int, num_folds: int = NUM_FOLDS) -> list[int]:
    """Fold of each of ``n`` examples: ``fold[perm[i]] = i % num_folds``, ``perm`` a RandomState(seed) permutation."""
    folds = np.empty(n, dtype=np.int64)
    folds[np.random.RandomState(seed).permutation(n)] = np.arange(n) % num_folds
    return folds.tolist()


def load_dataset(cfg: SentenceDataConfig) -> dict[str, Split]:
    """Read, tokenise and filter the data set of ``cfg`` into its splits (train, valid, test; CR, MPQA, SUBJ: train),
    not yet oversampled (:func:`write_order`); bad input raises DataError."""
    cfg = resolve(cfg)
    files = input_files(cfg)
    splits: dict[str, Split] = {}
    if cfg.dataset in CLASS_FILES:
        train = Split([], files["train"])
        for label, path in enumerate(files["train"]):
            train.examples += _read_file(cfg, path, True, train.dropped, label)
        splits["train"] = train
    else:
        for split, (path,) in files.items():
            splits[split] = Split([], [path])
            splits[split].examples = _read_file(cfg, path, split == "train", splits[split].dropped)
    if cfg.dataset == "trec":
        train, test = splits["train"], splits.pop("test")
        if cfg.trec_valid == "holdout":
            mask = holdout(len(train.examples), cfg.valid_fraction, cfg.split_seed)
            splits["valid"] = Split([ex for ex, held in zip(train.examples, mask) if held], train.sources)
            train.examples = [ex for ex, held in zip(train.examples, mask) if not held]
        else:
            splits["valid"] = Split(list(test.examples), test.sources)
        splits["test"] = test
    if cfg.clip_percentile and splits["train"].examples:
        train = splits["train"]
        limit = clip_length(train.examples, cfg.clip_percentile)
        kept = [ex for ex in train.examples if max(map(len, ex.sides)) <= limit]
        train.dropped["too_long"] += len(train.examples) - len(kept)
        train.examples = kept
    for name, split in splits.items():
        if not split.examples:
            raise DataError(f"no {name} examples left from {', '.join(map(str, split.sources))}")
    if cfg.dataset in CLASS_FILES and len(splits["train"].examples) < NUM_FOLDS:
        raise DataError(f"{NUM_FOLDS}-fold cross-validation needs at least {NUM_FOLDS} examples, "
                        f"got {len(splits['train'].examples)}")
    return {name: splits[name] for name in SPLITS if name in splits}


# ------------------------------------------------------------------------------------------ writing
def build_vocabulary(splits: dict[str, Split]) -> tuple[list[tuple[str, int]], int]:
    """``(word, count)`` in dictionary order (training words first) and the number of training words."""
    train = Counter(t for ex in splits["train"].examples for side in ex.sides for t in side)
    rest = Counter(t for name, split in splits.items() if name != "train"
                   for ex in split.examples for side in ex.sides for t in side if t not in train)

    def ordered(counts: Counter[str]) -> list[tuple[str, int]]:
        return sorted(counts.items(), key=lambda item: (-item[1], item[0]))

    return ordered(train) + ordered(rest), len(train)


def write_order(examples: list[Example], oversample: bool) -> list[int]:
    """Indices of ``examples`` in writing order: all once, then, when oversampling, the ``repeat`` ones 3 times."""
    order = list(range(len(examples)))
    if oversample:
        order += [i for i, ex in enumerate(examples) if ex.repeat] * 3
    return order


def binarize(prefix: Path, sequences: list[tuple[str, ...]], order: list[int], dictionary: Dictionary) -> None:
    """Write ``prefix.bin/.idx`` (mmap): ``sequences[i]`` without end-of-sentence for each ``i`` of ``order``."""
    from fairseq.data.indexed_dataset import make_builder

    builder = make_builder(f"{prefix}.bin", impl="mmap", vocab_size=len(dictionary))
    encoded: dict[tuple[str, ...], torch.Tensor] = {}  # phrases, premises and oversampled examples recur
    for i in order:
        tokens = sequences[i]
        item = encoded.get(tokens)
        if item is None:
            item = encoded[tokens] = dictionary.encode_line(" ".join(tokens), add_if_not_exist=False,
                                                            append_eos=False)
        builder.add_item(item)
    builder.finalize(f"{prefix}.idx")


def _write_lines(path: Path, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(line + "\n" for line in lines)


def build_manifest(cfg: SentenceDataConfig, splits: dict[str, Split], written: dict[str, int],
                   num_train_words: int, files: dict[str, dict]) -> dict:
    """The ``manifest.json`` of a prepared directory (docs/sentence-tasks.md, The prepared directory); ``options``
    holds the resolved options (``None`` where one does not apply, paths absolute), ``checksums`` ``files``."""
    options = {k: str(v.absolute()) if isinstance(v, Path) else v for k, v in asdict(cfg).items()
               if k not in ("dataset", "out")}
    return {
        "schema": SENTENCE_DATA_SCHEMA, "dataset": cfg.dataset, "kind": DATASET_KINDS[cfg.dataset],
        "labels": list(LABELS[cfg.dataset]), "splits": written,
        "num_folds": NUM_FOLDS if cfg.dataset in CLASS_FILES else 0, "num_train_words": num_train_words,
        "lowercase": not cfg.keep_case,
        "sources": {name: [str(p.absolute()) for p in split.sources] for name, split in splits.items()},
        "dropped": {name: dict(sorted(split.dropped.items())) for name, split in splits.items()},
        "options": options, "checksums": files,
    }


def _check_out(out: Path, overwrite: bool) -> None:
    if not out.exists():
        return
    if not overwrite:
        raise DataError(f"--out {out} exists; pass --overwrite to replace it")
    if not out.is_dir() or (any(out.iterdir()) and not (out / "manifest.json").is_file()):
        raise DataError(f"--overwrite refuses to replace {out}: it is not a prepared data directory "
                        "(no manifest.json)")


def prepare(cfg: SentenceDataConfig, log: Callable[[str], None] = print) -> dict:
    """Validate and read everything, then write the prepared directory ``cfg.out`` (staged in a hidden sibling:
    on any error or interrupt an existing ``cfg.out`` is untouched); return its manifest."""
    cfg = resolve(cfg)
    out = cfg.out.absolute()
    _check_out(out, cfg.overwrite)
    splits = load_dataset(cfg)
    vocabulary, num_train_words = build_vocabulary(splits)
    from fairseq.data import Dictionary

    with staging_dir(out) as tmp:
        _write_lines(tmp / "dict.txt", [f"{word} {count}" for word, count in vocabulary])  # fairseq's dict.txt
        dictionary = Dictionary.load(str(tmp / "dict.txt"))
        written = {}
        for name, split in splits.items():
            order = write_order(split.examples, bool(cfg.oversample) and name == "train")
            for side in range(len(split.examples[0].sides)):
                binarize(tmp / f"{name}.input{side}", [ex.sides[side] for ex in split.examples], order, dictionary)
            _write_lines(tmp / f"{name}.label", [split.examples[i].label for i in order])
            written[name] = len(order)
        if cfg.dataset in CLASS_FILES:
            _write_lines(tmp / "train.fold", list(map(str, assign_folds(written["train"], cfg.fold_seed))))
        manifest = build_manifest(cfg, splits, written, num_train_words,
                                  checksums(tmp, [p.name for p in tmp.iterdir()]))
        publish_dir(tmp, out, manifest)
    for name in splits:
        drops = ", ".join(f"{reason} {n:,}" for reason, n in manifest["dropped"][name].items()) or "none"
        log(f"[prepare] {name}: {written[name]:,} examples written (dropped: {drops})")
    log(f"[prepare] dictionary: {len(vocabulary):,} words, {num_train_words:,} of them in the training split")
    log(f"[prepare] wrote {out}")
    return manifest
