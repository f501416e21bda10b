"""End to end through fairseq's own entry points, on a tiny synthetic corpus made here."""

import math
import os
import pickle
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fairseq import checkpoint_utils, options, tasks

import mtsa_fairseq.plugin
from mtsa_fairseq.checkpoint_safety import FAIRSEQ_CHECKPOINT_GLOBALS
from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention

pytestmark = pytest.mark.slow  # end-to-end runs of fairseq's and the project's commands

USER_DIR = str(Path(mtsa_fairseq.__file__).parent)
BIN = Path(sys.executable).parent
TINY = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--share-all-embeddings",
]
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
# validating BLEU as the Multi30k configs do: fairseq then saves numpy arrays (the n-gram counts) in every checkpoint
EVAL_BLEU = ["--eval-bleu", "--eval-bleu-args", '{"beam": 1}', "--best-checkpoint-metric", "bleu",
             "--maximize-best-checkpoint-metric"]


def run(tool: str, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(BIN / tool), *args], input=stdin, capture_output=True, text=True, env=ENV, timeout=1500
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
def trained(toy_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("e2e") / "ckpt"
    run("fairseq-train", *train_args(toy_data / "bin", save, "--arch", "transformer_mtsa_tiny", "--max-update", "24",
                                        *EVAL_BLEU))
    return toy_data, save


def _pickled_globals(path: Path) -> list[str]:
    """Every global in a checkpoint torch would not load without an allow-list (the plugin's set aside)."""
    allowed = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    finally:
        torch.serialization.add_safe_globals(allowed)


def test_train_writes_loadable_checkpoints(trained):
    _, save = trained
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        path = save / name
        pickled = set(_pickled_globals(path))
        assert "numpy.ndarray" in pickled  # the validation BLEU's n-gram counts
        assert pickled <= {f"{c.__module__}.{c.__qualname__}" for c in FAIRSEQ_CHECKPOINT_GLOBALS}
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


def test_a_translation_checkpoint_given_to_the_sentence_evaluation_is_named_as_such(trained):
    root, save = trained
    proc = run("mtsa-evaluate-sentence", "--checkpoint", str(save / "checkpoint_last.pt"), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith("is a translation checkpoint, not a sentence_encoding one")


def test_missing_user_dir_is_the_known_failure(trained):
    root, save = trained
    proc = run("fairseq-generate", str(root / "bin"), "--path", str(save / "checkpoint_last.pt"), "--cpu", check=False)
    assert proc.returncode != 0
    assert "Unsupported global: GLOBAL argparse.Namespace" in proc.stderr  # the message README's Traps quote


def test_from_pretrained_translates(trained):
    root, save = trained
    from fairseq.models.transformer import TransformerModel

    hub = TransformerModel.from_pretrained(str(save), "checkpoint_last.pt", str(root / "bin"), user_dir=USER_DIR)
    out = hub.translate("the dog sees the cat", beam=2)
    assert isinstance(out, str) and out.strip()


def test_resume_continues_the_run(trained):
    root, save = trained
    args = train_args(root / "bin", save, "--arch", "transformer_mtsa_tiny", "--max-update", "30", *EVAL_BLEU)
    proc = run("fairseq-train", *args)
    assert "Loaded checkpoint" in proc.stdout + proc.stderr and "@ 24 updates" in proc.stdout + proc.stderr
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 30


def _params_after(data: Path, save: Path, stops: list[int], *extra: str) -> dict[str, torch.Tensor]:
    """The parameters of a run of transformer_mtsa_tiny (dropout on) stopped and resumed at each update in
    ``stops``: one fairseq-train process per stop, each resuming from the previous one's checkpoint_last.pt."""
    for stop in stops:
        run("fairseq-train", *train_args(data, save, "--arch", "transformer_mtsa_tiny", "--dropout", "0.1",
                                          "--max-tokens", "512", "--max-update", str(stop), *extra))
    return checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))["model"]


def test_a_resumed_run_equals_an_uninterrupted_one_with_update_epoch_batch_itr(toy_data, tmp_path):
    """fairseq's translation task composes its batches once per process, from the seed and the epoch the
    process starts in, so a run resumed after epoch 1 trains on other batches than one that never stopped
    (docs/results-multi30k.md); with --update-epoch-batch-itr True every epoch composes its own, and a run
    resumed mid-epoch and at an epoch's end (7 updates per epoch here) equals the uninterrupted one exactly."""
    data = toy_data / "bin"
    straight = _params_after(data, tmp_path / "straight", [40], "--update-epoch-batch-itr", "True")
    resumed = _params_after(data, tmp_path / "resumed", [10, 28, 40], "--update-epoch-batch-itr", "True")
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)
    default_straight = _params_after(data, tmp_path / "default_straight", [40])
    default_resumed = _params_after(data, tmp_path / "default_resumed", [28, 40])
    assert not all(torch.equal(default_straight[k], default_resumed[k]) for k in default_straight)


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
    for i, payload in enumerate((_Payload(), np.array([_Payload()], dtype=object))):  # an object array too
        torch.save({"model": {}, "args": None, "extra": payload}, path)
        with pytest.raises(pickle.UnpicklingError):
            checkpoint_utils.load_checkpoint_to_cpu(str(path))
        assert not marker.exists(), i


