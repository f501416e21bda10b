"""mtsa_fairseq.experiments.translation.scoring and scripts/score.py, end to end through fairseq's real CLIs on a
tiny corpus."""

import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
from fairseq import checkpoint_utils
from process_helpers import processes_naming, wait_for
from sacremoses import MosesTokenizer

import mtsa_fairseq.plugin
from mtsa_fairseq.contracts import RUN_SCHEMA, check_dictionaries, checksums
from mtsa_fairseq.experiments.processes import RunLock
from mtsa_fairseq.experiments.translation import scoring
from mtsa_fairseq.experiments.translation.data_prep import count_lines
from mtsa_fairseq.experiments.translation.toy_corpus import write_corpus

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "score.py"
USER_DIR = str(Path(mtsa_fairseq.__file__).parent)
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
TINY = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--share-all-embeddings",
]

# fairseq-generate output as printed with --batch-size 3 (ids come in batch order, not sentence order)
GENERATE_OUTPUT = """\
2026-11-22 04:50:01 | INFO | fairseq_cli.generate | loading model(s) from ckpt/checkpoint_last.pt
S-1\t\u2581the \u2581gardens \u2581hear \u2581the \u2581red \u2581rivers
T-1\t\u2581die \u2581g\u00e4rten \u2581h\u00f6ren \u2581die \u2581roten \u2581fl\u00fcsse
H-1\t-0.52\t\u2581Die \u2581G\u00e4rten \u2581h\u00f6ren \u2581die \u2581Zwei - Staaten - L\u00f6sung .
D-1\t-0.52\t\u2581Die \u2581G\u00e4rten \u2581h\u00f6ren \u2581die \u2581Zwei - Staaten - L\u00f6sung .
P-1\t-0.5940 -2.8654 -2.7453 -2.9820 -3.1280 -3.3806 -4.5150 -2.6328 -0.8628
S-0\t\u2581the \u2581old \u2581horse
T-0\t\u2581das \u2581alte \u2581pferd
H-0\t-1.91\t\u2581das \u2581alte \u2581Pferd
D-0\t-1.91\t\u2581das \u2581alte \u2581Pferd
P-0\t-2.0743 -1.5388 -1.6043 -1.6052
S-2\t\u2581the \u2581car
T-2\t\u2581der \u2581wagen
H-2\t-3.00\t
D-2\t-3.00\t
P-2\t-0.7020
2026-11-22 04:50:02 | INFO | fairseq_cli.generate | NOTE: hypothesis and token scores are output in base 2
Generate test with beam=4: BLEU4 = 4.38, 12.5/6.0/3.8/1.3 (BP=1.000, ratio=2.316, syslen=88, reflen=38)
"""

HYPS = ["Die Zwei-Staaten-Lösung ist seit 1967 gut.", "Das ist ein well-known test, nicht wahr?", "Ja"]
REFS = ["Die Zwei-Staaten-Lösung war seit 1967 gut.", "Das ist ein well-known Test, oder?", "Ja"]


def run(tool: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, env=ENV, timeout=1500)
    if proc.returncode != 0:
        raise AssertionError(f"{tool} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def score(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=ENV,
                          timeout=1500)


def test_compound_split():
    assert scoring.compound_split("Die Zwei-Staaten-Lösung") == "Die Zwei ##AT##-##AT## Staaten ##AT##-##AT## Lösung"
    # non-overlapping like perl's s///g: the "b" of "a-b" is consumed, so "b-c" stays joined
    assert scoring.compound_split("a-b-c") == "a ##AT##-##AT## b-c"
    assert scoring.compound_split("von 3 - 4 -x y-") == "von 3 - 4 -x y-"


