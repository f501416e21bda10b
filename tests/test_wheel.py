"""The project as users install it (``pip install .`` or ``pip install git+URL``: a wheel, not an editable
checkout): built, installed into a fresh virtual environment that shares this environment's torch and fairseq,
and run from a directory outside the checkout."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel and runs the demo pipeline end to end

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "COMMANDS")
    return [f"mtsa-{name.replace('_', '-')}" for name in ast.literal_eval(node.value)]


def _run(*cmd, cwd: Path | None = None, env: dict | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, env=env, timeout=1800)
    assert proc.returncode == 0, f"{cmd[:3]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(the virtual environment, a working directory outside the checkout, the environment to run in)."""
    root = tmp_path_factory.mktemp("wheel")
    env = {**os.environ, "MTSA_FAIRSEQ_OWN_FAIRSEQ": "1", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ROOT, "-w", root / "wheels",
         env=env)
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", "--system-site-packages", venv)
    _run(venv / "bin/python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", *(root / "wheels").glob("*.whl"),
         env=env)
    work = root / "work"
    work.mkdir()
    # fairseq's console scripts live beside this interpreter: the venv shares its fairseq
    env["PATH"] = os.pathsep.join([str(venv / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")])
    return venv, work, env


def test_the_wheel_holds_the_configs_and_imports_outside_the_checkout(installed):
    venv, work, env = installed
    where = _run(venv / "bin/python", "-c", "import mtsa_fairseq.experiments as e; print(e.__file__); "
                 "print(sorted(p.name for p in e.CONFIGS.glob('*.yaml')))", cwd=work, env=env).splitlines()
    assert where[0].startswith(str(venv)) and not where[0].startswith(str(ROOT))
    assert ast.literal_eval(where[1]) == sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))


def test_every_console_entry_point_answers_help(installed):
    venv, work, env = installed
    for name in _commands():
        assert "usage:" in _run(venv / "bin" / name, "--help", cwd=work, env=env), name


def test_the_demo_pipeline_runs_from_the_wheel_to_its_report(installed):
    """The pipeline calls its steps as modules of the installed package and reads the demo configs from it."""
    venv, work, env = installed
    _run(venv / "bin/mtsa-pipeline", "--out", "demo", "--seeds", "1", "2", "--cpu", "--threads", "1",
         "--train-args", "--extra-args '--max-update 3'", cwd=work, env=env)
    report = (work / "demo/report.md").read_text()
    assert "| Transformer |" in report and "| MTSA |" in report
    assert sorted(p.name for p in (work / "demo/results").glob("*.json")) == [
        f"demo_{system}_seed{seed}_toy_test.json" for system in ("mtsa", "transformer") for seed in (1, 2)]
