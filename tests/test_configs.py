"""The training configs in configs/: structure, fairseq-train's parser, and the numbers of docs/reference.md §1.4."""

import argparse
import math
import re
from pathlib import Path

import pytest
import torch
from fairseq import optim
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim import lr_scheduler

from mtsa_fairseq.contracts import load_yaml
from mtsa_fairseq.experiments.errors import ConfigError
from mtsa_fairseq.experiments.fairseq_train import options_to_args
from mtsa_fairseq.experiments.translation.train_config import check_with_fairseq, fairseq_args, load_config
from mtsa_fairseq.models.transformer_mtsa import MTSA_OPTIONS

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
PLUGIN_KEYS = {option.flag.lstrip("-") for option in MTSA_OPTIONS}  # the only options a transformer twin lacks
SETUPS = {  # reference §1.4: warmup, tokens per GPU, GPUs, updates, source2token bias init (MTSA)
    "setup1": {"warmup": 16000, "tokens": 2048, "gpus": 1, "updates": 250_000, "bias": 5.0},
    "setup2": {"warmup": 8000, "tokens": 6144, "gpus": 4, "updates": 133_000, "bias": 0.0},
}


def t2t_learning_rate(step: float, warmup: int, hidden_size: int = 512, constant: float = 2.0) -> float:
    """tensor2tensor's Transformer schedule ``constant * min(1, step/warmup) * rsqrt(max(step, warmup))
    * hidden_size^-0.5`` (reference §1.4)."""
    return constant * min(1.0, step / warmup) / math.sqrt(max(step, warmup)) / math.sqrt(hidden_size)


def t2t_peak_learning_rate(warmup: int, hidden_size: int = 512, constant: float = 2.0) -> float:
    """The schedule's maximum, reached at ``step == warmup``: ``constant / sqrt(warmup * hidden_size)``."""
    return t2t_learning_rate(warmup, warmup, hidden_size, constant)


def test_every_expected_config_exists():
    names = {p.stem for p in CONFIGS}
    assert {f"{s}_{m}" for s in ("setup1", "setup2", "demo") for m in ("transformer", "mtsa")} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_validates_against_fairseq_train(path):
    config = load_config(path)
    namespace = check_with_fairseq(config)
    assert config.name == path.stem
    assert namespace.arch == config.arch
    assert namespace.max_update == config.max_update
    assert ("mtsa" in namespace.arch) == (config.system == "mtsa")


@pytest.mark.parametrize("setup", sorted(SETUPS))
@pytest.mark.parametrize("system", ["transformer", "mtsa"])
def test_setup_numbers_match_reference(setup, system):
    want = SETUPS[setup]
    config = load_config(CONFIG_DIR / f"{setup}_{system}.yaml")
    ns = check_with_fairseq(config)
    assert ns.lr == [pytest.approx(t2t_peak_learning_rate(want["warmup"]), rel=1e-12)]
    assert round(ns.lr[0], 6) == {"setup1": 6.99e-4, "setup2": 9.88e-4}[setup]
    assert ns.lr_scheduler == "inverse_sqrt" and ns.warmup_updates == want["warmup"] and ns.warmup_init_lr == 0
    assert ns.optimizer == "adam" and eval(ns.adam_betas) == (0.9, 0.997) and ns.adam_eps == 1e-9
    assert ns.weight_decay == 0 and ns.clip_norm == 0
    assert ns.max_tokens == want["tokens"] and ns.update_freq == [1] and ns.max_update == want["updates"]
    assert config.nodes * config.gpus_per_node == want["gpus"]
    # every epoch composes its own batches: a preempted run resumes exactly (test_fairseq_integration.py)
    assert convert_namespace_to_omegaconf(ns).dataset.update_epoch_batch_itr is True
    assert ns.encoder_normalize_before and ns.decoder_normalize_before and ns.share_all_embeddings
    assert ns.dropout == ns.attention_dropout == ns.activation_dropout == 0.1
    assert ns.criterion == "label_smoothed_cross_entropy" and ns.label_smoothing == 0.1
    assert (ns.encoder_embed_dim, ns.encoder_ffn_embed_dim, ns.encoder_layers, ns.encoder_attention_heads) == (
        512, 2048, 6, 8)
    # t2t max_length 256 filters training pairs only; the model keeps 1024 positions for long test sentences
    assert config.train_max_length == 256
    assert ns.max_source_positions == ns.max_target_positions == 1024
    assert config.average_last == 0 and not config.cpu
    if system == "mtsa":
        assert ns.encoder_self_attention_type == "mtsa" and ns.mtsa_s2t_input == "v"
        assert ns.mtsa_s2t_activation == "scaled_sigmoid" and ns.mtsa_s2t_hidden_activation == "none"
        assert ns.mtsa_s2t_bias_init == want["bias"]
    else:
        assert not hasattr(ns, "mtsa_s2t_bias_init")


