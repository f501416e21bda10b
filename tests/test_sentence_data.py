"""scripts/prepare_sentence_data.py and mtsa_fairseq.experiments.sentence.data: readers, tokenisation, dictionary,
output.

Real-data tests read ../shared/data (relative to the repository root) and are skipped where it is absent.
"""

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fairseq.data import Dictionary, data_utils

from mtsa_fairseq.contracts import SENTENCE_DATA_SCHEMA, read_sentence_manifest
from mtsa_fairseq.experiments.sentence.data import (
    DataError,
    SentenceDataConfig,
    assign_folds,
    load_dataset,
    parse_tree,
    prepare,
    split_token,
    tokenize_nli,
    tokenize_sick,
    write_order,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "prepare_sentence_data.py"
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
MANIFEST_KEYS = {"schema", "dataset", "kind", "labels", "splits", "num_folds", "num_train_words", "lowercase",
                 "sources", "dropped", "options", "checksums"}
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")


def real(name: str) -> Path:
    path = DATA / name
    if not path.is_dir():
        pytest.skip(f"real data not available: {path}")
    return path


def run(dataset: str, out: Path, **options) -> dict:
    return prepare(SentenceDataConfig(dataset, out, **options), log=lambda _: None)


def loaded(dataset: str, **options) -> dict:
    return load_dataset(SentenceDataConfig(dataset, Path("unused"), **options))


def run_script(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=ENV,
                          timeout=1200)


def decoded(out: Path, split: str, side: int = 0, rows: int | None = None) -> list[list[str]]:
    """The token lists of a binarised split (its first ``rows`` items), read back through fairseq."""
    dictionary = Dictionary.load(str(out / "dict.txt"))
    data = data_utils.load_indexed_dataset(str(out / f"{split}.input{side}"), dictionary, "mmap")
    assert data is not None, f"{out}/{split}.input{side} missing"
    return [[dictionary[i] for i in data[k].tolist()] for k in range(len(data) if rows is None else rows)]


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def by_count(counts: Counter) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda x: (-x[1], x[0]))


def check_dictionary(out: Path, train: list[list[str]], others: list[list[str]], num_train_words: int) -> None:
    """dict.txt = training words by (count desc, word asc), then the words of the other splits only."""
    entries = [line.rsplit(" ", 1) for line in lines(out / "dict.txt")]
    words, counts = [w for w, _ in entries], [int(c) for _, c in entries]
    train_counts = Counter(t for tokens in train for t in tokens)
    rest = Counter(t for tokens in others for t in tokens if t not in train_counts)
    assert num_train_words == len(train_counts)
    assert list(zip(words, counts)) == by_count(train_counts) + by_count(rest)
    dictionary = Dictionary.load(str(out / "dict.txt"))
    assert [dictionary.bos(), dictionary.pad(), dictionary.eos(), dictionary.unk()] == [0, 1, 2, 3]
    assert len(dictionary) == 4 + len(words)
    assert all(dictionary.index(w) == 4 + k for k, w in enumerate(words))


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------- tokenisers


def test_parse_tree_preorder_nodes():
    words, nodes = parse_tree("(3 (2 A) (4 (3 good) (2 film)))")
    assert words == ["A", "good", "film"]
    assert nodes == [(3, 0, 3), (2, 0, 1), (4, 1, 3), (3, 1, 2), (2, 2, 3)]
    assert parse_tree("(1 word)") == (["word"], [(1, 0, 1)])
    assert parse_tree("(2 8\u00a01\\/2)") == (["8\u00a01\\/2"], [(2, 0, 1)])


@pytest.mark.parametrize("text", ["", "   ", "(2 a", "(2 a))", "(x a)", "(2 a b)", "(2 (2 a) b)", "(2 a) (2 b)",
                                  "(2 )", "2 a", "(2 (2 a)", "(2 ()"])
def test_parse_tree_rejects_malformed(text):
    with pytest.raises(ValueError):
        parse_tree(text)


@pytest.mark.parametrize("token, pieces", [
    ("well-known", ["well", "-", "known"]),
    ("and/or", ["and", "/", "or"]),
    ("man's", ["man", "'", "s"]),
    ('"hi"', ['"', "hi", '"']),
    ("a~b", ["a", "~", "b"]),
    ("x\u2013y\u2014", ["x", "\u2013", "y", "\u2014"]),
    ("\u201cquoted\u201d", ["\u201c", "quoted", "\u201d"]),
    ("\u2018it\u2019s", ["\u2018", "it", "\u2019", "s"]),
    ("--", ["-", "-"]),
    ("plain", ["plain"]),
])
def test_split_token(token, pieces):
    assert split_token(token) == pieces


