"""fairseq's Transformer with MTSA as the encoder self-attention (docs/reference.md §1), and optionally as the
decoder self-attention (causal, with cached incremental decoding). Everything else is fairseq's own, extended through
its hooks (``build_encoder``/``build_decoder``, ``build_encoder_layer``/``build_decoder_layer``,
``build_self_attention``); each architecture takes every default of its fairseq counterpart."""

from __future__ import annotations

import math
import os
from argparse import ArgumentParser, Namespace
from typing import TYPE_CHECKING, Any

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerDecoder, TransformerEncoder, TransformerModel
from fairseq.models.transformer import transformer_legacy as legacy
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor, nn

from ..modules.mtsa_attention import S2T_ACTIVATIONS, S2T_INPUTS, MTSAMultiheadAttention, shared_pass
from ..modules.mtsa_core import EXP_KERNELS, SharedPass
from ..modules.per_head import ACTIVATIONS
from .options import Option, apply_defaults, option_value

if TYPE_CHECKING:
    from fairseq.data import Dictionary

# The defaults are what the authors ran (reference §1.3, §1.4: Setup 2).
MTSA_OPTIONS = (
    Option("--encoder-self-attention-type", "mtsa", "MTSA or fairseq's multi-head attention in the encoder "
           "(ablation)", choices=("mtsa", "standard")),
    Option("--decoder-self-attention-type", "standard", "fairseq's multi-head attention (as the authors ran) or "
           "causal MTSA with cached incremental decoding in the decoder self-attention; MTSA there needs a sigmoid "
           "--mtsa-s2t-activation", choices=("standard", "mtsa")),
    Option("--mtsa-s2t-input", "v", "source2token input: per-head values v (authors' runs) or keys k",
           choices=S2T_INPUTS),
    Option("--mtsa-s2t-activation", "scaled_sigmoid", "source2token activation; scaled_* divide the logits by "
           "sqrt(d_head)", choices=S2T_ACTIVATIONS),
    Option("--mtsa-s2t-bias-init", 0.0, "initial source2token bias (bias_start): 5 in Setup 1", type=float,
           metavar="B"),
    Option("--mtsa-s2t-hidden-activation", "none", "activation of an extra per-head source2token layer "
           "(afn_extra); none = the single layer the authors ran", choices=("none", *sorted(ACTIVATIONS))),
    Option("--mtsa-kernel", "auto", "how the MTSA layers compute their attention core (mtsa_core's kernel): sdpa, "
           "two SDPA calls; auto, sdpa except for larger CPU batches with keys up to 256, there dense; sdpa-joint, "
           "one SDPA call over the joined values (no attention dropout: for inference, or training with "
           "--attention-dropout 0); dense, the scores materialised per query chunk; triton, the fused Triton kernel "
           "(CUDA, with Triton installed) (docs/kernel.md)",
           choices=EXP_KERNELS),
    Option("--mtsa-bi-directional", False, "forward masks on the first half of the encoder heads, backward on the "
           "rest (diagonal included); off as the authors ran; the decoder is always causal"),
)
_BY_DEST = {option.dest: option for option in MTSA_OPTIONS}


def mtsa_option(cfg: Namespace | TransformerConfig, name: str) -> Any:
    """The MTSA option ``name`` of ``cfg`` (its default from :data:`MTSA_OPTIONS` where unset)."""
    return option_value(cfg, _BY_DEST[name])


