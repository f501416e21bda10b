"""Every citation of docs/reference.md names a section (and step) that exists there.

Citations are ``reference §X.Y`` or ``docs/reference.md §X.Y``, optionally followed by more sections
(``, §2.2 and §5``, ``-§2.3``) and by a numbered step or item (``§1.2 step 5``, ``§3.1 items 3-4``). Older forms
without ``§`` (the word reference followed by a bare number, the abbreviation "ref." with a number, "fact N")
and names of the external notes files are reported as stale. Other uses of the word reference (a float64
reference, a reference architecture, ``--reference``) are not citations and are left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference.md"
SCANNED = ("mtsa_fairseq/**/*.py", "scripts/**/*.py", "tests/**/*.py", "configs/**/*.yaml", "docs/*.md", "README.md")

HEADING = re.compile(r"^#{2,3}\s+(\d+(?:\.\d+)?)\.?\s", re.MULTILINE)
ANY_HEADING = re.compile(r"^#{1,6}\s", re.MULTILINE)
LIST_ITEM = re.compile(r"^(\d+)\.\s", re.MULTILINE)

# whitespace between words, also across a line break into a "# " comment continuation
_WS = r"\s+(?:#\s+)?"
_SECTION = r"§(\d+(?:\.\d+)?)"
_STEPS = r"((?:,?\s+(?:steps?|items?)\s+\d+(?:\s*(?:-|–|,|and)\s*\d+)*)?)"
_JOIN = r"(?:\s*[,;/–-]\s*(?:and\s+)?|\s+(?:and|or|to)\s+)"
SECTION_REF = re.compile(_SECTION + _STEPS)
CITATION = re.compile(
    rf"\b(?:docs/reference\.md|reference){_WS}{_SECTION}{_STEPS}(?:{_JOIN}{_SECTION}{_STEPS})*"
)
_NUMBER = r"\d+(?:\.\d+)*(?![A-Za-z0-9])"  # not "1e-6"
STALE = {
    "citation without §": re.compile(rf"\breference(?:{_WS}notes?)?,?{_WS}(?:sections?{_WS})?{_NUMBER}", re.I),
    "docs/reference.md citation without §": re.compile(rf"\breference\.md{_WS}(?:sections?{_WS})?{_NUMBER}"),
    "abbreviated citation": re.compile(rf"\bref\.{_WS}§?{_NUMBER}", re.I),
    "fact number (cite §9.N)": re.compile(rf"\bfacts?{_WS}{_NUMBER}", re.I),
    "§ separated from its number": re.compile(r"§\s+\d"),
    "external notes file": re.compile(r"\b(?:mtsa-reference|fairseq-notes)\.md\b"),
}


def reference_sections(text: str) -> dict[str, set[int]]:
    """Section number -> numbers of the top-level numbered list items in that section's own text."""
    heads = list(HEADING.finditer(text))
    sections: dict[str, set[int]] = {}
    for head in heads:
        start = head.end()
        following = ANY_HEADING.search(text, start)
        body = text[start:following.start() if following else len(text)]
        sections[head.group(1)] = {int(m.group(1)) for m in LIST_ITEM.finditer(body)}
    return sections


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _steps(spec: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", spec)]


def _check_refs(where: str, fragment: str, sections: dict[str, set[int]]) -> list[str]:
    problems = []
    for ref in SECTION_REF.finditer(fragment):
        number, steps = ref.group(1), _steps(ref.group(2))
        if number not in sections:
            problems.append(f"{where}: cites §{number}, which is not a section of docs/reference.md")
        else:
            problems += [f"{where}: cites §{number} step {s}, but §{number} has no numbered step {s}"
                         for s in steps if s not in sections[number]]
    return problems


def citation_problems(path: Path, text: str, sections: dict[str, set[int]]) -> list[str]:
    """Unresolved and stale citations in ``text`` (the contents of ``path``), as ``file:line: problem``."""
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    problems = []
    # inside docs/reference.md a bare "§X.Y" is a cross-reference; elsewhere only the citation forms count
    pattern = SECTION_REF if path.name == REFERENCE.name and path.parent.name == "docs" else CITATION
    for match in pattern.finditer(text):
        problems += _check_refs(f"{name}:{_line(text, match.start())}", match.group(0), sections)
    for kind, stale in STALE.items():
        for match in stale.finditer(text):
            problems.append(f"{name}:{_line(text, match.start())}: stale {kind}: {match.group(0)!r}")
    return problems


def scanned_files() -> list[Path]:
    return sorted({p for pattern in SCANNED for p in ROOT.glob(pattern) if p.is_file()})


@pytest.fixture(scope="module")
def sections() -> dict[str, set[int]]:
    return reference_sections(REFERENCE.read_text(encoding="utf-8"))


def test_reference_keeps_its_numbered_structure(sections):
    expected = {str(n) for n in range(1, 10)}
    counts = {1: 6, 2: 6, 3: 3, 4: 4, 7: 11, 8: 5, 9: 10}
    expected |= {f"{top}.{sub}" for top, n in counts.items() for sub in range(1, n + 1)}
    assert expected <= set(sections), f"missing sections: {sorted(expected - set(sections))}"
    assert sections["1.2"] == set(range(1, 8)) and sections["3.1"] == set(range(1, 9))
    assert sections["4.1"] == set(range(1, 7))


def test_scan_covers_code_configs_and_docs():
    names = {str(p.relative_to(ROOT)) for p in scanned_files()}
    assert {"README.md", "docs/reference.md", "mtsa_fairseq/modules/mtsa_core.py"} <= names
    assert any(n.startswith("configs/sentence/") for n in names) and any(n.startswith("scripts/") for n in names)


def test_every_citation_resolves(sections):
    problems = [p for path in scanned_files()
                for p in citation_problems(path, path.read_text(encoding="utf-8"), sections)]
    assert not problems, "citations of docs/reference.md that do not resolve:\n" + "\n".join(problems)


def test_checker_flags_missing_sections_steps_and_stale_forms(tmp_path, sections):
    sign = "§"
    scratch = tmp_path / "scratch.py"
    lines = [
        f'"""Fine: reference {sign}1.2 step 5, {sign}8.3 and {sign}2.1-{sign}2.3; docs/reference.md {sign}9.8."""',
        f"x = 1  # bogus: reference {sign}10.1",
        f"y = 2  # bogus step: reference {sign}1.2 step 9",
        "z = 3  # stale: reference" + " 1.4, and the fa" + "ct 8",
        f'w = "split over lines: reference\n    {sign}3.7"',
        "v = 4  # not citations: the float64 reference, a reference architecture, --reference FILE, ref to x",
    ]
    text = "\n".join(lines) + "\n"
    scratch.write_text(text)
    problems = citation_problems(scratch, text, sections)
    assert any(":2: cites §10.1" in p for p in problems)
    assert any(":3: cites §1.2 step 9" in p for p in problems)
    assert sum(":4: stale" in p for p in problems) == 2
    assert any(":5: cites §3.7" in p for p in problems)
    assert not [p for p in problems if ":1:" in p or ":7:" in p]  # the line break above shifts the last line
    assert len(problems) == 5