def test_tokenize_nli():
    parse = "( ( The well-known ) ( ( ( is \u201cGood\u201d ) ( and/or bad ) ) . ) )"
    assert tokenize_nli(parse) == ["the", "well", "-", "known", "is", "\u201c", "good", "\u201d", "and", "/", "or",
                                   "bad", "."]
    assert tokenize_nli("( A B )", lowercase=False) == ["A", "B"]


def test_tokenize_sick():
    assert tokenize_sick("A man's (big) dog, well-known!! Yes...") == [
        "a", "man", "'", "s", "(", "big", ")", "dog", ",", "well", "-", "known", "!", "!", "yes", ".", ".", "."]
    assert tokenize_sick("The (U.S.) team", lowercase=False) == ["The", "(", "U.S", ".", ")", "team"]
    assert tokenize_sick(" ... ") == [".", ".", "."]


# ------------------------------------------------------------------------------------------- synthetic

TREES_TRAIN = ("(3 (2 The) (4 (3 (2 -LRB-) (3 good)) (2 Film)))\n"
               "(2 (2 It) (2 (1 bad) (2 8\u00a01\\/2)))\n")
TREES_DEV = "(1 (2 A) (0 awful))\n(2 (2 so) (2 so))\n"
TREES_TEST = "(4 (4 Great) (2 fun))\n"


def sst_dir(root: Path) -> Path:
    write(root / "train.txt", TREES_TRAIN)
    write(root / "dev.txt", TREES_DEV)
    write(root / "test.txt", TREES_TEST)
    return root


def test_sst5_tiny_nodes_oversampling_and_dictionary(tmp_path):
    out = tmp_path / "sst5"
    m = run("sst5", out, input=sst_dir(tmp_path / "in"))
    nodes = [["the", "(", "good", "film"], ["the"], ["(", "good", "film"], ["(", "good"], ["("], ["good"], ["film"],
             ["it", "bad", "8", "1\\/2"], ["it"], ["bad", "8", "1\\/2"], ["bad"], ["8", "1\\/2"]]
    node_labels = ["3", "2", "4", "3", "2", "3", "2", "2", "2", "2", "1", "2"]
    repeated = [0, 2, 3, 5, 7, 10]  # non-neutral phrases and the two roots (the second root is neutral)
    train = decoded(out, "train")
    assert train == nodes + [nodes[i] for i in repeated] * 3
    assert lines(out / "train.label") == node_labels + [node_labels[i] for i in repeated] * 3
    assert decoded(out, "valid") == [["a", "awful"], ["so", "so"]]
    assert lines(out / "valid.label") == ["1", "2"]
    assert decoded(out, "test") == [["great", "fun"]] and lines(out / "test.label") == ["4"]
    assert m["splits"] == {"train": 30, "valid": 2, "test": 1}
    assert m["kind"] == "single" and m["num_folds"] == 0 and m["lowercase"] is True
    assert m["labels"] == ["very negative", "negative", "neutral", "positive", "very positive"]
    assert m["options"]["oversample"] is True
    assert not (out / "train.input1.bin").exists() and not (out / "train.fold").exists()
    # counts before oversampling (a token counts once per phrase holding it), by count then word
    assert lines(out / "dict.txt")[:m["num_train_words"]] == ["( 4", "good 4", "1\\/2 3", "8 3", "bad 3", "film 3",
                                                             "it 2", "the 2"]
    check_dictionary(out, nodes, [["a", "awful"], ["so", "so"], ["great", "fun"]], m["num_train_words"])
    assert lines(out / "dict.txt")[m["num_train_words"]:] == ["so 2", "a 1", "awful 1", "fun 1", "great 1"]
    assert sorted(m["checksums"]) == sorted(p.name for p in out.iterdir() if p.name != "manifest.json")
    assert read_sentence_manifest(out) == m
    data = bytearray((out / "test.input0.bin").read_bytes())
    data[0] ^= 1  # a token id edited after preparation
    (out / "test.input0.bin").write_bytes(data)
    with pytest.raises(ValueError, match=re.escape(f"{out / 'test.input0.bin'} changed after preparation (SHA-256")):
        read_sentence_manifest(out)


def test_sst2_tiny_drops_neutral_and_maps_labels(tmp_path):
    out = tmp_path / "sst2"
    m = run("sst2", out, input=sst_dir(tmp_path / "in"), keep_case=True)
    assert decoded(out, "train") == [["The", "(", "good", "Film"], ["(", "good", "Film"], ["(", "good"], ["good"],
                                     ["bad"]]
    assert lines(out / "train.label") == ["1", "1", "1", "1", "0"]
    assert decoded(out, "valid") == [["A", "awful"]] and lines(out / "valid.label") == ["0"]
    assert m["labels"] == ["negative", "positive"] and m["lowercase"] is False
    assert m["dropped"] == {"train": {"neutral": 7}, "valid": {"neutral": 1}, "test": {}}
    assert m["options"]["oversample"] is False
    m = run("sst2", tmp_path / "over", input=tmp_path / "in", oversample=True, max_examples=1)
    assert m["splits"] == {"train": 16, "valid": 1, "test": 1}  # the 4 positive nodes of the first tree, 4 times


