"""Small host lists onto the device without waiting for the device.

`torch.tensor(values, device="cuda")` copies from pageable memory, which synchronises the stream: the host
stops until every kernel already queued has finished. An eager decode step makes several such copies (token
ids, positions, slots, block tables, context lengths, sampled rows), so each step's launches could only start
once the step before had run to its end, and the host's launch time added to the GPU's instead of hiding it.
Here the values go through pinned memory, one asynchronous copy per dtype; torch's pinned-memory allocator
keeps a buffer out of reuse until the copy that reads it has run.
"""

from __future__ import annotations

import torch


def to_device(values: list, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A flat list of numbers on `device`, without a stream synchronisation."""
    if device.type != "cuda" or not values:
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def lists_to_device(lists: list[list[int]], device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """Several integer lists on `device` in one copy; returns a 1-D view of each, in order."""
    flat = [value for values in lists for value in values]
    return list(to_device(flat, device, dtype).split([len(values) for values in lists]))
