"""The CPU attention kernels (`csrc/*.c`: paged decode attention, causal prefill attention), compiled once
with the system's C compiler into one library and called through ctypes.

Why C: torch has no paged attention on the CPU, so the torch path copies every sequence's blocks into a dense
tensor and runs SDPA over the copy (the KV read twice, written once); the decode kernel reads the blocks where
they lie. For prefill, torch's CPU flash attention took 55 of a 256-token prefill's 342 ms on SmolLM2-135M;
the prefill kernel is a register-tiled loop for that shape of problem
(benchmarks/results/cpu_vs_vllm/README.md). Why not a torch extension: building one takes a minute against
torch's headers; these files compile in about a second, need only `cc`, and are cached by their sources' hash.
Without a compiler the engine keeps the torch path and says so in its log.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sysconfig
from functools import cache, partial
from pathlib import Path

import torch

from reference_engine.kernels import attention
from reference_engine.kernels.attention import AttentionBatch, PrefillChunk
from reference_engine.kernels.ops import TorchOps
from reference_engine.kernels.paths import cache_root

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = sorted(CSRC.glob("*.c"))
HEADERS = sorted(CSRC.glob("*.h"))
_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIGNATURES = {  # every exported function returns int or nothing; arguments as in csrc/
    "paged_decode_attention_f32": (ctypes.c_int, [_P] * 6 + [_I] * 6 + [_F]),
    "prefill_attention_f32": (ctypes.c_int, [_P, _I] + [_P] * 4 + [_I] * 6 + [_F]),
    "rms_norm_f32": (None, [_P] * 4 + [_I, _I, _F]),
    "rope_write_kv_f32": (None, [_P] * 7 + [_I] * 4),
    "silu_and_mul_f32": (None, [_P, _P, _I, _I]),
}
# Reassociation lets the head_dim reductions vectorise and contraction makes multiply-adds FMAs (ISO C modes
# turn it off); no -ffast-math: it would assume no infinities.
CFLAGS = [
    "-O3",
    "-march=native",
    "-fPIC",
    "-shared",
    "-fno-math-errno",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
    "-ffp-contract=fast",
    "-std=c11",
]


def _compiler() -> str | None:
    configured = (sysconfig.get_config_var("CC") or "").split()
    for name in (os.environ.get("CC"), configured[0] if configured else None, "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_identity() -> bytes:
    """The CPU's model and instruction-set flags, as the kernel's cache key needs them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode() + platform.machine().encode()
    keep = [line for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(keep)).encode()


@cache
def load_kernel() -> ctypes.CDLL | None:
    """The compiled kernel, or None (no compiler, no source, or the build failed: logged once)."""
    compiler = _compiler()
    if compiler is None or not SOURCES:
        log.info("CPU attention: torch path (%s)", "no C compiler" if compiler is None else "no source")
        return None
    # -march=native: a library built on another CPU (a shared cache directory) must not be loaded here
    key = (
        b"".join(src.read_bytes() for src in SOURCES + HEADERS) + " ".join(CFLAGS).encode() + _cpu_identity()
    )
    target = cache_root() / "kernels" / f"cpu_attention-{hashlib.sha256(key).hexdigest()[:16]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        result = subprocess.run(
            [compiler, *CFLAGS, *map(str, SOURCES), "-o", str(partial), "-lm"], capture_output=True, text=True
        )
        if result.returncode != 0:
            log.warning("CPU attention: torch path (%s failed: %s)", compiler, result.stderr.strip()[-500:])
            return None
        partial.replace(target)  # atomic: concurrent servers never load a half-written library
    lib = ctypes.CDLL(str(target))
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    log.info("CPU attention: C kernels %s", target.name)
    return lib


def decode_attention(
    lib: ctypes.CDLL,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: AttentionBatch,
    scale: float,
) -> torch.Tensor:
    """Float32 decode attention of `q` [num_decode, heads, head_dim] over the paged cache."""
    q = q.contiguous()
    tables = batch.decode_block_tables
    lens = batch.decode_context_lens
    assert (
        tables is not None and lens is not None and tables.dtype == torch.int32 and lens.dtype == torch.int32
    )
    tables, lens = tables.contiguous(), lens.contiguous()
    out = torch.empty_like(q)
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    _require_plain("decode", q=q, k_cache=k_cache, v_cache=v_cache)
    status = lib.paged_decode_attention_f32(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        tables.data_ptr(),
        lens.data_ptr(),
        out.data_ptr(),
        num_seqs,
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        tables.shape[1],
        scale,
    )
    if status != 0:
        raise MemoryError("CPU decode attention could not allocate its score buffer")
    return out


