"""Which implementation of the model's operations runs on a device: torch, Triton or the C kernels."""

from __future__ import annotations

import torch

from reference_engine.kernels.ops import TorchOps


def ops_for(device: torch.device, kernels: str = "auto", dtype: torch.dtype = torch.float32) -> TorchOps:
    """`auto`: Triton kernels on CUDA (imported only there); on the CPU in float32, torch plus the C
    decode-attention kernel when a C compiler builds it (cpu_kernels.py); else torch. `torch` / `triton`
    force one (Triton on the CPU needs TRITON_INTERPRET=1)."""
    if kernels not in ("auto", "torch", "triton"):
        raise ValueError(f"kernels must be auto, torch or triton, got {kernels!r}")
    if kernels == "triton" or (kernels == "auto" and device.type == "cuda"):
        from reference_engine.kernels.triton_ops import TritonOps

        return TritonOps()
    if kernels == "auto" and device.type == "cpu" and dtype == torch.float32:
        from reference_engine.kernels.cpu_kernels import CPUOps, load_kernel

        lib = load_kernel()
        if lib is not None:
            return CPUOps(lib)
    return TorchOps()
