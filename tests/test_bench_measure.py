"""The benchmark scripts' shared measurement helpers: a cell in a fresh process answers with its last JSON
line or fails naming the cell, and peak memory growth sees what a step allocates on top of what is there."""

import argparse
import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch

from mtsa_fairseq.experiments.bench.measure import (
    CellFailed,
    can_measure,
    check_device,
    check_positive,
    device_name,
    emit,
    peak_growth_mb,
    processor_name,
    run_isolated,
    timed_rounds,
)


def child(tmp_path, body: str):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(body))
    return script


def test_timed_rounds_draw_an_order_per_round_in_which_every_step_follows_every_other():
    calls = []
    seconds = timed_rounds({name: lambda r, name=name: calls.append((name, r)) for name in "abc"}, 300, "cpu")
    assert {name: len(values) for name, values in seconds.items()} == {"a": 300, "b": 300, "c": 300}
    assert [r for _, r in calls] == sorted(r for _, r in calls)  # round by round, warm-up round 0 first
    assert sorted(calls[:3]) == [("a", 0), ("b", 0), ("c", 0)]
    pairs = Counter((before, after) for (before, _), (after, _) in zip(calls, calls[1:]))
    assert not any(before == after for before, after in pairs)  # never a step twice in a row
    assert len(pairs) == 6 and min(pairs.values()) > 100  # each follows each other one ~150 times of 902


def test_emit_prints_one_json_line(capsys):
    emit({"peak_mb": 1.5, "ms": 2})
    emit("OOM")
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"peak_mb": 1.5, "ms": 2}, "OOM"]


def test_run_isolated_returns_the_last_json_line_of_the_child(tmp_path):
    script = child(tmp_path, """
        import json, sys
        print("a library's chatter on stdout")
        print(json.dumps({"not": "this one"}))
        print(json.dumps({"args": sys.argv[1:], "peak_mb": 1.5}))
    """)
    assert run_isolated(script, ["--one", "mtsa:8"], "mtsa at L=8") == {"args": ["--one", "mtsa:8"], "peak_mb": 1.5}
    assert run_isolated(str(script), [], "x") == {"args": [], "peak_mb": 1.5}


def test_a_failing_child_raises_with_the_cell_and_the_end_of_its_stderr(tmp_path):
    script = child(tmp_path, """
        import sys
        print('{"peak_mb": 1.0}')
        sys.stderr.write("early noise\\n" * 1000 + "MemoryError: the real cause\\n")
        sys.exit(3)
    """)
    with pytest.raises(CellFailed) as error:
        run_isolated(script, [], "mtsa at L=4096")
    message = str(error.value)
    assert message.startswith("mtsa at L=4096 failed (exit status 3)")
    assert message.endswith("MemoryError: the real cause\n") and len(message) < 2200


@pytest.mark.parametrize("output", ["", "done\\n"])
def test_a_child_without_a_json_result_raises(tmp_path, output):
    script = child(tmp_path, f'print("{output}", end="")')
    with pytest.raises(CellFailed, match="naive at L=16 printed no JSON result"):
        run_isolated(script, [], "naive at L=16")


@pytest.mark.skipif(not can_measure("cpu"), reason="needs a writable /proc/self/clear_refs (Linux)")
def test_peak_growth_on_cpu_sees_the_step_not_earlier_peaks():
    """In a fresh process, as the benchmarks measure: a test worker's allocator may hold freed pages that a step
    reuses without growing the resident set."""
    code = textwrap.dedent("""
        import json, torch
        from mtsa_fairseq.experiments.bench.measure import peak_growth_mb
        held = torch.ones(2**20)  # 4 MiB present before the step: not growth
        big = torch.ones(50 * 2**18)  # 50 MiB ...
        del big  # ... freed again: an earlier peak, above the coming step's starting point
        step = lambda: torch.ones(50 * 2**18).sum()  # ~50 MiB, written (and so resident), then freed
        print(json.dumps([peak_growth_mb(step, "cpu"), peak_growth_mb(lambda: None, "cpu"), float(held.sum())]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-2000:]
    step, nothing, held = json.loads(proc.stdout.splitlines()[-1])
    assert 45 < step < 70
    assert nothing < 5
    assert held == 2**20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_peak_growth_on_cuda_counts_the_allocator_peak():
    def step():
        torch.ones(50 * 2**18, device="cuda").sum()

    assert 49 < peak_growth_mb(step, "cuda") < 55


def test_check_positive_refuses_integers_below_one():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--core", action="store_true")
    check_positive(parser, parser.parse_args(["--lengths", "8", "16", "--repeats", "1"]))
    for argv in (["--lengths", "8", "0"], ["--repeats", "-1"]):
        with pytest.raises(SystemExit) as exc:
            check_positive(parser, parser.parse_args(argv))
        assert exc.value.code == 2


def test_check_positive_refuses_floats_not_above_zero_or_not_finite(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-seconds", type=float)
    parser.add_argument("--dropouts", type=float, nargs="+", default=[0.0])
    check_positive(parser, parser.parse_args(["--max-seconds", "1e-6"]), skip=("dropouts",))
    for value in ("0", "-1", "nan", "inf"):
        with pytest.raises(SystemExit) as exc:
            check_positive(parser, parser.parse_args(["--max-seconds", value]), skip=("dropouts",))
        assert exc.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith("error: --max-seconds must be positive and finite")
    with pytest.raises(SystemExit):
        check_positive(parser, parser.parse_args([]))  # --dropouts 0 when not skipped


@pytest.mark.parametrize("device", ["foo", "cuda:x", "meta"])
def test_check_device_refuses_what_is_not_cpu_or_cuda(device, capsys):
    with pytest.raises(SystemExit) as exc:
        check_device(argparse.ArgumentParser(), device)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: --device must be cpu or cuda[:N], not {device!r}")


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads Linux's /proc/cpuinfo")
def test_a_cpu_record_names_the_cpu_model():
    """Benchmark records name the CPU model, so that figures from different machines are told apart."""
    models = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
              if line.startswith("model name")]
    if not models:
        pytest.skip("this /proc/cpuinfo names no model")
    assert processor_name("cpu") == models[0]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert device_name("cpu") == f"{models[0]}, 1 thread"
        torch.set_num_threads(2)
        assert device_name("cpu") == f"{models[0]}, 2 threads"
    finally:
        torch.set_num_threads(threads)