def prefill_attention(
    lib: ctypes.CDLL,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
) -> torch.Tensor:
    """Float32 causal attention of one sequence's chunk `q` [n, heads, head_dim] (rows may sit apart, as in
    the fused qkv buffer) over its context in the paged cache; returns [n, heads, head_dim]."""
    n, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    table = chunk.block_table.to(torch.int32).contiguous()
    _require_plain("prefill", q=q[0], k_cache=k_cache, v_cache=v_cache)  # q: each row; rows may sit apart
    out = torch.empty(n, num_heads, head_dim)
    status = lib.prefill_attention_f32(
        q.data_ptr(),
        q.stride(0),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        table.data_ptr(),
        out.data_ptr(),
        n,
        chunk.context_len,
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        scale,
    )
    if status == -1:
        raise MemoryError("CPU prefill attention could not allocate its buffers")
    if status != 0:
        raise ValueError(
            f"CPU prefill attention cannot run head_dim {head_dim}, {n} queries over {chunk.context_len}"
        )
    return out


def _require_plain(kernel: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if not _plain(t):
            raise ValueError(f"CPU {kernel} attention needs contiguous float32 CPU tensors; {name} is not")


def prefill_kernel_fits(head_dim: int) -> bool:
    """The prefill kernel works in 16-float vectors over head_dim."""
    return head_dim % 16 == 0


def _plain(t: torch.Tensor) -> bool:
    """A tensor the C loops can walk: float32, on the CPU, rows contiguous."""
    return t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()


class CPUOps(TorchOps):
    """TorchOps with attention and the elementwise steps in the C kernels (float32 only; anything else, such
    as a non-contiguous input, goes to the torch implementation)."""

    name = "cpu"

    def __init__(self, lib: ctypes.CDLL) -> None:
        super().__init__()
        self.lib = lib
        self._decode = partial(decode_attention, lib)
        self._prefill = partial(prefill_attention, lib)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not (_plain(x) and _plain(weight) and x.dim() == 2):
            return super().rms_norm(x, weight, eps)
        out = torch.empty_like(x)
        self.lib.rms_norm_f32(
            x.data_ptr(), None, weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps
        )
        return out

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Writes x + residual into `residual` (in place) and returns (its norm, residual)."""
        if not (
            _plain(x) and _plain(residual) and _plain(weight) and x.dim() == 2 and x.shape == residual.shape
        ):
            return super().add_rms_norm(x, residual, weight, eps)
        out = torch.empty_like(x)
        self.lib.rms_norm_f32(
            x.data_ptr(), residual.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], eps
        )
        return out, residual

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
        """Rotates q and k inside `qkv` (in place) and returns q as a view of it [T, heads, head_dim]."""
        head_dim = k_cache.shape[-1]
        plain = all(map(_plain, (qkv, cos, sin, k_cache, v_cache)))
        indices_ok = all(t.dtype == torch.int64 and t.is_contiguous() for t in (positions, slot_mapping))
        if not (plain and indices_ok and qkv.dim() == 2 and head_dim % 2 == 0):
            return super().rope_and_write_kv(
                qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads
            )
        tokens = qkv.shape[0]
        self.lib.rope_write_kv_f32(
            qkv.data_ptr(),
            positions.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            slot_mapping.data_ptr(),
            tokens,
            num_heads,
            num_kv_heads,
            head_dim,
        )
        return qkv.view(tokens, -1, head_dim)[:, :num_heads]

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not (_plain(gate_up) and gate_up.dim() == 2):
            return super().silu_and_mul(gate_up)
        rows, double = gate_up.shape
        out = torch.empty(rows, double // 2)
        self.lib.silu_and_mul_f32(gate_up.data_ptr(), out.data_ptr(), rows, double // 2)
        return out

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: AttentionBatch,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        prefill = self._prefill if prefill_kernel_fits(q.shape[-1]) else None
        return attention.paged_attention(q, k_cache, v_cache, batch, scale, self._decode, prefill, out)