def test_malformed_tree_is_an_error_and_nothing_is_written(tmp_path):
    root = sst_dir(tmp_path / "in")
    write(root / "train.txt", TREES_TRAIN + "(3 (2 unbalanced)\n")
    with pytest.raises(DataError, match=r"train\.txt:3: malformed tree: unbalanced"):
        run("sst5", tmp_path / "out", input=root)
    write(root / "train.txt", TREES_TRAIN)
    write(root / "test.txt", "(7 (2 a) (2 b))\n")
    with pytest.raises(DataError, match=r"test\.txt:1: .*not in 0-4"):
        run("sst5", tmp_path / "out", input=root)
    assert not (tmp_path / "out").exists() and hidden(tmp_path) == []


def trec_dir(root: Path, train: bytes = b"", test: bytes = b"") -> Path:
    write(root / "train_5500.label", train or b"".join(
        f"{c}:x Question {k} about {c.lower()} ?\n".encode() for k in range(20) for c in TREC_CLASSES[:2]))
    write(root / "TREC_10.label", test or b"HUM:ind Who is Andr\xe9 ?\nNUM:date When ?\n")
    return root


def test_trec_tiny_holdout_latin1_and_protocols(tmp_path):
    root = trec_dir(tmp_path / "in")
    m = run("trec", tmp_path / "a", input=root)
    assert m["splits"] == {"train": 36, "valid": 4, "test": 2}
    mask = np.zeros(40, dtype=bool)
    mask[np.random.RandomState(1234).permutation(40)[:4]] = True
    raw = [line.split(" ", 1)[1].lower().split() for line in lines(root / "train_5500.label")]
    assert decoded(tmp_path / "a", "valid") == [t for t, held in zip(raw, mask) if held]
    assert decoded(tmp_path / "a", "train") == [t for t, held in zip(raw, mask) if not held]
    assert decoded(tmp_path / "a", "test") == [["who", "is", "andr\u00e9", "?"], ["when", "?"]]
    assert lines(tmp_path / "a" / "test.label") == ["3", "5"]
    assert m["sources"]["valid"] == m["sources"]["train"] == [str((root / "train_5500.label").absolute())]
    assert m["options"]["trec_valid"] == "holdout" and m["options"]["valid_fraction"] == 0.1

    m = run("trec", tmp_path / "b", input=root, trec_valid="test")
    assert m["splits"] == {"train": 40, "valid": 2, "test": 2}
    assert decoded(tmp_path / "b", "valid") == decoded(tmp_path / "b", "test")
    assert m["sources"]["valid"] == [str((root / "TREC_10.label").absolute())]
    assert m["options"]["valid_fraction"] is None and m["options"]["split_seed"] is None

    m = run("trec", tmp_path / "c", input=root, max_examples=10, valid_fraction=0.3, split_seed=5)
    assert m["splits"] == {"train": 7, "valid": 3, "test": 2}


@pytest.mark.parametrize("train, test, message", [
    (b"FOO:bar What is it ?\n", b"", r"train_5500\.label:1: unknown TREC class 'FOO'"),
    (b"DESC:def What ?\nDESC What is it ?\n", b"", r"train_5500\.label:2: expected 'COARSE:fine question'"),
    (b"", b"HUM:ind Who ?\nNUM:date\n", r"TREC_10\.label:2: empty sentence"),
    (b"", b"HUM:ind Who is <unk> ?\n", r"TREC_10\.label:1: the token <unk> is a reserved dictionary symbol"),
])
def test_trec_errors(tmp_path, train, test, message):
    with pytest.raises(DataError, match=message):
        run("trec", tmp_path / "out", input=trec_dir(tmp_path / "in", train, test))
    assert not (tmp_path / "out").exists() and hidden(tmp_path) == []


def test_empty_training_example_is_dropped_and_counted(tmp_path):
    train = b"".join(f"DESC:def What is {k} ?\n".encode() for k in range(19)) + b"ENTY:other\n\n"
    m = run("trec", tmp_path / "out", input=trec_dir(tmp_path / "in", train), trec_valid="test")
    assert m["splits"]["train"] == 19 and m["dropped"]["train"] == {"empty": 1}


