"""Run records (run.json): when a run counts as finished."""

import pytest

from mtsa_fairseq.experiments.runs import is_done


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
