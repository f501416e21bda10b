"""Sentence-encoder model, embeddings, criterion and task pieces (no training; see test_sentence_tasks.py)."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
import torch
from fairseq import metrics
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY
from scipy import stats

import mtsa_fairseq.plugin  # noqa: F401  (registers everything)
from mtsa_fairseq.criterions.sentence_encoding import (
    SentenceEncodingCriterion,
    expected_score,
    pearson_from_sums,
    tai_target,
)
from mtsa_fairseq.models.sentence_encoder import SentenceEncoderModel
from mtsa_fairseq.modules.word_embedding import WordEmbedding, read_vectors

ARCHS = ("mtsa_encoder", "fast_disa_encoder", "disan_encoder", "disan_undirected_encoder", "stacked_mtsa_encoder",
         "bilstm_encoder", "multi_cnn_encoder", "hrchy_cnn_encoder", "multi_head_encoder", "multi_head_proj_encoder")
WORDS = "the cat sat on a mat dog ran far".split()


def make_dictionary(words=WORDS) -> Dictionary:
    d = Dictionary()
    for w in words:
        d.add_symbol(w)
    return d


class FakeTask:
    def __init__(self, kind: str, num_classes: int = 3, num_train_words: int = 6):
        self.source_dictionary = make_dictionary()
        self.kind, self.num_classes, self.num_train_words = kind, num_classes, num_train_words


def build(arch: str, kind: str = "single", num_classes: int = 3, **options) -> SentenceEncoderModel:
    args = argparse.Namespace(**options)
    ARCH_CONFIG_REGISTRY[arch](args)
    return SentenceEncoderModel.build_model(args, FakeTask(kind, num_classes))


def non_embedding_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith("embedding."))


# ---------------------------------------------------------------------------------------------- parameters


def test_snli_parameter_counts_match_the_reference():
    # docs/reference.md §3.1 step 7 and §4.3: MTSA 1,262,400 + pooling 721,200 + classifier 901,803; DiSAN 2 x 451,500 +
    # 721,200 + 721,203
    mtsa = build("mtsa_encoder", "pair", 3, classifier_highway=True, encoder_activation="elu")
    assert non_embedding_params(mtsa) == 2_885_403
    assert sum(p.numel() for p in mtsa.encoder.mtsa.parameters()) == 1_262_400
    disan = build("disan_encoder", "pair", 3, encoder_activation="elu")
    assert non_embedding_params(disan) == 2_345_403
    # Fast-DiSA is the same model: with the SNLI options it has MTSA's count
    fast = build("fast_disa_encoder", "pair", 3, classifier_highway=True, token2token="sigmoid")
    assert non_embedding_params(fast) == 2_885_403


def test_sst_head_has_no_output_bias_when_asked():
    model = build("mtsa_encoder", "single", 5, classifier_no_output_bias=True)
    assert model.head.out.bias is None
    # 600 -> 300 (+ bias) -> 5 without bias
    assert sum(p.numel() for p in model.head.parameters()) == 600 * 300 + 300 + 300 * 5


def test_fast_disa_defaults_are_the_released_function_defaults():
    fast, mtsa = build("fast_disa_encoder"), build("mtsa_encoder")
    assert type(fast.encoder) is type(mtsa.encoder)
    assert (fast.encoder.mtsa.token2token, mtsa.encoder.mtsa.token2token) == ("exp", "sigmoid")
    assert fast.args.encoder_activation == "relu"


# ---------------------------------------------------------------------------------------------- behaviour


@pytest.mark.parametrize("arch", ARCHS)
def test_padding_and_batch_composition_do_not_change_predictions(arch):
    torch.manual_seed(0)
    model = build(arch, "single", 4, embed_dim=30 if arch == "stacked_mtsa_encoder" else 24,
                  encoder_hidden_dim=12 if arch not in ("stacked_mtsa_encoder",) else None,
                  encoder_heads=2, encoder_layers=2, classifier_hidden_dim=8).double().eval()
    pad = model.embedding.padding_idx
    a, b = torch.tensor([4, 5, 6, 7, 8]), torch.tensor([9, 10, 4])
    alone = model(torch.stack([a]))
    batch = torch.stack([a, torch.cat([b, torch.full((2,), pad)])])
    wide = torch.stack([torch.cat([a, torch.full((3,), pad)]), torch.cat([b, torch.full((5,), pad)])])
    torch.testing.assert_close(model(batch)[0], alone[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(model(wide), model(batch), rtol=0, atol=1e-10)
    torch.testing.assert_close(model(torch.stack([b]))[0], model(batch)[1], rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", ["pair", "relatedness"])
def test_pairs_are_encoded_separately_with_shared_weights(kind):
    torch.manual_seed(0)
    model = build("mtsa_encoder", kind, 3, embed_dim=16, encoder_hidden_dim=8, classifier_hidden_dim=6).double().eval()
    p, h = torch.tensor([[4, 5, 6, 7]]), torch.tensor([[8, 9, 4, 1]])
    ep, eh = model.encode(p), model.encode(h)
    features = [ep, eh, ep - eh, ep * eh] if kind == "pair" else [ep * eh, (ep - eh).abs()]
    torch.testing.assert_close(model(p, None, h), model.head(torch.cat(features, -1)), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="second sentence"):
        model(p)


def test_regularized_weights_are_the_dense_weights_only():
    model = build("mtsa_encoder", "single", 5)
    names = {n for n, p in model.named_parameters() if any(p is w for w in model.regularized_weights())}
    assert names and all(not n.startswith("embedding.") and not n.endswith("bias") for n in names)
    assert "encoder.mtsa.gate.bias" not in names  # per-head biases are [H, 1, d] but still biases
    expected = {n for n, _ in model.named_parameters() if n.endswith("weight") and not n.startswith("embedding.")}
    assert names == expected and "encoder.mtsa.v_proj.weight" in names


# ---------------------------------------------------------------------------------------------- embeddings


def test_embedding_rows_follow_the_reference_rules(tmp_path):
    d = make_dictionary()  # specials 0-3, train words 4..9 (num_train_words 6), test-only words 10..12
    vectors_file = tmp_path / "vec.txt"
    vectors_file.write_text("3 4\ncat 1 2 3 4\nfar 5 6 7 8\nzebra 9 9 9 9\n")  # word2vec header
    words = [d[i] for i in range(len(d))]
    vectors = read_vectors(vectors_file, set(words[4:]), 4)
    assert set(vectors) == {"cat", "far"}
    torch.manual_seed(0)
    emb = WordEmbedding(words, 6, 4, 4, vectors, "uniform", d.pad())
    w = emb.weight
    assert torch.equal(w[:4], torch.zeros(4, 4))  # specials: constant zeros
    assert torch.equal(w[d.index("cat")], torch.tensor([1.0, 2, 3, 4]))  # training word with a vector
    others = [d.index(x) for x in ("the", "sat", "on", "a", "mat")]
    assert w[others].abs().max() <= 0.05 and w[others].abs().min() > 0  # OOV ~ U(-0.05, 0.05)
    assert torch.equal(w[d.index("far")], torch.tensor([5.0, 6, 7, 8]))  # test-only word with a vector: constant
    assert torch.equal(w[d.index("dog")], torch.zeros(4))  # test-only without a vector: like <unk>
    assert emb.num_pretrained == 2
    tokens = torch.tensor([[d.index("cat"), d.index("far"), d.unk(), d.pad()]])
    emb(tokens).sum().backward()
    assert [n for n, p in emb.named_parameters()] == ["trainable"]
    grad = emb.trainable.grad
    assert grad[d.index("cat") - 4].abs().sum() > 0 and grad.abs().sum() == grad[d.index("cat") - 4].abs().sum()
    assert set(emb.state_dict()) == {"head", "trainable", "tail"}  # constant rows travel with checkpoints


def test_normal_oov_init_and_vector_file_errors(tmp_path):
    words = ["<s>", "<pad>", "</s>", "<unk>"] + [f"w{i}" for i in range(4000)]
    torch.manual_seed(0)
    emb = WordEmbedding(words, 4000, 4, 8, None, "normal")
    assert abs(emb.trainable.std().item() - 1.0) < 0.02 and abs(emb.trainable.mean().item()) < 0.02
    kim = WordEmbedding(words, 4000, 4, 8, None, "uniform", oov_scale=0.25).trainable
    assert kim.abs().max() <= 0.25 and abs(kim.std().item() - 0.25 / 3 ** 0.5) < 0.005
    assert WordEmbedding(words, 4000, 4, 8, None, "uniform").trainable.abs().max() <= 0.05
    assert abs(WordEmbedding(words, 4000, 4, 8, None, "normal", oov_scale=0.3).trainable.std().item() - 0.3) < 0.01
    with pytest.raises(ValueError, match="oov_scale"):
        WordEmbedding(words, 4, 4, 8, None, "normal", oov_scale=0.0)
    bad = tmp_path / "bad.txt"
    bad.write_text("cat 1 2 3\n")
    with pytest.raises(ValueError, match="bad.txt:1: expected a word and 4 numbers"):
        read_vectors(bad, {"cat"}, 4)
    with pytest.raises(FileNotFoundError):
        read_vectors(tmp_path / "missing.txt", {"cat"}, 4)
    with pytest.raises(ValueError, match="oov_init"):
        WordEmbedding(words, 4, 4, 8, None, "glorot")


# ---------------------------------------------------------------------------------------------- criterion


def test_tai_target_distribution_and_expected_score():
    scores = torch.tensor([1.0, 5.0, 3.6, 2.0, 4.25], dtype=torch.float64)
    target = tai_target(scores)
    expected = torch.tensor([[1, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0.4, 0.6, 0], [0, 1, 0, 0, 0],
                             [0, 0, 0, 0.75, 0.25]], dtype=torch.float64)
    torch.testing.assert_close(target, expected)
    torch.testing.assert_close(target @ torch.arange(1.0, 6, dtype=torch.float64), scores)
    logits = torch.log(expected.clamp_min(1e-30)).float()
    torch.testing.assert_close(expected_score(logits).double(), scores, atol=1e-5, rtol=0)


class CriterionTask:
    def __init__(self):
        self.source_dictionary = make_dictionary()


def test_l2_term_is_added_in_training_only():
    torch.manual_seed(0)
    model = build("mtsa_encoder", "single", 3, embed_dim=8, encoder_hidden_dim=4, classifier_hidden_dim=5).double()
    model.train()
    sample = {"net_input": {"src_tokens": torch.tensor([[4, 5, 6], [7, 8, 1]])}, "target": torch.tensor([0, 2]),
              "ntokens": 5}
    plain, with_l2 = SentenceEncodingCriterion(CriterionTask()), SentenceEncodingCriterion(CriterionTask(), 1e-2)
    torch.manual_seed(1)
    loss0, n, log0 = plain(model, sample)
    torch.manual_seed(1)
    loss1, _, log1 = with_l2(model, sample)
    l2 = sum((w.double() ** 2).sum() for w in model.regularized_weights()) / 2
    assert n == 2
    torch.testing.assert_close(loss1 - loss0, 2 * 1e-2 * l2)
    assert log1["loss"] == pytest.approx(log0["loss"])  # the logged loss is the data loss
    model.eval()
    assert with_l2(model, sample)[0].item() == pytest.approx(plain(model, sample)[0].item())


def test_pearson_is_computed_over_the_whole_split_not_per_batch():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=40), rng.normal(size=40)
    batches = [slice(0, 7), slice(7, 25), slice(25, 40)]
    logs = [{"sample_size": s.stop - s.start, "loss": 0.0, "sse": float(((x[s] - y[s]) ** 2).sum()),
             "sx": x[s].sum(), "sy": y[s].sum(), "sxx": (x[s] ** 2).sum(), "syy": (y[s] ** 2).sum(),
             "sxy": (x[s] * y[s]).sum()} for s in batches]
    with metrics.aggregate(new_root=True) as agg:
        for log in logs:  # fairseq reduces every validation batch separately
            SentenceEncodingCriterion.reduce_metrics([log])
        values = agg.get_smoothed_values()
    assert values["pearson"] == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-4)
    assert values["mse"] == pytest.approx(np.mean((x - y) ** 2), abs=1e-4)
    assert not any(k.startswith("_") for k in values)
    assert pearson_from_sums(3, 3, 3, 3, 5, 4) == 0.0  # constant x
    assert math.isclose(pearson_from_sums(3, 6, 6, 14, 14, 14), 1.0)