def _build(tmp_path: Path, arch: str, *extra: str, vocab: int = 32_768):
    for lang in ("en", "de"):  # a joined dictionary of `vocab` entries (32,768 as in the paper's setup)
        (tmp_path / f"dict.{lang}.txt").write_text("".join(f"w{i} 1\n" for i in range(vocab - 4)))
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [str(tmp_path), "--user-dir", USER_DIR, "--arch", arch, "--share-all-embeddings", "--task",
                 "translation", "-s", "en", "-t", "de", *extra]
    )
    task = tasks.setup_task(args)
    return task, task.build_model(args)


def _params(tmp_path: Path, arch: str, *extra: str) -> int:
    return sum(p.numel() for p in _build(tmp_path, arch, *extra)[1].parameters())


def test_transformer_mtsa_wmt_en_de_parameter_count(tmp_path):
    base = _params(tmp_path, "transformer_wmt_en_de")
    mtsa = _params(tmp_path, "transformer_mtsa_wmt_en_de")
    assert base == 44_138_496 + 512 * 32_768
    assert mtsa - base == 6 * 8 * (64 * 64 + 64) == 199_680
    both = _params(tmp_path, "transformer_mtsa_wmt_en_de", "--decoder-self-attention-type", "mtsa")
    assert both - base == 12 * 8 * (64 * 64 + 64)
    assert _params(tmp_path, "transformer_mtsa_wmt_en_de", "--encoder-self-attention-type", "standard") == base


# ---------------------------------------------------------------- MTSA in the decoder


def _sources(task, rows: list[list[int]]):
    """A left-padded source batch, as fairseq's translation task builds it."""
    pad, eos = task.source_dictionary.pad(), task.source_dictionary.eos()
    width = max(len(r) for r in rows) + 1
    tokens = torch.full((len(rows), width), pad)
    for b, r in enumerate(rows):
        tokens[b, width - len(r) - 1:] = torch.tensor([*r, eos])
    return tokens, torch.tensor([len(r) + 1 for r in rows])


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, None)])
def test_sequence_generator_with_decoder_mtsa_equals_full_forward(tmp_path, dtype, atol):
    """Beam search decodes incrementally (cached k, v, E_S); every hypothesis' per-token scores must
    equal the full-sequence forward of the same tokens. In bf16: runs, finite, same shapes."""
    from fairseq.sequence_generator import SequenceGenerator

    task, model = _build(tmp_path, "transformer_mtsa_tiny", "--decoder-self-attention-type", "mtsa",
                         "--decoder-layers", "3", vocab=48)
    model = model.to(dtype).eval()
    src_tokens, src_lengths = _sources(task, [[5, 9, 11, 7, 20, 6], [8, 12, 30], [14, 15, 16, 17]])
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=12, min_len=4)
    with torch.no_grad():
        hypos = generator.generate([model], {"net_input": {"src_tokens": src_tokens, "src_lengths": src_lengths}})
        for b, beam in enumerate(hypos):
            real = src_tokens[b, src_tokens[b] != task.source_dictionary.pad()][None]
            for hypo in beam:
                tokens = hypo["tokens"][None]
                prev = torch.cat([tokens.new_full((1, 1), task.target_dictionary.eos()), tokens[:, :-1]], 1)
                out = model(real, torch.tensor([real.shape[1]]), prev)
                lprobs = model.get_normalized_probs(out, log_probs=True)
                full = lprobs.gather(-1, tokens[..., None])[0, :, 0]
                assert torch.isfinite(hypo["positional_scores"]).all()
                if atol is not None:
                    torch.testing.assert_close(hypo["positional_scores"], full.float(), rtol=0, atol=atol)
    assert len(hypos) == 3 and all(len(beam) == 3 for beam in hypos)


def test_mtsa_kernel_option_reaches_every_mtsa_layer(tmp_path):
    _, model = _build(tmp_path, "transformer_mtsa_tiny", "--decoder-self-attention-type", "mtsa", "--mtsa-kernel",
                      "dense", vocab=48)
    layers = [m for m in model.modules() if isinstance(m, MTSAMultiheadAttention)]
    assert len(layers) == 4 and {m.kernel for m in layers} == {"dense"}
    _, model = _build(tmp_path, "transformer_mtsa_tiny", vocab=48)
    assert {m.kernel for m in model.modules() if isinstance(m, MTSAMultiheadAttention)} == {"auto"}


