"""The JSON files the pipeline's scripts exchange: schema names and one checked reader.

``manifest.json`` (``scripts/prepare_data.py``), ``run.json`` (``scripts/train_seeds.py``) and result files
(``scripts/score.py``) each carry a ``schema`` key naming their layout and version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MANIFEST_SCHEMA = "mtsa-fairseq.data.v1"
RUN_SCHEMA = "mtsa-fairseq.run.v1"
RESULT_SCHEMA = "mtsa-fairseq.result.v1"


def read_json(path: Path, schema: str, what: str, error: type[Exception]) -> dict[str, Any]:
    """A JSON object file of the given ``schema``; anything else raises ``error`` naming ``what``."""
    if not path.is_file():
        raise error(f"{what} not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{what} {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != schema:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise error(f"{what} {path} has schema {found!r}, expected {schema!r}")
    return data
