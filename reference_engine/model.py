"""Llama-family decoder (Llama 2/3, Mistral, Qwen2) over a flat batch of tokens and a paged KV cache.

Q/K/V and gate/up projections are fused into one matmul each (the loader concatenates the checkpoint's
weights); the arithmetic otherwise follows Hugging Face's implementation step for step, so logits agree with
transformers to float32 rounding.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from reference_engine.kernels.attention import AttentionBatch
from reference_engine.kernels.ops import Ops
from reference_engine.model_config import ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = ops

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Normalise x; with `residual`, first add it and also return the sum (the next residual)."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies for rotary embeddings: default, linear or llama3 scaling (as Hugging Face)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position up to max_len, looked up by position id."""

    def __init__(self, spec: ModelSpec, max_len: int) -> None:
        super().__init__()
        self.spec, self.max_len = spec, max_len
        self.register_buffer("cos", torch.empty(max_len, spec.head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_len, spec.head_dim), persistent=False)

    def reset_tables(self) -> None:
        """Fill the float32 cos/sin tables on the buffers' device (after meta init or a dtype cast)."""
        device = self.cos.device
        inv_freq = rope_inv_freq(self.spec.head_dim, self.spec.rope_theta, self.spec.rope_scaling).to(device)
        freqs = torch.outer(torch.arange(self.max_len, dtype=torch.float32, device=device), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, ops: Ops) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size = spec.num_heads * spec.head_dim
        self.kv_size = spec.num_kv_heads * spec.head_dim
        self.qkv_proj = nn.Linear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, spec.hidden_size, bias=False)
        self.scale = spec.head_dim**-0.5
        self.rotary = rotary
        self.ops = ops
        self.k_cache = torch.empty(0)  # [num_blocks, block_size, kv_heads, head_dim], set by the runner
        self.v_cache = torch.empty(0)

    def project(self, positions: torch.Tensor, x: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        """Project, rotate q and k, store k and v at each token's cache slot; returns q [T, heads, dim]."""
        rotary = self.rotary
        return self.ops.project_rope_and_write_kv(
            self.qkv_proj,
            x,
            positions,
            rotary.cos,
            rotary.sin,
            self.k_cache,
            self.v_cache,
            slot_mapping,
            self.num_heads,
            self.num_kv_heads,
        )

    def attend(self, q: torch.Tensor, batch: AttentionBatch, out: torch.Tensor | None = None) -> torch.Tensor:
        """Every query over its whole context, read from the cache (where `project` just wrote)."""
        return self.ops.attend(q, self.k_cache, self.v_cache, batch, self.scale, out)


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, ops: Ops) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.project_silu_and_mul(self.gate_up_proj, x))


class DecoderLayer(nn.Module):
    """One layer's weights; `LlamaModel` runs it in two pieces around attention (see `LlamaModel.piece`)."""

    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, ops: Ops) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, ops)
        self.self_attn = Attention(spec, rotary, ops)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, ops)
        self.mlp = MLP(spec, ops)


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm and LM head; `forward` returns hidden states, `logits`
    projects."""

    def __init__(self, spec: ModelSpec, max_len: int, ops: Ops) -> None:
        super().__init__()
        self.spec = spec
        self.ops = ops
        # given an empty weight, as every parameter here is filled by the loader: nn.Embedding's own init
        # draws normal_, whose meta-device kernel imports sympy (1.2 s of start-up) when built on meta
        self.embed_tokens = nn.Embedding(
            spec.vocab_size, spec.hidden_size, _weight=torch.empty(spec.vocab_size, spec.hidden_size)
        )
        self.rotary = RotaryEmbedding(spec, max_len)
        self.layers = nn.ModuleList(DecoderLayer(spec, self.rotary, ops) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, ops)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor:
        """Hidden states after the final norm: the pieces in order, each layer's attention between two."""
        self.ops.begin_step()
        out, residual = self.first_piece(input_ids, positions, batch.slot_mapping)
        for index, layer in enumerate(self.layers, start=1):
            out, residual = self.piece(
                index, layer.self_attn.attend(out, batch), residual, positions, batch.slot_mapping
            )
        return out

    # The forward pass in the pieces that lie between attention calls. Nothing in a piece depends on how
    # the tokens divide into sequences, only on their number, so a CUDA graph of each piece serves any step
    # of that many tokens; attention, which reads the step's paging, runs between them (piecewise_graphs.py).

    def first_piece(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The embedding, then the first layer up to its attention: (q, residual)."""
        x = self.embed_tokens(input_ids)
        layer = self.layers[0]
        return layer.self_attn.project(positions, layer.input_layernorm(x), slot_mapping), x

    def piece(
        self,
        index: int,
        attended: torch.Tensor,
        residual: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """From layer index-1's attention output to layer index's attention input: the o projection, the
        residual add and norm, the MLP, then the next layer's norm and q/k/v (its q returned with the
        residual); after the last layer, the final norm (the hidden states returned instead of q)."""
        done = self.layers[index - 1]
        x = done.self_attn.o_proj(attended.view(attended.shape[0], -1))
        x, residual = done.post_attention_layernorm(x, residual)
        x = done.mlp(x)
        if index == len(self.layers):
            return self.norm(x, residual)
        layer = self.layers[index]
        x, residual = layer.input_layernorm(x, residual)
        return layer.self_attn.project(positions, x, slot_mapping), residual

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
