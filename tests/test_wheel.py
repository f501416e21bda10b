"""The project as users install it (``pip install .`` or ``pip install git+URL``: a wheel, not an editable
checkout): built, installed into a fresh virtual environment that shares this environment's packages (torch, fairseq),
and run from a directory outside the checkout."""

import ast
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from mtsa_fairseq.contracts import read_run

pytestmark = pytest.mark.slow  # builds a wheel and trains the demo pipeline's runs

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "COMMANDS")
    return [f"mtsa-{name.replace('_', '-')}" for name in ast.literal_eval(node.value)]


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python*/site-packages"))


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
    _run(sys.executable, "-m", "venv", venv)
    # share this environment's packages (torch, fairseq, tqdm, ...), not the base interpreter's: a .pth line adds
    # the directory as it is, without running its .pth files (this checkout's editable install stays out)
    shared = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (_site_packages(venv) / "shared_environment.pth").write_text("\n".join(shared) + "\n")
    _run(venv / "bin/python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", *(root / "wheels").glob("*.whl"),
         env=env)
    work = root / "work"
    work.mkdir()
    # fairseq's console scripts live beside this interpreter: the venv shares its fairseq
    env["PATH"] = os.pathsep.join([str(venv / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")])
    return venv, work, env


def test_the_wheel_holds_the_configs_and_imports_and_gives_its_user_dir_outside_the_checkout(installed):
    venv, work, env = installed
    where = _run(venv / "bin/python", "-c", "import mtsa_fairseq.experiments as e; print(e.__file__); "
                 "print(sorted(p.name for p in e.CONFIGS.glob('*.yaml')))", cwd=work, env=env).splitlines()
    assert where[0].startswith(str(venv)) and not where[0].startswith(str(ROOT))
    assert ast.literal_eval(where[1]) == sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert _run(venv / "bin/python", "-m", "mtsa_fairseq", cwd=work, env=env).strip() == str(
        _site_packages(venv) / "mtsa_fairseq")


def test_every_console_entry_point_answers_help(installed):
    venv, work, env = installed
    for name in _commands():
        assert "usage:" in _run(venv / "bin" / name, "--help", cwd=work, env=env), name


def test_the_demo_pipeline_trains_from_the_wheel(installed):
    """The pipeline calls its steps as modules of the installed package, reads the demo configs from it and gives
    fairseq the installed plugin (scoring and the report, the same modules, are tested from the checkout)."""
    venv, work, env = installed
    _run(venv / "bin/mtsa-pipeline", "--out", "demo", "--seeds", "1", "2", "--cpu", "--threads", "1", "--train-only",
         "--train-args", "--extra-args '--max-update 3'", cwd=work, env=env)
    records = [read_run(p.parent) for p in sorted((work / "demo/runs").glob("*/seed*/run.json"))]
    assert [(r["system"], r["seed"], r["status"], r["num_updates"]) for r in records] == [
        (system, seed, "done", 3) for system in ("mtsa", "transformer") for seed in (1, 2)]
    site = _site_packages(venv)
    for record in records:
        assert record["command"][record["command"].index("--user-dir") + 1] == str(site / "mtsa_fairseq")
        assert record["config_path"].startswith(str(site / "mtsa_fairseq/experiments/configs"))