def test_cross_validation_tiny(tmp_path):
    root = tmp_path / "in"
    write(root / "subj.objective", b"".join(f"plain fact {k} .\n".encode() for k in range(12)))
    # 12 lines: UTF-8, Latin-1, blank, 9 more
    write(root / "subj.subjective", "Caf\u00e9 ok\n".encode() + b"h\xe9ros \x96 grand\n\n" + b"same\n" * 9)
    out = tmp_path / "out"
    m = run("subj", out, input=root, fold_seed=7)
    assert m["splits"] == {"train": 23} and m["dropped"] == {"train": {"empty": 1}} and m["num_folds"] == 10
    assert m["labels"] == ["objective", "subjective"]
    assert lines(out / "train.label") == ["0"] * 12 + ["1"] * 11
    assert decoded(out, "train")[12:14] == [["caf\u00e9", "ok"], ["h\u00e9ros", "\x96", "grand"]]  # UTF-8, Latin-1
    folds = [int(x) for x in lines(out / "train.fold")]
    perm = np.random.RandomState(7).permutation(23)
    assert all(folds[perm[i]] == i % 10 for i in range(23))
    assert folds == assign_folds(23, 7)
    assert not (out / "valid.input0.bin").exists()
    with pytest.raises(DataError, match="at least 10 examples"):
        run("subj", tmp_path / "few", input=root, max_examples=4)


def sick_dir(root: Path, train_rows: list[str], test_rows: list[str] | None = None) -> Path:
    header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
    rows = [f"{k}\tA dog runs.\tThe dog (brown) is running!\t{3 + k / 10:.1f}\tNEUTRAL" for k in range(3)]
    write(root / "SICK_train.txt", header + "\n".join(train_rows or rows) + "\n")
    write(root / "SICK_trial.txt", header + "\n".join(rows) + "\n")
    write(root / "SICK_test_annotated.txt", header + "\n".join(test_rows or rows) + "\n")
    return root


def test_sick_tiny(tmp_path):
    rows = ["1\tA man's dog, well-known.\tNobody is here\t4.50\tNEUTRAL", "2\t\tEmpty A\t1\tNEUTRAL",
            "3\tTwo kids\tTwo children\t5\tENTAILMENT"]
    out = tmp_path / "out"
    m = run("sick", out, input=sick_dir(tmp_path / "in", rows))
    assert m["kind"] == "relatedness" and m["labels"] == [] and m["dropped"]["train"] == {"empty": 1}
    assert m["splits"] == {"train": 2, "valid": 3, "test": 3}
    assert decoded(out, "train", 0) == [["a", "man", "'", "s", "dog", ",", "well", "-", "known", "."],
                                        ["two", "kids"]]
    assert decoded(out, "train", 1) == [["nobody", "is", "here"], ["two", "children"]]
    assert lines(out / "train.label") == ["4.50", "5"]
    assert decoded(out, "test", 1)[0] == ["the", "dog", "(", "brown", ")", "is", "running", "!"]


@pytest.mark.parametrize("test_rows, message", [
    (["1\tA\tB\t5.5\tNEUTRAL"], r"SICK_test_annotated\.txt:2: relatedness_score '5\.5' is not a number in \[1, 5\]"),
    (["1\tA\tB\tabc\tNEUTRAL"], r"SICK_test_annotated\.txt:2: relatedness_score 'abc'"),
    (["1\tA\tB\t3"], r"SICK_test_annotated\.txt:2: expected 5 tab-separated fields, found 4"),
    (["1\tA\t\t3\tNEUTRAL"], r"SICK_test_annotated\.txt:2: empty sentence"),
])
def test_sick_errors(tmp_path, test_rows, message):
    root = sick_dir(tmp_path / "in", [], test_rows)
    with pytest.raises(DataError, match=message):
        run("sick", tmp_path / "out", input=root)
    assert not (tmp_path / "out").exists()


def test_sick_header_is_required(tmp_path):
    root = sick_dir(tmp_path / "in", [])
    write(root / "SICK_trial.txt", "1\tA dog\tA cat\t2\tNEUTRAL\n")
    with pytest.raises(DataError, match=r"SICK_trial\.txt:1: the header line has no column sentence_A"):
        run("sick", tmp_path / "out", input=root)


def nli_record(premise: str, hypothesis: str, gold: str) -> str:
    def parse(text: str) -> str:
        return "( " + " ".join(text.split()) + " )"

    return json.dumps({"gold_label": gold, "sentence1_binary_parse": parse(premise),
                       "sentence2_binary_parse": parse(hypothesis), "sentence1": premise, "sentence2": hypothesis})