def test_bleu_functions_equal_sacrebleu():
    score, signature = scoring.sacrebleu_bleu(HYPS, REFS)
    reference = sacrebleu.corpus_bleu(HYPS, [REFS])
    assert score == reference.score
    assert signature == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" + sacrebleu.__version__
    assert scoring.t2t_intl_bleu(HYPS, REFS) == sacrebleu.corpus_bleu(HYPS, [REFS], tokenize="intl").score
    moses = MosesTokenizer(lang="de")
    split = [[scoring.compound_split(moses.tokenize(s, escape=False, return_str=True)) for s in side]
             for side in (HYPS, REFS)]
    assert "Zwei ##AT##-##AT## Staaten ##AT##-##AT## Lösung" in split[0][0]
    expected = sacrebleu.corpus_bleu(split[0], [split[1]], tokenize="none", smooth_method="none", force=True).score
    assert scoring.tokenized_compound_split_bleu(HYPS, REFS, "de") == expected
    bleu = scoring.bleu_scores(HYPS, REFS, "de")
    lowercased = sacrebleu.corpus_bleu([h.lower() for h in HYPS], [[r.lower() for r in REFS]]).score
    assert lowercased == sacrebleu.corpus_bleu(HYPS, [REFS], lowercase=True).score != score
    assert bleu == {"sacrebleu": score, "signature": signature, "sacrebleu_lc": lowercased,
                    "tokenized_compound_split": expected,
                    "t2t_intl": scoring.t2t_intl_bleu(HYPS, REFS)}


def test_rescore_adds_new_metrics_and_refuses_changed_hypotheses(tmp_path):
    (tmp_path / "r.hyp.txt").write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    (tmp_path / "refs.de").write_text("\n".join(REFS) + "\n", encoding="utf-8")
    bleu = scoring.bleu_scores(HYPS, REFS, "de")
    older = {k: v for k, v in bleu.items() if k != "sacrebleu_lc"}  # scored before lowercased BLEU was recorded
    result = tmp_path / "r.json"
    fields = {"schema": "mtsa-fairseq.result.v1", "system": "mtsa", "test_set": "toy", "num_params": 1000,
              "num_sentences": 3, "hypotheses": "r.hyp.txt", "references": "refs.de", "bleu": older, "seed": 1}
    result.write_text(json.dumps(fields), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rescore", str(result), "--target-lang", "de"],
                          capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0 and proc.stdout == f"rescored {result}\n", proc.stderr
    rescored = json.loads(result.read_text(encoding="utf-8"))
    assert rescored["bleu"] == bleu and rescored["seed"] == 1
    (tmp_path / "r.hyp.txt").write_text("\n".join(HYPS[::-1]) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rescore", str(result), "--target-lang", "de"],
                          capture_output=True, text=True, env=ENV)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "sacrebleu recomputes to" in proc.stderr and "hypotheses, references or scorer changed" in proc.stderr
    assert json.loads(result.read_text(encoding="utf-8")) == rescored
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rescore", str(result)], capture_output=True, text=True)
    assert proc.returncode == 2 and "--rescore needs --target-lang" in proc.stderr
    (tmp_path / "r.hyp.txt").unlink()  # a result whose hypotheses are gone: one line naming the file
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rescore", str(result), "--target-lang", "de"],
                          capture_output=True, text=True, env=ENV)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "r.hyp.txt" in proc.stderr
    for edit, message in (({"references": None}, "lacks references"), ({"hypotheses": None}, "lacks hypotheses"),
                          ({"bleu": "x"}, "bleu must be an object of BLEU values, not str"),
                          ({"num_sentences": "3"}, "num_sentences must be int, got '3'")):
        result.write_text(json.dumps({**fields, **edit}), encoding="utf-8")  # edited by hand: one line, no traceback
        proc = subprocess.run([sys.executable, str(SCRIPT), "--rescore", str(result), "--target-lang", "de"],
                              capture_output=True, text=True, env=ENV)
        where = f"{result}:" if " must " in message else f"{result}"
        assert proc.returncode == 1 and proc.stderr == f"error: {where} {message}\n"


def test_tokenized_compound_split_bleu_by_hand():
    # tokens: the well ##AT##-##AT## known man ##AT##-##AT## made lake is|was big (10 each)
    # matches: 9/10 unigrams, 7/9 bigrams, 6/8 trigrams, 5/7 4-grams, no brevity penalty
    value = scoring.tokenized_compound_split_bleu(["the well-known man-made lake is big"],
                                                  ["the well-known man-made lake was big"], "en")
    assert value == pytest.approx(100 * (9 / 10 * 7 / 9 * 6 / 8 * 5 / 7) ** 0.25)
    # multi-bleu semantics: no smoothing, a missing 4-gram match gives 0
    assert scoring.tokenized_compound_split_bleu(["a b c x"], ["a b c d"], "en") == 0.0


