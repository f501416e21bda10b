"""Word embeddings with the sentence-encoder code's rules (docs/reference.md §3.1; docs/sentence-tasks.md, Embeddings)
over the dictionary of ``scripts/prepare_sentence_data.py``: special rows constant zeros, training words a trainable
matrix (pretrained vectors, else the task's ``oov_init``), the other words constant pretrained vectors or zeros."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

OOV_INITS = ("uniform", "normal")
OOV_INIT_SCALES = {"uniform": 0.05, "normal": 1.0}  # the authors': U(-0.05, 0.05) (SNLI), N(0, 1) (SST)


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8", errors="replace") if path.suffix == ".gz" else \
        path.open(encoding="utf-8", errors="replace")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_vectors(path: str | Path, words: set[str], dim: int) -> dict[str, Tensor]:
    """Vectors of ``words`` (only those: a 6B-token GloVe file needs little memory; the first occurrence wins) from a
    GloVe or word2vec text file (its ``count dim`` header skipped; a word may hold spaces, as a few of GloVe 840B's
    do). ``ValueError`` names the file and line of a line not ``dim`` wide, and of a vector of ``words`` that is not
    finite numbers."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"embedding file not found: {path}")
    found: dict[str, Tensor] = {}
    with _open_text(path) as lines:
        for number, line in enumerate(lines, 1):
            parts = line.rstrip("\n").rstrip(" ").split(" ")
            if number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                continue  # word2vec text header
            if len(parts) < dim + 1 or any(_is_number(p) for p in parts[1:-dim]):
                raise ValueError(f"{path}:{number}: expected a word and {dim} numbers, got {len(parts) - 1} fields")
            word = " ".join(parts[:-dim])
            if word in words and word not in found:
                try:
                    vector = torch.tensor([float(v) for v in parts[-dim:]])
                except ValueError:
                    raise ValueError(f"{path}:{number}: the vector of {word!r} holds a field that is not a "
                                     "number") from None
                if not torch.isfinite(vector).all():
                    raise ValueError(f"{path}:{number}: the vector of {word!r} is not finite")
                found[word] = vector
    return found


def _spans(num_embeddings: int, first_word: int, num_train_words: int) -> Iterator[tuple[int, int]]:
    yield 0, first_word
    yield first_word, first_word + num_train_words
    yield first_word + num_train_words, num_embeddings


class WordEmbedding(nn.Module):
    """``[len(words), dim]`` embedding whose rows ``[first_word, first_word + num_train_words)`` (``first_word``:
    fairseq's ``Dictionary.nspecial``) are trainable and all others constant buffers (saved in checkpoints). Training
    words without one of the ``vectors`` start as ``oov_init`` ``"uniform"`` U(-a, a) or ``"normal"`` N(0, a^2), ``a``
    = ``oov_scale`` (default :data:`OOV_INIT_SCALES`); the ``padding_idx`` row stays zero (for fairseq's utilities)."""

    def __init__(self, words: list[str], num_train_words: int, first_word: int, dim: int,
                 vectors: dict[str, Tensor] | None = None, oov_init: str = "uniform", padding_idx: int = 1,
                 oov_scale: float | None = None):
        super().__init__()
        if oov_init not in OOV_INITS:
            raise ValueError(f"oov_init must be one of {OOV_INITS}, got {oov_init!r}")
        scale = OOV_INIT_SCALES[oov_init] if oov_scale is None else oov_scale
        if not scale > 0:
            raise ValueError(f"oov_scale must be positive, got {oov_scale!r}")
        if first_word + num_train_words > len(words):
            raise ValueError(f"{num_train_words} training words after {first_word} specials do not fit a "
                             f"dictionary of {len(words)} symbols")
        self.padding_idx, self.embedding_dim = padding_idx, dim
        vectors = vectors or {}
        head, train, tail = (torch.zeros(b - a, dim) for a, b in _spans(len(words), first_word, num_train_words))
        if oov_init == "uniform":
            nn.init.uniform_(train, -scale, scale)
        else:
            nn.init.normal_(train, std=scale)
        for row, (a, b) in zip((train, tail), list(_spans(len(words), first_word, num_train_words))[1:]):
            for offset, word in enumerate(words[a:b]):
                if word in vectors:
                    row[offset] = vectors[word]
        self.num_pretrained = sum(w in vectors for w in words[first_word:])
        self.register_buffer("head", head)
        self.trainable = nn.Parameter(train)
        self.register_buffer("tail", tail)

    @property
    def weight(self) -> Tensor:
        """The full ``[num_embeddings, dim]`` matrix."""
        return torch.cat([self.head, self.trainable, self.tail])

    def forward(self, tokens: Tensor) -> Tensor:
        return F.embedding(tokens, self.weight, self.padding_idx)
