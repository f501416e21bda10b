"""Scoring fairseq translations with BLEU, and the result-file contract (``mtsa-fairseq.result.v1``).

:func:`score_checkpoint` (``mtsa-score``) runs ``fairseq-generate`` on one test subset, orders the ``H-<id>`` hypotheses
by sentence id, decodes them (sentencepiece, or whitespace-joined tokens for already-tokenised data),
whitespace-normalises them (one line per sentence) and scores them against the untouched reference file (its lines as
data preparation counted them, see :func:`mtsa_fairseq.contracts.iter_lines`). Every value is corpus BLEU with one
reference, case-sensitive but one (docs/experiment.md, 3. Scoring):

* ``sacrebleu``: sacreBLEU's default BLEU (``13a``, ``exp`` smoothing) on the detokenised hypotheses, with its
  signature; the number to compare across papers.
* ``sacrebleu_lc``: the same lowercased (signature ``case:lc``), for literature that reports lowercased BLEU
  (Multi30k's does).
* ``tokenized_compound_split``: what Vaswani et al. (2017) and fairseq's ``compound_split_bleu.sh`` report:
  hypotheses and references Moses-tokenised (sacremoses, ``escape=False``, target language), hyphenated compounds
  split (``(\\S)-(\\S)`` -> ``\\1 ##AT##-##AT## \\2``), then multi-bleu.perl's BLEU (sacreBLEU with ``tokenize="none"``,
  no smoothing); comparable only with numbers computed the same way.
* ``t2t_intl``: tensor2tensor's ``t2t-bleu`` ``BLEU_cased``, the MTSA paper's metric: mteval-v14's international
  tokenisation (sacreBLEU's ``intl``) with the ``exp`` smoothing t2t's ``compute_bleu`` applies.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtsa_fairseq.contracts import (
    MANIFEST_SCHEMA,
    RESULT_SCHEMA,
    SACREBLEU_OPTIONS,
    check_checksums,
    not_found,
    read_json,
    read_lines,
    read_result,
    read_run,
    record_path,
    relative_path,
    run_beside,
)
from mtsa_fairseq.experiments.fairseq_train import USER_DIR
from mtsa_fairseq.experiments.files import write_atomic, write_json
from mtsa_fairseq.experiments.processes import run_logged

_HYPOTHESIS = re.compile(r"^H-(\d+)\t")
_COMPOUND = re.compile(r"(\S)-(\S)")


class ScoringError(ValueError):
    """Bad input for scoring, or fairseq-generate failing on it: the message is one line naming the problem."""


def write_lines(path: Path, lines: Sequence[str]) -> None:
    """Write one line per item, each ended by ``\\n``, atomically."""
    write_atomic(path, "".join(line + "\n" for line in lines))


def parse_generate_output(text: str) -> dict[int, str]:
    """Map sentence id -> hypothesis string of the ``H-<id>\\t<score>\\t<tokens>`` lines of fairseq-generate."""
    hypotheses: dict[int, str] = {}
    for line in text.split("\n"):
        match = _HYPOTHESIS.match(line)
        if not match:
            continue
        sentence_id = int(match.group(1))
        if sentence_id in hypotheses:
            raise ScoringError(f"fairseq-generate printed two hypotheses for sentence {sentence_id} (use --nbest 1)")
        fields = line.split("\t", 2)
        hypotheses[sentence_id] = fields[2] if len(fields) == 3 else ""
    return hypotheses


def ordered_hypotheses(hypotheses: dict[int, str], num_sentences: int, subset: str = "test") -> list[str]:
    """The hypotheses in sentence-id order; every id ``0 .. num_sentences - 1`` must be present."""
    if len(hypotheses) != num_sentences or set(hypotheses) != set(range(num_sentences)):
        missing = sorted(set(range(num_sentences)) - set(hypotheses))
        detail = f" (missing ids {missing[:5]}{' ...' if len(missing) > 5 else ''})" if missing else ""
        raise ScoringError(
            f"fairseq-generate translated {len(hypotheses)} sentences of subset {subset!r} but the reference has "
            f"{num_sentences} lines{detail}"
        )
    return [hypotheses[i] for i in range(num_sentences)]


def detokenize(hypotheses: Sequence[str], spm_model: Path | None = None) -> list[str]:
    """Decode sentencepiece pieces with ``spm_model``, or join whitespace tokens when it is None."""
    if spm_model is None:
        return [" ".join(h.split()) for h in hypotheses]
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(spm_model))
    return [" ".join(processor.decode_pieces(h.split()).split()) for h in hypotheses]


def compound_split(text: str) -> str:
    """Split hyphenated compounds as Vaswani et al. did: ``(\\S)-(\\S)`` -> ``\\1 ##AT##-##AT## \\2``."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


