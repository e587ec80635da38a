"""Which NVIDIA GPUs a launched server can see, and how much of their memory is in use.

Read with `nvidia-smi`, not with torch in this process: `torch.cuda.mem_get_info` would create a CUDA context
here, which itself takes a few hundred MiB of the very memory being measured, and would make the launcher
import torch. `nvidia-smi` sees every process on the device (containers included), so what a launch adds is
the difference between the reading before the spawn and the one at ready; other work on the same GPU in
between shows up in it, which the note says.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

MIB = 2**20


def _smi() -> str | None:
    return shutil.which("nvidia-smi")


def visible_indices(env: Mapping[str, str] | None = None) -> set[int] | None:
    """GPU indices CUDA_VISIBLE_DEVICES leaves visible in `env` (default: this process's environment), taken
    as nvidia-smi's (and NVML's) indices, which CUDA's are under CUDA_DEVICE_ORDER=PCI_BUS_ID (the order
    `compare` launches servers with); None: all, or not given as indices."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    try:
        return {int(v) for v in value.split(",") if v.strip()}
    except ValueError:  # UUIDs or MIG names: nvidia-smi's indices cannot be matched; count them all
        return None


def gpu_memory_used() -> dict[int, float] | None:
    """Bytes in use per visible GPU index, or None when there is no NVIDIA GPU (or no nvidia-smi)."""
    smi = _smi()
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    wanted = visible_indices()
    used: dict[int, float] = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            continue
        try:
            index, mib = int(parts[0]), float(parts[1])
        except ValueError:
            continue
        if wanted is None or index in wanted:
            used[index] = mib * MIB
    return used or None


def gpu_visible() -> bool:
    return gpu_memory_used() is not None


def memory_note(before: dict[int, float] | None, at_ready: dict[int, float]) -> tuple[float, str]:
    """What the launch added (bytes), and a sentence saying how it was measured."""
    base = sum((before or {}).get(i, 0.0) for i in at_ready)
    total = sum(at_ready.values())
    gpus = ", ".join(str(i) for i in sorted(at_ready))
    return total - base, (
        f"device memory read with nvidia-smi on GPU {gpus}: {total / 2**30:.2f} GiB in use at ready, "
        f"{base / 2**30:.2f} GiB before the launch (other work on these GPUs would count too)"
    )