@pytest.mark.parametrize("extra, message", [
    (("--encoder-self-attention-type", "standard", "--mtsa-s2t-bias-init", "5"),
     "--mtsa-s2t-bias-init has no effect: no layer uses MTSA"),
    (("--encoder-self-attention-type", "standard", "--decoder-self-attention-type", "mtsa",
      "--mtsa-s2t-activation", "sigmoid", "--mtsa-bi-directional"),
     "--mtsa-bi-directional has no effect: it masks the encoder's MTSA heads"),
    (("--mtsa-s2t-bias-init", "inf"), "--mtsa-s2t-bias-init must be finite, got inf"),
])
def test_mtsa_options_that_would_mislead_are_refused_at_build(tmp_path, extra, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _build(tmp_path, "transformer_mtsa_tiny", *extra, vocab=48)


def test_decoder_mtsa_rejects_exp_source2token_at_build(tmp_path):
    with pytest.raises(ValueError, match="--mtsa-s2t-activation"):
        _build(tmp_path, "transformer_mtsa_tiny", "--decoder-self-attention-type", "mtsa",
               "--mtsa-s2t-activation", "exp", vocab=48)


def test_bf16_training_step_is_finite(tmp_path):
    """fairseq 0.12's --bf16 implies --tpu, so the CPU check drives the model and criterion in bf16
    directly: forward, NLL loss and backward through encoder and decoder MTSA."""
    task, model = _build(tmp_path, "transformer_mtsa_tiny", "--decoder-self-attention-type", "mtsa",
                         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", vocab=48)
    model = model.to(torch.bfloat16).train()
    src_tokens, src_lengths = _sources(task, [[5, 9, 11, 7, 20, 6], [8, 12, 30]])
    target = torch.tensor([[6, 7, 8, 9, 2], [10, 11, 2, 1, 1]])
    prev = torch.tensor([[2, 6, 7, 8, 9], [2, 10, 11, 1, 1]])
    out = model(src_tokens, src_lengths, prev)
    assert out[0].dtype == torch.bfloat16
    lprobs = model.get_normalized_probs(out, log_probs=True)  # fairseq's log_softmax runs in float32
    loss = torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.shape[-1]), target.view(-1), ignore_index=1)
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) > 0 and all(torch.isfinite(g).all() for g in grads)
    assert any(".self_attn.s2t.weight" in n and p.grad.abs().sum() > 0 for n, p in model.named_parameters()
               if "decoder" in n)


def test_decoder_mtsa_trains_in_fp16_and_generates(trained, tmp_path):
    """fairseq-train --fp16 on CPU (fp16 master-weight copies without flattening, which would need CUDA),
    then fairseq-generate --fp16 with beam search through the cached MTSA decoder."""
    root, _ = trained
    save = tmp_path / "dec"
    proc = run("fairseq-train", *train_args(root / "bin", save, "--arch", "transformer_mtsa_tiny", "--max-update", "12",
                                            "--decoder-self-attention-type", "mtsa", "--fp16",
                                            "--fp16-no-flatten-grads", "--log-interval", "4"))
    losses = [float(x.split("| loss ")[1].split()[0]) for x in proc.stdout.splitlines() if "| loss " in x]
    assert losses and all(math.isfinite(x) for x in losses)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))
    assert any(k.startswith("decoder.layers.0.self_attn.s2t") for k in state["model"])
    gen = run("fairseq-generate", str(root / "bin"), "--user-dir", USER_DIR, "--path", str(save / "checkpoint_last.pt"),
              "--cpu", "--fp16", "--beam", "3", "--batch-size", "16", "--required-batch-size-multiple", "1")
    scores = [float(line.split("\t")[1]) for line in gen.stdout.splitlines() if line.startswith("H-")]
    assert len(scores) == 20 and all(math.isfinite(x) for x in scores)


# ---------------------------------------------------------------- data-parallel training on CPU


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_process_gloo_training_and_its_checkpoint_loads(trained, tmp_path):
    root, _ = trained
    save = tmp_path / "ddp"
    port = _free_port()
    common = train_args(root / "bin", save, "--arch", "transformer_mtsa_tiny", "--max-update", "8",
                        "--ddp-backend", "legacy_ddp", "--distributed-backend", "gloo", "--distributed-no-spawn",
                        "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-world-size", "2",
                        "--disable-validation")
    procs = [subprocess.Popen([str(BIN / "fairseq-train"), *common, "--distributed-rank", str(rank)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
             for rank in (0, 1)]
    logs = [p.communicate(timeout=1500)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert "distributed init (rank 0)" in logs[0] and "distributed init (rank 1)" in logs[1]
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 8
    assert state["cfg"]["distributed_training"]["distributed_world_size"] == 2
    gen = run("fairseq-generate", str(root / "bin"), "--user-dir", USER_DIR, "--path", str(save / "checkpoint_last.pt"),
              "--cpu", "--beam", "2", "--batch-size", "16", "--required-batch-size-multiple", "1")
    assert sum(line.startswith("H-") for line in gen.stdout.splitlines()) == 20