def test_bias_init_5_only_in_setup1_mtsa_and_the_multi30k_ablation():
    with_bias = {p.stem for p in CONFIGS if load_config(p).fairseq.get("mtsa-s2t-bias-init") == 5}
    assert with_bias == {"setup1_mtsa", "multi30k_mtsa_s2t_bias5"}


@pytest.mark.parametrize("setup", ["setup1", "setup2", "demo"])
def test_transformer_and_mtsa_differ_only_in_arch_and_mtsa_options(setup):
    base = load_config(CONFIG_DIR / f"{setup}_transformer.yaml")
    mtsa = load_config(CONFIG_DIR / f"{setup}_mtsa.yaml")
    assert (base.setup, base.nodes, base.gpus_per_node, base.average_last, base.train_max_length) == (
        mtsa.setup, mtsa.nodes, mtsa.gpus_per_node, mtsa.average_last, mtsa.train_max_length)
    assert (base.system, mtsa.system) == ("transformer", "mtsa")
    assert mtsa.arch == base.arch.replace("transformer_", "transformer_mtsa_", 1)
    differing = {k for k in base.fairseq.keys() | mtsa.fairseq.keys() if base.fairseq.get(k) != mtsa.fairseq.get(k)}
    assert differing - {"arch"} == differing & PLUGIN_KEYS
    assert not PLUGIN_KEYS & base.fairseq.keys()


@pytest.mark.filterwarnings("ignore::UserWarning")  # hydra's deprecation notices when building the cfg
@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_inverse_sqrt_schedule_equals_t2t_formula(setup):
    config = load_config(CONFIG_DIR / f"{setup}_mtsa.yaml")
    cfg = convert_namespace_to_omegaconf(check_with_fairseq(config))
    optimizer = optim.build_optimizer(cfg.optimizer, [torch.nn.Parameter(torch.zeros(1))])
    scheduler = lr_scheduler.build_lr_scheduler(cfg.lr_scheduler, optimizer)
    warmup = SETUPS[setup]["warmup"]
    assert scheduler.step_update(0) == 0
    for step in (1, 10, warmup // 2, warmup - 1, warmup, warmup + 1, 3 * warmup, config.max_update):
        assert scheduler.step_update(step) == pytest.approx(t2t_learning_rate(step, warmup), rel=1e-9)
    assert max(t2t_learning_rate(s, warmup) for s in range(1, 3 * warmup)) == pytest.approx(
        t2t_peak_learning_rate(warmup), rel=1e-12)


def test_options_to_args_mapping():
    args = options_to_args({"arch": "transformer_tiny", "share-all-embeddings": True, "fp16": False,
                            "restore-file": None, "lr": 6.987712429686843e-4, "max-tokens": 2048,
                            "ddp-backend": "legacy_ddp", "valid-subset": ["valid", "valid1"]})
    assert args == ["--arch", "transformer_tiny", "--share-all-embeddings", "--lr", "0.0006987712429686843",
                    "--max-tokens", "2048", "--ddp-backend", "legacy_ddp", "--valid-subset", "valid", "valid1"]
    config = load_config(CONFIG_DIR / "setup1_mtsa.yaml")
    assert fairseq_args(config)[fairseq_args(config).index("--mtsa-s2t-bias-init") + 1] == "5.0"


def _write(tmp_path: Path, text: str, name: str = "tiny") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


TINY = """name: {name}
system: transformer
setup: test
description: a tiny config
hardware: {{nodes: 1, gpus_per_node: 0}}
average_last: 0
fairseq:
  arch: transformer_tiny
  cpu: true
  max-update: 10
"""


def test_tiny_config_loads(tmp_path):
    config = load_config(_write(tmp_path, TINY.format(name="tiny")))
    assert check_with_fairseq(config).arch == "transformer_tiny"


@pytest.mark.parametrize("change, message", [
    (lambda t: t + "extra_key: 1\n", "unknown key 'extra_key'"),
    (lambda t: t.replace("name: tiny", "name: other"), "must equal the file stem"),
    (lambda t: t.replace("average_last: 0\n", ""), "missing key 'average_last'"),
    (lambda t: t.replace("system: transformer", "system: lstm"), "'system' must be one of"),
    (lambda t: t.replace("arch: transformer_tiny", "arch: transformer_mtsa_tiny"), "does not match arch"),
    (lambda t: t + "  seed: 3\n", "'seed' is set by the launcher"),
    (lambda t: t.replace("max-update: 10", "max-update: 0"), "'max-update' is required"),
    (lambda t: t + "  log-format: json\n", "'log-format' must be 'simple'"),
    (lambda t: t.replace("gpus_per_node: 0", "gpus_per_node: 1"), "gpus_per_node' is 0 exactly when"),
    (lambda t: t.replace("average_last: 0", "average_last: 2"), "'save-interval-updates'"),
    (lambda t: t.replace("average_last: 0", "average_last: 2") + "  save-interval-updates: 5\n"
     "  keep-interval-updates: 1\n", "'keep-interval-updates' >= 2"),
    (lambda t: t + "  lr: {a: 1}\n", "value must be a scalar"),
])
def test_bad_structure_fails_with_a_message(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, change(TINY.format(name="tiny"))))


