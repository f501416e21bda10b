"""scripts/bench_fairseq_train.py: fairseq-train's throughput read from its own log lines, the usage errors, and a
tiny CPU run end to end with a profiled window and cuDNN attention off."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mtsa_fairseq.experiments.bench.fairseq_train import split_system, throughput

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_fairseq_train.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=1500)


def test_throughput_is_the_median_wps_past_the_skipped_updates():
    log = "\n".join([
        "epoch 001: 10 / 99 loss=9.1, wps=100.0, ups=1.0, num_updates=10, lr=1e-05",
        "epoch 001: 20 / 99 loss=9.0, wps=300.0, ups=1.0, num_updates=20, lr=2e-05",
        "epoch 001: 30 / 99 loss=8.9, num_updates=30, wps=200.0, lr=3e-05",
        "epoch 001: 40 / 99 loss=8.8, wps=900.0, ups=1.0, num_updates=40, lr=4e-05",
    ]).replace("epoch", "| INFO | train_inner | epoch")
    assert throughput(log, skip_updates=10) == 300.0
    with pytest.raises(RuntimeError, match="past update 40"):
        throughput(log, skip_updates=40)


def test_a_system_splits_into_its_architecture_and_options():
    assert split_system("transformer_mtsa_tiny --mtsa-kernel 'sdpa-joint'") == (
        "transformer_mtsa_tiny", ["--mtsa-kernel", "sdpa-joint"])
    assert split_system("transformer_tiny") == ("transformer_tiny", [])
    for bad in ("", "--mtsa-kernel sdpa"):
        with pytest.raises(ValueError, match="starts with its architecture"):
            split_system(bad)


@pytest.mark.parametrize("args, message", [
    (["--profile", "2", "3"], "--profile needs --logs"),
    (["--profile", "2", "9", "--logs", "."], "START <= END <= --skip-updates"),
    (["--profile", "0", "3", "--logs", "."], "--profile must be positive"),
    (["--archs", "transformer_tiny"], "at least two systems"),
    (["--archs", "transformer_tiny", "--mtsa-kernel sdpa"], "starts with its architecture"),
    (["--archs", "transformer_tiny", "transformer_mtsa_tiny --mtsa-kernel 'sdpa"], "No closing quotation"),
])
def test_profile_usage_errors(args, message):
    proc = run("--device", "cpu", "--precision", "fp32", "--updates", "10", "--skip-updates", "5", *args)
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.slow
def test_tiny_cpu_run_writes_the_table_and_a_profile_of_each_run(tmp_path):
    out, logs = tmp_path / "bench.json", tmp_path / "logs"
    logs.mkdir()
    joint = "transformer_mtsa_tiny --mtsa-kernel sdpa-joint"
    proc = run("--device", "cpu", "--precision", "fp32", "--archs", "transformer_tiny", "transformer_mtsa_tiny", joint,
               "--max-tokens", "256", "--updates", "8", "--skip-updates", "5", "--log-interval", "1", "--vocab", "100",
               "--pairs", "200", "--profile", "3", "4", "--no-cudnn-attention", "--logs", str(logs), "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "cuDNN attention off" in result["settings"]
    assert result["archs"] == ["transformer_tiny", "transformer_mtsa_tiny", joint]
    row = result["rows"][0]
    assert row["max_tokens"] == 256 and all(row["tok_s"][a] > 0 for a in result["archs"])
    assert set(row["throughput_ratio"]) == set(row["memory_ratio"]) == {"transformer_mtsa_tiny", joint}
    ratio = row["tok_s"][joint] / row["tok_s"]["transformer_tiny"]
    assert row["throughput_ratio"][joint] == pytest.approx(ratio)
    joint_log = (logs / "transformer_mtsa_tiny_--mtsa-kernel_sdpa-joint-256-run1.log").read_text()
    assert "mtsa_kernel='sdpa-joint'" in joint_log
    for arch in ("transformer_tiny", "transformer_mtsa_tiny", "transformer_mtsa_tiny_--mtsa-kernel_sdpa-joint"):
        report = (logs / f"{arch}-256-run1.profile.txt").read_text()
        assert report.startswith("updates profiled: 2 ")
        assert "of which inside Trainer.train_step (host)" in report and "aten::nonzero per update" in report
        assert "torch.profiler, by self CPU time:" in report and "aten::mm" in report
        assert "cProfile of the host, by cumulative:" in report and "trainer.py" in report
        assert (logs / f"{arch}-256-run1.log").is_file()


@pytest.mark.slow
def test_rows_measured_are_kept_when_a_later_batch_size_fails(tmp_path):
    out = tmp_path / "bench.json"
    proc = run("--device", "cpu", "--precision", "fp32", "--archs", "transformer_tiny", "transformer_tiny",
               "--max-tokens", "256", "2", "--updates", "3", "--skip-updates", "1", "--log-interval", "1", "--vocab",
               "100", "--pairs", "200", "--json", str(out))  # 2 tokens: shorter than any pair
    assert proc.returncode == 1
    assert "transformer_tiny at --max-tokens 2 failed" in proc.stderr
    assert [row["max_tokens"] for row in json.loads(out.read_text())["rows"]] == [256]


def test_profile_reports_name_source_files_from_their_import_root():
    import fairseq

    from mtsa_fairseq.experiments.bench.fairseq_train import without_import_roots
    from mtsa_fairseq.experiments.fairseq_train import USER_DIR

    trainer, core = Path(fairseq.__file__).parent / "trainer.py", Path(USER_DIR) / "modules" / "mtsa_core.py"
    line = f"   10    0.006 {trainer}:796(train_step)\n   60    0.004 {core}:598(forward)"
    assert without_import_roots(line) == ("   10    0.006 fairseq/trainer.py:796(train_step)\n"
                                          "   60    0.004 mtsa_fairseq/modules/mtsa_core.py:598(forward)")