def test_nli_tiny_gold_labels_and_length_clip(tmp_path):
    lengths = [2, 3, 4, 5, 6, 7, 8, 9, 10, 30]
    train = [nli_record(" ".join(["w"] * n), "A well-known cat", gold)
             for n, gold in zip(lengths, ["entailment", "neutral", "contradiction"] * 4)]
    train.insert(3, nli_record("no gold", "label here", "-"))
    path = write(tmp_path / "train.jsonl", "\n".join(train) + "\n")
    valid = write(tmp_path / "valid.jsonl", "\n".join([nli_record("A b", "C d", "-"),
                                                      nli_record("A b", "C d", "neutral")]))
    out = tmp_path / "out"
    m = run("snli", out, train=path, valid=valid, test=valid)
    sides = lengths + [5] * len(lengths)  # the hypothesis has 5 tokens
    limit = np.percentile(sides, 97, method="linear")
    kept = [n for n in lengths if n <= limit]
    assert len(kept) == 9  # the 30-word premise is over the 97th percentile
    assert m["splits"] == {"train": len(kept), "valid": 1, "test": 1}
    assert m["dropped"] == {"train": {"no_gold_label": 1, "too_long": 1}, "valid": {"no_gold_label": 1},
                            "test": {"no_gold_label": 1}}
    assert m["kind"] == "pair" and m["labels"] == ["contradiction", "neutral", "entailment"]
    assert lines(out / "train.label")[:3] == ["2", "1", "0"]
    assert decoded(out, "train", 1)[0] == ["a", "well", "-", "known", "cat"]
    assert [len(t) for t in decoded(out, "train", 0)] == kept
    m = run("snli", tmp_path / "all", train=path, valid=valid, test=valid, clip_percentile=0)
    assert m["splits"]["train"] == 10 and m["dropped"]["train"] == {"no_gold_label": 1}


@pytest.mark.parametrize("line, message", [
    ("{not json", r"valid\.jsonl:1: not valid JSON"),
    ('{"gold_label": "neutral"}', r"valid\.jsonl:1: expected a JSON object with string fields"),
    (nli_record("a", "b", "maybe"), r"valid\.jsonl:1: unknown gold_label 'maybe'"),
    (nli_record("( )", "b", "neutral"), r"valid\.jsonl:1: empty sentence"),
])
def test_nli_errors(tmp_path, line, message):
    good = write(tmp_path / "train.jsonl", nli_record("a b", "c d", "neutral") + "\n")
    bad = write(tmp_path / "valid.jsonl", line + "\n")
    with pytest.raises(DataError, match=message):
        run("mnli", tmp_path / "out", train=good, valid=bad, test=good)


@pytest.mark.parametrize("dataset, options, message", [
    ("trec", {"clip_percentile": 50}, "--clip-percentile applies only to snli, mnli, not to trec"),
    ("cr", {"oversample": True}, "--oversample applies only to sst5, sst2, not to cr"),
    ("trec", {"trec_valid": "test", "valid_fraction": 0.2}, "--valid-fraction applies only to trec with"),
    ("sick", {"fold_seed": 3}, "--fold-seed applies only to cr, mpqa, subj"),
    ("trec", {"valid_fraction": 1.5}, "--valid-fraction must be between 0 and 1"),
    ("sst5", {"max_examples": 0}, "--max-examples must be at least 1"),
    ("cr", {"train": Path("x")}, "do not apply to cr"),
    ("trec", {"valid": Path("x")}, "--valid does not apply to trec"),
    ("snli", {}, "no train file: give --input DIR"),
    ("nope", {}, "unknown data set 'nope'"),
])
def test_option_errors(tmp_path, dataset, options, message):
    with pytest.raises(DataError, match=re.escape(message)):
        run(dataset, tmp_path / "out", **options)


