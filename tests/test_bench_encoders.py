"""scripts/bench_encoders.py end to end at a tiny size: every encoder is the registered architecture, the
table and JSON hold each (encoder, L), and a pass that cannot get its memory is reported as OOM."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_encoders.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1500)


def test_tiny_benchmark_writes_every_encoder_and_length(tmp_path):
    out = tmp_path / "bench.json"
    proc = run("--lengths", "4", "12", "--batch", "2", "--dim", "20", "--repeats", "1",
               "--archs", "mtsa_encoder", "disan_encoder", "stacked_mtsa_encoder",
               "--json", str(out), "--plot", str(tmp_path / "bench.png"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["encoders"] == ["mtsa_encoder", "disan_encoder", "stacked_mtsa_encoder"]
    assert [r["L"] for r in result["rows"]] == [4, 12]
    for row in result["rows"]:
        assert all(row["ms"][n] > 0 and isinstance(row["mb"][n], float) for n in result["encoders"])
    assert "| L | mtsa ms | disan ms | stacked_mtsa ms |" in proc.stdout
    assert (tmp_path / "bench.png").stat().st_size > 0


def test_an_encoder_over_the_time_limit_stops(tmp_path):
    out = tmp_path / "bench.json"
    proc = run("--lengths", "4", "8", "--batch", "2", "--dim", "20", "--repeats", "1", "--max-seconds", "0.000001",
               "--archs", "multi_cnn_encoder", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["ms"] for r in result["rows"]][1] == {} and "multi_cnn_encoder" in result["stopped"]
    assert "| 8 | — |" in proc.stdout and "not run at longer lengths (a pass took" in proc.stdout


def test_out_of_memory_is_reported_not_fatal():
    # MTSA at L = 2048, batch 64: [64, 2, 2048, 2048] floats are 2 GiB per tensor, far above a 3 GiB limit
    proc = run("--memory-of", "mtsa_encoder:2048", "--batch", "64", "--memory-limit-gb", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == "OOM"


def test_bad_lengths_and_missing_output_directory(tmp_path):
    proc = run("--lengths", "64", "16")
    assert proc.returncode != 0 and "--lengths must be increasing" in proc.stderr
    proc = run("--lengths", "4", "--json", str(tmp_path / "missing" / "b.json"))
    assert proc.returncode != 0 and "does not exist" in proc.stderr


def test_from_json_merges_runs_without_measuring(tmp_path):
    def row(length, names):
        return {"L": length, "ms": {n: 10.0 * length for n in names}, "mb": {n: 1.0 * length for n in names}}

    short = {"settings": "cpu A", "encoders": ["mtsa_encoder", "disan_encoder"], "stopped": {},
             "rows": [row(16, ["mtsa_encoder", "disan_encoder"]), row(512, ["mtsa_encoder", "disan_encoder"])]}
    long = {"settings": "cpu B", "encoders": ["mtsa_encoder"], "stopped": {"mtsa_encoder": "out of memory at L = 2048"},
            "rows": [row(16, ["mtsa_encoder"]), row(1024, ["mtsa_encoder"])]}
    paths = [tmp_path / "short.json", tmp_path / "long.json"]
    for path, result in zip(paths, (short, long)):
        path.write_text(json.dumps(result))
    out = tmp_path / "merged.json"
    proc = run("--from-json", *map(str, paths), "--json", str(out), "--plot", str(tmp_path / "merged.png"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = json.loads(out.read_text())
    assert [r["L"] for r in merged["rows"]] == [16, 512, 1024]
    assert merged["rows"][0] == long["rows"][0]  # the later file's row for a length measured twice
    assert merged["encoders"] == ["mtsa_encoder", "disan_encoder"]
    assert merged["settings"] == "L = 16, 512: cpu A; L = 16, 1024: cpu B"
    assert "| 1024 | 10240.0 | — |" in proc.stdout and "out of memory at L = 2048" in proc.stdout
    assert (tmp_path / "merged.png").stat().st_size > 0
    missing = run("--from-json", str(tmp_path / "none.json"))
    assert missing.returncode != 0 and "no such file" in missing.stderr


@pytest.mark.parametrize("option, message", [
    (("--memory-limit-gb", "-1"), "error: --memory-limit-gb must be positive and finite"),
    (("--max-seconds", "-1"), "error: --max-seconds must be positive and finite"),
    (("--device", "foo"), "error: --device must be cpu or cuda[:N], not 'foo'"),
])
def test_bad_options_are_a_usage_error(option, message):
    proc = run("--lengths", "4", *option)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(message)


def test_from_json_refuses_what_is_not_a_record(tmp_path):
    truncated, other = tmp_path / "truncated.json", tmp_path / "other.json"
    truncated.write_text('{"settings": "cpu", "rows": [')
    other.write_text(json.dumps({"schema": "mtsa-fairseq.result.v1", "bleu": 30.0}))
    proc = run("--from-json", str(truncated))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {truncated} is not valid JSON: Expecting value: line 1 "
                                                "column 30 (char 29)"]
    proc = run("--from-json", str(other))
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: {other} is not an mtsa-bench-encoders --json record (an object of settings, encoders, rows, "
        "each row with L, ms and mb)"]
