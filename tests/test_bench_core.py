"""scripts/bench_core.py on the CPU at a tiny size: the table holds every (method, L) with its ratios, is written
after every length, and an interrupted run keeps the lengths it measured; the JSON record prints the same table."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from process_helpers import terminate_a_benchmark_once_it_wrote

from mtsa_fairseq.experiments.commands.docs_tables import KINDS

pytestmark = pytest.mark.slow  # every cell is a fresh process that imports torch and fairseq

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_core.py"
TINY = ("--batch", "1", "--dim", "16", "--heads", "2", "--repeats", "1", "--methods", "mtsa", "mha")


def test_tiny_benchmark_writes_every_method_and_length(tmp_path):
    out, record = tmp_path / "core.md", tmp_path / "core.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--lengths", "8", "16", *TINY, "--markdown", str(out),
                           "--json", str(record)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("torch ") and "float32, batch 1, d_model 16, 2 heads, forward+backward, median of 1" in text
    assert "| L | mtsa MB | mha MB | mtsa ms | mha ms | mtsa/mha mem | mtsa/mha time |" in text
    assert [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| 8 ") or line.startswith("| 16 ")] \
        == ["| 8", "| 16"]
    report = json.loads(record.read_text())
    assert [row["L"] for row in report["rows"]] == [8, 16] and report["methods"] == ["mtsa", "mha"]
    assert report["rows"][1]["mha"]["ms"] > 0 and report["settings"]["lengths"] == [8, 16]
    table = KINDS["bench-core"].table(report, {})
    assert table == [line for line in text.splitlines() if line.startswith("|")]


def test_an_interrupted_run_keeps_the_lengths_measured(tmp_path):
    out = tmp_path / "core.md"
    terminate_a_benchmark_once_it_wrote([sys.executable, str(SCRIPT), "--lengths", "8", "16", "32", "64", *TINY,
                                         "--markdown", str(out)], out)
    assert "| 8 | " in out.read_text()


def test_the_cores_alone_on_the_cpu(tmp_path):
    out = tmp_path / "core.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--core", "--lengths", "8", "--batch", "1", "--dim", "16",
                           "--heads", "2", "--repeats", "1", "--methods", "mtsa", "mtsa-sdpa", "mtsa-dense",
                           "mha-flash", "--markdown", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "attention cores alone on [B, H, L, 8] tensors, no padding" in text
    assert "| mtsa/mha-flash time | mtsa-sdpa/mha-flash time | mtsa-dense/mha-flash time |" in text
    proc = subprocess.run([sys.executable, str(SCRIPT), "--core", "--methods", "naive"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2 and "--core takes only the methods mtsa, mtsa-sdpa" in proc.stderr


@pytest.mark.parametrize("option, message", [
    (("--device", "foo"), "--device must be cpu or cuda[:N], not 'foo'"),
    (("--dim", "10", "--heads", "3"), "--dim 10 is not divisible by --heads 3"),
])
def test_bad_options_are_a_usage_error(option, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--lengths", "16", "--repeats", "1", *option],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(f"error: {message}")


def test_a_memory_ratio_below_what_the_resident_set_resolves_is_a_dash():
    from mtsa_fairseq.experiments.bench.core import table

    rows = [{"L": 16, "mtsa": {"peak_mb": 0.2, "ms": 2.0}, "mha": {"peak_mb": 0.0, "ms": 1.0}},
            {"L": 32, "mtsa": {"peak_mb": 3.0, "ms": 3.0}, "mha": {"peak_mb": 1.5, "ms": 2.0}}]
    lines = table(rows, ["mtsa", "mha"]).splitlines()
    assert lines[2] == "| 16 | 0.2 | 0.0 | 2.0 | 1.0 | — | 2.00 |"
    assert lines[3] == "| 32 | 3.0 | 1.5 | 3.0 | 2.0 | 2.00 | 1.50 |"


def test_the_methods_are_timed_in_one_process_in_turns(monkeypatch):
    """pass_times takes every method's passes in one process through measure.timed_rounds (the turns)."""
    import argparse

    from mtsa_fairseq.experiments.bench import core, measure

    rounds = []
    timed_rounds = measure.timed_rounds
    monkeypatch.setattr(measure, "timed_rounds", lambda steps, *a, **k: rounds.append(list(steps)) or
                        timed_rounds(steps, *a, **k))
    args = argparse.Namespace(batch=1, dim=16, heads=2, repeats=2, device="cpu", dtype="float32", core=False,
                              methods=["mtsa", "naive", "mha"])
    times = core.pass_times(8, args)
    assert rounds == [["mtsa", "naive", "mha"]] and sorted(times) == ["mha", "mtsa", "naive"]
    assert all(ms > 0 for ms in times.values())