def test_parse_generate_output_orders_by_id():
    parsed = scoring.parse_generate_output(GENERATE_OUTPUT)
    assert sorted(parsed) == [0, 1, 2]
    hyps = scoring.ordered_hypotheses(parsed, 3)
    assert hyps[0] == "\u2581das \u2581alte \u2581Pferd"
    assert hyps[1].startswith("\u2581Die \u2581G\u00e4rten")
    assert hyps[2] == ""
    assert scoring.detokenize(hyps) == ["\u2581das \u2581alte \u2581Pferd", hyps[1], ""]
    with pytest.raises(scoring.ScoringError, match="translated 3 sentences of subset 'test' but the reference has 4"):
        scoring.ordered_hypotheses(parsed, 4)
    with pytest.raises(scoring.ScoringError, match="missing ids \\[1\\]"):
        scoring.ordered_hypotheses({0: "a", 2: "b"}, 2)
    with pytest.raises(scoring.ScoringError, match="two hypotheses for sentence 0"):
        scoring.parse_generate_output("H-0\t-1\ta\nH-0\t-2\tb\n")


def test_detokenize_with_sentencepiece(tmp_path):
    import sentencepiece

    write_corpus(tmp_path, {"train": 200}, seed=4)
    sentencepiece.SentencePieceTrainer.train(input=str(tmp_path / "train.de"), model_prefix=str(tmp_path / "spm"),
                                             vocab_size=60, character_coverage=1.0)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    lines = scoring.read_lines(tmp_path / "train.de")[:5]
    pieces = [" ".join(processor.encode(line, out_type=str)) for line in lines]
    assert pieces[0] != lines[0]
    assert scoring.detokenize(pieces, tmp_path / "spm.model") == lines


@pytest.fixture(scope="module")
def trained(toy_data):
    root = toy_data
    run("fairseq-train", str(root / "bin"), "--user-dir", USER_DIR, "--cpu", "--seed", "5", *TINY,
        "--arch", "transformer_mtsa_tiny", "--optimizer", "adam", "--lr", "5e-3", "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", "10", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", "1024", "--num-workers", "0", "--no-epoch-checkpoints", "--save-dir", str(root / "ckpt"),
        "--log-format", "simple", "--max-update", "40")
    return root


def _parameters_in_checkpoint(path: Path) -> int:
    """Distinct parameter tensors in the saved state dict (shared embeddings counted once, no buffers)."""
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))["model"]
    tensors = {t.untyped_storage().data_ptr(): t for k, t in state.items() if not k.endswith(".version")}
    return sum(t.numel() for t in tensors.values())


@pytest.mark.slow
def test_score_explicit_data_bin(trained, tmp_path):
    root = trained
    out = tmp_path / "res" / "toy.json"
    proc = score("--checkpoint", str(root / "ckpt/checkpoint_last.pt"), "--data-bin", str(root / "bin"),
                 "--gen-subset", "test", "--reference", str(root / "raw/test.de"), "--result", str(out), "--cpu",
                 "--batch-size", "7", "--system", "mtsa")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "signature: nrefs:1|case:mixed|eff:no|tok:13a" in proc.stdout
    result = json.loads(out.read_text())
    assert result["schema"] == "mtsa-fairseq.result.v1"
    assert (result["system"], result["setup"], result["seed"]) == ("mtsa", None, 5)
    assert result["arch"] == "transformer_mtsa_tiny"
    assert result["num_sentences"] == 20 and result["test_set"] == "test" and result["subset"] == "test"
    assert result["num_params"] == _parameters_in_checkpoint(root / "ckpt/checkpoint_last.pt")
    assert result["generation"] == {"beam": 4, "lenpen": 0.6, "max_len_a": 0, "max_len_b": 200}
    hyp_path = scoring.result_file(result, "hypotheses", out)
    assert hyp_path.resolve() == (tmp_path / "res" / "toy.hyp.txt").resolve()
    hyps, refs = scoring.read_lines(hyp_path), scoring.read_lines(root / "raw/test.de")
    assert len(hyps) == 20 and any(hyps)
    assert result["bleu"] == scoring.bleu_scores(hyps, refs, "de")
    # the same sentences in the same order as fairseq's own generate prints them
    gen = run("fairseq-generate", str(root / "bin"), "--user-dir", USER_DIR, "--path",
              str(root / "ckpt/checkpoint_last.pt"), "--cpu", "--beam", "4", "--lenpen", "0.6", "--max-len-a", "0",
              "--max-len-b", "200", "--batch-size", "7", "--required-batch-size-multiple", "1", "--num-workers", "0")
    assert hyps == scoring.ordered_hypotheses(scoring.parse_generate_output(gen.stdout), 20)
    # fairseq's sentence id is the line number of the test set: the S-<id> line is source line <id>
    sources = dict(line[2:].split("\t", 1) for line in gen.stdout.splitlines() if line.startswith("S-"))
    assert [sources[str(i)] for i in range(20)] == scoring.read_lines(root / "raw/test.en")