def check_mtsa_options(cfg: TransformerConfig, training: bool = False, cpu: bool = False) -> None:
    """Raise ValueError for MTSA options that cannot build a model, or that no layer would use (called by the model
    and its MTSA layers). ``training`` (on the CPU: ``cpu``), as the experiment tooling checks before it launches
    fairseq-train: also a kernel that cannot train so (``sdpa-joint`` with attention dropout, ``triton`` on the
    CPU)."""
    encoder = mtsa_option(cfg, "encoder_self_attention_type") == "mtsa"
    if not encoder and mtsa_option(cfg, "decoder_self_attention_type") != "mtsa":
        unused = [option.flag for option in MTSA_OPTIONS
                  if option.flag.startswith("--mtsa-") and mtsa_option(cfg, option.dest) != option.default]
        if unused:
            raise ValueError(f"{unused[0]} has no effect: no layer uses MTSA (--encoder-self-attention-type and "
                             "--decoder-self-attention-type are both standard)")
    if not encoder and mtsa_option(cfg, "mtsa_bi_directional"):
        raise ValueError("--mtsa-bi-directional has no effect: it masks the encoder's MTSA heads, and "
                         "--encoder-self-attention-type is standard (the decoder's MTSA is always causal)")
    if not math.isfinite(mtsa_option(cfg, "mtsa_s2t_bias_init")):
        raise ValueError(f"--mtsa-s2t-bias-init must be finite, got {mtsa_option(cfg, 'mtsa_s2t_bias_init')}")
    kernel = mtsa_option(cfg, "mtsa_kernel")
    if training and kernel == "sdpa-joint" and cfg.attention_dropout > 0:
        raise ValueError(f"--mtsa-kernel sdpa-joint has no attention dropout: train with --attention-dropout 0 "
                         f"(got {cfg.attention_dropout}) or another kernel")
    if training and cpu and kernel == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("--mtsa-kernel triton runs on CUDA (on the CPU only under TRITON_INTERPRET=1)")
    if (encoder and mtsa_option(cfg, "mtsa_bi_directional")
            and cfg.encoder.attention_heads % 2):
        raise ValueError("--mtsa-bi-directional splits the heads into forward and backward halves and needs an "
                         f"even --encoder-attention-heads, got {cfg.encoder.attention_heads}")
    if mtsa_option(cfg, "decoder_self_attention_type") == "mtsa":
        if cfg.cross_self_attention:
            raise ValueError("--decoder-self-attention-type mtsa is a plain causal self-attention: it cannot be "
                             "combined with --cross-self-attention")
        activation = mtsa_option(cfg, "mtsa_s2t_activation")
        if not activation.endswith("sigmoid"):
            raise ValueError("--decoder-self-attention-type mtsa needs --mtsa-s2t-activation sigmoid or "
                             f"scaled_sigmoid, got {activation}: exp source2token weights are shifted by a "
                             "sequence-wide maximum, which is not causal")


def _mtsa_attention(layer: nn.Module, embed_dim: int, num_heads: int, cfg: TransformerConfig,
                    **masks: bool) -> MTSAMultiheadAttention:
    """MTSA with the ``--mtsa-*`` options shared by encoder and decoder, and the layer's quant-noise."""
    hidden = mtsa_option(cfg, "mtsa_s2t_hidden_activation")
    return MTSAMultiheadAttention(
        embed_dim, num_heads, dropout=cfg.attention_dropout, q_noise=layer.quant_noise,
        qn_block_size=layer.quant_noise_block_size, s2t_input=mtsa_option(cfg, "mtsa_s2t_input"),
        s2t_activation=mtsa_option(cfg, "mtsa_s2t_activation"), s2t_bias_init=mtsa_option(cfg, "mtsa_s2t_bias_init"),
        s2t_hidden_activation=None if hidden == "none" else hidden, kernel=mtsa_option(cfg, "mtsa_kernel"), **masks,
    )


def _wrap_layer(layer: nn.Module, cfg: TransformerConfig) -> nn.Module:
    """The activation-checkpoint and FSDP wrapping fairseq's encoder and decoder apply to a new layer."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class MTSAEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer whose self-attention is :class:`MTSAMultiheadAttention`."""

    def build_self_attention(self, embed_dim: int, cfg: TransformerConfig) -> nn.Module:
        if mtsa_option(cfg, "encoder_self_attention_type") != "mtsa":
            return super().build_self_attention(embed_dim, cfg)
        check_mtsa_options(cfg)
        return _mtsa_attention(self, embed_dim, cfg.encoder.attention_heads, cfg,
                               bi_directional=mtsa_option(cfg, "mtsa_bi_directional"))


class MTSADecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer; with ``--decoder-self-attention-type mtsa`` its self-attention is a
    causal :class:`MTSAMultiheadAttention` (encoder-decoder attention stays fairseq's)."""

    def build_self_attention(self, embed_dim: int, cfg: TransformerConfig, add_bias_kv: bool = False,
                             add_zero_attn: bool = False) -> nn.Module:
        if mtsa_option(cfg, "decoder_self_attention_type") != "mtsa":
            return super().build_self_attention(embed_dim, cfg, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        if add_bias_kv or add_zero_attn:
            raise ValueError("--decoder-self-attention-type mtsa is a plain causal self-attention: it cannot be "
                             "combined with add_bias_kv or add_zero_attn")
        check_mtsa_options(cfg)
        return _mtsa_attention(self, embed_dim, cfg.decoder.attention_heads, cfg, causal=True)


class TransformerMTSAEncoder(TransformerEncoder):
    """fairseq's encoder with :class:`MTSAEncoderLayer` layers, whose pass reads fairseq's ``has_pads`` on the host
    once, not before every layer. Outside TorchScript and torch.compile its MTSA layers share one ``SharedPass`` (one
    key mask, one host read after the pass of whether a layer's products underflowed); from the first layer that
    underflowed on, the layers run again, each with its own check (docs/kernel.md, "Large activations")."""

    def build_encoder_layer(self, args: Namespace) -> nn.Module:
        cfg = TransformerConfig.from_namespace(args)
        return _wrap_layer(MTSAEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    def forward_scriptable(self, src_tokens: Tensor, src_lengths: Tensor | None = None,
                           return_all_hiddens: bool = False,
                           token_embeddings: Tensor | None = None) -> dict[str, list[Tensor]]:
        """fairseq's ``forward_scriptable``, ``has_pads`` read once (see the class docstring)."""
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        # the most padding in one sequence, the pass's one host read before its layers
        most = int(encoder_padding_mask.sum(dim=1).amax()) if src_tokens.numel() else 0
        has_pads = src_tokens.device.type == "xla" or most > 0
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if has_pads:  # padding positions enter the layers as zeros
            x = x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x))
        x = x.transpose(0, 1)  # B x T x C -> T x B x C
        padding = encoder_padding_mask if has_pads else None
        encoder_states = [x] if return_all_hiddens else []
        fc_results = []
        if torch.jit.is_scripting():
            for layer in self.layers:
                x = layer(x, encoder_padding_mask=padding)
        else:
            outputs = self._eager_layers(x, padding, most == src_tokens.shape[1])
            x = outputs[-1][0] if outputs else x
            if return_all_hiddens:
                encoder_states += [out for out, _ in outputs]
                fc_results += [fc_result for _, fc_result in outputs]
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        src_lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {"encoder_out": [x], "encoder_padding_mask": [encoder_padding_mask],
                "encoder_embedding": [encoder_embedding], "encoder_states": encoder_states, "fc_results": fc_results,
                "src_tokens": [], "src_lengths": [src_lengths]}

    @torch.jit.unused
    def _eager_layers(self, x: Tensor, padding: Tensor | None,
                      padding_only: bool) -> list[tuple[Tensor, Tensor | None]]:
        """Each layer's ``(x, fc_result)``, the MTSA layers sharing one SharedPass (see the class docstring);
        ``padding_only``: whether a sequence is padding only."""
        layers = list(self.layers)  # a LayerDropModuleList draws the layers it drops on each iteration: once here
        if torch.compiler.is_compiling():
            return _run_layers(layers, x, padding)
        inputs, outputs, owners = [], [], []
        with shared_pass(SharedPass(every_row_has_key=not padding_only)) as shared:
            for index, layer in enumerate(layers):
                inputs.append(x)
                calls = len(shared.dens)
                outputs += _run_layers([layer], x, padding)
                x = outputs[-1][0]
                owners += [index] * (len(shared.dens) - calls)
            first = shared.first_underflowed()
        if first is None:
            return outputs
        index = owners[first]
        return outputs[:index] + _run_layers(layers[index:], inputs[index], padding)


def _run_layers(layers, x: Tensor, padding: Tensor | None) -> list[tuple[Tensor, Tensor | None]]:
    """Each encoder layer's ``(x, fc_result)``, each layer taking the one before's ``x``."""
    outputs = []
    for layer in layers:
        out = layer(x, encoder_padding_mask=padding)
        x, fc_result = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
        outputs.append((x, fc_result))
    return outputs


class TransformerMTSADecoder(TransformerDecoder):
    """fairseq's decoder with :class:`MTSADecoderLayer` layers. A pass over whole targets (training, scoring: no
    incremental state) outside TorchScript and torch.compile shares one ``SharedPass`` across its MTSA layers, as the
    encoder's does: one host read after the pass; if a layer's products underflowed, the pass runs again with each
    layer checking on its own. Incremental decoding checks per call (a step cannot run twice on its cache)."""

    def build_decoder_layer(self, args: Namespace, no_encoder_attn: bool = False) -> nn.Module:
        cfg = TransformerConfig.from_namespace(args)
        return _wrap_layer(MTSADecoderLayer(cfg, no_encoder_attn), cfg)

    def extract_features(self, prev_output_tokens: Tensor, encoder_out: dict[str, list[Tensor]] | None,
                         incremental_state: dict[str, dict[str, Tensor | None]] | None = None,
                         full_context_alignment: bool = False, alignment_layer: int | None = None,
                         alignment_heads: int | None = None) -> tuple[Tensor, dict[str, list[Tensor | None]]]:
        if torch.jit.is_scripting() or incremental_state is not None:
            return self.extract_features_scriptable(prev_output_tokens, encoder_out, incremental_state,
                                                    full_context_alignment, alignment_layer, alignment_heads)
        return self._shared_pass(prev_output_tokens, encoder_out, full_context_alignment, alignment_layer,
                                 alignment_heads)

    @torch.jit.unused
    def _shared_pass(self, prev_output_tokens: Tensor, encoder_out: dict[str, list[Tensor]] | None,
                     full_context_alignment: bool, alignment_layer: int | None,
                     alignment_heads: int | None) -> tuple[Tensor, dict[str, list[Tensor | None]]]:
        args = (prev_output_tokens, encoder_out, None, full_context_alignment, alignment_layer, alignment_heads)
        if torch.compiler.is_compiling():
            return self.extract_features_scriptable(*args)
        with shared_pass(SharedPass()) as shared:
            features = self.extract_features_scriptable(*args)
            underflowed = shared.first_underflowed() is not None
        return self.extract_features_scriptable(*args) if underflowed else features


@register_model("transformer_mtsa")
class TransformerMTSAModel(TransformerModel):
    """Transformer (Vaswani et al., 2017) with multi-mask tensorized self-attention in the encoder
    (and, on request, in the decoder)."""

    @classmethod
    def hub_models(cls) -> dict:
        return {}

    @staticmethod
    def add_args(parser: ArgumentParser) -> None:
        TransformerModel.add_args(parser)
        group = parser.add_argument_group("MTSA self-attention")
        for option in MTSA_OPTIONS:
            option.add_to(group)

    @classmethod
    def build_model(cls, args: Namespace, task: Any) -> TransformerMTSAModel:
        check_mtsa_options(TransformerConfig.from_namespace(args))
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args: Namespace, src_dict: Dictionary, embed_tokens: nn.Embedding) -> TransformerEncoder:
        return TransformerMTSAEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args: Namespace, tgt_dict: Dictionary, embed_tokens: nn.Embedding) -> TransformerDecoder:
        return TransformerMTSADecoder(
            args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False)
        )


def _register(arch: str, fairseq_arch) -> None:
    def arch_fn(args: Namespace) -> None:
        apply_defaults(args, MTSA_OPTIONS)
        fairseq_arch(args)

    arch_fn.__doc__ = f"{fairseq_arch.__name__} with MTSA encoder self-attention."
    register_model_architecture("transformer_mtsa", arch)(arch_fn)


for _arch, _fairseq_arch in {
    "transformer_mtsa": legacy.base_architecture,
    "transformer_mtsa_tiny": legacy.tiny_architecture,
    "transformer_mtsa_iwslt_de_en": legacy.transformer_iwslt_de_en,
    "transformer_mtsa_wmt_en_de": legacy.transformer_wmt_en_de,
    "transformer_mtsa_vaswani_wmt_en_de_big": legacy.transformer_vaswani_wmt_en_de_big,
    "transformer_mtsa_wmt_en_de_big": legacy.transformer_wmt_en_de_big,
}.items():
    _register(_arch, _fairseq_arch)
