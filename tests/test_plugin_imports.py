"""What ``--user-dir mtsa_fairseq`` loads: the plugin only, and no library that fairseq's own translation task,
transformer model and criterions do not load already; and what the experiment commands load: neither torch nor
fairseq until they need them (each checked in a fresh interpreter)."""

import json
import subprocess
import sys
from pathlib import Path

PLUGIN = {"checkpoint_safety", "contracts", "criterions", "models", "modules", "quiet_imports", "tasks"}
PROBE = """
import json, sys, importlib.util
import fairseq.criterions, fairseq.models.transformer, fairseq.tasks.translation
before = {m.split(".")[0] for m in sys.modules}
from fairseq import utils
from argparse import Namespace
utils.import_user_module(Namespace(user_dir=importlib.util.find_spec("mtsa_fairseq").submodule_search_locations[0]))
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.tasks import TASK_REGISTRY
print(json.dumps({"new": sorted({m.split(".")[0] for m in sys.modules} - before),
                  "ours": sorted(m for m in sys.modules if m.startswith("mtsa_fairseq.")),
                  "registered": ["transformer_mtsa_wmt_en_de" in ARCH_MODEL_REGISTRY, "mtsa_encoder" in
                                 ARCH_MODEL_REGISTRY, "sentence_encoding" in TASK_REGISTRY, "sentence_encoding" in
                                 CRITERION_REGISTRY]}))
"""
COMMANDS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "mtsa_fairseq/experiments/commands")
                  .glob("*.py") if p.stem != "__init__")


def test_user_dir_loads_the_plugin_and_nothing_else():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=1500, check=True)
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["new"] == ["mtsa_fairseq"]
    outside = [m for m in loaded["ours"] if m.split(".")[1] not in PLUGIN]
    assert outside == [], f"the plugin imports tooling: {outside}"
    assert loaded["registered"] == [True] * 4


def test_experiment_commands_start_without_torch_or_fairseq():
    """``mtsa-pipeline --help``, a usage error or the pipeline's own process cost no torch import: the
    package's root registers nothing (fairseq's --user-dir imports ``tasks/`` and ``models/``, which do)."""
    probe = ("import json, sys\n" + "".join(f"import mtsa_fairseq.experiments.commands.{c}\n" for c in COMMANDS) +
             "print(json.dumps(sorted({'torch', 'fairseq', 'scipy', 'matplotlib'} & set(sys.modules))))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=1500, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    assert {"pipeline", "train_seeds", "score", "significance", "prepare_data", "prepare_sentence_data"} <= set(
        COMMANDS)
