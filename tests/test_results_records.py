"""The committed records under results/ name files relative to their own folders, never by a machine's path."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r"/(work|tmp|root|home)/")


def test_no_record_names_an_absolute_path_of_the_machine_that_made_it():
    found = []
    for path in sorted((ROOT / "results").rglob("*")):
        if path.is_file() and path.suffix != ".png":  # figures hold no paths
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if MACHINE_PATH.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}")
    assert found == [], f"{len(found)} lines name absolute paths, the first: {found[:5]}"
