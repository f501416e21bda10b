"""Translate one test set with one checkpoint (fairseq-generate) and write its BLEU result file.

Writes RESULT (schema mtsa-fairseq.result.v1, paths relative to its folder) and the detokenised hypotheses next to
it (<RESULT stem>.hyp.txt): sacreBLEU (cased and lowercased), tokenised compound-split BLEU and t2t-bleu's BLEU
(translation/scoring.py). --rescore recomputes the BLEU values of result files from their hypotheses instead.
Option errors exit with status 2, errors in the inputs (run record, checkpoint, data, references) with 1.
"""

import argparse
import ast
import logging
import math
import sys
from pathlib import Path

from mtsa_fairseq.contracts import check_dictionaries
from mtsa_fairseq.experiments.files import readable_json, write_json
from mtsa_fairseq.experiments.processes import RunLock, run_command
from mtsa_fairseq.experiments.translation import scoring


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--checkpoint", type=Path, help="checkpoint to score (a run.json beside it is read too)")
    model.add_argument("--run-dir", type=Path, help="training run directory: its run.json names the checkpoint, "
                                                    "system, setup and seed")
    model.add_argument("--rescore", type=Path, nargs="+", metavar="RESULT",
                       help="recompute the BLEU values of these result files from their hypotheses and references "
                            "(adds those scored since; a recorded value that differs is an error); needs --target-lang")
    data = parser.add_argument_group("data (either --data/--test or --data-bin/--reference)")
    data.add_argument("--data", type=Path, help="prepared data directory with manifest.json")
    data.add_argument("--test", help="with --data: test set name in manifest.json (e.g. newstest2014); with "
                                     "--data-bin: name recorded in the result (default: the subset)")
    data.add_argument("--data-bin", type=Path, help="fairseq-preprocess output directory")
    data.add_argument("--gen-subset", default="test", help="with --data-bin: subset to translate (default: test)")
    data.add_argument("--reference", type=Path, help="with --data-bin: untouched reference text, one sentence a line")
    data.add_argument("--spm-model", type=Path, help="with --data-bin: sentencepiece model to decode hypotheses "
                                                     "(default: join whitespace tokens)")
    data.add_argument("--source-lang", help="with --data-bin: source language (default: the checkpoint's)")
    data.add_argument("--target-lang", help="with --data-bin: target language, also used by the Moses tokeniser "
                                            "(default: the checkpoint's)")
    parser.add_argument("--result", type=Path, help="result file to write (JSON)")
    parser.add_argument("--overwrite", action="store_true", help="replace RESULT and its hypotheses file if they exist")
    parser.add_argument("--system", help="system name in the result (default: run.json's, else the arch)")
    parser.add_argument("--setup", help="setup name in the result (default: run.json's, else none)")
    parser.add_argument("--seed", type=int, help="seed in the result (default: run.json's, else the checkpoint's)")
    parser.add_argument("--allow-diverged", action="store_true", help="score a run recorded diverged (marked so)")
    gen = parser.add_argument_group("generation (defaults: the MTSA paper's t2t decoding)")
    gen.add_argument("--beam", type=int, default=4, help="beam size (default: 4)")
    gen.add_argument("--lenpen", type=float, default=0.6,
                     help="length penalty (default: 0.6, t2t's alpha; fairseq divides scores by length**lenpen, "
                          "t2t by ((5 + length) / 6)**alpha)")
    gen.add_argument("--max-len-a", type=float, default=0, help="max length = a * source length + b (default: 0)")
    gen.add_argument("--max-len-b", type=int, default=200, help="max length = a * source length + b (default: 200)")
    gen.add_argument("--max-tokens", type=int, help="tokens per batch (default: 4096 unless --batch-size is given)")
    gen.add_argument("--batch-size", type=int, help="sentences per batch")
    gen.add_argument("--model-overrides", metavar="DICT",
                     help="fairseq-generate's --model-overrides, recorded in the result: a dict literal of model "
                          "options to replace, e.g. \"{'mtsa_kernel': 'auto'}\" to translate on the CPU with a "
                          "checkpoint trained with --mtsa-kernel triton")
    gen.add_argument("--cpu", action="store_true", help="translate on the CPU")
    gen.add_argument("--fp16", action="store_true", help="translate in half precision (GPU)")
    return parser


def resolve_data(args: argparse.Namespace, parser: argparse.ArgumentParser) -> scoring.ScoringInputs:
    """The test set's inputs (a usage error exits 2, an input error raises :class:`scoring.ScoringError`)."""
    if (args.data is None) == (args.data_bin is None):
        parser.error("give either --data DIR --test NAME or --data-bin DIR --reference FILE")
    if args.data is None:
        if args.reference is None:
            parser.error("--data-bin needs --reference FILE")
        return scoring.ScoringInputs(args.data_bin, args.gen_subset, args.reference, args.spm_model,
                                     args.source_lang, args.target_lang, None)
    if not args.test:
        parser.error("--data needs --test NAME")
    for name in ("reference", "spm_model", "source_lang", "target_lang"):
        if getattr(args, name) is not None:
            parser.error(f"--{name.replace('_', '-')} goes with --data-bin; --data reads it from manifest.json")
    if args.gen_subset != parser.get_default("gen_subset"):
        parser.error("--gen-subset goes with --data-bin; --data translates the test set --test names")
    return scoring.inputs_from_manifest(args.data, scoring.read_manifest(args.data), args.test)


