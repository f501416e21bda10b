"""Sentence encoders (MTSA, Fast-DiSA, DiSAN and the papers' baselines) with the authors' classifiers: one model
class (``--task sentence_encoding``), one architecture per encoder; the task's data decides the head, with input
dropout ``--dropout`` before every dense layer and embeddings as in reference §3.1:

* single sentence: ``y = W_2 act(W_1 e + b_1) (+ b_2)`` (docs/reference.md §3.2, §4.4);
* pair (SNLI, MultiNLI), shared weights: ``[p; h; p - h; p * h]`` -> ``act(W_1 . + b_1)`` -> optional highway
  (reference §3.1) -> ``W_2 . (+ b_2)``;
* relatedness (SICK, Tai et al. 2015): ``[p * h; |p - h|]`` -> ``act(W_1 . + b_1)`` -> 5 logits, the score
  ``sum_k k * softmax_k`` (docs/sentence-tasks.md).
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from fairseq.models import BaseFairseqModel, register_model, register_model_architecture
from torch import Tensor, nn

from ..modules import (
    BiLSTMEncoder,
    DiSAN,
    HierarchicalCNNEncoder,
    MultiCNNEncoder,
    MultiDimSource2Token,
    MultiHeadEncoder,
    ProjectedMultiHeadEncoder,
    SentenceMTSA,
    StackedMTSA,
)
from ..modules.per_head import ACTIVATIONS, activation, glorot_
from ..modules.word_embedding import OOV_INITS, WordEmbedding, read_vectors
from .options import Option, apply_defaults

if TYPE_CHECKING:
    from fairseq.tasks import FairseqTask

logger = logging.getLogger(__name__)

ENCODERS = ("mtsa", "disan", "disan_undirected", "stacked_mtsa", "bilstm", "multi_cnn", "hrchy_cnn", "multi_head",
            "multi_head_proj")
RELATEDNESS_CLASSES = 5  # SICK scores 1..5

# Every option of the sentence_encoder model, with the default an architecture falls back on (see ARCHS).
SENTENCE_OPTIONS = (
    Option("--encoder", "mtsa", "sentence encoder (set by the architecture)", choices=ENCODERS),
    Option("--embed-dim", 300, "word embedding width", type=int, metavar="N"),
    Option("--embedding-path", None, "GloVe or word2vec text file (.gz ok) to initialise the embeddings; default: "
           "random init of every training word (--oov-init)", metavar="FILE"),
    Option("--oov-init", "uniform", "training words without a pretrained vector: uniform U(-0.05, 0.05) (SNLI) or "
           "normal N(0, 1) (SST); reference §3.1", choices=OOV_INITS),
    Option("--oov-init-scale", None, "scale of --oov-init: U(-A, A) or N(0, A^2) (default 0.05 uniform, 1 normal, "
           "the authors'); e.g. 0.25 for Kim (2014)'s CNN-rand U(-0.25, 0.25)", type=float, metavar="A"),
    Option("--encoder-hidden-dim", 600, "MTSA: hn (split over heads); Bi-LSTM: units per direction; Multi-CNN: "
           "filters per window; Hrchy-CNN: layer width; multi-head: units per head", type=int, metavar="N"),
    Option("--encoder-heads", 2, "attention heads (MTSA: even)", type=int, metavar="N"),
    Option("--encoder-layers", 1, "layers (stacked MTSA, Hrchy-CNN)", type=int, metavar="N"),
    Option("--encoder-activation", "elu", "the code's activation_func_name: elu (SNLI) or relu (SST, TREC, CR, ...)",
           choices=tuple(sorted(ACTIVATIONS))),
    Option("--token2token", "sigmoid", "MTSA token2token activation: E_R = sigmoid(R) or exp(R)",
           choices=("sigmoid", "exp")),
    Option("--dropout", 0.0, "input dropout of every dense layer (the code's 1 - dense_keep_prob)", type=float,
           metavar="P"),
    Option("--attention-dropout", 0.0, "MTSA attention dropout (1 - attn_keep_prob; applied as keep sqrt(1 - P))",
           type=float, metavar="P"),
    Option("--disan-chunk-size", None, "DiSA query chunk (default: as many queries as fit 2^24 score elements)",
           type=int, metavar="N"),
    Option("--classifier-hidden-dim", 300, "classifier hidden width", type=int, metavar="N"),
    Option("--classifier-activation", None, "classifier hidden activation (default: --encoder-activation)",
           choices=tuple(sorted(ACTIVATIONS))),
    Option("--classifier-highway", False, "a highway layer after the classifier's hidden layer (MTSA's SNLI model)"),
    Option("--classifier-no-output-bias", False, "no bias on the output layer (the SST models)"),
)


# The options only some encoders read; the others warn when one is set (an experiment passes one set to every arch).
ENCODER_OPTIONS = {
    "mtsa": ("encoder_hidden_dim", "encoder_heads", "token2token", "attention_dropout"),
    "disan": ("disan_chunk_size",),
    "disan_undirected": ("disan_chunk_size",),
    "stacked_mtsa": ("encoder_heads", "encoder_layers", "token2token", "attention_dropout"),
    "bilstm": ("encoder_hidden_dim",),
    "multi_cnn": ("encoder_hidden_dim",),
    "hrchy_cnn": ("encoder_hidden_dim", "encoder_layers"),
    "multi_head": ("encoder_heads", "encoder_hidden_dim"),
    "multi_head_proj": ("encoder_heads", "encoder_hidden_dim"),
}


def ignored_options(args: argparse.Namespace) -> list[str]:
    """The options ``args.encoder`` does not read that are set away from their default, as ``--name value``."""
    specific = {dest for dests in ENCODER_OPTIONS.values() for dest in dests} - set(ENCODER_OPTIONS[args.encoder])
    return [f"{option.flag} {getattr(args, option.dest)}" for option in SENTENCE_OPTIONS
            if option.dest in specific and getattr(args, option.dest, None) not in (None, option.default)]


class MTSASentenceEncoder(nn.Module):
    """:class:`SentenceMTSA` followed by multi-dimensional source2token pooling (reference §3.1-§3.3)."""

    def __init__(self, input_dim: int, hidden_dim: int, num_heads: int, token2token: str, activation_name: str,
                 dropout: float, attn_dropout: float):
        super().__init__()
        self.mtsa = SentenceMTSA(input_dim, hidden_dim, num_heads, attn_dropout=attn_dropout, dense_dropout=dropout,
                                 token2token=token2token, activation_name=activation_name)
        self.pool = MultiDimSource2Token(hidden_dim, activation_name, dropout)
        self.output_dim = hidden_dim

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        return self.pool(self.mtsa(x, key_padding_mask), key_padding_mask)


def build_encoder(args: argparse.Namespace) -> nn.Module:
    """The sentence encoder named by ``args.encoder``; it maps ``[B, L, embed_dim]`` to ``[B, output_dim]``."""
    dim, act, drop = args.embed_dim, args.encoder_activation, args.dropout
    if ignored := ignored_options(args):
        logger.warning(f"the {args.encoder} encoder ignores {', '.join(ignored)}")
    if args.encoder == "mtsa":
        return MTSASentenceEncoder(dim, args.encoder_hidden_dim, args.encoder_heads, args.token2token, act, drop,
                                   args.attention_dropout)
    if args.encoder in ("disan", "disan_undirected"):
        encoder = DiSAN(dim, act, drop, directional=args.encoder == "disan", chunk_size=args.disan_chunk_size)
        encoder.output_dim = 2 * dim
        return encoder
    if args.encoder == "stacked_mtsa":
        return StackedMTSA(dim, dim, args.encoder_heads, args.encoder_layers, dropout=drop,
                           attn_dropout=args.attention_dropout, dense_dropout=drop, activation_name=act,
                           token2token=args.token2token, pool_activation=act)
    if args.encoder == "bilstm":
        return BiLSTMEncoder(dim, args.encoder_hidden_dim, drop, act)
    if args.encoder == "multi_cnn":
        return MultiCNNEncoder(dim, (3, 4, 5), args.encoder_hidden_dim, drop, act)
    if args.encoder == "hrchy_cnn":
        return HierarchicalCNNEncoder(dim, args.encoder_hidden_dim, args.encoder_layers, 3, drop, act)
    if args.encoder == "multi_head":
        return MultiHeadEncoder(dim, args.encoder_heads, args.encoder_hidden_dim, drop, act)
    if args.encoder == "multi_head_proj":
        return ProjectedMultiHeadEncoder(dim, args.encoder_heads, args.encoder_hidden_dim, drop, act)
    raise ValueError(f"unknown --encoder {args.encoder!r}; choose one of {ENCODERS}")


class Highway(nn.Module):
    """``g * act(W_t x + b_t) + (1 - g) * x``, ``g = sigmoid(W_g x + b_g)``, input dropout on both (reference §3.1)."""

    def __init__(self, dim: int, activation_name: str, dropout: float):
        super().__init__()
        self.transform, self.gate = glorot_(nn.Linear(dim, dim)), glorot_(nn.Linear(dim, dim))
        self.act, self.dropout = activation(activation_name), dropout

    def forward(self, x: Tensor) -> Tensor:
        t = self.act(self.transform(F.dropout(x, self.dropout, self.training)))
        g = torch.sigmoid(self.gate(F.dropout(x, self.dropout, self.training)))
        return g * t + (1.0 - g) * x


class ClassifierHead(nn.Module):
    """``act(W_1 x + b_1)`` -> optional highway -> ``W_2 . (+ b_2)``, input dropout before every dense layer."""

    def __init__(self, input_dim: int, hidden_dim: int, num_outputs: int, activation_name: str, dropout: float,
                 highway: bool, output_bias: bool):
        super().__init__()
        self.hidden = glorot_(nn.Linear(input_dim, hidden_dim))
        self.out = glorot_(nn.Linear(hidden_dim, num_outputs, bias=output_bias))
        self.highway = Highway(hidden_dim, activation_name, dropout) if highway else None
        self.act, self.dropout = activation(activation_name), dropout

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.hidden(F.dropout(x, self.dropout, self.training)))
        if self.highway is not None:
            h = self.highway(h)
        return self.out(F.dropout(h, self.dropout, self.training))


@register_model("sentence_encoder")
class SentenceEncoderModel(BaseFairseqModel):
    """Embedding -> sentence encoder -> task head; ``forward`` returns logits ``[B, classes]``."""

    def __init__(self, args: argparse.Namespace, embedding: WordEmbedding, encoder: nn.Module, head: ClassifierHead,
                 kind: str):
        super().__init__()
        self.args, self.kind = args, kind
        self.embedding, self.encoder, self.head = embedding, encoder, head

    @staticmethod
    def add_args(parser: argparse.ArgumentParser) -> None:
        for option in SENTENCE_OPTIONS:
            option.add_to(parser)

    @classmethod
    def build_model(cls, args: argparse.Namespace, task: FairseqTask) -> SentenceEncoderModel:
        sentence_encoder_base(args)
        dictionary = task.source_dictionary
        words = [dictionary[i] for i in range(len(dictionary))]
        vectors = None
        if args.embedding_path:
            vectors = read_vectors(args.embedding_path, set(words[dictionary.nspecial:]), args.embed_dim)
            train = words[dictionary.nspecial:dictionary.nspecial + task.num_train_words]
            if not vectors:
                raise ValueError(f"{args.embedding_path} holds a vector for none of the "
                                 f"{len(words) - dictionary.nspecial} dictionary words")
            logger.info(f"{args.embedding_path}: vectors for {sum(w in vectors for w in train):,} of the "
                        f"{len(train):,} training words and {len(vectors):,} words in all")
        embedding = WordEmbedding(words, task.num_train_words, dictionary.nspecial, args.embed_dim, vectors,
                                  args.oov_init, dictionary.pad(), args.oov_init_scale)
        encoder = build_encoder(args)
        width = encoder.output_dim
        kind = task.kind
        inputs = {"single": width, "pair": 4 * width, "relatedness": 2 * width}[kind]
        outputs = RELATEDNESS_CLASSES if kind == "relatedness" else task.num_classes
        head = ClassifierHead(inputs, args.classifier_hidden_dim, outputs,
                              args.classifier_activation or args.encoder_activation, args.dropout,
                              args.classifier_highway, not args.classifier_no_output_bias)
        return cls(args, embedding, encoder, head, kind)

    def encode(self, tokens: Tensor) -> Tensor:
        """Sentence vectors ``[B, output_dim]`` of right- or left-padded ``tokens [B, L]``."""
        mask = tokens.eq(self.embedding.padding_idx)
        return self.encoder(self.embedding(tokens), mask if mask.any() else None)

    def forward(self, src_tokens: Tensor, src_lengths: Tensor | None = None, src_tokens1: Tensor | None = None,
                src_lengths1: Tensor | None = None) -> Tensor:
        if self.kind == "single":
            return self.head(self.encode(src_tokens))
        if src_tokens1 is None:
            raise ValueError(f"a {self.kind} model needs the second sentence (src_tokens1)")
        p, h = self.encode(src_tokens), self.encode(src_tokens1)
        features = [p, h, p - h, p * h] if self.kind == "pair" else [p * h, (p - h).abs()]
        return self.head(torch.cat(features, dim=-1))

    def regularized_weights(self) -> list[Tensor]:
        """Weights the code's L2 term covers: every dense/recurrent/convolution weight (>= 2-D), not the
        embeddings and not biases (reference §3.1 step 5)."""
        return [p for name, p in self.named_parameters()
                if p.dim() >= 2 and "bias" not in name.rsplit(".", 1)[-1] and not name.startswith("embedding.")]

    def max_positions(self) -> int | None:
        return None


def sentence_encoder_base(args: argparse.Namespace) -> None:
    """Fill every option the user left unset with its default (:data:`SENTENCE_OPTIONS`)."""
    apply_defaults(args, SENTENCE_OPTIONS)


# Each architecture: its docstring and the defaults it sets before SENTENCE_OPTIONS' (the user's options win).
ARCHS = {
    "mtsa_encoder": ("MTSA as in the SNLI/SST code (reference §3.1, §9.8): 2 heads x 300, E_R = sigmoid(q.k / "
                     "sqrt(300)) with strict forward/backward masks, E_S = exp of a 2-layer source2token on v, fusion "
                     "gate, pooling.", {"encoder": "mtsa"}),
    "fast_disa_encoder": ("Fast-DiSA: its released ``fast_directional_self_attention`` is line for line the MTSA API "
                          "(reference §5), so this is the same model with that function's defaults: 2 heads, E_R = "
                          "exp(q.k / sqrt(d)) with strict forward/backward masks, relu, fusion gate.",
                          {"encoder": "mtsa", "token2token": "exp", "encoder_activation": "relu"}),
    "disan_encoder": ("DiSAN (reference §4): forward and backward DiSA blocks of the embedding width, pooled to 600.",
                      {"encoder": "disan"}),
    "disan_undirected_encoder": ('The papers\' "DiSAN without directions": both DiSA blocks use the ``i != j`` mask.',
                                 {"encoder": "disan_undirected"}),
    "stacked_mtsa_encoder": ("``stacking_mtsa`` (reference §2.5) over the embeddings, pooled: 10 layers; 10 heads of "
                             "30 (the API's 8 heads do not divide 300).",
                             {"encoder": "stacked_mtsa", "encoder_heads": 10, "encoder_layers": 10,
                              "token2token": "exp", "encoder_activation": "relu"}),
    "bilstm_encoder": ("Bi-LSTM baseline, 600D (300 per direction), pooled.",
                       {"encoder": "bilstm", "encoder_hidden_dim": 300}),
    "multi_cnn_encoder": ("Multi-window CNN baseline: windows 3/4/5, 200 filters each (600D), pooled.",
                          {"encoder": "multi_cnn", "encoder_hidden_dim": 200}),
    "hrchy_cnn_encoder": ("Hierarchical CNN baseline: 3 gated residual convolution layers of 300, pooled.",
                          {"encoder": "hrchy_cnn", "encoder_hidden_dim": 300, "encoder_layers": 3}),
    "multi_head_encoder": ("The papers' multi-head attention baseline as the authors' code computes it (reference "
                           "§4.5): 8 heads x 75 (600D), one bias-free weight, no output projection, pooled.",
                           {"encoder": "multi_head", "encoder_heads": 8, "encoder_hidden_dim": 75}),
    "multi_head_proj_encoder": ("The project's first multi-head baseline (nn.MultiheadAttention after a biased "
                                "projection to 8 x 75, Vaswani et al.'s positions), pooled; kept for the results "
                                "measured with it.",
                                {"encoder": "multi_head_proj", "encoder_heads": 8, "encoder_hidden_dim": 75}),
}


def _register(arch: str, doc: str, defaults: dict) -> None:
    def arch_fn(args: argparse.Namespace) -> None:
        args.encoder = defaults["encoder"]  # the architecture is the encoder
        apply_defaults(args, SENTENCE_OPTIONS, **defaults)

    arch_fn.__name__, arch_fn.__doc__ = arch, doc
    register_model_architecture("sentence_encoder", arch)(arch_fn)


for _arch, (_doc, _defaults) in ARCHS.items():
    _register(_arch, _doc, _defaults)
