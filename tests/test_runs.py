"""Run records (run.json): when a run is finished, diverged or failed, and the time its sessions took."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from mtsa_fairseq.contracts import RUN_SCHEMA, read_run
from mtsa_fairseq.experiments.checkpoint_average import AverageError, average_checkpoints, save_checkpoint
from mtsa_fairseq.experiments.runs import (
    best_repair,
    carried_seconds,
    diverged_loss,
    finish_session,
    is_done,
    write_run,
)


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


def _checkpoint(path: Path, updates: int, value: float) -> None:
    torch.save({"model": {"w": torch.full((2,), value)}, "optimizer_history": [{"num_updates": updates}]}, path)


def _finished(run_dir: Path, losses: list[str], average_last: int = 0) -> dict:
    """finish_session of a run whose log shows ``losses`` and whose last checkpoint is at its budget, 20."""
    run_dir.mkdir(parents=True)
    (run_dir / "train.log").write_text("".join(
        f"| INFO | train_inner | epoch 001:  {10 * i} / 99 loss={loss}, nll_loss=1.0, wps=100, num_updates={10 * i}\n"
        for i, loss in enumerate(losses, 1)))
    _checkpoint(run_dir / "checkpoint_1_10.pt", 10, 1.0)
    _checkpoint(run_dir / "checkpoint_last.pt", 20, 3.0)
    write_run(run_dir, {"schema": RUN_SCHEMA, "status": "running", "max_update": 20, "average_last": average_last,
                        "save_interval_updates": 10, "checkpoint": str(run_dir / "checkpoint_avg.pt")})
    return finish_session(run_dir, 0, log=lambda _: None, trained=False)


@pytest.mark.parametrize("losses, status", [
    (["9.5", "7.25"], "done"),
    (["9.5", "9.75"], "done"),  # a little above its start is noise, not divergence
    (["9.5", "194403"], "diverged"),  # lr -1
    (["9.5", "inf"], "diverged"),
    (["9.5", "nan"], "diverged"),
])
def test_a_run_whose_loss_ends_non_finite_or_far_above_its_start_is_recorded_diverged(tmp_path, losses, status):
    record = _finished(tmp_path / "run", losses)
    assert record["status"] == status == read_run(tmp_path / "run")["status"]
    if status == "diverged":
        assert record["error"] == f"training diverged: its last training loss is {float(losses[-1])}"
        assert str(record["last_loss"]) == str(float(losses[-1]))
    assert diverged_loss("no training logged") is None


def test_a_full_disk_while_averaging_fails_the_run_in_one_line(tmp_path, monkeypatch):
    """torch.save raises RuntimeError on a full disk; it becomes the one-line OSError and a failed run.json."""
    def full(*_args, **_kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 128 vs 64\nframe #0 ...")

    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10, 10, 0))
    with pytest.raises(OSError) as err:
        save_checkpoint({"model": {}}, tmp_path / "out.pt")
    assert err.value.strerror == f"cannot write {tmp_path / 'out.pt'}: No space left on device"
    assert not list(tmp_path.iterdir())  # no temporary file left
    monkeypatch.undo()
    run_dir = tmp_path / "run"
    _finished(run_dir, ["9.5", "7.0"])  # checkpoints written before the disk fills
    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(10, 10, 0))
    (run_dir / "run.json").write_text(json.dumps({**json.loads((run_dir / "run.json").read_text()),
                                                  "status": "running", "average_last": 2}))
    record = finish_session(run_dir, 0, log=lambda _: None, trained=False)
    assert record["status"] == "failed" == read_run(run_dir)["status"]
    assert record["error"] == f"averaging: cannot write {run_dir / 'checkpoint_avg.pt'}: No space left on device"


def test_an_unreadable_best_checkpoint_is_moved_aside_with_the_last_one_for_training_again(tmp_path):
    lines: list[str] = []
    assert best_repair(tmp_path, lines.append) == {}  # none: nothing to repair
    _checkpoint(tmp_path / "checkpoint_best.pt", 5, 1.0)
    _checkpoint(tmp_path / "checkpoint_last.pt", 10, 2.0)
    assert best_repair(tmp_path, lines.append) == {} and not lines  # readable: kept
    last = (tmp_path / "checkpoint_last.pt").read_bytes()
    truncated = (tmp_path / "checkpoint_best.pt").read_bytes()[:100]
    (tmp_path / "checkpoint_best.pt").write_bytes(truncated)
    notes = best_repair(tmp_path, lines.append)
    best_aside, = tmp_path.glob("checkpoint_best.pt.unreadable-*")
    last_aside, = tmp_path.glob("checkpoint_last.pt.superseded-*")
    assert (best_aside.read_bytes(), last_aside.read_bytes()) == (truncated, last)  # renamed, never deleted
    assert notes == {"unreadable_checkpoint": str(best_aside), "resumed_from": None}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([best_aside.name, last_aside.name])
    assert lines == [f"checkpoint_best.pt is unreadable (moved to {best_aside.name}); training again from update 0 "
                     "so that a best checkpoint exists"]


def test_a_file_torch_did_not_write_is_named_as_no_checkpoint(tmp_path):
    (tmp_path / "notes.json").write_text("{}")  # e.g. a record given among the checkpoints
    torch.save({"model": {"w": torch.zeros(2)}}, tmp_path / "a.pt")
    with pytest.raises(AverageError) as refused:
        average_checkpoints([tmp_path / "a.pt", tmp_path / "notes.json"])
    assert str(refused.value) == f"{tmp_path / 'notes.json'} is not a checkpoint: torch.save writes a zip archive"
