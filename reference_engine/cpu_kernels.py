"""The CPU decode-attention kernel (`csrc/paged_decode_attention.c`), compiled once with the system's C compiler
and called through ctypes.

Why C: torch has no paged attention on the CPU, so the torch path copies every sequence's blocks into a dense
tensor and runs SDPA over the copy (the KV read twice, written once). The kernel reads the blocks where they
lie. Why not a torch extension: building one takes a minute against torch's headers; this file compiles in well
under a second, needs only `cc`, and is cached by its source's hash. Without a compiler the engine keeps the
torch path and says so in its log.
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

from reference_engine import attention
from reference_engine.attention import AttentionBatch
from reference_engine.builtin_models import cache_root
from reference_engine.ops import TorchOps

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_decode_attention.c"
# Reassociation lets the head_dim reductions vectorise; no -ffast-math: it would assume no infinities.
CFLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros",
          "-fno-trapping-math", "-std=c11"]


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
    if compiler is None or not SOURCE.exists():
        log.info("CPU decode attention: torch path (%s)", "no C compiler" if compiler is None else "no source")
        return None
    # -march=native: a library built on another CPU (a shared cache directory) must not be loaded here
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode() + _cpu_identity()).hexdigest()[:16]
    target = cache_root() / "kernels" / f"paged_decode_attention-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        result = subprocess.run([compiler, *CFLAGS, str(SOURCE), "-o", str(partial), "-lm"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            log.warning("CPU decode attention: torch path (%s failed: %s)", compiler, result.stderr.strip()[-500:])
            return None
        partial.replace(target)  # atomic: concurrent servers never load a half-written library
    lib = ctypes.CDLL(str(target))
    fn = lib.paged_decode_attention_f32
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float]
    log.info("CPU decode attention: C kernel %s", target.name)
    return lib


def decode_attention(lib: ctypes.CDLL, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     batch: AttentionBatch, scale: float) -> torch.Tensor:
    """Float32 decode attention of `q` [num_decode, heads, head_dim] over the paged cache."""
    q = q.contiguous()
    tables = batch.decode_block_tables
    lens = batch.decode_context_lens
    assert tables is not None and lens is not None and tables.dtype == torch.int32 and lens.dtype == torch.int32
    tables, lens = tables.contiguous(), lens.contiguous()
    out = torch.empty_like(q)
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"CPU decode attention needs contiguous float32 CPU tensors; {name} is not")
    status = lib.paged_decode_attention_f32(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(), out.data_ptr(),
        num_seqs, num_heads, num_kv_heads, head_dim, block_size, tables.shape[1], scale)
    if status != 0:
        raise MemoryError("CPU decode attention could not allocate its score buffer")
    return out


class CPUOps(TorchOps):
    """TorchOps with decode attention in the C kernel (float32 only; prefill stays on torch's SDPA)."""

    name = "cpu"

    def __init__(self, lib: ctypes.CDLL) -> None:
        super().__init__()
        self._decode = partial(decode_attention, lib)

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch,
               scale: float) -> torch.Tensor:
        return attention.paged_attention(q, k_cache, v_cache, batch, scale, self._decode)
