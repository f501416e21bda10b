"""The MTSA encoder's and decoder's passes (models/transformer_mtsa.py): fairseq's ``has_pads`` read once, the
layers' underflow checks deferred to one read after the pass, the decoder's future mask read once, and the same
outputs as the layers run one by one, each with its own check, including when a layer's linear-space products
underflow and when a sequence is padding only."""

from pathlib import Path

import pytest
import torch
from fairseq import options, tasks

import mtsa_fairseq.plugin
from mtsa_fairseq.experiments.bench.launches import count_step
from mtsa_fairseq.modules.mtsa_attention import MTSAMultiheadAttention

USER_DIR = str(Path(mtsa_fairseq.__file__).parent)


def build(tmp_path: Path, arch: str, *extra: str):
    for lang in ("en", "de"):
        (tmp_path / f"dict.{lang}.txt").write_text("".join(f"w{i} 1\n" for i in range(60)))
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(tmp_path), "--user-dir", USER_DIR, "--arch", arch, "--share-all-embeddings", "--task", "translation",
        "-s", "en", "-t", "de", "--encoder-layers", "3", *extra])
    torch.manual_seed(0)
    return tasks.setup_task(args).build_model(args).train()


def sources(padding_only: bool = False) -> torch.Tensor:
    tokens = torch.randint(4, 64, (3, 7))
    tokens[1, :3] = 1  # left-padded, as fairseq batches sources
    if padding_only:
        tokens[2] = 1
    return tokens


def layer_by_layer(encoder, tokens: torch.Tensor) -> torch.Tensor:
    """The encoder's output with every layer called on its own, each checking its own rows."""
    pad = tokens.eq(encoder.padding_idx)
    x, _ = encoder.forward_embedding(tokens)
    x = (x * (1 - pad.unsqueeze(-1).type_as(x))).transpose(0, 1)
    for layer in encoder.layers:
        x = layer(x, encoder_padding_mask=pad)
    return x


def record_calls(monkeypatch, layers) -> list[int]:
    """The list to which every MTSA self-attention call of ``layers`` appends its layer's index."""
    calls = []
    forward = MTSAMultiheadAttention.forward

    def recording(self, *args, **kwargs):
        calls.append(next(i for i, layer in enumerate(layers) if layer.self_attn is self))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(MTSAMultiheadAttention, "forward", recording)
    return calls


@pytest.mark.parametrize("padding_only", [False, True], ids=["padded", "a-sequence-of-padding-only"])
def test_the_pass_equals_its_layers_run_one_by_one(tmp_path, padding_only):
    encoder = build(tmp_path, "transformer_mtsa_tiny", "--dropout", "0").encoder
    tokens = sources(padding_only)
    out = encoder(tokens, None)["encoder_out"][0]
    torch.testing.assert_close(out, encoder.layer_norm(layer_by_layer(encoder, tokens)) if encoder.layer_norm
                               else layer_by_layer(encoder, tokens), rtol=1e-5, atol=1e-6)
    if padding_only:  # MTSA's rows without a key are 0, before the residual connection
        assert torch.isfinite(out).all()


def test_a_layer_whose_products_underflow_runs_again_with_every_layer_after_it(tmp_path, monkeypatch):
    encoder = build(tmp_path, "transformer_mtsa_tiny", "--dropout", "0").encoder
    with torch.no_grad():  # sigmoid(-1e4 / sqrt(d)) is 0 in float32: every denominator of the second layer is 0
        encoder.layers[1].self_attn.s2t.bias.fill_(-1e4)
    calls = record_calls(monkeypatch, encoder.layers)
    tokens = sources()
    out = encoder(tokens, None)["encoder_out"][0]
    assert calls == [0, 1, 2, 1, 2]
    calls.clear()
    expected = layer_by_layer(encoder, tokens)
    torch.testing.assert_close(out, encoder.layer_norm(expected) if encoder.layer_norm else expected)
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in encoder.parameters() if p.grad is not None)


def test_with_layerdrop_the_layers_that_ran_run_again(tmp_path, monkeypatch):
    """--encoder-layerdrop: from the layer that underflowed on, a pass runs again the layers it ran (not a new draw,
    not none); in evaluation every layer runs, as without layerdrop."""
    encoder = build(tmp_path, "transformer_mtsa_tiny", "--dropout", "0", "--encoder-layerdrop", "0.5").encoder
    with torch.no_grad():
        encoder.layers[1].self_attn.s2t.bias.fill_(-1e4)
    calls = record_calls(monkeypatch, [encoder.layers[i] for i in range(3)])  # iterating the layers would drop some
    tokens = sources()
    draws = []
    for seed in range(12):
        torch.manual_seed(seed)
        calls.clear()
        encoder(tokens, None)
        ran = sorted(set(calls))
        assert calls == ran + ([index for index in ran if index >= 1] if 1 in ran else [])
        draws.append(ran)
    assert any(1 in ran and len(ran) < 3 for ran in draws)  # some pass dropped a layer and reran the others
    encoder.eval()
    calls.clear()
    with torch.no_grad():
        out = encoder(tokens, None)["encoder_out"][0]
        assert calls == [0, 1, 2, 1, 2]
        expected = layer_by_layer(encoder, tokens)
    torch.testing.assert_close(out, encoder.layer_norm(expected) if encoder.layer_norm else expected)

