"""scripts/prepare_data.py and mtsa_fairseq.experiments.translation.data_prep: normalisation, validation, filters,
end to end."""

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
from fairseq.data import Dictionary, data_utils
from process_helpers import wait_for

from mtsa_fairseq.experiments.errors import DataError, LaunchError
from mtsa_fairseq.experiments.files import staging_dir
from mtsa_fairseq.experiments.translation import scoring
from mtsa_fairseq.experiments.translation.data_prep import (
    Corpus,
    NamedCorpus,
    PrepareConfig,
    check_pair,
    copy_decompressed,
    count_lines,
    filter_reason,
    iter_lines,
    normalize,
    prepare,
    validate,
)
from mtsa_fairseq.experiments.translation.toy_corpus import write_corpus
from mtsa_fairseq.experiments.translation.training_view import resolve_data

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "prepare_data.py"
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
LONG = " ".join(["the big red dog"] * 75)  # 300 words: more than 256 pieces


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=ENV,
                          timeout=1200)


def append(path: Path, *lines: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def bin_sizes(bin_dir: Path, subset: str) -> tuple[int, int]:
    return tuple(len(data_utils.load_indexed_dataset(str(bin_dir / f"{subset}.en-de.{lang}"))) for lang in ("en", "de"))


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# ------------------------------------------------------------------------------------------------ unit


@pytest.mark.parametrize("raw, form, expected", [
    ("  Hello \t world \r", "nfkc", "Hello world"),
    ("\ufeffa\x00b\x1bc\x7f", "nfkc", "abc"),
    ("a\x85b\u2028c\u00a0d", "nfkc", "a b c d"),
    ("ﬁne ＡＢＣ ½", "nfkc", "fine ABC 1⁄2"),
    ("ﬁne ＡＢＣ e\u0301", "nfc", "ﬁne ＡＢＣ \u00e9"),
    ("ﬁne e\u0301 \x01x ", "none", "ﬁne e\u0301 x"),
    ("Grüße, „Straße“ – 5 €", "nfkc", "Grüße, „Straße“ – 5 €"),
    (" \t\r ", "nfkc", ""),
])
def test_normalize(raw, form, expected):
    assert normalize(raw, form) == expected


def test_lines_end_at_newline_only(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("a\rb\nc\u2028d\n\nlast".encode())
    assert count_lines(path) == 4
    assert list(iter_lines(path)) == ["a\rb", "c\u2028d", "", "last"]
    assert [normalize(line) for line in iter_lines(path)] == ["a b", "c d", "", "last"]


def test_bom_and_missing_final_newline(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("\ufeffa\ufeffb\r\nc".encode())
    assert count_lines(path) == 2
    assert list(iter_lines(path)) == ["a\ufeffb\r", "c"]  # only the byte-order mark at the start goes


def test_gzip_input_is_read_like_plain_text(tmp_path):
    data = b"eins\nzwei\r\n\ndrei\n"
    plain, packed, unsuffixed = tmp_path / "x.txt", tmp_path / "x.txt.gz", tmp_path / "y"
    plain.write_bytes(data)
    packed.write_bytes(gzip.compress(data))
    unsuffixed.write_bytes(gzip.compress(data))  # recognised by content, not by name
    for path in (packed, unsuffixed):
        assert count_lines(path) == count_lines(plain) == 4
        assert list(iter_lines(path)) == list(iter_lines(plain)) == ["eins", "zwei\r", "", "drei"]
    copy_decompressed(packed, tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == data


def test_damaged_gzip_is_a_data_error(tmp_path):
    packed = gzip.compress("".join(f"zeile {k}\n" for k in range(5000)).encode())
    truncated, corrupt = tmp_path / "t.gz", tmp_path / "c.gz"
    truncated.write_bytes(packed[:-20])
    corrupt.write_bytes(packed[:40] + bytes(b ^ 0x55 for b in packed[40:60]) + packed[60:])
    with pytest.raises(DataError, match=f"cannot read {truncated}: Compressed file ended"):
        count_lines(truncated)
    with pytest.raises(DataError, match=f"cannot read {corrupt}: Error -3 while decompressing data"):
        count_lines(corrupt)


def test_check_pair_names_files_and_counts(tmp_path):
    src, tgt, empty = tmp_path / "c.en", tmp_path / "c.de", tmp_path / "e.de"
    src.write_text("a\nb\nc\n")
    tgt.write_text("a\nb\n")
    empty.write_text("")
    with pytest.raises(DataError, match=rf"misaligned.*{src}.* 3 lines.*{tgt}.* 2"):
        check_pair(src, tgt, "--train")
    with pytest.raises(DataError, match=rf"empty file: {empty}"):
        check_pair(src, empty, "--valid")
    with pytest.raises(DataError, match=rf"file not found: {tmp_path / 'nope'}"):
        check_pair(src, tmp_path / "nope", "--test x")
    with pytest.raises(DataError, match=rf"--train: file {tmp_path} is a directory, not a file"):
        check_pair(tmp_path, tgt, "--train")
    tgt.write_text("a\nb\nc")  # no final newline: still 3 lines
    assert check_pair(src, tgt, "--train") == 3


def config(tmp_path: Path, **overrides) -> PrepareConfig:
    raw = tmp_path / "raw"
    if not raw.exists():
        write_corpus(raw, {"train": 60, "valid": 5, "test": 5}, seed=5)
    kwargs = dict(source_lang="en", target_lang="de", train=[Corpus(raw / "train.en", raw / "train.de")],
                  out=tmp_path / "out", valid=Corpus(raw / "valid.en", raw / "valid.de"),
                  tests=[NamedCorpus("t", raw / "test.en", raw / "test.de")])
    return PrepareConfig(**{**kwargs, **overrides})


def test_validate_catches_bad_configurations(tmp_path):
    cfg = config(tmp_path)
    assert validate(cfg) == {"train": 60, "valid": 5, "t": 5}
    raw = tmp_path / "raw"
    bad = {
        "duplicate --test name: t": dict(tests=[NamedCorpus("t", raw / "test.en", raw / "test.de")] * 2),
        "holds out nothing": dict(valid=None, valid_every=100),
        "exactly one of --valid": dict(valid_every=10),
        "both 'en'": dict(target_lang="en"),
        "--test name 'a/b' must be letters": dict(tests=[NamedCorpus("a/b", raw / "test.en", raw / "test.de")]),
        "--character-coverage": dict(character_coverage=0.5),
        "--max-length-ratio": dict(max_ratio=0.5),
        "--seed must be at least 0, got -1": dict(seed=-1),
    }
    for message, overrides in bad.items():
        with pytest.raises(DataError, match=message):
            validate(config(tmp_path, **overrides))
    assert validate(config(tmp_path, tests=[NamedCorpus("töy", raw / "test.en", raw / "test.de")]))["töy"] == 5
    (tmp_path / "out").mkdir()
    validate(cfg)  # an empty directory is fine
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="not empty; pass --overwrite"):
        validate(cfg)
    with pytest.raises(DataError, match="not a prepared data directory"):
        validate(config(tmp_path, overwrite=True))


@pytest.mark.parametrize("lengths, max_ratio, expected", [
    ((10, 12), None, None), ((256, 256), None, None), ((257, 3), None, "too_long"), ((3, 300), 1.5, "too_long"),
    ((2, 40), None, None), ((2, 40), 3.0, "ratio"), ((10, 15), 1.5, None), ((10, 16), 1.5, "ratio"),
    ((0, 4), None, "empty"),
])
def test_filter_reason(lengths, max_ratio, expected):
    assert filter_reason(*lengths, max_tokens=256, max_ratio=max_ratio) == expected


@pytest.mark.slow
def test_vocab_too_large_is_restated_and_nothing_is_written(tmp_path):
    cfg = config(tmp_path, vocab_size=5000)
    with pytest.raises(DataError, match=r"--vocab-size 5000 is too large .*at most \d+"):
        prepare(cfg, log=lambda _: None)
    assert not cfg.out.exists() and leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------- CLI errors


@pytest.fixture()
def toy(tmp_path):
    write_corpus(tmp_path / "raw", {"train": 30, "valid": 5, "test": 5}, seed=4)
    return tmp_path


def _misaligned(raw: Path) -> str:
    append(raw / "train.de", "ein weiterer satz")
    return f"--train: misaligned line counts: {raw / 'train.en'} has 30 lines, {raw / 'train.de'} has 31"


def _empty(raw: Path) -> str:
    (raw / "test.de").write_text("")
    return f"--test t: empty file: {raw / 'test.de'}"


def _existing(raw: Path) -> str:
    (raw.parent / "out").mkdir()
    (raw.parent / "out" / "keep.txt").write_text("mine")
    return f"--out {raw.parent / 'out'} exists and is not empty; pass --overwrite to replace it"


def _not_utf8(path: Path, line: int, compress: bool = False) -> str:
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] += b" gr\xfc\xdfe"  # Latin-1
    data = b"\n".join(lines)
    path.write_bytes(gzip.compress(data) if compress else data)
    return f"{path}:{line}: not valid UTF-8"


def _not_utf8_train_gzip(raw: Path) -> str:
    return _not_utf8(raw / "train.en", 7, compress=True)  # gzip, recognised by content


def _not_utf8_valid(raw: Path) -> str:
    return _not_utf8(raw / "valid.de", 2)


def _not_utf8_test(raw: Path) -> str:
    return _not_utf8(raw / "test.de", 5)


@pytest.mark.slow
@pytest.mark.parametrize("make_bad", [_misaligned, _empty, _existing, _not_utf8_train_gzip, _not_utf8_valid,
                                      _not_utf8_test])
def test_bad_input_exits_with_one_line_and_writes_nothing(toy, make_bad):
    raw = toy / "raw"
    message = make_bad(raw)
    before = sorted(p.name for p in toy.rglob("*"))
    proc = run_script("--source-lang", "en", "--target-lang", "de", "--train", raw / "train.en", raw / "train.de",
                      "--valid", raw / "valid.en", raw / "valid.de", "--test", "t", raw / "test.en", raw / "test.de",
                      "--out", toy / "out", "--vocab-size", "60")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == f"error: {message}"
    assert sorted(p.name for p in toy.rglob("*")) == before
    assert "[prepare] normalising" not in proc.stdout


# -------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    raw = root / "raw"
    write_corpus(raw, {"train": 300, "valid": 40, "test": 20, "test1": 20}, seed=3)
    append(raw / "train.en", "the dog sees the cat", LONG, "the dog")  # empty side, too long, length ratio
    append(raw / "train.de", "   ", LONG, " ".join(["der hund"] * 20))
    append(raw / "valid.en", "", LONG)  # valid/test are never filtered
    append(raw / "valid.de", "", LONG)
    append(raw / "test.en", "\ufeff the  dog\tsees\x00 the cat \r", "", LONG)
    append(raw / "test.de", "der hund die\rkatze sieht", "", LONG)  # a stray CR does not end a line
    for lang in ("en", "de"):  # the second test set comes compressed
        (raw / f"test1.{lang}.gz").write_bytes(gzip.compress((raw / f"test1.{lang}").read_bytes()))
    out = root / "out"
    proc = run_script("--source-lang", "en", "--target-lang", "de", "--train", raw / "train.en", raw / "train.de",
                      "--valid", raw / "valid.en", raw / "valid.de", "--test", "toy2016", raw / "test.en",
                      raw / "test.de", "--test", "toy2017", raw / "test1.en.gz", raw / "test1.de.gz", "--out", out,
                      "--vocab-size", "100", "--max-length-ratio", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return raw, out, proc


@pytest.mark.slow
def test_manifest(prepared):
    _, out, proc = prepared
    manifest = json.loads((out / "manifest.json").read_text())
    files = manifest.pop("checksums")
    assert sorted(files) == sorted(f"bin/{p.name}" for p in (out / "bin").iterdir() if p.name != "preprocess.log")
    for name, entry in files.items():
        data = (out / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert manifest == {
        "schema": "mtsa-fairseq.data.v1", "source_lang": "en", "target_lang": "de", "data_bin": "bin",
        "spm_model": "spm.model", "vocab_size": 100, "normalization": "nfkc",
        "train": {"lines": 303, "kept": 300, "dropped_empty": 1, "dropped_too_long": 1, "dropped_ratio": 1},
        "valid": {"lines": 42, "subset": "valid"},
        "tests": {
            "toy2016": {"subset": "test", "lines": 23, "source": "raw/toy2016.en", "reference": "raw/toy2016.de"},
            "toy2017": {"subset": "test1", "lines": 20, "source": "raw/toy2017.en", "reference": "raw/toy2017.de"},
        },
    }
    assert "[prepare] train: 303 lines, kept 300, dropped 3" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == f"[prepare] wrote {out}"
    assert leftovers(out.parent) == []


@pytest.mark.slow
def test_data_changed_after_preparation_is_refused_naming_the_file(prepared, tmp_path):
    """Token ids edited inside a .bin, or a file cut short, no longer match the manifest: no run starts on it."""
    _, out, _ = prepared
    assert resolve_data(out).dictionaries == {
        name: hashlib.sha256((out / "bin" / name).read_bytes()).hexdigest() for name in ("dict.de.txt", "dict.en.txt")}
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    data = bytearray((copy / "bin/test.en-de.en.bin").read_bytes())
    data[10] ^= 1
    (copy / "bin/test.en-de.en.bin").write_bytes(data)
    with pytest.raises(LaunchError, match=re.escape(f"{copy / 'bin/test.en-de.en.bin'} changed after preparation "
                                                    "(SHA-256 differs from")):
        resolve_data(copy)
    (copy / "bin/dict.de.txt").write_text((copy / "bin/dict.de.txt").read_text()[:-10])
    with pytest.raises(LaunchError, match=re.escape(f"{copy / 'bin/dict.de.txt'} changed after preparation "
                                                    "(size differs")):
        resolve_data(copy)


@pytest.mark.slow
def test_bin_has_every_split_with_the_right_counts(prepared):
    _, out, _ = prepared
    sizes = {subset: bin_sizes(out / "bin", subset) for subset in ("train", "valid", "test", "test1")}
    assert sizes == {"train": (300, 300), "valid": (42, 42), "test": (23, 23), "test1": (20, 20)}
    assert (out / "bin" / "dict.en.txt").read_text() == (out / "bin" / "dict.de.txt").read_text()


@pytest.mark.slow
def test_raw_test_text_is_kept_untouched(prepared):
    raw, out, _ = prepared
    assert (out / "raw" / "toy2016.en").read_bytes() == (raw / "test.en").read_bytes()
    assert (out / "raw" / "toy2017.de").read_bytes() == (raw / "test1.de").read_bytes()  # decompressed


@pytest.mark.slow
def test_scoring_reads_the_references_as_prepare_counted_them(prepared):
    _, out, _ = prepared
    tests = json.loads((out / "manifest.json").read_text())["tests"]
    refs = {name: scoring.read_references(out / t["reference"], t["lines"]) for name, t in tests.items()}
    assert [len(r) for r in refs.values()] == [23, 20]
    assert refs["toy2016"][-3] == "der hund die\rkatze sieht"


@pytest.mark.slow
def test_encoded_test_source_decodes_to_the_normalised_text(prepared):
    raw, out, _ = prepared
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    dictionary = Dictionary.load(str(out / "bin" / "dict.en.txt"))
    dataset = data_utils.load_indexed_dataset(str(out / "bin" / "test.en-de.en"), dictionary)
    decoded = [sp.decode_pieces(dictionary.string(dataset[i]).split()) for i in range(len(dataset))]
    expected = [normalize(line) for line in iter_lines(raw / "test.en")]
    assert decoded == expected
    assert decoded[-3:] == ["the dog sees the cat", "", LONG]


@pytest.mark.slow
def test_overwrite_replaces_a_prepared_directory_and_holds_out_valid(toy):
    raw, out = toy / "raw", toy / "out"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    (out / "stale.txt").write_text("old")
    proc = run_script("--source-lang", "en", "--target-lang", "de", "--train", raw / "train.en", raw / "train.de",
                      "--valid-from-train", "10", "--out", out, "--vocab-size", "50", "--overwrite")
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["train"]["lines"] == manifest["train"]["kept"] == 27
    assert manifest["valid"] == {"lines": 3, "subset": "valid"} and manifest["tests"] == {}
    assert not (out / "stale.txt").exists()
    assert bin_sizes(out / "bin", "valid") == (3, 3) and bin_sizes(out / "bin", "train") == (27, 27)
    assert leftovers(toy) == []


@pytest.mark.slow
@pytest.mark.skipif(not MULTI30K.is_dir(), reason="../shared/data/multi30k not available")
def test_multi30k(tmp_path):
    d, out = MULTI30K, tmp_path / "multi30k"
    proc = run_script("--source-lang", "en", "--target-lang", "de", "--train", d / "train.en.gz", d / "train.de.gz",
                      "--valid", d / "val.en.gz", d / "val.de.gz",
                      "--test", "test_2016_flickr", d / "test_2016_flickr.en.gz", d / "test_2016_flickr.de.gz",
                      "--test", "test_2017_flickr", d / "test_2017_flickr.en.gz", d / "test_2017_flickr.de.gz",
                      "--out", out, "--vocab-size", "2000", "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["train"]["lines"] == manifest["train"]["kept"] == 29000
    assert manifest["valid"]["lines"] == 1014
    assert {name: t["lines"] for name, t in manifest["tests"].items()} == {"test_2016_flickr": 1000,
                                                                         "test_2017_flickr": 1000}
    assert bin_sizes(out / "bin", "test1") == (1000, 1000)
    assert bin_sizes(out / "bin", "train") == (manifest["train"]["kept"],) * 2
    with gzip.open(d / "test_2017_flickr.de.gz", "rb") as f:
        assert (out / "raw" / "test_2017_flickr.de").read_bytes() == f.read()


def preprocess_children(parent: Path) -> list[int]:
    """Live fairseq-preprocess processes working in a temporary directory of ``parent``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            cwd = os.readlink(proc / "cwd")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if b"fairseq_cli.preprocess" in cmdline and cwd.startswith(str(parent / ".out.tmp-")) and state != "Z":
            found.append(int(proc.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killed_preparation_stops_its_child_and_the_rerun_cleans_up(toy):
    raw = toy / "raw"
    args = [sys.executable, str(SCRIPT), "--source-lang", "en", "--target-lang", "de", "--train", raw / "train.en",
            raw / "train.de", "--valid-from-train", "10", "--out", toy / "out", "--vocab-size", "50"]
    proc = subprocess.Popen(list(map(str, args)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    child = wait_for(lambda: preprocess_children(toy), "fairseq-preprocess", timeout=600)
    assert len(child) == 1
    proc.kill()  # kill -9 in the middle of fairseq-preprocess
    proc.wait()
    wait_for(lambda: not preprocess_children(toy), "fairseq-preprocess to stop with its parent", timeout=300)
    assert [name for name in leftovers(toy) if name.startswith(".out.tmp-")] and not (toy / "out").exists()
    rerun = run_script(*args[2:])
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert leftovers(toy) == [] and (toy / "out" / "manifest.json").is_file()


@pytest.mark.slow
def test_preparation_of_an_output_being_prepared_is_refused(toy):
    raw = toy / "raw"
    with staging_dir(toy / "out"):  # as if another preparation of the same output were running
        busy = run_script("--source-lang", "en", "--target-lang", "de", "--train", raw / "train.en", raw / "train.de",
                          "--valid-from-train", "10", "--out", toy / "out", "--vocab-size", "50")
    assert busy.returncode == 1 and busy.stderr.strip().splitlines()[-1] == (
        f"error: output {toy / 'out'} is in use by preparation pid {os.getpid()}; wait for it to finish or stop it, "
        "then rerun")
    assert leftovers(toy) == []


def test_the_toy_corpus_command_never_replaces_a_corpus_unasked(tmp_path):
    make = [sys.executable, str(ROOT / "scripts" / "make_toy_corpus.py"), str(tmp_path / "raw")]
    sizes = ["--train", "10", "--valid", "5", "--test", "5"]
    assert subprocess.run([*make, *sizes], capture_output=True, text=True, env=ENV).returncode == 0
    before = (tmp_path / "raw" / "train.en").read_text()
    proc = subprocess.run([*make, *sizes, "--seed", "3"], capture_output=True, text=True, env=ENV)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(
        f"{tmp_path / 'raw' / 'train.en'} exists (pass --overwrite to replace the corpus in {tmp_path / 'raw'})")
    assert (tmp_path / "raw" / "train.en").read_text() == before
    proc = subprocess.run([*make, *sizes, "--seed", "3", "--overwrite"], capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0 and (tmp_path / "raw" / "train.en").read_text() != before


@pytest.mark.parametrize("option", [("--vocab-size", "0"), ("--workers", "0"), ("--character-coverage", "2"),
                                    ("--valid-from-train", "1")])
def test_option_values_no_input_makes_right_are_usage_errors(tmp_path, option):
    """Option errors exit 2, before any file is read (inputs and runs exit 1)."""
    held_out = [] if option[0] == "--valid-from-train" else ["--valid-from-train", "100"]
    proc = run_script("--source-lang", "en", "--target-lang", "de", "--train", tmp_path / "a.en", tmp_path / "a.de",
                      "--out", tmp_path / "out", *held_out, *option)
    assert proc.returncode == 2 and f"error: {option[0]} must" in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert not (tmp_path / "out").exists()
