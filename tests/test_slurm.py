"""``mtsa-train-seeds --launcher slurm`` against a real single-node Slurm (scripts/slurm_test_cluster.sh): submission,
a second launcher, ``scontrol requeue``, ``scancel`` of a queued and of a running job, the time-limit warning with
and without requeues left. Skipped where Slurm is not installed (``scripts/slurm_test_cluster.sh install``)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from process_helpers import wait_for
from test_launch import ENV, ROOT, corpus, write_config  # noqa: F401  (corpus is a fixture)

from mtsa_fairseq.experiments.runs import checkpoint_updates

pytestmark = pytest.mark.slow

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A running single-node Slurm; SLURM_CONF points every command of the module at it."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"no Slurm here ({', '.join(missing)} not found): scripts/slurm_test_cluster.sh install")
    directory = tmp_path_factory.mktemp("slurm")
    script = str(ROOT / "scripts" / "slurm_test_cluster.sh")
    started = subprocess.run(["bash", script, "start", str(directory)], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", started.stdout.strip().rsplit("SLURM_CONF=", 1)[1])
        yield directory
        subprocess.run(["scancel", "--user", subprocess.getoutput("id -un")], timeout=60)
        wait_for(lambda: not subprocess.getoutput("squeue --noheader"), "the test jobs to end", timeout=120)
    subprocess.run(["bash", script, "stop", str(directory)], timeout=120, check=True)


def submit(config: Path, data: Path, save_root: Path, *args: str) -> str:
    """Run the launcher for seed 1 on Slurm (CPU, one thread); returns its output."""
    command = [sys.executable, str(ROOT / "scripts" / "train_seeds.py"), "--config", str(config), "--data", str(data),
               "--save-root", str(save_root), "--seeds", "1", "--threads", "1", "--launcher", "slurm", "--cpu", *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**ENV, "SLURM_CONF": os.environ["SLURM_CONF"]})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def submitted_job(output: str) -> str:
    return re.search(r"submitted Slurm job (\d+)", output)[1]


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def state(job: str) -> str:
    out = subprocess.run(["scontrol", "--oneliner", "show", "job", job], capture_output=True, text=True).stdout
    return re.search(r"JobState=(\S+)", out)[1]


def jobs_named(name: str) -> list[str]:
    return subprocess.getoutput(f"squeue --noheader --name {name} --format %i").split()


def config_for(tmp_path: Path, updates: int) -> Path:
    config = write_config(tmp_path / "configs", updates=updates)
    config.write_text(config.read_text() + "  no-epoch-checkpoints: true\n")
    return config


def trained_some(run_dir: Path) -> bool:
    return (checkpoint_updates(run_dir / "checkpoint_last.pt") or 0) >= 5


def test_job_is_submitted_once_and_resumes_after_scontrol_requeue(cluster, corpus, tmp_path):  # noqa: F811
    config, runs = config_for(tmp_path, updates=300), tmp_path / "runs"
    run_dir = runs / "tiny" / "seed1"
    job = submitted_job(submit(config, corpus / "prepared", runs))
    assert record(run_dir)["slurm_job"] == job  # recorded at submission, queued or not
    assert f"Slurm job {job} is " in submit(config, corpus / "prepared", runs)  # a second launcher: nothing new
    assert jobs_named("tiny.seed1") == [job]
    wait_for(lambda: trained_some(run_dir), "5 updates")
    subprocess.run(["scontrol", "requeue", job], check=True)  # what a preemption with PreemptMode=REQUEUE does
    wait_for(lambda: record(run_dir)["status"] == "requeued", "run.json to say requeued")
    assert f"Slurm job {job} is " in submit(config, corpus / "prepared", runs)  # during the requeue delay
    assert jobs_named("tiny.seed1") == [job]
    wait_for(lambda: record(run_dir)["status"] not in ("requeued", "running"), "the job to end")
    done = record(run_dir)
    assert done["status"] == "done", done
    assert done["num_updates"] == 300 and done["slurm_job"] == job and 0 < done["resumed_from_updates"] < 300
    assert done["peak_rss_mb"] > 0 and done["wall_seconds"] > 0 and "started_at" not in done
    assert "[progress] tiny seed 1: 300/300 updates" in (run_dir / "slurm" / f"{job}_0_log.err").read_text()
    assert "done (300 updates), skipped" in submit(config, corpus / "prepared", runs)


def test_cancelled_queued_job_is_resubmitted(cluster, corpus, tmp_path):  # noqa: F811
    config, runs = config_for(tmp_path, updates=30), tmp_path / "runs"
    run_dir = runs / "tiny" / "seed1"
    later = ("--slurm-args", "begin=now+3600")  # queued for an hour
    job = submitted_job(submit(config, corpus / "prepared", runs, *later))
    assert state(job) == "PENDING" and record(run_dir)["status"] == "submitted"
    assert record(run_dir)["slurm_job"] == job
    subprocess.run(["scancel", job], check=True)
    wait_for(lambda: state(job) == "CANCELLED", "the cancellation")
    output = submit(config, corpus / "prepared", runs, *later)
    assert f"run.json says submitted, but Slurm job {job} ended CANCELLED; resubmitting" in output
    again = submitted_job(output)
    assert again != job and jobs_named("tiny.seed1") == [again]
    assert record(run_dir)["slurm_job"] == again
    assert record(run_dir)["slurm_history"] == [{"slurm_job": job, "state": "CANCELLED", "status": "submitted"}]
    subprocess.run(["scancel", again], check=True)


def test_cancelled_running_job_is_recorded_and_resubmitted(cluster, corpus, tmp_path):  # noqa: F811
    config, runs = config_for(tmp_path, updates=200), tmp_path / "runs"
    run_dir = runs / "tiny" / "seed1"
    job = submitted_job(submit(config, corpus / "prepared", runs))
    wait_for(lambda: trained_some(run_dir), "5 updates")
    subprocess.run(["scancel", job], check=True)  # SIGTERM to the job's processes, then SIGKILL
    wait_for(lambda: state(job) == "CANCELLED" and record(run_dir)["status"] != "running", "the cancellation")
    assert record(run_dir)["status"] == "requeued"  # SIGTERM: a requeue, a preemption or scancel; Slurm tells
    output = submit(config, corpus / "prepared", runs)
    assert f"run.json says requeued, but Slurm job {job} ended CANCELLED; resubmitting" in output
    again = submitted_job(output)
    wait_for(lambda: record(run_dir)["status"] not in ("submitted", "running"), "the second job to end")
    done = record(run_dir)
    assert done["status"] == "done" and done["slurm_job"] == again and done["resumed_from_updates"] >= 5, done


def test_time_limit_requeues_then_runs_out_of_requeues(cluster, corpus, tmp_path):  # noqa: F811
    """Slurm's warning before the time limit (USR2, 90 s ahead): requeued and resumed once, then, out of requeues,
    the run is recorded failed and a rerun resubmits it. Once each session trains, the limit is shortened to 2
    minutes, so that its warning comes after about 30 s instead of 90 (and never before the session starts)."""
    config, runs = config_for(tmp_path, updates=100_000), tmp_path / "runs"
    run_dir = runs / "tiny" / "seed1"
    job = submitted_job(submit(config, corpus / "prepared", runs, "--slurm-time", "3", "--slurm-requeues", "1"))
    wait_for(lambda: trained_some(run_dir), "5 updates")
    subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=2"], check=True)
    wait_for(lambda: record(run_dir)["status"] == "requeued", "the time-limit requeue", timeout=300)
    subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=3"], check=True)
    wait_for(lambda: record(run_dir)["status"] != "requeued", "the requeued job to start", timeout=300)
    resumed = record(run_dir)
    assert resumed["status"] == "running" and resumed["resumed_from_updates"] >= 5, resumed
    subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=2"], check=True)
    wait_for(lambda: record(run_dir)["status"] not in ("running", "requeued"), "the second warning", timeout=300)
    out_of_requeues = record(run_dir)  # submitit checkpoints first, then finds no requeue left
    assert out_of_requeues["status"] == "failed" and "timed-out too many times" in out_of_requeues["error"]
    wait_for(lambda: state(job) not in ("RUNNING", "COMPLETING"), "the job to end")
    output = submit(config, corpus / "prepared", runs, "--slurm-time", "3", "--slurm-requeues", "1")
    again = submitted_job(output)
    assert again != job and jobs_named("tiny.seed1") == [again]
    subprocess.run(["scancel", again], check=True)
