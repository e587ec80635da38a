"""The model's hot-path operations, in plain torch: the reference every faster implementation is checked
against, and what runs on the CPU. `dispatch.ops_for(device)` picks Triton kernels on CUDA (triton_ops.py).

Numerics follow Hugging Face's Llama step for step (normalise in float32, round, then scale; rotary tables in
float32 cast to the activation dtype), so logits agree with transformers to rounding.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from reference_engine.kernels import attention
from reference_engine.kernels.attention import AttentionBatch


class TorchOps:
    """Reference implementations; each method is one step of a decoder layer."""

    name = "torch"

    def __init__(self) -> None:
        self._rope_rows: tuple | None = None  # (positions, cos table, cos rows, sin rows) of the current step

    def begin_step(self) -> None:
        """Called at the start of every forward pass (and so inside a CUDA-graph capture): drops per-step
        state."""
        self._rope_rows = None

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; in float32 it is Hugging Face's arithmetic exactly
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(dtype)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the residual add fused into the norm that follows it."""
        summed = x + residual
        return self.rms_norm(summed, weight, eps), summed

    def rope_and_write_kv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
    ) -> torch.Tensor:
        """Split fused q/k/v, rotate q and k, store k and v in the cache; return rotated q [T, heads, dim]."""
        head_dim = k_cache.shape[-1]
        qk, v = qkv.split([(num_heads + num_kv_heads) * head_dim, num_kv_heads * head_dim], dim=-1)
        # q and k heads side by side: rotate them at once
        qk = qk.view(-1, num_heads + num_kv_heads, head_dim)
        v = v.view(-1, num_kv_heads, head_dim)
        c, s = self._rope_rows_for(positions, cos, sin, qkv.dtype)
        qk = qk * c + _rotate_half(qk) * s
        attention.write_kv(k_cache, v_cache, qk[:, num_heads:], v, slot_mapping)
        return qk[:, :num_heads]

    def project_rope_and_write_kv(
        self,
        qkv_proj: nn.Module,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
    ) -> torch.Tensor:
        """The qkv projection, then `rope_and_write_kv` (one call so that a kernel may fuse the two)."""
        return self.rope_and_write_kv(
            qkv_proj(x), positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads
        )

    def _rope_rows_for(
        self, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows of this step's positions, looked up once per step rather than once per layer."""
        cached = self._rope_rows
        if cached is None or cached[0] is not positions or cached[1] is not cos:  # first layer of the step
            c = cos[positions].to(dtype).unsqueeze(1)
            s = sin[positions].to(dtype).unsqueeze(1)
            cached = self._rope_rows = (positions, cos, c, s)
        return cached[2], cached[3]

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: AttentionBatch,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Paged attention of q [T, heads, dim] over the cache; into `out` (same shape) when given, so that a
        step captured in pieces finds it where the next piece reads."""
        return attention.paged_attention(q, k_cache, v_cache, batch, scale, out=out)

    def prefill_tile_tokens(self, group: int) -> int | None:
        """New tokens per program of a kernel that attends every prefill chunk in one launch (the model runner
        then builds `AttentionBatch.prefill_batch`), or None: here each chunk runs on its own."""
        return None

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def project_silu_and_mul(self, gate_up_proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The gate/up projection, then `silu_and_mul` (one call so that a kernel may fuse the two)."""
        return self.silu_and_mul(gate_up_proj(x))


Ops = TorchOps  # the interface every implementation follows


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def replace_linears(
    model: nn.Module,
    wrap: Callable[[nn.Linear], nn.Module],
    where: Callable[[nn.Linear], bool] = lambda linear: True,
) -> int:
    """Put wrap(linear) in place of each nn.Linear of `model` that `where` picks (a device's own linear
    kernels, loaded after the weights); returns how many."""
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and where(module)
    ]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, wrap(module))
    return len(targets)
