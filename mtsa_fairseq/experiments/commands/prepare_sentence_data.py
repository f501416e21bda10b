"""Prepare a sentence-encoder data set (SST-5/SST-2, TREC, CR, MPQA, SUBJ, SICK, SNLI, MultiNLI) for fairseq:
tokenise, build the word dictionary and binarise into OUT (manifest.json, dict.txt, {split}.input0/.input1 .bin/.idx,
{split}.label, and train.fold for the cross-validation sets CR, MPQA, SUBJ), as docs/sentence-tasks.md describes.
"""

import argparse
from pathlib import Path

from mtsa_fairseq.experiments.processes import run_command, say
from mtsa_fairseq.experiments.sentence.data import (
    CLASS_FILES,
    DATASETS,
    SPLIT_FILES,
    DataError,
    SentenceDataConfig,
    prepare,
    resolve,
)


def _standard_names() -> str:
    lines = ["standard input file names (in --input DIR):"]
    lines += [f"  {name}: " + ", ".join(f"{split} {file}" for split, file in files.items())
              for name, files in SPLIT_FILES.items()]
    lines += [f"  {name}: " + ", ".join(files) + " (one file per class, label order; 10-fold cross-validation)"
              for name, files in CLASS_FILES.items()]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, epilog=_standard_names(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=DATASETS, metavar="DATASET",
                        help=f"the data set to prepare: {', '.join(DATASETS)}")
    parser.add_argument("--input", type=Path, metavar="DIR",
                        help="directory holding the release files under their standard names")
    parser.add_argument("--out", required=True, type=Path, help="output directory (must not exist unless --overwrite)")
    for split in ("train", "valid", "test"):
        parser.add_argument(f"--{split}", type=Path, metavar="FILE",
                            help=f"read the {split} split from FILE instead of its standard file in --input "
                                 "(data sets with one file per split)")
    parser.add_argument("--max-examples", type=int, metavar="N",
                        help="read only the first N examples (trees, questions, sentences, pairs) of each input "
                             "file, before any filter, holdout or oversampling (tests and quick runs)")
    parser.add_argument("--keep-case", action="store_true", help="do not lowercase the tokens")
    parser.add_argument("--oversample", action=argparse.BooleanOptionalAction, default=None,
                        help="sst5/sst2: write each training sentence and each non-neutral training phrase 4 times "
                             "(default: on for sst5, off for sst2)")
    parser.add_argument("--trec-valid", choices=("holdout", "test"),
                        help="trec: valid split = a random part of train_5500 (holdout, default) or a copy of "
                             "the test set TREC_10 (test, the DiSAN authors' protocol)")
    parser.add_argument("--valid-fraction", type=float, metavar="F",
                        help="trec --trec-valid holdout: share of train_5500 held out as valid (default 0.1)")
    parser.add_argument("--split-seed", type=int, metavar="SEED",
                        help="trec --trec-valid holdout: seed of the held-out permutation (default 1234)")
    parser.add_argument("--clip-percentile", type=float, metavar="P",
                        help="snli/mnli: drop training pairs with a side longer than this percentile of the "
                             "training sentence lengths (default 97; 0 = keep all)")
    parser.add_argument("--fold-seed", type=int, metavar="SEED",
                        help="cr/mpqa/subj: seed of the permutation assigning the 10 folds (default 1234)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT if it is an earlier prepared directory (one with manifest.json)")
    return parser


def _main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    cfg = SentenceDataConfig(**vars(parser.parse_args(argv)))  # the options are the config's fields
    try:
        resolve(cfg)  # options that do not apply, or values out of range: usage errors
    except DataError as err:
        parser.error(str(err))
    prepare(cfg, log=say)


def main(argv: list[str] | None = None) -> None:
    """The command: one line, never a traceback, for bad input, a full disk, Ctrl-C (status 130) or SIGTERM (143)."""
    run_command(lambda: _main(argv), errors=(DataError,))


if __name__ == "__main__":
    main()