def test_the_command_exits_2_on_option_errors(tmp_path):
    """Option errors are usage errors (status 2), before any file is read; input errors exit 1."""
    proc = run_script("trec", "--input", tmp_path, "--out", tmp_path / "out", "--valid-fraction", "1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("error: --valid-fraction must be between 0 and 1, got 1.0")
    assert not (tmp_path / "out").exists()


def test_missing_and_empty_input_files(tmp_path):
    root = trec_dir(tmp_path / "in")
    (root / "TREC_10.label").unlink()
    with pytest.raises(DataError, match=r"file not found: .*TREC_10\.label"):
        run("trec", tmp_path / "out", input=root)
    write(root / "TREC_10.label", "")
    with pytest.raises(DataError, match=r"TREC_10\.label: no questions \(the file is empty or blank\)"):
        run("trec", tmp_path / "out", input=root)
    assert not (tmp_path / "out").exists() and hidden(tmp_path) == []


@pytest.mark.slow
def test_blank_trec_file_is_refused_before_the_holdout(tmp_path):
    root = trec_dir(tmp_path / "in", train=b" \n\n\t \r\n")
    proc = run_script("trec", "--input", root, "--out", tmp_path / "out", "--valid-fraction", "0.1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {root / 'train_5500.label'}: no questions (the file is empty or blank)")
    assert not (tmp_path / "out").exists() and hidden(tmp_path) == []


@pytest.mark.parametrize("dataset, name, unit", [
    ("sst5", "dev.txt", "trees"),
    ("cr", "custrev.pos", "sentences"),  # the other class file has sentences
    ("sick", "SICK_trial.txt", "sentence pairs"),
    ("snli", "snli_1.0_test.jsonl", "sentence pairs"),
])
def test_blank_input_file_is_refused(tmp_path, dataset, name, unit):
    root = tmp_path / "in"
    sst_dir(root)
    sick_dir(root, [])
    write(root / "custrev.neg", b"".join(f"bad thing {k}\n".encode() for k in range(12)))
    for nli in ("snli_1.0_train.jsonl", "snli_1.0_dev.jsonl", "snli_1.0_test.jsonl"):
        write(root / nli, nli_record("a b", "c d", "neutral") + "\n")
    write(root / name, "\ufeff \n\n")
    with pytest.raises(DataError, match=re.escape(f"{root / name}: no {unit} (the file is empty or blank)")):
        run(dataset, tmp_path / "out", input=root)


def test_existing_output_directory(tmp_path):
    root = trec_dir(tmp_path / "in")
    out = write(tmp_path / "out" / "keep.txt", "precious").parent
    with pytest.raises(DataError, match="exists; pass --overwrite"):
        run("trec", out, input=root)
    with pytest.raises(DataError, match="not a prepared data directory"):
        run("trec", out, input=root, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "precious"
    run("trec", tmp_path / "prepared", input=root)
    with pytest.raises(DataError, match="exists; pass --overwrite"):
        run("trec", tmp_path / "prepared", input=root, trec_valid="test")
    assert json.loads((tmp_path / "prepared" / "manifest.json").read_text())["splits"]["valid"] == 4
    run("trec", tmp_path / "prepared", input=root, trec_valid="test", overwrite=True)
    assert json.loads((tmp_path / "prepared" / "manifest.json").read_text())["splits"]["valid"] == 2
    assert hidden(tmp_path) == []


@pytest.mark.slow
def test_script_end_to_end(tmp_path):
    root = sick_dir(tmp_path / "in", [])
    out = tmp_path / "out"
    proc = run_script("sick", "--input", root, "--out", out, "--max-examples", "2")
    assert proc.returncode == 0, proc.stderr
    assert "[prepare] wrote" in proc.stdout
    m = json.loads((out / "manifest.json").read_text())
    assert set(m) == MANIFEST_KEYS and m["schema"] == SENTENCE_DATA_SCHEMA == "mtsa-fairseq.sentence-data.v1"
    assert m["splits"] == {"train": 2, "valid": 2, "test": 2} and m["options"]["max_examples"] == 2
    assert m["sources"]["test"] == [str((root / "SICK_test_annotated.txt").absolute())]
    assert decoded(out, "valid", 0) == [["a", "dog", "runs", "."]] * 2
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "dict.txt"] + [f"{s}.{x}" for s in ("train", "valid", "test")
                                         for x in ("input0.bin", "input0.idx", "input1.bin", "input1.idx", "label")])

    proc = run_script("cr", "--input", root, "--out", tmp_path / "cr")
    assert proc.returncode == 1 and re.search(r"^error: file not found: .*custrev\.neg$", proc.stderr, re.M)
    assert not (tmp_path / "cr").exists() and hidden(tmp_path) == []


# ------------------------------------------------------------------------------------------- real data


def test_trec_real(tmp_path):
    root = real("trec")
    out = tmp_path / "trec"
    m = run("trec", out, input=root)
    assert m["splits"] == {"train": 4907, "valid": 545, "test": 500}  # valid = round(0.1 * 5452)
    assert m["labels"] == list(TREC_CLASSES) and m["dropped"] == {"train": {}, "valid": {}, "test": {}}

    def histogram(*splits: str) -> dict[str, int]:
        found = Counter(TREC_CLASSES[int(x)] for s in splits for x in lines(out / f"{s}.label"))
        return dict(sorted(found.items()))

    assert histogram("train", "valid") == {"ABBR": 86, "DESC": 1162, "ENTY": 1250, "HUM": 1223, "LOC": 835, "NUM": 896}
    assert histogram("test") == {"ABBR": 9, "DESC": 138, "ENTY": 94, "HUM": 65, "LOC": 81, "NUM": 113}
    raw = [line.split(" ", 1)[1].lower().split()
           for line in (root / "train_5500.label").read_bytes().decode("latin-1").splitlines()]
    held = set(np.random.RandomState(1234).permutation(5452)[:545].tolist())
    train, valid = decoded(out, "train"), decoded(out, "valid")
    assert valid == [t for k, t in enumerate(raw) if k in held]
    assert train == [t for k, t in enumerate(raw) if k not in held]
    assert "sister\u00f0city" in raw[65] and (raw[65] in train or raw[65] in valid)  # a Latin-1 byte
    test = decoded(out, "test")
    assert test[0] == "how far is it from denver to aspen ?".split()
    check_dictionary(out, train, valid + test, m["num_train_words"])

    splits = loaded("trec", input=root, trec_valid="test")
    assert {k: len(s.examples) for k, s in splits.items()} == {"train": 5452, "valid": 500, "test": 500}
    assert splits["valid"].examples == splits["test"].examples


