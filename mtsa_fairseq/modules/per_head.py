"""Dense layers (TF's Glorot-uniform initialisation, and one layer per head) and the activation table shared by
the MTSA attention modules."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _linear(x: Tensor) -> Tensor:
    return x


# The authors' ``afn_name2fn`` / ``activation_name_to_func`` tables (docs/reference.md §1.2, §2.1). Named functions
# only: TorchScript compiles a module attribute holding one of them, not a lambda.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "linear": _linear, "relu": F.relu, "elu": F.elu, "selu": F.selu, "leaky_relu": F.leaky_relu,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp,
}


def activation(name: str) -> Callable[[Tensor], Tensor]:
    """Look up an activation by the authors' name, with a clear error for unknown names."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def glorot_(layer: nn.Linear) -> nn.Linear:
    """Initialise ``layer`` in place as TF's ``get_variable`` default does a dense layer: Glorot-uniform weight,
    zero bias; returns it."""
    nn.init.xavier_uniform_(layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


class PerHeadLinear(nn.Module):
    """``y[b, h] = x[b, h] @ W[h] (+ b[h])``: one dense layer per head (``multi_head_dense_layer``
    with ``merge_var=False``), weights ``[H, d_in, d_out]`` initialised Glorot-uniform per head."""

    def __init__(self, num_heads: int, in_features: int, out_features: int, bias: bool = True, bias_init: float = 0.0):
        super().__init__()
        self.bias_init = bias_init
        self.weight = nn.Parameter(torch.empty(num_heads, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(num_heads, out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in self.weight:
            nn.init.xavier_uniform_(w)
        if self.bias is not None:
            nn.init.constant_(self.bias, self.bias_init)

    def forward(self, x: Tensor, scale: float = 1.0) -> Tensor:
        """``x``: ``[B, H, L, d_in]`` -> ``scale * (x W + b)``, ``[B, H, L, d_out]``."""
        if x.stride(1) == 0:  # the same input for every head (expanded): einsum runs one matmul
            y = torch.einsum("bhld,hde->bhle", x, self.weight)
            y = y if self.bias is None else y + self.bias[None, :, None, :]
            return y if scale == 1.0 else y * scale
        batch, heads, length, d_in = x.shape
        # [H, L*B, d_in] is a view of a head-split [L, B, H*d] projection, so autograd keeps no copy of x
        rows = x.permute(1, 2, 0, 3).reshape(heads, length * batch, d_in)
        weight, bias = self.weight, self.bias  # each parameter read is a Python call
        y = torch.bmm(rows, weight) if bias is None else torch.baddbmm(bias[:, None, :], rows, weight)
        y = y if scale == 1.0 else y.mul_(scale)  # one kernel each way; baddbmm's alpha and beta cost three backward
        return y.view(heads, length, batch, -1).permute(2, 0, 1, 3)  # [B, H, L, d_out] stored head-major

    def extra_repr(self) -> str:
        h, i, o = self.weight.shape
        return f"heads={h}, in_features={i}, out_features={o}, bias={self.bias is not None}"


def stable_exp(logits: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """``E_S = exp(S)`` up to a per (batch, head, feature) constant, which cancels in the MTSA ratio:
    the maximum over non-pad positions is subtracted first and pad positions are zeroed, as the
    API's ``exp(S) * key_mask`` (reference §8.4). ``logits``: ``[B, H, L, d]``."""
    if key_padding_mask is None:
        return torch.exp(logits - logits.amax(dim=2, keepdim=True).detach())
    pad = key_padding_mask[:, None, :, None]
    logits = logits.masked_fill(pad, float("-inf"))
    top = logits.amax(dim=2, keepdim=True).detach()
    return torch.exp(logits - top.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0))  # padding only: shift 0