# What --rescore leaves as recorded: every option but --target-lang.
_NOT_WITH_RESCORE = ("data", "test", "data_bin", "gen_subset", "reference", "spm_model", "source_lang", "result",
                     "overwrite", "system", "setup", "seed", "allow_diverged", "beam", "lenpen", "max_len_a",
                     "max_len_b", "max_tokens", "batch_size", "model_overrides", "cpu", "fp16")


def _is_dict_literal(text: str) -> bool:
    try:
        return isinstance(ast.literal_eval(text), dict)
    except (ValueError, SyntaxError):
        return False


def main() -> None:
    """The command (environment errors: one line, status 1; Ctrl-C 130, SIGTERM 143, fairseq-generate with it)."""
    run_command(_main, errors=(scoring.ScoringError,))


def _main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.WARNING)  # fairseq's import sets up chatty root logging
    for option in ("beam", "max_len_b", "max_tokens", "batch_size"):
        value = getattr(args, option)
        if value is not None and value < 1:
            parser.error(f"--{option.replace('_', '-')} must be positive")
    if not (math.isfinite(args.max_len_a) and args.max_len_a >= 0):
        parser.error("--max-len-a must be a finite number, not negative")
    if not math.isfinite(args.lenpen):
        parser.error("--lenpen must be a finite number")
    if args.cpu and args.fp16:
        parser.error("--fp16 translates on a GPU; --cpu translates in float32")
    if args.model_overrides is not None and not _is_dict_literal(args.model_overrides):
        parser.error(f"--model-overrides must be a dict literal such as \"{{'mtsa_kernel': 'auto'}}\", "
                     f"not {args.model_overrides!r}")
    if args.rescore:
        given = [f"--{name.replace('_', '-')}" for name in _NOT_WITH_RESCORE
                 if getattr(args, name) != parser.get_default(name)]
        if given:
            parser.error(f"--rescore recomputes the BLEU of the recorded hypotheses: {', '.join(given)} cannot apply")
        if not args.target_lang:
            parser.error("--rescore needs --target-lang (the Moses tokeniser's language)")
        for path in args.rescore:
            lock = RunLock(path.with_name(f".{path.name}.lock"), f"result {path}", "scorer")
            with lock.acquire(scoring.ScoringError):
                write_json(path, scoring.rescore(path, args.target_lang), indent=2)
            print(f"rescored {path}")
        return
    if args.max_tokens is None and args.batch_size is None:
        args.max_tokens = 4096
    if args.result is None:
        parser.error("--result is required")
    if args.result.suffix != ".json" or args.result.is_dir():
        parser.error(f"--result must name a JSON file (RESULT.json), not {args.result}")
    checkpoint, run = scoring.resolve_checkpoint(args.run_dir, args.checkpoint, args.allow_diverged)
    inputs = resolve_data(args, parser)
    check_dictionaries(run, checkpoint, inputs.data_bin, scoring.ScoringError)
    references = scoring.read_test_set(inputs)
    args.result.parent.mkdir(parents=True, exist_ok=True)
    with RunLock(args.result.with_name(f".{args.result.name}.lock"), f"result {args.result}",
                 "scorer").acquire(scoring.ScoringError):
        if args.result.exists() and not args.overwrite:
            if readable_json(args.result):
                parser.error(f"{args.result} exists (pass --overwrite to replace it)")
            print(f"note: {args.result} is empty or unreadable: scoring again", file=sys.stderr)
        try:
            result = scoring.score_checkpoint(
                checkpoint, inputs, references, args.result, run=run,
                generation={"beam": args.beam, "lenpen": args.lenpen, "max_len_a": args.max_len_a,
                            "max_len_b": args.max_len_b,
                            **({"model_overrides": args.model_overrides} if args.model_overrides else {}),
                            **({"fp16": True} if args.fp16 else {})},
                system=args.system, setup=args.setup, seed=args.seed, test_set=args.test,
                max_tokens=args.max_tokens, batch_size=args.batch_size, cpu=args.cpu)
        except OSError as exc:  # a full disk, a vanished directory: the previous files stay whole
            sys.exit(f"error: {exc.strerror or exc} ({exc.filename or args.result})")
    bleu = result["bleu"]
    print(f"{result['test_set']} ({result['num_sentences']} sentences), {result['system']} seed {result['seed']}, "
          f"{result['num_params']:,} parameters")
    print(f"sacreBLEU {bleu['sacrebleu']:.2f}  signature: {bleu['signature']}")
    print(f"sacreBLEU lowercased {bleu['sacrebleu_lc']:.2f}")
    print(f"tokenized compound-split BLEU {bleu['tokenized_compound_split']:.2f}")
    print(f"t2t intl BLEU (cased) {bleu['t2t_intl']:.2f}")
    print(f"wrote {args.result} and {scoring.result_file(result, 'hypotheses', args.result)}")


if __name__ == "__main__":
    main()
