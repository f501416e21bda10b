import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from process_helpers import children_of
from sentence_helpers import prepare, write_trec
from torch.utils._python_dispatch import TorchDispatchMode

from mtsa_fairseq.experiments.translation.toy_corpus import write_corpus


def pytest_addoption(parser):
    parser.addoption("--torch-device", default="cpu",
                     help="default device of the tests marked any_device (e.g. cuda: mtsa_core and the attention "
                          "modules against the float64 references on a GPU)")


def pytest_runtest_logreport(report):
    """With ``MTSA_TEST_REPORT_AT_ONCE=1`` (scripts/test.sh sets it) a failure's traceback is printed when it
    happens, not only in the summary at the end, and so is every phase that took 20 s or more: a run cut short
    by a time limit still shows why and where its time went."""
    if os.environ.get("MTSA_TEST_REPORT_AT_ONCE") != "1" or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # under pytest-xdist the controller prints what its workers report
    if report.failed:
        print(f"\n[failed] {report.nodeid} ({report.when}, {report.duration:.0f} s)\n{report.longreprtext[-4000:]}",
              file=sys.stderr, flush=True)
    elif report.duration >= 20:
        print(f"\n[slow] {report.nodeid} ({report.when}, {report.duration:.0f} s)", file=sys.stderr, flush=True)


def pytest_configure(config):
    """Under pytest-xdist (scripts/test.sh runs ``-n 2``) the workers share the cores: torch's intra-op threads
    are divided among them instead of each taking them all."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (``_no_processes_left_by_a_failure`` reads the call's)."""
    report = yield
    setattr(item, f"_report_{report.when}", report)
    return report


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        children = children_of(todo.pop())
        found += children
        todo += children
    return found


@pytest.fixture(autouse=True)
def _no_processes_left_by_a_failure(request):
    """A test that fails while a process it started still runs (a launcher asked for 100,000 updates, its
    trainer) would leave it training beside the rest of the suite: after a failed test, every process it left
    behind is killed."""
    linux = sys.platform.startswith("linux")
    before = set(_descendants(os.getpid())) if linux else set()
    yield
    report = getattr(request.node, "_report_call", None)
    if linux and report is not None and report.failed:
        for pid in (p for p in _descendants(os.getpid()) if p not in before):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _torch_device(request):
    device = request.config.getoption("--torch-device")
    if device == "cpu" or request.node.get_closest_marker("any_device") is None:
        yield
        return
    with torch.device(device):
        yield


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory) -> Path:
    """The toy corpus (300/40/20 pairs, seed 3) in ``raw/`` and binarised with a joined dictionary in ``bin/``."""
    root = tmp_path_factory.mktemp("toy")
    write_corpus(root / "raw", {"train": 300, "valid": 40, "test": 20}, seed=3)
    subprocess.run(
        [str(Path(sys.executable).parent / "fairseq-preprocess"), "--source-lang", "en", "--target-lang", "de",
         "--trainpref", str(root / "raw/train"), "--validpref", str(root / "raw/valid"), "--testpref",
         str(root / "raw/test"), "--destdir", str(root / "bin"), "--joined-dictionary", "--workers", "1"],
        check=True, capture_output=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=1500,
    )
    return root


@pytest.fixture(scope="session")
def trec_data(tmp_path_factory) -> Path:
    """Synthetic TREC questions (400 train, 60 test; tests/sentence_helpers.py) prepared by
    scripts/prepare_sentence_data.py: the data of the sentence-task tests."""
    return prepare("trec", write_trec(tmp_path_factory.mktemp("trec_raw"), seed=0),
                   tmp_path_factory.mktemp("trec") / "data")


class _LargestTensor(TorchDispatchMode):
    """Records the element count of the largest allocation any operator makes while active: the elements of a
    result's storage, so that a broadcast view (``expand``, as CUDA's SDPA does to a padding mask) counts as the
    memory it holds, not as the shape it shows."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes() // t.element_size())
        return out


@pytest.fixture
def largest_tensor() -> type[_LargestTensor]:
    """``with largest_tensor() as mode: ...`` then ``mode.largest``: the memory-bound checks."""
    return _LargestTensor
