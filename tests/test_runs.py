"""Run records (run.json): when a run counts as finished, and the training time its sessions took."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from mtsa_fairseq.contracts import RUN_SCHEMA, read_run
from mtsa_fairseq.experiments.runs import carried_seconds, is_done, write_run


@pytest.mark.parametrize("record, max_update, done", [
    ({"status": "done", "num_updates": 100, "max_update": 100}, 100, True),
    ({"status": "done", "num_updates": 100, "max_update": 100}, 200, False),  # a larger budget trains on
    ({"status": "failed", "num_updates": 100, "max_update": 100}, 100, False),
    ({"status": "done", "num_updates": 40, "max_update": 100, "early_stopped": True}, 100, True),  # --patience
    ({"status": "done", "num_updates": 40, "max_update": 100, "early_stopped": True}, 200, True),  # stops there too
    (None, 100, False),
])
def test_is_done(record, max_update, done):
    assert is_done(record, max_update) is done


def test_carried_seconds_adds_a_session_that_never_recorded_its_end(tmp_path):
    """A launcher killed outright leaves run.json "running": its session lasted until its log's last write."""
    log = tmp_path / "train.log"
    log.write_text("fairseq output\n")
    now = time.time()
    os.utime(log, (now - 40, now - 40))
    killed = {"status": "running", "started_at": now - 100, "wall_seconds": 500.0}
    assert carried_seconds(killed, log) == pytest.approx(560.0, abs=0.01)
    assert carried_seconds({**killed, "status": "interrupted"}, log) == 500.0  # its time was recorded
    assert carried_seconds({"status": "running", "wall_seconds": 500.0}, log) == 500.0  # no start known
    assert carried_seconds(killed, tmp_path / "missing.log") == 500.0
    assert carried_seconds(None, log) == 0.0


def test_run_record_names_its_paths_from_the_run_directory(tmp_path, monkeypatch):
    """run.json holds no absolute path; read back from elsewhere, and after its tree moves, it names the same files."""
    study = tmp_path / "study"
    run_dir = study / "runs" / "tiny" / "seed1"
    run_dir.mkdir(parents=True)
    monkeypatch.chdir(study)  # a relative data path is taken from the current directory
    command = [str(tmp_path / ".venv/bin/fairseq-train"), str(study / "data/bin"), "--save-dir", str(run_dir),
               "--lr", "0.0005", "--eval-bleu-args", '{"beam": 4}']
    record = {"schema": RUN_SCHEMA, "status": "done", "data": "data", "checkpoint": str(run_dir / "checkpoint_last.pt"),
              "averaged": [str(run_dir / "checkpoint_1_10.pt")], "config_path": str(tmp_path / "configs/tiny.yaml"),
              "command": command}
    write_run(run_dir, record)
    text = (run_dir / "run.json").read_text()
    assert str(tmp_path) not in text
    written = json.loads(text)
    assert (written["checkpoint"], written["data"], written["averaged"]) == (
        "checkpoint_last.pt", "../../../data", ["checkpoint_1_10.pt"])
    assert written["command"] == ["../../../../.venv/bin/fairseq-train", "../../../data/bin", "--save-dir", ".",
                                  "--lr", "0.0005", "--eval-bleu-args", '{"beam": 4}']
    monkeypatch.chdir(tmp_path)
    assert read_run(run_dir) == {**record, "data": str(study / "data")}
    shutil.move(study, tmp_path / "moved")
    moved = tmp_path / "moved" / "runs" / "tiny" / "seed1"
    monkeypatch.chdir(moved.parent)
    back = read_run(Path("seed1"))
    assert Path(back["checkpoint"]).resolve() == moved / "checkpoint_last.pt"
    assert Path(back["command"][1]).resolve() == tmp_path / "moved" / "data" / "bin"
    assert back["command"][3] == "seed1" and back["command"][4:] == command[4:]


def test_an_older_run_record_with_absolute_paths_reads_as_it_was(tmp_path):
    record = {"schema": RUN_SCHEMA, "checkpoint": "/elsewhere/run/checkpoint_last.pt",
              "command": ["/elsewhere/bin/fairseq-train", "--save-dir", "/elsewhere/run"]}
    (tmp_path / "run.json").write_text(json.dumps(record))
    assert read_run(tmp_path) == record