def moses_tokenize(lines: Sequence[str], lang: str) -> list[str]:
    """Moses tokenisation (sacremoses, no XML escaping) for language ``lang``."""
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, escape=False, return_str=True) for line in lines]


def sacrebleu_bleu(hypotheses: Sequence[str], references: Sequence[str], lowercase: bool = False) -> tuple[float, str]:
    """sacreBLEU's default detokenised corpus BLEU (``lowercase``: of both sides lowercased) and its signature."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(**SACREBLEU_OPTIONS["sacrebleu_lc" if lowercase else "sacrebleu"])
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return score.score, str(metric.get_signature())


def tokenized_compound_split_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> float:
    """Tokenised compound-split BLEU (Moses tokens, ``##AT##`` splits, multi-bleu.perl semantics)."""
    from sacrebleu.metrics import BLEU

    hyps = [compound_split(line) for line in moses_tokenize(hypotheses, lang)]
    refs = [compound_split(line) for line in moses_tokenize(references, lang)]
    metric = BLEU(tokenize="none", smooth_method="none", force=True)
    return metric.corpus_score(hyps, [refs]).score


def t2t_intl_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Case-sensitive BLEU with the international tokenisation, as ``t2t-bleu`` computes it."""
    from sacrebleu.metrics import BLEU

    return BLEU(**SACREBLEU_OPTIONS["t2t_intl"]).corpus_score(list(hypotheses), [list(references)]).score


def bleu_scores(hypotheses: Sequence[str], references: Sequence[str], target_lang: str) -> dict[str, Any]:
    """The ``bleu`` block of a result file."""
    if len(hypotheses) != len(references):
        raise ScoringError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    score, signature = sacrebleu_bleu(hypotheses, references)
    return {"sacrebleu": score, "signature": signature, "sacrebleu_lc": sacrebleu_bleu(hypotheses, references, True)[0],
            "tokenized_compound_split": tokenized_compound_split_bleu(hypotheses, references, target_lang),
            "t2t_intl": t2t_intl_bleu(hypotheses, references)}


def build_result(*, system: str, setup: str | None, arch: str, seed: int | None, checkpoint: Path, num_params: int,
                 test_set: str, subset: str, hypotheses: Path, references: Path, num_sentences: int,
                 bleu: dict[str, Any], generation: dict[str, Any], folder: Path,
                 diverged: bool = False) -> dict[str, Any]:
    """A result dict in the ``mtsa-fairseq.result.v1`` layout for a result file in ``folder``: ``checkpoint``,
    ``hypotheses`` and ``references`` relative to ``folder`` (read them back with :func:`result_file`); a
    ``diverged`` run's result says so (``"diverged": true``), which significance tests refuse unless asked."""
    return {"schema": RESULT_SCHEMA, "system": system, "setup": setup, "arch": arch, "seed": seed,
            "checkpoint": relative_path(checkpoint, folder), "num_params": int(num_params), "test_set": test_set,
            "subset": subset, "num_sentences": int(num_sentences), "hypotheses": relative_path(hypotheses, folder),
            "references": relative_path(references, folder), "bleu": dict(bleu), "generation": dict(generation),
            **({"diverged": True} if diverged else {})}


def hypotheses_path(result_path: Path) -> Path:
    """Where the hypotheses of the result ``result_path`` are written: ``<stem>.hyp.txt`` beside it."""
    return result_path.with_name(f"{result_path.stem}.hyp.txt")


def result_file(result: dict[str, Any], key: str, path: Path) -> Path:
    """The file a result read from ``path`` names under ``key`` (``checkpoint``, ``hypotheses``, ``references``):
    relative to ``path``'s folder, or absolute (older results)."""
    return record_path(result[key], Path(path).parent)


def rescore(path: Path, target_lang: str) -> dict[str, Any]:
    """The result file ``path`` with its ``bleu`` block recomputed from its hypotheses and references (adding the
    metrics scored since it was written); a recorded value the recomputation does not reproduce is an error."""
    result = read_result(path, ScoringError)
    hypotheses = read_lines(result_file(result, "hypotheses", path), ScoringError)
    references = read_references(result_file(result, "references", path), result.get("num_sentences"))
    bleu = bleu_scores(hypotheses, references, target_lang)
    recorded = result.get("bleu") or {}
    for key, value in recorded.items():
        if key in bleu and bleu[key] != value:
            cause = " or --target-lang" if key == "tokenized_compound_split" else ""  # Moses tokenises by language
            raise ScoringError(f"{path}: {key} recomputes to {bleu[key]!r}, not the recorded {value!r} (its "
                               f"hypotheses, references or scorer changed{cause})")
    return {**result, "bleu": {**recorded, **bleu}}


def read_manifest(data_dir: Path) -> dict[str, Any]:
    """``DIR/manifest.json`` of a prepared data directory (schema ``mtsa-fairseq.data.v1``)."""
    return read_json(Path(data_dir) / "manifest.json", MANIFEST_SCHEMA, "manifest", ScoringError)


def resolve_checkpoint(run_dir: Path | None, checkpoint: Path | None,
                       allow_diverged: bool = False) -> tuple[Path, dict[str, Any] | None]:
    """The checkpoint to score and the run.json that describes it: a finished run's (``run_dir``), or
    ``checkpoint`` with the run.json beside it (None without one). A diverged run is refused unless
    ``allow_diverged``."""
    if run_dir is not None:
        run = read_run(run_dir, ScoringError)
        if run.get("status") not in ("done", "diverged"):
            raise ScoringError(f"run {run_dir} has status {run.get('status')!r}, not 'done'")
        if not run.get("checkpoint"):
            raise ScoringError(f"{run_dir / 'run.json'} names no checkpoint")
        checkpoint = Path(run["checkpoint"])  # read_run resolves it (run.json names it from the run directory)
    else:
        run_dir = checkpoint.parent
        run = run_beside(checkpoint, ScoringError)
    if run and run.get("status") == "diverged" and not allow_diverged:
        raise ScoringError(f"run {run_dir} diverged (its last training loss is {run.get('last_loss')}): pass "
                           "--allow-diverged to score it anyway")
    if not checkpoint.is_file():
        raise ScoringError(not_found("checkpoint", checkpoint))
    return checkpoint, run


@dataclass(frozen=True)
class ScoringInputs:
    """Where one test set's binarised source, reference text and sentencepiece model are."""

    data_bin: Path
    subset: str
    reference: Path
    spm_model: Path | None
    source_lang: str | None
    target_lang: str | None
    lines: int | None


def inputs_from_manifest(data_dir: Path, manifest: dict[str, Any], test_name: str) -> ScoringInputs:
    """Resolve test set ``test_name`` of a prepared directory (paths in the manifest are relative to it)."""
    tests = manifest.get("tests") or {}
    if test_name not in tests:
        raise ScoringError(f"test set {test_name!r} is not in {Path(data_dir) / 'manifest.json'} "
                           f"(it has: {', '.join(sorted(tests)) or 'none'})")
    entry = tests[test_name]
    for key in ("subset", "reference"):
        if not entry.get(key):
            raise ScoringError(f"manifest entry tests.{test_name} has no {key!r}")
    if not manifest.get("data_bin"):
        raise ScoringError("manifest has no 'data_bin'")
    prefix = f"{manifest['data_bin']}/"
    used = (f"{prefix}dict.", f"{prefix}{entry['subset']}.")  # the dictionaries and the test set's own files
    check_checksums(Path(data_dir), {name: value for name, value in (manifest.get("checksums") or {}).items()
                                     if name.startswith(used)}, ScoringError)
    spm = manifest.get("spm_model")
    return ScoringInputs(data_bin=Path(data_dir) / manifest["data_bin"], subset=entry["subset"],
                         reference=Path(data_dir) / entry["reference"], spm_model=Path(data_dir) / spm if spm else None,
                         source_lang=manifest.get("source_lang"), target_lang=manifest.get("target_lang"),
                         lines=entry.get("lines"))


def read_references(path: Path, expected_lines: int | None = None) -> list[str]:
    """The reference lines, read as data preparation read them (:func:`mtsa_fairseq.contracts.iter_lines`): the
    file must exist, be valid UTF-8, be non-empty and match ``expected_lines`` when given."""
    if not Path(path).is_file():
        raise ScoringError(not_found("reference file", path))
    refs = read_lines(path, ScoringError)
    if not refs:
        raise ScoringError(f"reference file is empty: {path}")
    if expected_lines is not None and len(refs) != expected_lines:
        raise ScoringError(f"reference file {path} has {len(refs)} lines, {expected_lines} expected (the test set's "
                           "sentences)")
    return refs


def read_test_set(inputs: ScoringInputs) -> list[str]:
    """The references of test set ``inputs`` (:func:`read_references`), once its data-bin directory and
    sentencepiece model are found."""
    if not inputs.data_bin.is_dir():
        raise ScoringError(f"data-bin directory not found: {inputs.data_bin}")
    if inputs.spm_model is not None:
        if not inputs.spm_model.is_file():
            raise ScoringError(not_found("sentencepiece model", inputs.spm_model))
        import sentencepiece

        try:
            sentencepiece.SentencePieceProcessor(model_file=str(inputs.spm_model))
        except (OSError, RuntimeError) as exc:
            reason = str(exc).splitlines()[0]
            raise ScoringError(f"{inputs.spm_model} is not a sentencepiece model ({reason})") from None
    return read_references(inputs.reference, inputs.lines)


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint says about itself."""

    arch: str
    num_params: int
    seed: int | None
    source_lang: str | None
    target_lang: str | None


def checkpoint_info(checkpoint: Path, data_bin: Path) -> CheckpointInfo:
    """Build the model saved in ``checkpoint`` (dictionaries from ``data_bin``) and count its parameters; a
    checkpoint that does not load raises :class:`ScoringError` with the first line of the reason."""
    try:
        from fairseq import checkpoint_utils

        import mtsa_fairseq.plugin  # noqa: F401  (the architectures, and what fairseq checkpoints pickle)

        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(checkpoint)], arg_overrides={"data": str(data_bin)}
        )
    except Exception as exc:  # fairseq raises many kinds for unloadable checkpoints
        reason = (str(exc).strip().splitlines() or [""])[0]  # torch's explanations run over several lines
        raise ScoringError(f"cannot load checkpoint {checkpoint}: {type(exc).__name__}: {reason}") from exc
    arch = getattr(cfg.model, "arch", None) or getattr(cfg.model, "_name", None)
    return CheckpointInfo(arch=str(arch), num_params=sum(p.numel() for p in models[0].parameters()),
                          seed=getattr(cfg.common, "seed", None),
                          source_lang=getattr(task.cfg, "source_lang", None),  # inferred from data_bin if not saved
                          target_lang=getattr(task.cfg, "target_lang", None))


def generate_command(data_bin: Path, checkpoint: Path, subset: str, *, beam: int, lenpen: float, max_len_a: float,
                     max_len_b: int, max_tokens: int | None, batch_size: int | None, source_lang: str | None = None,
                     target_lang: str | None = None, cpu: bool = False, fp16: bool = False,
                     model_overrides: str | None = None) -> list[str]:
    """The ``fairseq-generate`` command line that translates every sentence of ``subset`` (``model_overrides``:
    fairseq's ``--model-overrides``, a dict literal of the checkpoint's model options to replace)."""
    executable = Path(sys.executable).parent / "fairseq-generate"
    cmd = [
        str(executable) if executable.exists() else "fairseq-generate", str(data_bin),
        "--user-dir", USER_DIR, "--path", str(checkpoint), "--gen-subset", subset,
        "--beam", str(beam), "--lenpen", str(lenpen), "--max-len-a", str(max_len_a), "--max-len-b", str(max_len_b),
        "--nbest", "1", "--required-batch-size-multiple", "1", "--num-workers", "0",
    ]
    for option, value in (("--max-tokens", max_tokens), ("--batch-size", batch_size)):
        cmd += [option, str(value)] if value is not None else []
    for option, value in (("--source-lang", source_lang), ("--target-lang", target_lang),
                          ("--model-overrides", model_overrides)):
        cmd += [option, value] if value else []
    return cmd + (["--cpu"] if cpu else []) + (["--fp16"] if fp16 else [])


def translate(checkpoint: Path, inputs: ScoringInputs, num_sentences: int, log_path: Path, **options: Any) -> list[str]:
    """The hypotheses of ``checkpoint`` for every sentence of the test set ``inputs``, in sentence order, not yet
    decoded: fairseq-generate (:func:`generate_command` with ``options``), its output in ``log_path``."""
    cmd = generate_command(inputs.data_bin, checkpoint, inputs.subset, **options)
    print("running: " + " ".join(cmd), file=sys.stderr)
    return ordered_hypotheses(parse_generate_output(run_generate(cmd, log_path)), num_sentences, inputs.subset)


def score_checkpoint(checkpoint: Path, inputs: ScoringInputs, references: Sequence[str], result_path: Path, *,
                     generation: dict[str, Any], run: dict[str, Any] | None = None, system: str | None = None,
                     setup: str | None = None, seed: int | None = None, test_set: str | None = None,
                     **device: Any) -> dict[str, Any]:
    """Translate the test set ``inputs`` with ``checkpoint`` (``generation``: beam, lenpen, max_len_a, max_len_b and any
    model_overrides and fp16, recorded in the result; ``device``: :func:`generate_command`'s max_tokens, batch_size,
    cpu), score it against ``references``, write the hypotheses (``<stem>.hyp.txt``) and then the result
    ``result_path``, each atomically, so that a result always has its hypotheses; return the result. ``system``,
    ``setup`` and ``seed`` default to the run record ``run``'s, then to the checkpoint's; ``test_set`` to the
    subset's name."""
    run = run or {}
    info = checkpoint_info(checkpoint, inputs.data_bin)
    for key, held in (("arch", info.arch), ("seed", info.seed)):
        if run.get(key) is not None and held is not None and run[key] != held:
            raise ScoringError(f"{checkpoint} holds a model of {key} {held}, its run.json records {key} {run[key]}: "
                               "score the run's own checkpoint")
    asked, trained = (inputs.source_lang, inputs.target_lang), (info.source_lang, info.target_lang)
    if all(asked) and all(trained) and asked != trained:
        raise ScoringError(f"{checkpoint} translates {trained[0]}->{trained[1]}, not {asked[0]}->{asked[1]}: pass "
                           "its languages")
    target_lang = inputs.target_lang or info.target_lang
    if not target_lang:
        raise ScoringError("the target language is unknown: pass --target-lang")
    log_path = result_path.with_name(result_path.stem + ".generate.log")
    hypotheses = translate(checkpoint, inputs, len(references), log_path,
                           source_lang=inputs.source_lang or info.source_lang, target_lang=target_lang,
                           **generation, **device)
    hypotheses = detokenize(hypotheses, inputs.spm_model)
    hyp_path = hypotheses_path(result_path)
    result = build_result(
        system=system or run.get("system") or info.arch, setup=setup or run.get("setup"), arch=info.arch,
        seed=seed if seed is not None else run.get("seed", info.seed), checkpoint=checkpoint,
        num_params=info.num_params, test_set=test_set or inputs.subset, subset=inputs.subset, hypotheses=hyp_path,
        references=inputs.reference, num_sentences=len(references),
        bleu=bleu_scores(hypotheses, references, target_lang), generation=generation, folder=result_path.parent,
        diverged=(run.get("status") == "diverged"))
    write_lines(hyp_path, hypotheses)
    write_json(result_path, result, indent=2)
    return result


def run_generate(cmd: Sequence[str], log_path: Path) -> str:
    """Run fairseq-generate (stopped with this process: Ctrl-C, SIGTERM) with its whole output in ``log_path``
    and return that output; a failure raises :class:`ScoringError`: fairseq's last error line and where the log is."""
    log_path.unlink(missing_ok=True)
    returncode, _, output = run_logged(list(cmd), log_path, echo=False)
    if returncode != 0:
        lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
        last = lines[-1] if lines else "no output"
        raise ScoringError(f"fairseq-generate failed with exit code {returncode}: {last} (its log: {log_path})")
    return output
