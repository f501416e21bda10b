"""What ``--user-dir mtsa_fairseq`` loads: the plugin only, and no library that fairseq's own translation task,
transformer model and criterions do not load already; what the experiment commands load: neither torch nor
fairseq until they need them (each checked in a fresh interpreter); and how the experiment tooling is layered."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

PLUGIN = {"checkpoint_safety", "contracts", "criterions", "models", "modules", "quiet_imports", "tasks"}
PROBE = """
import json, sys
import fairseq.criterions, fairseq.models.transformer, fairseq.tasks.translation
before = {m.split(".")[0] for m in sys.modules}
from fairseq import utils
from argparse import Namespace
utils.import_user_module(Namespace(user_dir=sys.argv[1]))
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.tasks import TASK_REGISTRY
print(json.dumps({"new": sorted({m.split(".")[0] for m in sys.modules} - before),
                  "ours": sorted(m for m in sys.modules if m.startswith("mtsa_fairseq.")),
                  "registered": ["transformer_mtsa_wmt_en_de" in ARCH_MODEL_REGISTRY, "mtsa_encoder" in
                                 ARCH_MODEL_REGISTRY, "sentence_encoding" in TASK_REGISTRY, "sentence_encoding" in
                                 CRITERION_REGISTRY]}))
"""
EXPERIMENTS = Path(__file__).resolve().parents[1] / "mtsa_fairseq/experiments"
COMMANDS = sorted(p.stem for p in (EXPERIMENTS / "commands").glob("*.py") if p.stem != "__init__")
# what both experiment stacks (translation/, sentence/) build on
SHARED = {"checkpoint_average", "errors", "fairseq_train", "files", "plotting", "processes", "runs", "significance",
          "tables"}


def test_user_dir_loads_the_plugin_and_nothing_else(tmp_path):
    """From outside the checkout, with the directory ``python -m mtsa_fairseq`` prints (the README's way)."""
    user_dir = subprocess.run([sys.executable, "-m", "mtsa_fairseq"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, check=True).stdout.strip()
    assert user_dir == str(EXPERIMENTS.parent)
    proc = subprocess.run([sys.executable, "-c", PROBE, user_dir], cwd=tmp_path, capture_output=True, text=True,
                          timeout=1500, check=True)
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["new"] == ["mtsa_fairseq"]
    outside = [m for m in loaded["ours"] if m.split(".")[1] not in PLUGIN]
    assert outside == [], f"the plugin imports tooling: {outside}"
    assert loaded["registered"] == [True] * 4


def test_mtsa_cudnn_attention_0_keeps_the_attention_of_a_process_loading_the_plugin_off_cudnn(tmp_path):
    probe = ("import sys, torch; from argparse import Namespace; from fairseq import utils; "
             "utils.import_user_module(Namespace(user_dir=sys.argv[1])); "
             "print(torch.backends.cuda.cudnn_sdp_enabled())")
    environment = {name: value for name, value in os.environ.items() if name != "MTSA_CUDNN_ATTENTION"}
    for value, enabled in ((None, "True"), ("1", "True"), ("0", "False"), ("off", None)):
        env = environment if value is None else {**environment, "MTSA_CUDNN_ATTENTION": value}
        proc = subprocess.run([sys.executable, "-c", probe, str(EXPERIMENTS.parent)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        if enabled is None:
            assert proc.returncode != 0
            assert "MTSA_CUDNN_ATTENTION must be 0 (cuDNN attention off) or 1, not 'off'" in proc.stderr
        else:
            assert proc.returncode == 0 and proc.stdout.split()[-1] == enabled, proc.stderr[-2000:]


def test_experiment_commands_start_without_torch_or_fairseq():
    """``mtsa-pipeline --help``, a usage error or the pipeline's own process cost no torch import: the
    package's root registers nothing (fairseq's --user-dir imports ``tasks/`` and ``models/``, which do)."""
    probe = ("import json, sys\n" + "".join(f"import mtsa_fairseq.experiments.commands.{c}\n" for c in COMMANDS) +
             "print(json.dumps(sorted({'torch', 'fairseq', 'scipy', 'matplotlib'} & set(sys.modules))))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=1500, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    assert {"pipeline", "train_seeds", "score", "significance", "prepare_data", "prepare_sentence_data"} <= set(
        COMMANDS)


def _project_imports(path: Path) -> set[str]:
    """The ``mtsa_fairseq`` modules ``path`` imports (at the top or inside functions), without the prefix."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mtsa_fairseq."):
            found.add(node.module.removeprefix("mtsa_fairseq."))
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix("mtsa_fairseq.") for a in node.names if a.name.startswith("mtsa_fairseq.")}
    return found


def test_each_experiment_stack_imports_only_itself_the_shared_layer_and_the_plugin():
    assert {p.stem for p in EXPERIMENTS.glob("*.py")} == SHARED | {"__init__"}
    allowed = {f"experiments.{name}" for name in SHARED} | PLUGIN | {"plugin"}
    for stack in ("translation", "sentence"):
        for path in (EXPERIMENTS / stack).glob("*.py"):
            wrong = {m for m in _project_imports(path) if m.split(".")[0] not in allowed and
                     ".".join(m.split(".")[:2]) not in allowed and not m.startswith(f"experiments.{stack}")}
            assert not wrong, f"{stack}/{path.name} imports {sorted(wrong)}"
    for name in SHARED:  # the shared layer climbs into neither stack
        wrong = {m for m in _project_imports(EXPERIMENTS / f"{name}.py") if m.split(".")[0] not in allowed and
                 ".".join(m.split(".")[:2]) not in allowed}
        assert not wrong, f"{name}.py imports {sorted(wrong)}"
