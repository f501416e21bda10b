"""The sentence-encoder model (mtsa_fairseq/models/sentence_encoder.py): parameter counts, heads, padding and pairs
(no training; see test_sentence_encoding_task.py)."""

from __future__ import annotations

import argparse
import logging

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY

import mtsa_fairseq.plugin  # noqa: F401  (registers everything)
from mtsa_fairseq.models.sentence_encoder import ENCODER_OPTIONS, ENCODERS, SentenceEncoderModel

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


@pytest.mark.parametrize("arch", ARCHS)
def test_the_size_options_an_encoder_reads_change_it_and_the_others_are_warned_about(arch, caplog):
    def predictions(**options) -> torch.Tensor:
        torch.manual_seed(0)
        model = build(arch, embed_dim=30, classifier_hidden_dim=8, **options).double().eval()
        return model(torch.tensor([[4, 5, 6, 7, 8]]))

    base, encoder = predictions(), build(arch).args.encoder
    for dest, value in (("encoder_hidden_dim", 12), ("encoder_heads", 6), ("encoder_layers", 2)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mtsa_fairseq.models.sentence_encoder"):
            changed = predictions(**{dest: value})
        if dest in ENCODER_OPTIONS[encoder]:
            assert not torch.equal(changed, base) and not caplog.records
        else:
            assert torch.equal(changed, base)
            assert caplog.messages == [f"the {encoder} encoder ignores --{dest.replace('_', '-')} {value}"]
    assert set(ENCODER_OPTIONS) == set(ENCODERS)


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


def test_an_embedding_file_is_reported_and_one_without_a_dictionary_word_refused(tmp_path, caplog):
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("cat 1 2 3 4\ndog 1 2 3 4\nzebra 1 2 3 4\n")
    with caplog.at_level("INFO"):
        build("bilstm_encoder", embed_dim=4, embedding_path=str(vectors))
    assert f"{vectors}: vectors for 1 of the 6 training words and 2 words in all" in caplog.text  # dog: not trained
    vectors.write_text("zebra 1 2 3 4\n")
    with pytest.raises(ValueError, match="holds a vector for none of the 9 dictionary words"):
        build("bilstm_encoder", embed_dim=4, embedding_path=str(vectors))
