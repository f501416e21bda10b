"""Outputs written whole or not at all (mtsa_fairseq/experiments/files.py) and the commands' one-line failures."""

import errno
import json
import os
import signal

import pytest

from mtsa_fairseq.contracts import RUN_SCHEMA
from mtsa_fairseq.experiments import files
from mtsa_fairseq.experiments.processes import LockBusy, Terminated, run_command, terminate_on_sigterm
from mtsa_fairseq.experiments.runs import close_session, resume_point, write_run


def _full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    out = tmp_path / "result.json"
    files.write_json(out, {"bleu": 1.0})
    monkeypatch.setattr(files.os, "fsync", _full_disk)
    with pytest.raises(OSError, match="No space left"):
        files.write_json(out, {"bleu": 2.0})
    assert out.read_text() == '{\n "bleu": 1.0\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_atomic_path_renames_only_what_was_written_whole(tmp_path):
    out = tmp_path / "plot.png"
    with pytest.raises(RuntimeError):
        with files.atomic_path(out) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("the plot failed")
    assert not any(tmp_path.iterdir())
    with files.atomic_path(out) as tmp:
        tmp.write_bytes(b"whole")
    assert out.read_bytes() == b"whole" and [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_a_failed_write_names_the_output_not_its_temporary(tmp_path):
    """The one-line error of a command names the file it was asked for."""
    (tmp_path / "out.md").mkdir()  # the rename onto a directory fails
    with pytest.raises(OSError) as exc:
        files.write_atomic(tmp_path / "out.md", "report")
    assert exc.value.filename == str(tmp_path / "out.md") and exc.value.filename2 is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.md"]


@pytest.mark.parametrize("text, readable", [("", False), ("{", False), ("[1]", False), ('{"a": 1}', True)])
def test_readable_json(tmp_path, text, readable):
    (tmp_path / "r.json").write_text(text)
    assert files.readable_json(tmp_path / "r.json") is readable
    assert files.readable_json(tmp_path / "absent.json") is False


def test_run_record_survives_a_full_disk(tmp_path, monkeypatch, capsys):
    """A failed write keeps the previous record whole (before: a 0-byte temporary and a stale record), and
    recording an interruption on a full disk warns instead of replacing the interruption."""
    write_run(tmp_path, {"schema": RUN_SCHEMA, "status": "running", "wall_seconds": 1.0})
    monkeypatch.setattr(files.os, "fsync", _full_disk)
    with pytest.raises(OSError):
        write_run(tmp_path, {"status": "done"})
    close_session(tmp_path)
    assert "could not record the interruption" in capsys.readouterr().err
    assert (tmp_path / "run.json").read_text() == \
        f'{{\n "schema": "{RUN_SCHEMA}",\n "status": "running",\n "wall_seconds": 1.0\n}}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_a_second_interruption_waits_for_the_interruption_record(tmp_path, monkeypatch):
    """SIGTERM arriving while the interruption is recorded (a launcher's death signal just after its output pipe
    broke; Ctrl-C twice) is raised once run.json says interrupted, not in the middle of writing it."""
    write_run(tmp_path, {"schema": RUN_SCHEMA, "status": "running", "wall_seconds": 1.0})
    fsync = files.os.fsync

    def signalled_fsync(fd: int) -> None:
        signal.raise_signal(signal.SIGTERM)
        fsync(fd)

    monkeypatch.setattr(files.os, "fsync", signalled_fsync)
    previous = signal.getsignal(signal.SIGTERM)
    terminate_on_sigterm()
    try:
        with pytest.raises(Terminated):
            close_session(tmp_path)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "interrupted"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_resume_point_without_checkpoints_or_with_none_readable(tmp_path):
    assert resume_point(tmp_path, print) == (0, {})
    (tmp_path / "checkpoint_last.pt").write_bytes(b"PK\x03\x04 truncated")
    lines = []
    updates, notes = resume_point(tmp_path, lines.append)
    assert updates == 0 and notes["resumed_from"] is None
    assert not (tmp_path / "checkpoint_last.pt").exists()
    assert os.path.basename(notes["unreadable_checkpoint"]).startswith("checkpoint_last.pt.unreadable-")
    assert lines == [f"{tmp_path}: checkpoint_last.pt is unreadable (moved to "
                     f"{os.path.basename(notes['unreadable_checkpoint'])}) and no other checkpoint can be read: "
                     "training starts over"]


@pytest.mark.parametrize("error, line", [
    (OSError(errno.ENOSPC, "No space left on device", "/out/r.json"), "error: No space left on device (/out/r.json)"),
    (PermissionError(errno.EACCES, "Permission denied"), "error: Permission denied"),
    (LockBusy("output /out/r.json is in use by report pid 7; wait for it to finish or stop it, then rerun"),
     "error: output /out/r.json is in use by report pid 7; wait for it to finish or stop it, then rerun"),
])
def test_environment_failures_are_one_line_and_status_1(capsys, error, line):
    def main():
        raise error

    with pytest.raises(SystemExit) as exit_:
        run_command(main)
    assert exit_.value.code == 1
    assert capsys.readouterr().err.splitlines() == [line]
