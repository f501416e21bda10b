"""What ``--user-dir mtsa_fairseq`` loads: the plugin only, and no library that fairseq's own translation task,
transformer model and criterions do not load already (checked in a fresh interpreter)."""

import json
import subprocess
import sys

PLUGIN = {"checkpoint_safety", "contracts", "criterions", "models", "modules", "quiet_imports", "tasks"}
PROBE = """
import json, sys
import fairseq.criterions, fairseq.models.transformer, fairseq.tasks.translation
before = {m.split(".")[0] for m in sys.modules}
from fairseq import utils
from argparse import Namespace
import mtsa_fairseq
utils.import_user_module(Namespace(user_dir=mtsa_fairseq.__path__[0]))
print(json.dumps({"new": sorted({m.split(".")[0] for m in sys.modules} - before),
                  "ours": sorted(m for m in sys.modules if m.startswith("mtsa_fairseq."))}))
"""


def test_user_dir_loads_the_plugin_and_nothing_else():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True)
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["new"] == ["mtsa_fairseq"]
    outside = [m for m in loaded["ours"] if m.split(".")[1] not in PLUGIN]
    assert outside == [], f"the plugin imports tooling: {outside}"
    assert "mtsa_fairseq.models.sentence_encoder" in loaded["ours"] and "mtsa_fairseq.tasks.sentence_encoding" in \
        loaded["ours"]
