"""The stacked MTSA encoder (mtsa_fairseq/modules/stacked_mtsa.py): the API's ``stacking_mtsa`` of docs/reference.md
§2.5 and the dropout masks of its accelerated path (reference §2.3)."""

import pytest
import torch
import torch.nn.functional as F

from mtsa_fairseq.modules.sentence_mtsa import SentenceMTSA
from mtsa_fairseq.modules.stacked_mtsa import StackedMTSA, StackedMTSALayer

D = 8


def test_stacked_mtsa_requires_equal_widths():
    with pytest.raises(ValueError, match="input_dim == hidden_dim"):
        StackedMTSA(D, hidden_dim=2 * D)
    model = StackedMTSA(D, hidden_dim=D, num_heads=2, num_layers=1)
    with pytest.raises(ValueError, match="input width"):
        model(torch.randn(1, 3, D + 1))


def test_stacked_mtsa_defaults_and_layer_config():
    model = StackedMTSA(16)
    assert len(model.layers) == 10 and model.output_dim == 16
    layer = model.layers[0]
    assert isinstance(layer, StackedMTSALayer)
    assert (layer.dropout, layer.dense_dropout) == (0.2, 0.1)
    attn = layer.attn
    assert attn.num_heads == 8 and attn.attn_dropout == 0.2 and attn.dense_dropout == 0.1
    assert attn.gate is None and attn.attn_input == "x" and attn.s2t_hidden is None and not attn.activate_v
    assert attn.out_layer is not None and attn.out_layer.out_features == 16
    assert attn.v_proj.bias is None and attn.q_proj.bias is None and attn.k_proj.bias is None
    assert attn.direction == "bi" and not attn.attn_self and attn.token2token == "exp"
    assert layer.ffn_norm.eps == 1e-6 and layer.attn_norm.eps == 1e-6
    assert len(StackedMTSA(16, num_layers=3).layers) == 3
    assert StackedMTSA(16, pool=False).pool is None


def test_stacked_mtsa_matches_spelled_out_post_ln_loop():
    torch.manual_seed(1)
    model = StackedMTSA(D, num_heads=4, num_layers=2, pool=False).double().eval()
    x = torch.randn(3, 6, D, dtype=torch.float64)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[1, :2] = True
    mask[2, 4:] = True
    h = x
    for layer in model.layers:
        h = F.layer_norm(h + F.relu(layer.ffn(h)), (D,), layer.ffn_norm.weight, layer.ffn_norm.bias, 1e-6)
        h = F.layer_norm(h + layer.attn(h, mask), (D,), layer.attn_norm.weight, layer.attn_norm.bias, 1e-6)
    want = h.masked_fill(mask[..., None], 0.0)
    with torch.no_grad():
        got = model(x, mask)
    assert got.shape == (3, 6, D)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # the other sub-block order (attention first) gives a different result
    h = x
    for layer in model.layers:
        h = layer.attn_norm(h + layer.attn(h, mask))
        h = layer.ffn_norm(h + F.relu(layer.ffn(h)))
    assert (h.masked_fill(mask[..., None], 0.0) - got).abs().max() > 1e-3


def test_stacked_mtsa_dropout_only_in_training():
    torch.manual_seed(2)
    model = StackedMTSA(D, num_heads=4, num_layers=2).double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    model.eval()
    torch.testing.assert_close(model(x), model(x), rtol=0, atol=0)
    model.train()
    assert (model(x) - model(x)).abs().max() > 0


def _inputs_of(attn, layers, x):
    """The inputs each projection of ``attn`` receives in one training forward of ``x``."""
    seen = {}
    hooks = [getattr(attn, name).register_forward_hook(
        lambda module, args, out, name=name: seen.__setitem__(name, args[0].detach().clone())) for name in layers]
    attn(x)
    for hook in hooks:
        hook.remove()
    return seen


def test_stacked_mtsa_draws_the_accelerated_paths_dropout_masks():
    """stacking_mtsa's accelerated path (reference §2.3): one mask on the untiled x shared by q, k, v and every
    head, one more shared by every head for the source2token layer; the default path draws per head."""
    torch.manual_seed(3)
    attn = StackedMTSA(D, num_heads=4, num_layers=1, dense_dropout=0.5).layers[0].attn.train()
    x = torch.rand(2, 5, D) + 1.0  # no zeros: a zero after dropout is a dropped element
    seen = _inputs_of(attn, ["v_proj", "q_proj", "k_proj", "s2t"], x)
    qkv, s2t = seen["v_proj"], seen["s2t"]
    assert torch.equal(seen["q_proj"], qkv) and torch.equal(seen["k_proj"], qkv)
    for inputs in (qkv, s2t):
        assert all(torch.equal(inputs[:, 0], inputs[:, c]) for c in range(1, 4))  # shared by the heads
        kept = inputs[:, 0] != 0
        assert torch.allclose(inputs[:, 0][kept], 2 * x[kept]) and 0.3 < kept.float().mean() < 0.7
    assert not torch.equal(qkv, s2t)  # the source2token layer draws its own mask

    per_head = SentenceMTSA(D, D, num_heads=4, dense_dropout=0.5, attn_input="x", s2t_hidden_layer=False).train()
    seen = _inputs_of(per_head, ["v_proj", "q_proj"], x)
    assert not torch.equal(seen["v_proj"][:, 0], seen["v_proj"][:, 1]) and not torch.equal(seen["v_proj"],
                                                                                          seen["q_proj"])
    with pytest.raises(ValueError, match="needs attn_input='x'"):
        SentenceMTSA(D, D, shared_input_dropout=True)