@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_the_encoder_reads_the_host_twice_per_pass_where_fairseqs_reads_once_per_layer(tmp_path, padded):
    """MTSA: the most padding of a sequence before the layers, whether a layer underflowed after them, nothing in
    the backward; fairseq's encoder reads ``has_pads`` before every layer (and a CPU flag once). Both embed the
    same way (fairseq's sinusoidal positions read shapes kept as CPU tensors)."""
    tokens = sources() if padded else torch.randint(4, 64, (3, 7))
    mtsa = build(tmp_path, "transformer_mtsa_tiny").encoder
    stock = build(tmp_path, "transformer_tiny", "--encoder-layers", "3").encoder
    embedding = count_step(lambda: stock.forward_embedding(tokens)[0])["forward"]["syncs"]
    counts = count_step(lambda: mtsa(tokens, None)["encoder_out"][0])
    assert counts["forward"]["syncs_by_name"] == {"_local_scalar_dense": embedding + 2}
    assert counts["backward"]["syncs"] == 0
    counts = count_step(lambda: stock(tokens, None)["encoder_out"][0])
    assert counts["forward"]["syncs_by_name"] == {"_local_scalar_dense": embedding + 1 + 3}


def test_activation_checkpointing_recomputes_the_same_gradients(tmp_path):
    """fairseq's --checkpoint-activations reruns each layer's forward in the backward, outside the shared pass: each
    layer then checks on its own, and the gradients are the pass's."""
    grads = []
    for extra in ([], ["--checkpoint-activations"]):
        encoder = build(tmp_path, "transformer_mtsa_tiny", "--dropout", "0", *extra).encoder
        encoder(sources(), None)["encoder_out"][0].pow(2).sum().backward()
        grads.append([p.grad for p in encoder.parameters()])
    for plain, checkpointed in zip(*grads):
        torch.testing.assert_close(plain, checkpointed)


def targets() -> torch.Tensor:
    tokens = torch.randint(4, 64, (3, 6))
    tokens[:, 0] = 2  # fairseq's previous output tokens start with </s>
    tokens[1, 4:] = 1  # right-padded, as fairseq batches targets
    return tokens


@pytest.mark.parametrize("underflow", [False, True], ids=["plain", "a-layer-underflows"])
def test_the_decoder_pass_equals_its_layers_checking_one_by_one(tmp_path, monkeypatch, underflow):
    """A causal MTSA decoder's pass over whole targets shares one check; when a layer's products underflow the
    whole pass runs again with each layer checking on its own, and the output is that of the layers checking
    one by one (fairseq's own pass, ``extract_features_scriptable``)."""
    model = build(tmp_path, "transformer_mtsa_tiny", "--dropout", "0", "--decoder-self-attention-type", "mtsa",
                  "--decoder-layers", "3")
    decoder = model.decoder
    if underflow:
        with torch.no_grad():
            decoder.layers[1].self_attn.s2t.bias.fill_(-1e4)
    encoder_out = model.encoder(sources(), None)
    calls = record_calls(monkeypatch, decoder.layers)
    prev = targets()
    out = decoder(prev, encoder_out)[0]
    assert calls == ([0, 1, 2, 0, 1, 2] if underflow else [0, 1, 2])
    expected = decoder.output_layer(decoder.extract_features_scriptable(prev, encoder_out)[0])
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in decoder.parameters() if p.grad is not None)


def test_the_mtsa_decoder_reads_the_host_once_per_pass_more_than_fairseqs(tmp_path):
    """fairseq's decoder reads once whether the targets hold padding; the MTSA decoder's layers add one read after
    the pass (not one per layer) and, in the first pass only, one reading the future mask, nothing in the backward."""
    prev = targets()
    syncs = []
    for extra in ((), ("--decoder-self-attention-type", "mtsa")):
        model = build(tmp_path, "transformer_mtsa_tiny", "--decoder-layers", "3", *extra)
        with torch.no_grad():
            encoder_out = model.encoder(sources(), None)
        for _ in range(2):
            counts = count_step(lambda decoder=model.decoder, out=encoder_out: decoder(prev, out)[0])
            assert counts["backward"]["syncs"] == 0
            syncs.append(counts["forward"]["syncs"])
    assert syncs[2:] == [syncs[0] + 2, syncs[1] + 1]


def test_a_future_mask_changed_in_place_is_checked_again():
    m = MTSAMultiheadAttention(8, 2, causal=True)
    x = torch.randn(5, 2, 8)
    buffer = torch.triu(torch.full((6, 6), float("-inf")), 1)
    m(x, x, x, attn_mask=buffer[:5, :5])
    m(x, x, x, attn_mask=buffer[:5, :5])  # the same buffer, unchanged: not read again
    buffer[4, 0] = float("-inf")
    with pytest.raises(ValueError, match="accepts only the decoder's future mask"):
        m(x, x, x, attn_mask=buffer[:5, :5])


def test_mtsa_kernel_offers_only_the_exp_forms_kernels(tmp_path, capsys):
    """The translation models' token2token form is exp: fairseq's parser refuses ``--mtsa-kernel flex`` (a sigmoid
    form's kernel) in one line, before any data is read, where it used to fail at the first forward."""
    with pytest.raises(SystemExit) as exit_info:
        build(tmp_path, "transformer_mtsa_tiny", "--mtsa-kernel", "flex")
    assert exit_info.value.code == 2
    assert "argument --mtsa-kernel: invalid choice: 'flex'" in capsys.readouterr().err
    model = build(tmp_path, "transformer_mtsa_tiny", "--mtsa-kernel", "dense")
    assert {layer.self_attn.kernel for layer in model.encoder.layers} == {"dense"}
