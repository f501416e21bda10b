"""Word embeddings (mtsa_fairseq/modules/word_embedding.py): the rows' rules of docs/reference.md §3.1 item 1, OOV
initialisation and vector files."""

import pytest
import torch
from test_sentence_encoder import make_dictionary

from mtsa_fairseq.modules.word_embedding import WordEmbedding, read_vectors


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
    bad.write_text("cat 1 2 3 4 5\n")  # a wider file
    with pytest.raises(ValueError, match="bad.txt:1: expected a word and 4 numbers, got 5 fields"):
        read_vectors(bad, {"cat"}, 4)
    bad.write_text("dog 1 2 3 4\ncat 1 2 x 4\n")
    with pytest.raises(ValueError, match="bad.txt:2: the vector of 'cat' holds a field that is not a number"):
        read_vectors(bad, {"cat"}, 4)
    bad.write_text("cat 1 2 nan 4\n")
    with pytest.raises(ValueError, match="bad.txt:1: the vector of 'cat' is not finite"):
        read_vectors(bad, {"cat"}, 4)
    spaced = tmp_path / "spaced.txt"  # GloVe 840B holds a few words with spaces
    spaced.write_text(". . . 1 2 3 4\ncat 5 6 7 8\n")
    assert list(read_vectors(spaced, {"cat", "."}, 4)) == ["cat"]
    with pytest.raises(FileNotFoundError):
        read_vectors(tmp_path / "missing.txt", {"cat"}, 4)
    with pytest.raises(ValueError, match="oov_init"):
        WordEmbedding(words, 4, 4, 8, None, "glorot")
