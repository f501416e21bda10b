"""Prepare a raw parallel corpus (plain text or gzip) for fairseq: normalise, train a joint sentencepiece model,
encode, and binarise with fairseq-preprocess --joined-dictionary into OUT (manifest.json, bin/, spm.model, raw/);
normalisation and filters: docs/experiment.md (1. Data).
"""

import argparse
from pathlib import Path

from mtsa_fairseq.experiments.errors import DataError
from mtsa_fairseq.experiments.processes import run_command, say
from mtsa_fairseq.experiments.translation.data_prep import (
    MODEL_TYPES,
    NORMALIZATIONS,
    Corpus,
    NamedCorpus,
    PrepareConfig,
    check_options,
    prepare,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source-lang", required=True, help="source language code, e.g. en (file suffix in bin/)")
    parser.add_argument("--target-lang", required=True, help="target language code, e.g. de")
    parser.add_argument("--train", nargs=2, action="append", required=True, metavar=("SRC", "TGT"), type=Path,
                        help="a training corpus (line-aligned files); repeat to concatenate several")
    valid = parser.add_mutually_exclusive_group(required=True)
    valid.add_argument("--valid", nargs=2, metavar=("SRC", "TGT"), type=Path, help="the validation corpus")
    valid.add_argument("--valid-from-train", type=int, metavar="N",
                       help="hold out every N-th training pair as the validation set (fairseq's WMT14 recipe: 100)")
    parser.add_argument("--test", nargs=3, action="append", default=[], metavar=("NAME", "SRC", "TGT"),
                        help="a named test set; repeat for more (fairseq subsets test, test1, ... in this order); "
                             "the original text is kept in OUT/raw/NAME.LANG for scoring")
    parser.add_argument("--out", required=True, type=Path, help="output directory (must not exist or be empty)")
    parser.add_argument("--vocab-size", type=int, default=32_000,
                        help="joint sentencepiece vocabulary size (default 32000)")
    parser.add_argument("--model-type", choices=MODEL_TYPES, default="unigram",
                        help="sentencepiece model type (default unigram)")
    parser.add_argument("--character-coverage", type=float, default=1.0,
                        help="share of characters the sentencepiece model covers, 0.98 to 1.0 (default 1.0)")
    parser.add_argument("--spm-input-sentence-size", type=int, default=10_000_000,
                        help="sentences (both sides together) sampled to train sentencepiece on big corpora "
                             "(default 10000000)")
    parser.add_argument("--max-tokens-per-sentence", type=int, default=256,
                        help="drop training pairs with a side longer than this many pieces (default 256; "
                             "valid/test untouched)")
    parser.add_argument("--max-length-ratio", type=float, default=None,
                        help="drop training pairs whose longer side has more than this times the pieces of the "
                             "shorter (e.g. 1.5 as in fairseq's WMT recipe; default: no ratio filter)")
    parser.add_argument("--normalization", choices=NORMALIZATIONS, default="nfkc",
                        help="Unicode normalisation form (default nfkc; whitespace and control characters are "
                             "always cleaned)")
    parser.add_argument("--workers", type=int, default=1,
                        help="threads for sentencepiece and processes for fairseq-preprocess (default 1)")
    parser.add_argument("--seed", type=int, default=1,
                        help="random seed for sentencepiece's sentence sampling (default 1)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT if it is an earlier prepared directory (one with manifest.json)")
    return parser


def _main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    cfg = PrepareConfig(
        source_lang=args.source_lang, target_lang=args.target_lang,
        train=[Corpus(src, tgt) for src, tgt in args.train], out=args.out,
        valid=Corpus(*args.valid) if args.valid else None, valid_every=args.valid_from_train,
        tests=[NamedCorpus(name, Path(src), Path(tgt)) for name, src, tgt in args.test],
        vocab_size=args.vocab_size, model_type=args.model_type, character_coverage=args.character_coverage,
        spm_input_sentence_size=args.spm_input_sentence_size, max_tokens=args.max_tokens_per_sentence,
        max_ratio=args.max_length_ratio, normalization=args.normalization, workers=args.workers, seed=args.seed,
        overwrite=args.overwrite,
    )
    try:
        check_options(cfg)
    except DataError as err:
        parser.error(str(err))
    prepare(cfg, log=say)


def main(argv: list[str] | None = None) -> None:
    """The command: one line, never a traceback, for bad input, a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(lambda: _main(argv), errors=(DataError,))


if __name__ == "__main__":
    main()
