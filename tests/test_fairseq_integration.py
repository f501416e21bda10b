"""End to end through fairseq's own entry points, on a tiny synthetic corpus made here."""

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks

import mtsa_fairseq
from mtsa_fairseq.checkpoint_safety import FAIRSEQ_CHECKPOINT_GLOBALS
from mtsa_fairseq.toy_corpus import write_corpus

USER_DIR = str(Path(mtsa_fairseq.__file__).parent)
BIN = Path(sys.executable).parent
TINY = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--share-all-embeddings",
]
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


def run(tool: str, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(BIN / tool), *args], input=stdin, capture_output=True, text=True, env=ENV, timeout=600
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def train_args(data: Path, save_dir: Path, *extra: str) -> list[str]:
    return [
        str(data), "--user-dir", USER_DIR, "--cpu", "--seed", "2", *TINY,
        "--optimizer", "adam", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "1024",
        "--num-workers", "0", "--no-epoch-checkpoints", "--save-dir", str(save_dir), "--log-format", "simple",
        *extra,
    ]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    write_corpus(root / "raw", {"train": 300, "valid": 40, "test": 20}, seed=3)
    run("fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", str(root / "raw/train"),
        "--validpref", str(root / "raw/valid"), "--testpref", str(root / "raw/test"), "--destdir", str(root / "bin"),
        "--joined-dictionary", "--workers", "1")
    save = root / "ckpt"
    run("fairseq-train", *train_args(root / "bin", save, "--arch", "transformer_mtsa_tiny", "--max-update", "24"))
    return root, save


def test_train_writes_loadable_checkpoints(trained):
    _, save = trained
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        path = save / name
        assert set(torch.serialization.get_unsafe_globals_in_checkpoint(str(path))) <= {
            f"{c.__module__}.{c.__qualname__}" for c in FAIRSEQ_CHECKPOINT_GLOBALS
        }
        state = checkpoint_utils.load_checkpoint_to_cpu(str(path))  # weights_only=True under torch >= 2.6
        assert state["cfg"]["model"].arch == "transformer_mtsa_tiny"
        assert any(".self_attn.s2t.weight" in k for k in state["model"])


def test_generate_and_interactive(trained):
    root, save = trained
    gen = run("fairseq-generate", str(root / "bin"), "--user-dir", USER_DIR, "--path", str(save / "checkpoint_last.pt"),
              "--cpu", "--beam", "2", "--batch-size", "16", "--required-batch-size-multiple", "1")
    # fairseq drops a last batch smaller than --required-batch-size-multiple (default 8): score with 1
    assert sum(line.startswith("H-") for line in gen.stdout.splitlines()) == 20
    assert "BLEU4" in gen.stdout
    inter = run("fairseq-interactive", str(root / "bin"), "--user-dir", USER_DIR, "--path",
                str(save / "checkpoint_last.pt"), "--cpu", "--beam", "2", "--source-lang", "en", "--target-lang", "de",
                stdin="the dog sees the cat\nthe old trees like the small car\n")
    assert sum(line.startswith("H-") for line in inter.stdout.splitlines()) == 2


def test_missing_user_dir_is_the_known_failure(trained):
    root, save = trained
    proc = run("fairseq-generate", str(root / "bin"), "--path", str(save / "checkpoint_last.pt"), "--cpu", check=False)
    assert proc.returncode != 0


def test_from_pretrained_translates(trained):
    root, save = trained
    from fairseq.models.transformer import TransformerModel

    hub = TransformerModel.from_pretrained(str(save), "checkpoint_last.pt", str(root / "bin"), user_dir=USER_DIR)
    out = hub.translate("the dog sees the cat", beam=2)
    assert isinstance(out, str) and out.strip()


def test_resume_continues_the_run(trained):
    root, save = trained
    args = train_args(root / "bin", save, "--arch", "transformer_mtsa_tiny", "--max-update", "30")
    proc = run("fairseq-train", *args)
    assert "Loaded checkpoint" in proc.stdout + proc.stderr and "@ 24 updates" in proc.stdout + proc.stderr
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 30


def test_odd_heads_with_bi_directional_masks_fail_at_build(trained, tmp_path):
    root, _ = trained
    proc = run("fairseq-train", *train_args(root / "bin", tmp_path / "x", "--arch", "transformer_mtsa_tiny",
                                            "--max-update", "1", "--mtsa-bi-directional"),
               "--encoder-attention-heads", "5", "--encoder-embed-dim", "40", "--decoder-embed-dim", "40",
               check=False)
    assert proc.returncode != 0
    assert "--mtsa-bi-directional" in proc.stderr and "--encoder-attention-heads" in proc.stderr
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned > " + os.environ.get("MTSA_PWN_MARKER", "/nonexistent/marker"),))


def test_crafted_checkpoint_with_a_callable_is_refused(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    monkeypatch.setenv("MTSA_PWN_MARKER", str(marker))
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "args": None, "extra": _Payload()}, path)
    with pytest.raises(pickle.UnpicklingError):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()


def _params(tmp_path: Path, arch: str) -> int:
    for lang in ("en", "de"):  # a joined dictionary of 32,768 entries, as in the paper's setup
        (tmp_path / f"dict.{lang}.txt").write_text("".join(f"w{i} 1\n" for i in range(32_768 - 4)))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [str(tmp_path), "--user-dir", USER_DIR, "--arch", arch, "--share-all-embeddings", "--task",
                 "translation", "-s", "en", "-t", "de"]
    )
    model = tasks.setup_task(args).build_model(args)
    return sum(p.numel() for p in model.parameters())


def test_transformer_mtsa_wmt_en_de_parameter_count(tmp_path):
    base = _params(tmp_path, "transformer_wmt_en_de")
    mtsa = _params(tmp_path, "transformer_mtsa_wmt_en_de")
    assert base == 44_138_496 + 512 * 32_768
    assert mtsa - base == 6 * 8 * (64 * 64 + 64) == 199_680
