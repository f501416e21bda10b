"""The commands: one module per command in mtsa_fairseq/experiments/commands/, installed as ``mtsa-*`` console
entry points, runnable from a clone as ``scripts/<name>.py``, with help text on every option."""

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS_DIR = ROOT / "mtsa_fairseq" / "experiments" / "commands"


def setup_commands() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMMANDS":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no COMMANDS list")


def test_every_command_module_is_an_entry_point_and_a_script():
    modules = sorted(p.stem for p in COMMANDS_DIR.glob("*.py") if p.stem != "__init__")
    assert sorted(setup_commands()) == modules
    for name in modules:
        assert f"from mtsa_fairseq.experiments.commands.{name} import main" in (ROOT / f"scripts/{name}.py").read_text()


@pytest.mark.parametrize("path", sorted(COMMANDS_DIR.glob("*.py")), ids=lambda p: p.stem)
def test_every_option_has_help(path):
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            if not any(k.arg == "help" for k in node.keywords):
                missing.append(ast.unparse(node.args[0]) if node.args else "?")
    assert missing == [], f"{path.name}: options without help: {missing}"


@pytest.mark.parametrize("path", sorted(COMMANDS_DIR.glob("*.py")), ids=lambda p: p.stem)
def test_help_text_keeps_its_line_breaks(path):
    """A lone backslash at a line's end inside a (non-raw) string joins two lines of --help: a shell command's
    continuation must be written ``\\\\``."""
    joined = [
        token.start[0] for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if token.type == tokenize.STRING and not re.match(r"[a-zA-Z]*[rR]", token.string)
        and re.search(r"(?<!\\)(?:\\\\)*\\\n", token.string)
    ]
    assert joined == [], f"{path.name}: strings starting on lines {joined} join lines with a trailing backslash"


@pytest.mark.slow
@pytest.mark.parametrize("name", setup_commands())
def test_installed_command_answers_help(name):
    executable = Path(sys.executable).parent / f"mtsa-{name.replace('_', '-')}"
    assert executable.is_file(), f"{executable} is not installed (pip install -e .)"
    proc = subprocess.run([str(executable), "--help"], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: mtsa-{name.replace('_', '-')}")


@pytest.mark.slow
@pytest.mark.parametrize("name, args, message", [
    ("sentence_experiment", ["--archs", "mtsa_encoder", "--seeds", "1", "1"], "--seeds must not repeat"),
    ("sentence_experiment", ["--archs", "mtsa_encoder", "mtsa_encoder"], "--archs must not repeat"),
    ("sentence_experiment", ["--archs", "mtsa_encoder", "--max-update", "0"], "--max-update must be positive"),
    ("sentence_experiment", ["--archs", "mtsa_encoder", "--extra-args", "'"], "--extra-args: No closing quotation"),
    ("train_seeds", ["--seeds", "1", "--save-root", "x", "--extra-args", "'"], "--extra-args: No closing quotation"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, name, args, message):
    common = ["--config", str(tmp_path / "c.yaml"), "--data", str(tmp_path)]
    if name == "sentence_experiment":
        common += ["--out", str(tmp_path / "out")]
    proc = subprocess.run([sys.executable, str(ROOT / f"scripts/{name}.py"), *common, *args], capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(f"error: {message}")
    assert not (tmp_path / "out").exists()
