"""Markdown tables: :func:`markdown_table` writes every table of the reports and benchmarks, and :func:`render`
regenerates the tables of a Markdown document from the JSON reports its markers name (``mtsa-docs-tables``).

A generated table is the block between a line ``<!-- table REPORT KIND [OPTION=VALUE ...] -->`` and the next
``<!-- /table -->``: table KIND of REPORT (a path relative to the document), drawn by the kind's function. An
option the kind does not declare is a name mapping: architecture or run OPTION shown as VALUE."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPEN = re.compile(r"^<!-- table (\S+) (\S+)((?: \S+=\S+)*) -->$")
CLOSE = "<!-- /table -->"


class TableError(ValueError):
    """A marker or report that cannot be rendered; the message names the document and line."""


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "") -> list[str]:
    """A Markdown table as lines: ``header``, its rule (column i right-aligned where ``align[i]`` is ``r``) and
    ``rows`` of cells."""
    rule = "|" + "".join("---:|" if align[i:i + 1] == "r" else "---|" for i in range(len(header)))
    return ["| " + " | ".join(header) + " |", rule, *("| " + " | ".join(cells) + " |" for cells in rows)]


@dataclass(frozen=True)
class Option:
    """A marker option of a table kind: its function's keyword, how its text is read (raising ValueError for a bad
    one), what a good one is (for the message), and whether the kind needs it."""

    keyword: str
    read: Callable[[str], Any] = str
    expected: str = "text"
    required: bool = False


@dataclass(frozen=True)
class Kind:
    """A table kind: ``table(report, names, **options)`` returns its lines; ``help`` says what it shows."""

    table: Callable[..., list[str]]
    options: dict[str, Option] = field(default_factory=dict)
    help: str = ""


def _options(kind: str, kinds: dict[str, Kind], given: str, where: str) -> tuple[dict[str, str], dict[str, Any]]:
    """A marker's ``OPTION=VALUE`` words as the name mapping and the keyword arguments of ``kind``'s function; an
    option that only other kinds declare is an error, not a name."""
    names, options = dict(word.split("=", 1) for word in given.split()), {}
    missing = [f"{option}=" for option, spec in kinds[kind].options.items() if spec.required and option not in names]
    if missing:
        raise TableError(f"{where}: {kind} tables need {' and '.join(missing)}")
    for option, spec in kinds[kind].options.items():
        if option not in names:
            continue
        text = names.pop(option)
        try:
            options[spec.keyword] = spec.read(text)
        except ValueError:
            raise TableError(f"{where}: {option}= must be {spec.expected}, not {text!r}") from None
    foreign = sorted(set(names) & {option for other in kinds.values() for option in other.options})
    if foreign:
        raise TableError(f"{where}: {foreign[0]}= is not an option of {kind} tables")
    return names, options


def render(document: Path, kinds: dict[str, Kind]) -> tuple[str, list[str]]:
    """The document with every generated table of ``kinds`` rendered, and the markers of the tables that changed."""
    lines = document.read_text(encoding="utf-8").split("\n")
    out, changed, i = [], [], 0
    while i < len(lines):
        out.append(lines[i])
        match = OPEN.match(lines[i])
        i += 1
        if match is None:
            if lines[i - 1].startswith("<!-- table"):
                raise TableError(f"{document}:{i}: not a table marker <!-- table REPORT KIND [OPTION=VALUE ...] -->")
            continue
        where = f"{document}:{i}"
        end = next((j for j in range(i, len(lines)) if lines[j] == CLOSE), None)
        if end is None:
            raise TableError(f"{where}: no {CLOSE} after this table marker")
        report_path, kind = document.parent / match[1], match[2]
        if kind not in kinds:
            raise TableError(f"{where}: unknown table kind {kind!r} (one of {', '.join(kinds)})")
        names, options = _options(kind, kinds, match[3], where)
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
            table = kinds[kind].table(report, names, **options)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise TableError(f"{where}: cannot render {kind} of {report_path}: {err!r}") from None
        if lines[i:end] != table:
            changed.append(f"{where}: {match[1]} {kind}")
        out.extend(table)
        i = end
    return "\n".join(out), changed