def test_fp16_translation_is_recorded_in_the_result(trained, tmp_path, monkeypatch):
    """--fp16 changes the hypotheses: the result's generation block says it was given (CPU: fairseq-generate is
    replaced by the references themselves)."""
    root, seen = trained, {}

    def translate(checkpoint, inputs, num_sentences, log_path, **options):
        seen.update(options)
        return scoring.read_lines(root / "raw/test.de")

    monkeypatch.setattr(scoring, "translate", translate)
    out = tmp_path / "fp16.json"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--checkpoint", str(root / "ckpt/checkpoint_last.pt"), "--data-bin",
                                      str(root / "bin"), "--gen-subset", "test", "--reference",
                                      str(root / "raw/test.de"), "--result", str(out), "--fp16"])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    assert seen["fp16"] is True and "cpu" in seen
    assert json.loads(out.read_text())["generation"] == {"beam": 4, "lenpen": 0.6, "max_len_a": 0, "max_len_b": 200,
                                                          "fp16": True}

@pytest.mark.slow
def test_a_checkpoint_saved_with_the_triton_kernel_scores_on_the_cpu_with_model_overrides(trained, tmp_path):
    """On the CPU such a checkpoint fails with one line saying how to choose another kernel; with
    --model-overrides it translates as the checkpoint it was copied from (every kernel gives the same values)."""
    import torch

    state = torch.load(trained / "ckpt/checkpoint_last.pt", map_location="cpu", weights_only=False)
    state["cfg"]["model"].mtsa_kernel = "triton"
    torch.save(state, tmp_path / "triton.pt")
    env = {key: value for key, value in ENV.items() if key != "TRITON_INTERPRET"}
    common = ["--data-bin", str(trained / "bin"), "--reference", str(trained / "raw/test.de"), "--cpu"]

    def score_copy(result: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), "--checkpoint", str(tmp_path / "triton.pt"), *common,
                               "--result", str(result), *extra], capture_output=True, text=True, env=env,
                              timeout=1500)

    proc = score_copy(tmp_path / "r.json")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("error: fairseq-generate failed")
    assert "--model-overrides \"{'mtsa_kernel': 'auto'}\"" in proc.stderr and not (tmp_path / "r.json").exists()
    proc = score_copy(tmp_path / "r.json", "--model-overrides", "mtsa_kernel=auto")
    assert proc.returncode == 2 and "--model-overrides must be a dict literal" in proc.stderr
    proc = score_copy(tmp_path / "r.json", "--model-overrides", "{'mtsa_kernel': 'auto'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["generation"]["model_overrides"] == "{'mtsa_kernel': 'auto'}"
    proc = score("--checkpoint", str(trained / "ckpt/checkpoint_last.pt"), *common, "--result",
                 str(tmp_path / "original.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "r.hyp.txt").read_text() == (tmp_path / "original.hyp.txt").read_text()


@pytest.mark.slow
def test_score_prepared_dir_and_run_dir(trained, tmp_path):
    root = trained
    data = tmp_path / "prepared"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({
        "schema": "mtsa-fairseq.data.v1", "source_lang": "en", "target_lang": "de", "data_bin": str(root / "bin"),
        "spm_model": None, "tests": {"toy2014": {"subset": "test", "lines": 20, "source": str(root / "raw/test.en"),
                                                 "reference": str(root / "raw/test.de")}},
    }))
    run_dir = tmp_path / "setup1_mtsa" / "seed5"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({
        "schema": "mtsa-fairseq.run.v1", "config": "setup1_mtsa", "system": "mtsa", "setup": "setup1",
        "arch": "transformer_mtsa_tiny", "seed": 5, "status": "done",
        "checkpoint": str(root / "ckpt/checkpoint_last.pt"),
    }))
    out = tmp_path / "toy2014.json"
    proc = score("--run-dir", str(run_dir), "--data", str(data), "--test", "toy2014", "--result", str(out), "--cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["system"], result["setup"], result["seed"], result["test_set"]) == ("mtsa", "setup1", 5, "toy2014")
    assert result["num_sentences"] == 20
    checkpoint = scoring.result_file(result, "checkpoint", out).resolve()
    assert str(checkpoint) == str((root / "ckpt/checkpoint_last.pt").resolve())


@pytest.mark.slow
def test_stray_carriage_return_in_a_reference_line(trained, tmp_path):
    root = trained
    lines = scoring.read_lines(root / "raw/test.de")
    reference = tmp_path / "ref.de"
    reference.write_bytes("".join(line.replace(" ", "\r", 1) + "\n" for line in lines).encode())
    data = tmp_path / "prepared"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({
        "schema": "mtsa-fairseq.data.v1", "source_lang": "en", "target_lang": "de", "data_bin": str(root / "bin"),
        "spm_model": None, "tests": {"toy": {"subset": "test", "lines": count_lines(reference),
                                             "reference": str(reference)}},
    }))
    out = tmp_path / "toy.json"
    proc = score("--checkpoint", str(root / "ckpt/checkpoint_last.pt"), "--data", str(data), "--test", "toy",
                 "--result", str(out), "--cpu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["num_sentences"] == 20
    hyps = scoring.read_lines(scoring.result_file(result, "hypotheses", out))
    assert result["bleu"] == scoring.bleu_scores(hyps, lines, "de")  # BLEU takes the CR for a space


@pytest.mark.slow
def test_missing_checkpoint_is_an_error(trained, tmp_path):
    out = tmp_path / "r.json"
    proc = score("--checkpoint", str(tmp_path / "nope.pt"), "--data-bin", str(trained / "bin"), "--reference",
                 str(trained / "raw/test.de"), "--result", str(out))
    assert proc.returncode == 1
    assert f"checkpoint not found: {tmp_path / 'nope.pt'}" in proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("case", ["exists", "empty_reference", "missing_reference", "not_utf8_reference",
                                  "unknown_test", "other_dictionary", "changed_data", "diverged", "other_arch",
                                  "other_direction"])
def test_bad_inputs_write_nothing(trained, tmp_path, monkeypatch, capsys, case):
    root = trained
    out = tmp_path / "r.json"
    reference = root / "raw/test.de"
    args = ["--checkpoint", str(root / "ckpt/checkpoint_last.pt"), "--result", str(out)]
    if case == "exists":
        out.write_text("{}")
        message = "exists (pass --overwrite to replace it)"
    elif case == "empty_reference":
        reference = tmp_path / "empty.de"
        reference.write_text("")
        message = "reference file is empty"
    elif case == "missing_reference":
        reference = tmp_path / "missing.de"
        message = "reference file not found"
    elif case == "not_utf8_reference":
        reference = tmp_path / "latin1.de"
        reference.write_bytes("der hund\ndie Stra\u00dfe\n".encode("latin-1"))
        message = f"{reference}:2: not valid UTF-8"
    if case in ("other_dictionary", "diverged", "other_arch"):  # a run.json beside the checkpoint
        (tmp_path / "run").mkdir()
        (tmp_path / "run/checkpoint_last.pt").symlink_to(root / "ckpt/checkpoint_last.pt")
        args[1] = str(tmp_path / "run/checkpoint_last.pt")
        dictionaries = {name: entry["sha256"] for name, entry in
                        checksums(root / "bin", ["dict.en.txt", "dict.de.txt"]).items()}
        record = {"schema": RUN_SCHEMA, "status": "done", "dictionaries": dictionaries}
        if case == "other_dictionary":  # another corpus's dictionary of the same size: two entries swapped
            shutil.copytree(root / "bin", tmp_path / "bin")
            lines = (tmp_path / "bin/dict.de.txt").read_text().splitlines(keepends=True)
            lines[4], lines[5] = lines[5], lines[4]
            (tmp_path / "bin/dict.de.txt").write_text("".join(lines))
            message = (f"{args[1]} was trained with another dict.de.txt than {tmp_path / 'bin/dict.de.txt'} (its "
                       "run.json records the dictionaries it was trained with)")
        elif case == "other_arch":  # another system's checkpoint copied into this run's directory
            record["arch"] = "transformer_tiny"
            message = (f"{args[1]} holds a model of arch transformer_mtsa_tiny, its run.json records arch "
                       "transformer_tiny: score the run's own checkpoint")
        else:
            record.update(status="diverged", last_loss=194403.0)
            message = (f"run {tmp_path / 'run'} diverged (its last training loss is 194403.0): pass "
                       "--allow-diverged to score it anyway")
        (tmp_path / "run/run.json").write_text(json.dumps(record))
        data_bin = tmp_path / "bin" if case == "other_dictionary" else root / "bin"
        args += ["--data-bin", str(data_bin), "--reference", str(reference)]
    elif case in ("unknown_test", "changed_data"):
        manifest = {"schema": "mtsa-fairseq.data.v1", "data_bin": "bin", "spm_model": None,
                    "tests": {"newstest2014": {"subset": "test", "reference": str(reference)}}}
        shutil.copytree(root / "bin", tmp_path / "bin")
        manifest["checksums"] = checksums(tmp_path, [f"bin/{p.name}" for p in (tmp_path / "bin").glob("*.*")])
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        args += ["--data", str(tmp_path), "--test", "newstest2017" if case == "unknown_test" else "newstest2014"]
        message = "test set 'newstest2017' is not in"
        if case == "changed_data":  # token ids edited inside the test set's .bin
            data = bytearray((tmp_path / "bin/test.en-de.en.bin").read_bytes())
            data[3] ^= 1
            (tmp_path / "bin/test.en-de.en.bin").write_bytes(data)
            message = f"{tmp_path / 'bin/test.en-de.en.bin'} changed after preparation (SHA-256 differs from"
    else:
        args += ["--data-bin", str(root / "bin"), "--reference", str(reference)]
    if case == "other_direction":  # an en->de checkpoint asked for de->en
        args += ["--source-lang", "de", "--target-lang", "en"]
        message = f"{args[1]} translates en->de, not de->en: pass its languages"
    before = sorted(tmp_path.iterdir())
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    if case == "exists":  # an option error: usage, exit status 2
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
    else:  # an error in the inputs: one line, exit status 1
        assert isinstance(exc.value.code, str) and exc.value.code.startswith("error: ")
        assert message in exc.value.code
    assert sorted(tmp_path.iterdir()) == before
    if case == "exists":
        assert out.read_text() == "{}"


@pytest.mark.slow
def test_checkpoint_info_counts_the_built_model(trained):
    info = scoring.checkpoint_info(trained / "ckpt/checkpoint_last.pt", trained / "bin")
    assert info.arch == "transformer_mtsa_tiny"
    assert (info.seed, info.source_lang, info.target_lang) == (5, "en", "de")
    assert info.num_params == _parameters_in_checkpoint(trained / "ckpt/checkpoint_last.pt")


@pytest.mark.slow
def test_an_empty_result_counts_as_absent(trained, tmp_path):
    """A 0-byte result (a full disk under an older version) is scored again, with a line saying so."""
    out = tmp_path / "r.json"
    out.write_text("")
    proc = score("--checkpoint", str(trained / "ckpt/checkpoint_last.pt"), "--data-bin", str(trained / "bin"),
                 "--reference", str(trained / "raw/test.de"), "--result", str(out), "--cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"note: {out} is empty or unreadable: scoring again" in proc.stderr
    assert json.loads(out.read_text())["num_sentences"] == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.generate.log", "r.hyp.txt", "r.json"]


def _start_scorer(trained: Path, out: Path, *extra: str) -> subprocess.Popen:
    """A scorer in the background; Ctrl-C reaches it even when the tests run with SIGINT ignored (a shell's
    background job, whose children inherit that and would never see it)."""
    return subprocess.Popen([sys.executable, str(SCRIPT), "--checkpoint", str(trained / "ckpt/checkpoint_last.pt"),
                             "--data-bin", str(trained / "bin"), "--reference", str(trained / "raw/test.de"),
                             "--result", str(out), "--cpu", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.slow
def test_a_second_scorer_on_the_same_result_refuses(trained, tmp_path):
    """The lock a scorer holds on its result (here taken by this process, as a running scorer takes it)."""
    out = tmp_path / "r.json"
    out.write_text('{"partial": true}')
    with RunLock(tmp_path / ".r.json.lock", f"result {out}", "scorer"):
        proc = score("--checkpoint", str(trained / "ckpt/checkpoint_last.pt"), "--data-bin", str(trained / "bin"),
                     "--reference", str(trained / "raw/test.de"), "--result", str(out), "--cpu", "--overwrite")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: result {out} is in use by scorer pid {os.getpid()}; wait for it to finish or stop it, then rerun")
    assert out.read_text() == '{"partial": true}'


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_scorer_says_one_line_and_stops_fairseq_generate(trained, tmp_path, signum, code):
    out = tmp_path / "r.json"
    proc = _start_scorer(trained, out, "--beam", "12")
    checkpoint = str(trained / "ckpt/checkpoint_last.pt")
    wait_for(lambda: processes_naming(checkpoint, "fairseq-generate"), "fairseq-generate")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == code
    assert err.strip().splitlines()[-1] == "interrupted: rerun the same command to resume"
    assert "Traceback" not in err
    wait_for(lambda: not processes_naming(checkpoint, "fairseq-generate"), "fairseq-generate to stop", 40)
    assert not out.exists() and not out.with_name(".r.json.lock").exists()


def test_a_failing_fairseq_generate_is_one_line_with_its_log(tmp_path):
    log = tmp_path / "gen.log"
    cmd = [sys.executable, "-c", "import sys; print('H-0\\tx'); "
           "sys.exit('Exception: Size of sample #3 is invalid (=(1100, 1100)) since max_positions=(1024, 1024)')"]
    with pytest.raises(scoring.ScoringError) as err:
        scoring.run_generate(cmd, log)
    message = str(err.value)
    assert "\n" not in message
    assert message == ("fairseq-generate failed with exit code 1: Exception: Size of sample #3 is invalid "
                       f"(=(1100, 1100)) since max_positions=(1024, 1024) (its log: {log})")
    assert log.read_text().startswith("H-0\tx\n")


def test_dictionaries_are_checked_by_their_digests_and_a_missing_one_is_named(tmp_path):
    (tmp_path / "dict.de.txt").write_text("a 1\nb 1\n")
    run = {"dictionaries": {name: entry["sha256"] for name, entry in checksums(tmp_path, ["dict.de.txt"]).items()}}
    check_dictionaries(run, tmp_path / "checkpoint_last.pt", tmp_path)  # the same file
    check_dictionaries({}, tmp_path / "checkpoint_last.pt", tmp_path)  # an older run.json records none
    (tmp_path / "dict.de.txt").write_text("b 1\na 1\n")  # the same size, other ids
    with pytest.raises(ValueError, match="was trained with another dict.de.txt than"):
        check_dictionaries(run, tmp_path / "checkpoint_last.pt", tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'other/dict.de.txt'} not found: ")):
        check_dictionaries(run, tmp_path / "checkpoint_last.pt", tmp_path / "other")


@pytest.mark.parametrize("args, message", [
    (["--result", "t1.de"], "--result must name a JSON file (RESULT.json), not t1.de"),
    (["--result", "r.json", "--cpu", "--fp16"], "--fp16 translates on a GPU; --cpu translates in float32"),
    (["--result", "r.json", "--lenpen", "nan"], "--lenpen must be a finite number"),
    (["--result", "r.json", "--max-len-a", "inf"], "--max-len-a must be a finite number, not negative"),
])
def test_option_errors_exit_2_before_any_work(tmp_path, args, message):
    """Contradicting or meaningless options stop the command with one line, before a checkpoint is read; a result
    must be a .json file, so an existing reference or checkpoint can never be taken for one and replaced."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--checkpoint", "c.pt", "--data-bin", "b", "--reference", "r",
                           *args], capture_output=True, text=True, env=ENV, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(message), proc.stderr
    assert not any(tmp_path.iterdir())


def test_rescore_refuses_the_options_it_would_ignore(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rescore", "r.json", "--target-lang", "de", "--beam", "5",
                           "--result", "s.json"], capture_output=True, text=True, env=ENV, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "--rescore recomputes the BLEU of the recorded hypotheses: --result, --beam cannot apply")


@pytest.mark.slow
def test_data_options_that_cannot_apply_and_a_bad_sentencepiece_model(trained, tmp_path):
    checkpoint = str(trained / "ckpt/checkpoint_last.pt")
    proc = score("--checkpoint", checkpoint, "--data", str(tmp_path), "--test", "t1", "--gen-subset", "valid",
                 "--result", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and "--gen-subset goes with --data-bin" in proc.stderr.splitlines()[-1]
    not_a_model = trained / "raw/test.de"
    proc = score("--checkpoint", checkpoint, "--data-bin", str(trained / "bin"), "--reference",
                 str(trained / "raw/test.de"), "--spm-model", str(not_a_model), "--result", str(tmp_path / "r.json"),
                 "--cpu")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: {not_a_model} is not a sentencepiece model (")
    assert not any(tmp_path.iterdir())
