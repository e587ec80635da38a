"""Float32 linears on the CPU through oneDNN, with each weight reordered once into oneDNN's blocked layout.

Why: decode on a CPU is a chain of matrix-vector products that must stream every weight from memory. torch's
default CPU path (MKL on the (out, in) weight) read about 16 GB/s on one core of the development machine and
ran batches of 8 rows barely faster than 8 single rows; oneDNN on a pre-packed weight read 25-32 GB/s and ran
8 rows 2.6x and a 256-token prefill 2.4x faster than F.linear (benchmarks/cpu_linear.py). vLLM's CPU build
takes the same route. The ops are torch's own (`torch.ops.mkldnn`, what torch.compile emits for CPU linears),
so nothing is added to the install.
"""

from __future__ import annotations

import torch
from torch import nn

from reference_engine.kernels.ops import replace_linears


def onednn_linear_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Packed oneDNN linears are used for float32 on a CPU whose torch build has oneDNN."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class PackedLinear(nn.Module):
    """`y = x W^T + b` with W held only in oneDNN's packed layout (the dense copy is dropped)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.weight_bytes = weight.numel() * weight.element_size()
        # batch size None: one packing serves every row count (prefill and decode alike). An opaque oneDNN
        # tensor, kept as a plain attribute so that module-wide moves and state dicts never touch it.
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn packed"


def pack_linears(model: nn.Module) -> int:
    """Replace every nn.Linear in `model` by a PackedLinear; returns how many were replaced. A tied LM head
    gets a packed copy of the embedding (the embedding itself stays dense for its row lookups)."""
    return replace_linears(model, PackedLinear)
