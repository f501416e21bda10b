"""Helpers shared by the sentence-task tests (test_sentence_encoding_task.py, test_sentence_runs.py,
test_lr_search.py, test_sentence_evaluation.py): the project's commands run from the repository root, synthetic
TREC questions and a small task config."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COARSE = {"ABBR": "abbreviation", "DESC": "how", "ENTY": "what", "HUM": "who", "LOC": "where", "NUM": "when"}
FILLER = "the a river city dog music old red long first book tree house".split()


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*args], capture_output=True, text=True, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args[:3]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def prepare(dataset: str, raw: Path, out: Path, *extra: str) -> Path:
    run(sys.executable, str(ROOT / "scripts/prepare_sentence_data.py"), dataset, "--input", str(raw), "--out",
        str(out), *extra)
    return out


def trec_lines(n: int, rng: random.Random) -> list[str]:
    """TREC-format questions whose coarse class is given away by the first word."""
    lines = []
    for _ in range(n):
        coarse = rng.choice(sorted(COARSE))
        words = [COARSE[coarse]] + rng.sample(FILLER, rng.randint(2, 6)) + ["?"]
        lines.append(f"{coarse}:other {' '.join(words)}")
    return lines


def write_trec(raw: Path, seed: int) -> Path:
    """TREC's two raw files in ``raw``: 400 training and 60 test questions of :func:`trec_lines`."""
    rng = random.Random(seed)
    (raw / "train_5500.label").write_text("\n".join(trec_lines(400, rng)) + "\n", encoding="latin-1")
    (raw / "TREC_10.label").write_text("\n".join(trec_lines(60, rng)) + "\n", encoding="latin-1")
    return raw


SMALL = ("name: small\ndataset: trec\nmetric: accuracy\ndescription: test\nfairseq:\n  criterion: sentence_encoding\n"
         "  optimizer: adam\n  lr: 0.005\n  batch-size: 16\n  max-update: {updates}\n  save-interval-updates: 5\n"
         "  best-checkpoint-metric: accuracy\n  maximize-best-checkpoint-metric: true\n  embed-dim: 16\n"
         "  encoder-hidden-dim: 8\n  classifier-hidden-dim: 8\n  num-workers: 0\n  log-format: simple\n")
