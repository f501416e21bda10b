"""mtsa_fairseq.experiments.processes: the run lock, children tied to their launcher, progress lines."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from process_helpers import children_of, wait_for

from mtsa_fairseq.experiments.processes import PROGRESS_PREFIX, LockBusy, RunLock, UpdateProgress, run_logged, say

HOLD = "import sys, time; sys.stdout.write('holding\\n'); sys.stdout.flush(); time.sleep(60)"


def test_lock_is_exclusive_names_its_holders_and_is_removed_on_release(tmp_path):
    path = tmp_path / ".lock"
    with RunLock(path, "run X") as lock:
        lock.record_holders(launcher=11, trainer=12)
        with pytest.raises(LockBusy, match=r"^run X is in use by launcher pid 11, trainer pid 12; wait for it"):
            RunLock(path, "run X").acquire()
    assert not path.exists()
    with RunLock(path, "run X", role="preparation"):
        assert path.read_text() == f"preparation pid {os.getpid()}\n"


def test_a_child_keeps_the_lock_after_its_launcher_let_go_and_frees_it_when_killed(tmp_path):
    lock = RunLock(tmp_path / ".lock", "run X").acquire()
    child = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True, pass_fds=(lock.fd,))
    assert child.stdout.readline() == "holding\n"
    os.close(lock.fd)  # the launcher dies without releasing (as with kill -9): the child still holds the lock
    lock.fd = None
    with pytest.raises(LockBusy):
        RunLock(tmp_path / ".lock", "run X").acquire()
    child.kill()
    child.wait()
    RunLock(tmp_path / ".lock", "run X").acquire().release()  # a stale lock file is taken over


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_run_logged_children_die_with_their_launcher(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import sys; from mtsa_fairseq.experiments.processes import run_logged; "
         f"run_logged([sys.executable, '-c', {HOLD!r}], None)"], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout.readline() == "holding\n"
    child = wait_for(lambda: children_of(launcher.pid), "the launcher's child")[0]
    launcher.kill()
    launcher.wait()
    wait_for(lambda: not _alive(child), "the child to die with its launcher", 20)


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_run_logged_appends_to_the_log_and_passes_lines_on(tmp_path):
    log, seen = tmp_path / "train.log", []
    log.write_text("$ earlier session\n")
    code, _, output = run_logged([sys.executable, "-c", "print('a'); print('b'); raise SystemExit(3)"], log,
                                 echo=False, on_line=seen.append)
    assert code == 3 and output == "a\nb\n" and seen == ["a\n", "b\n"]
    assert log.read_text() == "$ earlier session\na\nb\n"


def test_run_logged_children_ignore_the_signals_meant_for_their_launcher(tmp_path):
    """Slurm's time-limit warning (USR2) reaches fairseq-train too: ignored there, the launcher decides."""
    warned = "import os, signal; os.kill(os.getpid(), signal.SIGUSR2); print('alive')"
    assert run_logged([sys.executable, "-c", warned], None, echo=False)[0] == -signal.SIGUSR2
    code, _, output = run_logged([sys.executable, "-c", warned], None, echo=False, ignored=(signal.SIGUSR2,))
    assert code == 0 and output == "alive\n"


def test_update_progress_reports_at_most_every_interval_and_at_the_end():
    lines: list[str] = []
    progress = UpdateProgress("trec seed 1", 300, done=100, every=3600, write=lines.append)
    progress("epoch 001 | valid on 'valid' subset | loss 2.3 | num_updates 150 | best_accuracy 37")
    progress("train_inner | epoch 001: 200 / 154 loss=2.4, num_updates=200, lr=0.5")  # within the interval
    progress("a line without updates")
    progress("train | epoch 002 | loss 2.1 | num_updates 300 | lr 0.5")
    progress("train | epoch 002 | done training | num_updates 300")  # the end is reported once
    assert len(lines) == 2 and all(line.startswith(PROGRESS_PREFIX) for line in lines)
    assert lines[0].startswith("[progress] trec seed 1: 150/300 updates (50%), 00:00 elapsed, ETA ")
    assert lines[1].startswith("[progress] trec seed 1: 300/300 updates (100%), ") and lines[1].endswith("ETA 00:00")


def test_update_progress_eta_uses_this_sessions_rate():
    progress = UpdateProgress("run", 300, done=100, write=lambda _: None)
    progress("num_updates 150")
    progress.start = 0.0
    assert progress.line(50.0) == "[progress] run: 150/300 updates (50%), 00:50 elapsed, ETA 02:30"


def test_threads_sharing_a_stream_print_whole_lines():
    class Stream:  # a write yields to the other threads, as a busy console does
        def __init__(self):
            self.writes: list[str] = []

        def write(self, text: str) -> None:
            time.sleep(0.0005)
            self.writes.append(text)

        def flush(self) -> None:
            pass

    stream = Stream()
    jobs = [threading.Thread(target=lambda job=job: [say(f"job {job}: line {i}", stream) for i in range(10)])
            for job in range(4)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    assert sorted(stream.writes) == sorted(f"job {job}: line {i}\n" for job in range(4) for i in range(10))


@pytest.mark.slow
@pytest.mark.parametrize("resumes, line", [
    (True, "interrupted: rerun the same command to resume"),
    (False, "interrupted: this command does not resume (rerunning it starts again)"),
])
@pytest.mark.parametrize("signum, code", [(2, 130), (15, 143)])
def test_commands_end_on_ctrl_c_or_kill_with_one_line(signum, code, resumes, line):
    script = ("import signal, sys, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "from mtsa_fairseq.experiments.processes import run_command; "
              f"run_command(lambda: (print('ready', flush=True), time.sleep(60)), resumes={resumes})")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code and err == line + "\n"


def test_run_logged_keeps_what_the_child_wrote_before_an_interruption_stopped_it(tmp_path):
    """Lines still in the pipe when Ctrl-C (or SIGTERM) reaches the launcher, and what the child writes as it
    stops, reach the log: a run's last validation is not lost with its launcher's interruption."""
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *_: sys.exit(print('stopped by SIGTERM')))\n"
             "sys.stdout.write('validation 1\\nvalidation 2\\n'); sys.stdout.flush(); time.sleep(60)")

    def interrupt(line: str) -> None:
        raise KeyboardInterrupt

    log = tmp_path / "train.log"
    with pytest.raises(KeyboardInterrupt):
        run_logged([sys.executable, "-c", child], log, echo=False, on_line=interrupt)
    assert log.read_text() == "validation 1\nvalidation 2\nstopped by SIGTERM\n"