@pytest.mark.parametrize("name, files, counts", [
    ("cr", ("custrev.neg", "custrev.pos"), (1368, 2407)),
    ("mpqa", ("mpqa.neg", "mpqa.pos"), (7294, 3312)),
    ("subj", ("subj.objective", "subj.subjective"), (5000, 5000)),
])
def test_cross_validation_real(tmp_path, name, files, counts):
    root = real(name)
    out = tmp_path / name
    m = run(name, out, input=root)
    raw = [[decode(line).lower().split() for line in (root / f).read_bytes().split(b"\n")[:-1]] for f in files]
    assert [len(r) for r in raw] == list(counts)  # the standard sizes, blank lines included
    blank = [sum(1 for t in r if not t) for r in raw]  # CR: 2 + 2, MPQA: 2 + 1, SUBJ: 0
    n = sum(counts) - sum(blank)
    assert m["splits"] == {"train": n} and m["dropped"]["train"] == ({"empty": sum(blank)} if sum(blank) else {})
    assert Counter(lines(out / "train.label")) == {"0": counts[0] - blank[0], "1": counts[1] - blank[1]}
    folds = [int(x) for x in lines(out / "train.fold")]
    sizes = Counter(folds)
    assert sorted(sizes) == list(range(10)) and max(sizes.values()) - min(sizes.values()) <= 1
    perm = np.random.RandomState(1234).permutation(n)
    assert all(folds[perm[i]] == i % 10 for i in range(n))
    train = decoded(out, "train")
    assert train == [t for t in raw[0] + raw[1] if t]
    if name == "subj":  # subj.subjective line 21 is Latin-1
        assert train[5000 + 20][:7] == ["si", "el", "siglo", "xxi", "necesita", "de", "h\u00e9roes"]
    check_dictionary(out, train, [], m["num_train_words"])


def test_sick_real(tmp_path):
    root = real("sick")
    out = tmp_path / "sick"
    m = run("sick", out, input=root)
    assert m["splits"] == {"train": 4500, "valid": 500, "test": 4927}
    assert m["dropped"] == {"train": {}, "valid": {}, "test": {}} and m["kind"] == "relatedness"
    for split, name in (("train", "SICK_train.txt"), ("valid", "SICK_trial.txt"), ("test", "SICK_test_annotated.txt")):
        rows = [row.split("\t") for row in lines(root / name)[1:]]
        labels = lines(out / f"{split}.label")
        assert labels == [row[3] for row in rows] and all(1 <= float(x) <= 5 for x in labels)
        assert decoded(out, split, 1) == [tokenize_sick(row[2]) for row in rows]
    assert decoded(out, "train", 0)[0] == ("a group of kids is playing in a yard and an old man is standing in the "
                                           "background").split()


def test_snli_slice_real(tmp_path):
    root = real("snli_slice")
    dev, test = root / "snli_1.0_dev.first1289.jsonl", root / "snli_1.0_test.subset1277.jsonl"
    out = tmp_path / "snli"
    m = run("snli", out, train=dev, valid=dev, test=test)
    records = [json.loads(line) for line in dev.read_text(encoding="utf-8").splitlines()]
    labelled = [r for r in records if r["gold_label"] != "-"]
    assert len(records) == 1289 and len(labelled) == 1273
    sides = [len(tokenize_nli(r[k])) for r in labelled for k in ("sentence1_binary_parse", "sentence2_binary_parse")]
    limit = np.percentile(sides, 97, method="linear")
    too_long = sum(1 for r in labelled if max(len(tokenize_nli(r["sentence1_binary_parse"])),
                                              len(tokenize_nli(r["sentence2_binary_parse"]))) > limit)
    assert too_long > 0
    assert m["dropped"] == {"train": {"no_gold_label": 16, "too_long": too_long}, "valid": {"no_gold_label": 16},
                            "test": {"no_gold_label": 23}}
    assert m["splits"] == {"train": 1273 - too_long, "valid": 1273, "test": 1254}
    assert Counter(lines(out / "valid.label")) == {"2": 433, "1": 421, "0": 419}
    assert Counter(lines(out / "test.label")) == {"1": 429, "0": 420, "2": 405}
    assert decoded(out, "valid", 0) == [tokenize_nli(r["sentence1_binary_parse"]) for r in labelled]
    assert decoded(out, "valid", 1)[0] == ("the sisters are hugging goodbye while holding to go packages after just "
                                           "eating lunch .").split()


