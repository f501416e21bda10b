"""scripts/bench_transformer.py on the CPU at a tiny size: the table, raw numbers and plot hold every length (with
its operator profile) and the training row, are written after every length, and an interrupted run keeps the
lengths it measured."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from process_helpers import terminate_a_benchmark_once_it_wrote

pytestmark = pytest.mark.slow  # the full WMT models, and a fresh process per memory cell

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_transformer.py"
TINY = ("--batch", "1", "--repeats", "1", "--vocab", "64", "--train-steps", "1", "--train-max-tokens", "100",
        "--threads", "1")


def test_tiny_benchmark_writes_every_length_and_the_training_row(tmp_path):
    out = {kind: tmp_path / f"bench.{kind}" for kind in ("md", "json", "png")}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--lengths", "8", "16", *TINY, "--profile", "1",
                           "--markdown", str(out["md"]),
                           "--json", str(out["json"]), "--plot", str(out["png"])],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out["json"].read_text())
    assert [row["L"] for row in result["encoder"]] == [8, 16]
    for row in result["encoder"]:
        assert row["time_ratio"] == pytest.approx(row["ms"]["mtsa"] / row["ms"]["transformer"])
        assert row["memory_ratio"] == pytest.approx(row["mb"]["mtsa"] / row["mb"]["transformer"])
        profile = row["profile"]  # MTSA's source2token sigmoid is its own; both run the attention and the FFN
        assert "aten::sigmoid" in profile["mtsa"] and "aten::sigmoid" not in profile["transformer"]
        assert all(profile[name]["aten::addmm"] > 0 for name in ("transformer", "mtsa"))
    training = result["training"]
    assert training["steps"] == 1 and training["ratio"] == pytest.approx(
        training["tok_s"]["mtsa"] / training["tok_s"]["transformer"])
    table = out["md"].read_text()
    assert "mtsa_core kernel auto" in table and "| 1 steps of ~100 target tokens |" in table
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith(("| 8 ", "| 16 "))]
    assert rows == ["| 8", "| 16"]
    assert "| L = 8: host self time per pass |" in table and "| L = 16: host self time per pass |" in table
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_interrupted_run_keeps_the_lengths_measured(tmp_path):
    out = tmp_path / "bench.json"
    terminate_a_benchmark_once_it_wrote([sys.executable, str(SCRIPT), "--lengths", "8", "16", "32", "64", *TINY,
                                         "--json", str(out)], out)
    result = json.loads(out.read_text())
    assert result["encoder"][0]["L"] == 8 and result["training"] is None


@pytest.mark.parametrize("option, message", [
    (("--train-max-tokens", "50"), "--train-max-tokens must be at least 100, the longest training sentence drawn"),
    (("--kernel", "fast"), "--kernel must be one of auto, sdpa, sdpa-joint, dense, triton, not 'fast'"),
    (("--device", "foo"), "--device must be cpu or cuda[:N], not 'foo'"),
])
def test_bad_options_are_a_usage_error(tmp_path, option, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), *option, "--json", str(tmp_path / "b.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(message)
    assert not (tmp_path / "b.json").exists()
