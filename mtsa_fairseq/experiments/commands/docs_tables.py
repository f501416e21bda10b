"""Rewrite the generated tables of Markdown documents from the JSON reports they name (--check: only verify).

A generated table is the block between a line ``<!-- table REPORT KIND [OLD=NEW ...] -->`` and the next
``<!-- /table -->``: table KIND of REPORT, a report.json of mtsa-sentence-experiment, a search.json of
mtsa-sentence-lr-search, a curves JSON or a study.json of mtsa-multi30k-study (path relative to the document), with
architecture (or run) OLD shown as NEW (``archs=A,B`` keeps only those architectures in a folds table). Kinds:
summary (per architecture: the metric per seed, mean ± sd, Welch's t-test; ``metric=NAME`` for another metric
of the report, e.g. spearman or mse on SICK), cv (cross-validation: chosen, best (test-selected), last and the
paired tests), runs (per run: the tested checkpoint as the run recorded it, its dev metric, the last
validation), folds (per fold: chosen, best and last of every architecture), anchor (``value=NUMBER
label=NAME``: one-sample t-tests of every architecture's numbers, per seed or per fold (corrected for the folds'
shared training data), against a published figure, ``n=ITEMS`` adding the binomial standard error of an accuracy
on that many test items; ``metric=NAME`` as for summary), search (a search.json: per architecture the best dev
metric at every rate and the rate the rule chose), curves (a curves JSON: every run's validation BLEU and loss
per validated update), plateau (a curves JSON: the budget rule per run), study (a study.json: per test set,
checkpoint kind and BLEU both systems' mean ± sd, the difference with its 95% confidence interval, Welch's test,
the equivalence test within ±``margin=M`` (default 0.45) and the difference detectable at 80% power),
study-paired (the paired tests per seed: two-sided bootstrap, approximate randomization, Moses-style bootstrap),
study-runs (per run: updates, time, throughput, validation and test BLEU), fairseq-train (a result of
mtsa-bench-fairseq-train: every run's tokens per second, the medians and the ratios to the first system) and
launches (a result of mtsa-bench-launches: every row's operators, host synchronisations and time).

  mtsa-docs-tables docs/results-sentence.md            # rewrite the tables
  mtsa-docs-tables --check docs/results-sentence.md    # exit 1 naming every table that differs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
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
from mtsa_fairseq.experiments.translation.curves import curves_table, plateau_table
from mtsa_fairseq.experiments.translation.study_tables import study_paired_table, study_runs_table, study_table


def launches_table(report: dict, names: dict[str, str]) -> list[str]:
    """mtsa-bench-launches' table of ``report`` (imported here: its module imports torch)."""
    from mtsa_fairseq.experiments.bench.launches import launches_table

    return launches_table(report, names)


OPEN = re.compile(r"^<!-- table (\S+) (\S+)((?: \S+=\S+)*) -->$")
CLOSE = "<!-- /table -->"
TABLES = {"summary": summary_table, "cv": cross_validation_table, "runs": runs_table, "folds": folds_table,
          "anchor": anchor_table, "search": search_table, "curves": curves_table, "plateau": plateau_table,
          "study": study_table, "study-paired": study_paired_table, "study-runs": study_runs_table,
          "fairseq-train": fairseq_train_table, "launches": launches_table}


class TableError(ValueError):
    """A marker or report that cannot be rendered; the message names the document and line."""


def render(document: Path) -> tuple[str, list[str]]:
    """The document with every generated table rendered, and the markers of the tables that changed."""
    lines = document.read_text(encoding="utf-8").split("\n")
    out, changed, i = [], [], 0
    while i < len(lines):
        out.append(lines[i])
        match = OPEN.match(lines[i])
        i += 1
        if match is None:
            continue
        where = f"{document}:{i}"
        end = next((j for j in range(i, len(lines)) if lines[j] == CLOSE), None)
        if end is None:
            raise TableError(f"{where}: no {CLOSE} after this table marker")
        report_path, kind = document.parent / match[1], match[2]
        names = dict(option.split("=", 1) for option in match[3].split())
        archs = names.pop("archs", None)
        if kind not in TABLES:
            raise TableError(f"{where}: unknown table kind {kind!r} (one of {', '.join(TABLES)})")
        if archs is not None and kind != "folds":
            raise TableError(f"{where}: archs= selects the architectures of a folds table only")
        options: dict = {} if archs is None else {"archs": archs.split(",")}
        if kind in ("summary", "anchor") and "metric" in names:
            options["metric"] = names.pop("metric")
        if kind == "study" and "margin" in names:
            try:
                options["margin"] = float(names.pop("margin"))
            except ValueError:
                raise TableError(f"{where}: margin= must be a number") from None
        if kind == "anchor":
            try:
                options.update(value=float(names.pop("value")), label=names.pop("label"))
            except (KeyError, ValueError):
                raise TableError(f"{where}: an anchor table needs value=NUMBER and label=NAME") from None
            if "n" in names:
                try:
                    options["anchor_n"] = int(names.pop("n"))
                except ValueError:
                    raise TableError(f"{where}: n= must be a whole number of test items") from None
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
            table = TABLES[kind](report, names, **options)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise TableError(f"{where}: cannot render {kind} of {report_path}: {err!r}") from None
        if lines[i:end] != table:
            changed.append(f"{where}: {match[1]} {kind}")
        out.extend(table)
        i = end
    return "\n".join(out), changed


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("documents", type=Path, nargs="+", help="Markdown documents with generated tables")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming every table that differs from its report")
    args = parser.parse_args()
    stale = []
    for document in args.documents:
        if not document.is_file():
            parser.error(f"{document} is not a file")
        text, changed = render(document)
        stale += changed
        if changed and not args.check:
            write_atomic(document, text)
    for marker in stale:
        print(f"{'differs' if args.check else 'rewritten'}: {marker}")
    if args.check and stale:
        sys.exit(f"error: {len(stale)} table(s) differ from their reports (run mtsa-docs-tables without --check)")


def main() -> None:
    """The command: one line, never a traceback, for bad markers, a full disk, Ctrl-C or SIGTERM."""
    run_command(_main, errors=(TableError,))


if __name__ == "__main__":
    main()