def decode(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return line.decode("latin-1")


def sst_leaves(line: str) -> list[str]:
    """The tokens of a PTB tree line, read with a regular expression (independently of parse_tree)."""
    leaves = re.findall(r"\(\d ([^()]+)\)", line)
    return [t for leaf in leaves for t in {"-LRB-": "(", "-RRB-": ")"}.get(leaf, leaf).lower().split()]


def sst_counts(tree_lines: list[str]) -> tuple[Counter, int]:
    """Node labels and neutral roots of PTB tree lines, counted from the text: every '(' opens a node."""
    labels = Counter(label for line in tree_lines for label in re.findall(r"\((\d)", line))
    assert sum(labels.values()) == sum(line.count("(") for line in tree_lines)
    return labels, sum(1 for line in tree_lines if line.startswith("(2 "))


@pytest.mark.slow
def test_sst_real(tmp_path):
    root = real("sst_ptb")
    train_raw, dev_raw, test_raw = (lines(root / f) for f in ("train.txt", "dev.txt", "test.txt"))
    assert (len(train_raw), len(dev_raw), len(test_raw)) == (8544, 1101, 2210)

    # the full training split, read but not binarised (binarising 600k phrases takes a while)
    labels, neutral_roots = sst_counts(train_raw)
    nodes, non_neutral = sum(labels.values()), sum(labels.values()) - labels["2"]
    splits = loaded("sst5", input=root)
    assert len(splits["train"].examples) == nodes
    assert len(write_order(splits["train"].examples, oversample=True)) == nodes + 3 * (non_neutral + neutral_roots)

    # end to end with the first 300 training trees and the full dev and test sets
    head = write(tmp_path / "train300.txt", "\n".join(train_raw[:300]) + "\n")
    labels, neutral_roots = sst_counts(train_raw[:300])
    nodes, non_neutral = sum(labels.values()), sum(labels.values()) - labels["2"]
    out = tmp_path / "sst5"
    m = run("sst5", out, input=root, train=head)
    assert m["splits"] == {"train": nodes + 3 * (non_neutral + neutral_roots), "valid": 1101, "test": 2210}
    assert m["sources"]["train"] == [str(head)] and m["sources"]["test"] == [str(root.absolute() / "test.txt")]
    splits = loaded("sst2", input=root, train=head)
    assert {k: len(s.examples) for k, s in splits.items()} == {"train": non_neutral, "valid": 872, "test": 1821}
    assert splits["test"].dropped == {"neutral": 389} and splits["train"].dropped == {"neutral": labels["2"]}
    assert Counter(ex.label for ex in splits["test"].examples) == {"0": 279 + 633, "1": 510 + 399}
    train_labels = lines(out / "train.label")
    assert Counter(train_labels[:nodes]) == labels
    assert Counter(train_labels[nodes:]) == {k: 3 * v for k, v in (labels - Counter({"2": labels["2"]})
                                                                   + Counter({"2": neutral_roots})).items()}
    assert Counter(lines(out / "test.label")) == {"0": 279, "1": 633, "2": 389, "3": 510, "4": 399}
    assert lines(out / "test.label") == [line[1] for line in test_raw]
    assert decoded(out, "test") == [sst_leaves(line) for line in test_raw]
    assert decoded(out, "valid", rows=1)[0][:6] == ["it", "'s", "a", "lovely", "film", "with"]
    assert decoded(out, "train", rows=3) == [sst_leaves(train_raw[0]), ["the", "rock"], ["the"]]
    # dictionary counts before oversampling: a leaf token occurs in as many training phrases as it has ancestors
    depth_counts = Counter()
    for line in train_raw[:300]:
        for match in re.finditer(r"\(\d ([^()]+)\)", line):
            depth = line.count("(", 0, match.start()) - line.count(")", 0, match.start()) + 1
            for token in sst_leaves(match.group(0)):
                depth_counts[token] += depth
    entries = [line.rsplit(" ", 1) for line in lines(out / "dict.txt")]
    assert m["num_train_words"] == len(depth_counts)
    assert [(w, int(c)) for w, c in entries[:m["num_train_words"]]] == by_count(depth_counts)
    assert {w for w, _ in entries[m["num_train_words"]:]} == {t for line in dev_raw + test_raw
                                                              for t in sst_leaves(line)} - set(depth_counts)