@pytest.mark.parametrize("line, message", [
    ("  max-tokenz: 100\n", r"fairseq option 'max-tokenz'.*'--max-tokenz' is not a fairseq-train option"),
    ("  mtsa-s2t-bias-init: 5.0\n", r"fairseq option 'mtsa-s2t-bias-init'.*not a fairseq-train option"),
    ("  lr-scheduler: nope\n", r"fairseq option 'lr-scheduler'.*invalid choice"),
    ("  max-tokens: many\n", r"fairseq option 'max-tokens'.*invalid"),
    ("  dropout: [0.1]\n", r"tiny.yaml: fairseq option 'dropout': takes one value, not the list \[0.1\]"),
    ("  fp16: 1\n", r"tiny.yaml: fairseq option 'fp16': a flag takes true or false, not 1"),
])
def test_bad_fairseq_option_fails_naming_it(tmp_path, line, message):
    config = load_config(_write(tmp_path, TINY.format(name="tiny") + line))
    with pytest.raises(ConfigError, match=message):
        check_with_fairseq(config)


@pytest.mark.parametrize("extra, message", [
    ("average_last: 2\n", "key 'average_last' given twice (lines 6 and 11)"),
    ("  lr: 0.1\n  max-update: 20\n", "key 'max-update' given twice (lines 10 and 12)"),
])
def test_duplicate_key_is_refused(tmp_path, extra, message):
    path = _write(tmp_path, TINY.format(name="tiny") + extra)
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {message}")):
        load_config(path)


@pytest.mark.parametrize("text, message", [
    ("a:\n  b: 1\n  c:\n    - {d: 1, e: 2, d: 3}\n", ": key 'd' given twice (lines 4 and 4)"),
    ("a: 1\nb: [1, 2\n", ":3: not valid YAML: while parsing a flow sequence (line 2): expected ',' or ']'"),
    ("a: 1\nb: 2\x00\n", ":2: not valid YAML: unacceptable character #x0000"),
    ("a: 1\nb: Stra\xdfe\n".encode("latin-1"), ":2: not valid UTF-8"),
])
def test_load_yaml_names_file_and_line(tmp_path, text, message):
    path = tmp_path / "x.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=re.escape(f"{path}{message}")):
        load_yaml(path)


def test_load_yaml_allows_merge_keys_to_be_overridden(tmp_path):
    path = _write(tmp_path, "base: &b {lr: 1, seed: 2}\nrun:\n  <<: *b\n  lr: 3\n")
    assert load_yaml(path) == {"base": {"lr": 1, "seed": 2}, "run": {"lr": 3, "seed": 2}}


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_mtsa_options_are_declared_once_and_applied_by_every_arch():
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from mtsa_fairseq.models.transformer_mtsa import MTSA_OPTIONS, TransformerMTSAModel

    parser = argparse.ArgumentParser()
    TransformerMTSAModel.add_args(parser)
    helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
    for option in MTSA_OPTIONS:
        assert option.flag in helps and (isinstance(option.default, bool) or helps[option.flag].endswith(
            f"default {option.default}"))
    for arch in [a for a in ARCH_CONFIG_REGISTRY if a.startswith("transformer_mtsa")]:
        args = parser.parse_args([])
        ARCH_CONFIG_REGISTRY[arch](args)
        assert {o.dest: getattr(args, o.dest) for o in MTSA_OPTIONS} == {o.dest: o.default for o in MTSA_OPTIONS}
    args = parser.parse_args(["--mtsa-s2t-activation", "exp", "--mtsa-bi-directional"])
    ARCH_CONFIG_REGISTRY["transformer_mtsa_wmt_en_de"](args)
    assert args.mtsa_s2t_activation == "exp" and args.mtsa_bi_directional is True


def test_sentence_encoder_options_are_declared_once_and_each_arch_sets_only_its_own():
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from mtsa_fairseq.models.sentence_encoder import ARCHS, SENTENCE_OPTIONS, SentenceEncoderModel

    parser = argparse.ArgumentParser()
    SentenceEncoderModel.add_args(parser)
    dests = {o.dest for o in SENTENCE_OPTIONS}
    for arch, (_, defaults) in ARCHS.items():
        assert set(defaults) <= dests
        args = parser.parse_args([])
        ARCH_CONFIG_REGISTRY[arch](args)
        assert {o.dest: getattr(args, o.dest) for o in SENTENCE_OPTIONS} == {o.dest: defaults.get(o.dest, o.default)
                                                                            for o in SENTENCE_OPTIONS}
    args = parser.parse_args(["--encoder-hidden-dim", "64", "--token2token", "sigmoid"])
    ARCH_CONFIG_REGISTRY["fast_disa_encoder"](args)  # the user's options win over the architecture's
    assert (args.encoder_hidden_dim, args.token2token, args.encoder_activation) == (64, "sigmoid", "relu")
