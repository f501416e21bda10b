"""Run records (run.json): when a run counts as finished, and the training time its sessions took."""

import os
import time

import pytest

from mtsa_fairseq.experiments.runs import carried_seconds, is_done


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
