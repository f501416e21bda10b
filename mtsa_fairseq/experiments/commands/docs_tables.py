"""Rewrite the generated tables of Markdown documents from the JSON reports they name (--check: only verify).

A generated table is the block between a line ``<!-- table REPORT KIND [OPTION=VALUE ...] -->`` and the next
``<!-- /table -->``: table KIND of REPORT (a path relative to the document). An option the kind does not take
shows architecture (or run) OPTION as VALUE.

  mtsa-docs-tables docs/results-sentence.md            # rewrite the tables
  mtsa-docs-tables --check docs/results-sentence.md    # exit 1 naming every table that differs
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from mtsa_fairseq.experiments.bench.fairseq_train import runs_table as fairseq_train_table
from mtsa_fairseq.experiments.files import write_atomic
from mtsa_fairseq.experiments.processes import run_command
from mtsa_fairseq.experiments.sentence.lr_search import search_table
from mtsa_fairseq.experiments.sentence.report import (
    anchor_table,
    cross_validation_table,
    folds_table,
    runs_table,
    summary_table,
)
from mtsa_fairseq.experiments.tables import OPEN, Kind, Option, TableError, render
from mtsa_fairseq.experiments.translation.curves import curves_table, plateau_table
from mtsa_fairseq.experiments.translation.study_tables import (
    BLEU_KINDS,
    bleu_kinds,
    study_paired_table,
    study_runs_table,
    study_table,
)


def launches_table(report: dict, names: dict[str, str]) -> list[str]:
    """mtsa-bench-launches' table of ``report`` (imported here: its module imports torch)."""
    from mtsa_fairseq.experiments.bench.launches import launches_table

    return launches_table(report, names)


def _printed_table(benchmark: str) -> Callable[..., list[str]]:
    """The table kind of mtsa-bench-BENCHMARK: table ``part`` (from 1) of what the command prints for its JSON record
    (the module is imported when a table is made: it imports torch)."""

    def table(report: dict, names: dict[str, str], part: int = 1) -> list[str]:
        module = importlib.import_module(f"mtsa_fairseq.experiments.bench.{benchmark}")
        tables = [block for block in module.markdown(report).split("\n\n") if block.startswith("|")]
        if not 1 <= part <= len(tables):
            raise ValueError(f"part={part}: this record prints {len(tables)} tables")
        return tables[part - 1].splitlines()

    return table


METRIC = Option("metric")  # another metric of the report, e.g. spearman or mse on SICK
KINDS = {  # kind -> its table function, options and help
    "summary": Kind(summary_table, {"metric": METRIC}, "a sentence report.json: per architecture the metric per "
                    "seed, mean ± sd, Welch's t-test (metric=NAME: another metric of the report)"),
    "cv": Kind(cross_validation_table, help="a cross-validated report.json: chosen, best (test-selected) and last, "
               "the corrected and paired tests"),
    "runs": Kind(runs_table, help="a report.json: per run the tested checkpoint, its dev metric, the last validation"),
    "folds": Kind(folds_table, {"archs": Option("archs", lambda text: text.split(","))},
                  "a cross-validated report.json: per fold chosen, best and last (archs=A,B: only those)"),
    "anchor": Kind(anchor_table, {"metric": METRIC, "value": Option("value", float, "a number", required=True),
                                  "label": Option("label", required=True),
                                  "n": Option("anchor_n", int, "a whole number of test items")},
                   "a report.json: one-sample t-tests against the published figure value=NUMBER label=NAME (n=ITEMS: "
                   "with the binomial standard error of an accuracy on that many test items; metric=NAME)"),
    "search": Kind(search_table, help="a search.json: per architecture the best dev metric at every rate, the rate "
                   "chosen"),
    "curves": Kind(curves_table, help="a curves JSON: every run's validation BLEU and loss per validated update"),
    "plateau": Kind(plateau_table, help="a curves JSON: the budget rule per run"),
    "study": Kind(study_table, {"margin": Option("margin", float, "a number"),
                                "bleu": Option("bleu", bleu_kinds, f"some of {', '.join(BLEU_KINDS)}, "
                                               "comma-separated")},
                  "a study.json: both systems' mean ± sd, the difference and its 95% interval, Welch's test, the "
                  "equivalence test within ±margin=M (default 0.45), the difference detectable at 80% power "
                  f"(bleu=A,B: only those of {', '.join(BLEU_KINDS)})"),
    "study-paired": Kind(study_paired_table, help="a study.json: the paired tests per seed"),
    "study-runs": Kind(study_runs_table, help="a study.json: per run updates, time, throughput, validation and test "
                       "BLEU"),
    "fairseq-train": Kind(fairseq_train_table, help="an mtsa-bench-fairseq-train result: tokens per second of "
                          "every run, medians, ratios"),
    "launches": Kind(launches_table, help="an mtsa-bench-launches result: operators, host synchronisations, time"),
    **{f"bench-{benchmark}": Kind(_printed_table(benchmark), {"part": Option("part", int, "a whole number")},
                                  f"an mtsa-bench-{benchmark} record: table part=N (default 1) of what the command "
                                  "prints") for benchmark in ("core", "encoders", "transformer")},
}


def _main() -> None:
    kinds = "\n".join(textwrap.fill(kind.help, 110, initial_indent=f"  {name:<19}", subsequent_indent=" " * 21)
                      for name, kind in KINDS.items())
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=f"table kinds:\n{kinds}")
    parser.add_argument("documents", type=Path, nargs="+", help="Markdown documents with generated tables")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming every table that differs from its report")
    args = parser.parse_args()
    stale, tables = [], 0
    for document in args.documents:
        if not document.is_file():
            parser.error(f"{document} is not a file")
        text, changed = render(document, KINDS)
        found = sum(1 for line in text.split("\n") if OPEN.match(line))
        if not found:
            print(f"note: {document} has no generated table (no <!-- table REPORT KIND --> line)")
        stale, tables = stale + changed, tables + found
        if changed and not args.check:
            write_atomic(document, text)
    for marker in stale:
        print(f"{'differs' if args.check else 'rewritten'}: {marker}")
    if args.check and stale:
        sys.exit(f"error: {len(stale)} of {tables} table(s) differ from their reports (run mtsa-docs-tables without "
                 "--check)")
    outcome = f"{len(stale)} rewritten" if stale else "all equal their reports"
    print(f"{tables} generated table(s) in {len(args.documents)} document(s): {outcome}")


def main() -> None:
    """The command: one line, never a traceback, for bad markers, a full disk, Ctrl-C or SIGTERM."""
    run_command(_main, errors=(TableError,))


if __name__ == "__main__":
    main()
