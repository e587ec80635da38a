"""How fast a safetensors checkpoint's bytes reach the GPU, by four ways of reading it: what bounds the
weights phase of the server's start-up (5-8 s of it for the 7B shape on the H200 host).

    python benchmarks/weight_read.py /tmp/ckpt-llama-3.2-1b --rounds 2 --out weight-read.jsonl

- `safetensors`: the loader's way, `safe_open(...).get_tensor` (through a memory map) then a copy to the
  device from pageable memory, tensor by tensor;
- `staged`: the file read front to back with `readinto` through two pinned 64 MiB buffers, each copied to the
  device asynchronously while the next is read;
- `threads`: the same with 8 threads, each reading its own stretch of the file through its own pair of pinned
  buffers and stream;
- `registered`: the file memory-mapped, the mapping registered with CUDA (page-locked in place), and one copy
  to the device straight from it.

Each way moves every byte of every `.safetensors` file into one device buffer; rounds alternate the order.
One JSON line per way and round: seconds and GB/s.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import threading
import time
from pathlib import Path

import torch
from safetensors import safe_open

CHUNK = 64 * 2**20


def read_safetensors(files: list[Path], device: torch.device) -> int:
    moved = 0
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensor = f.get_tensor(key).to(device)
                moved += tensor.numel() * tensor.element_size()
    return moved


def copy_range(path: Path, start: int, length: int, target: torch.Tensor, stream: torch.cuda.Stream) -> None:
    """Bytes [start, start+length) of the file into target[start:...] through two pinned buffers."""
    buffers = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    events: list[torch.cuda.Event | None] = [None, None]
    with open(path, "rb", buffering=0) as f, torch.cuda.stream(stream):
        f.seek(start)
        for turn, offset in enumerate(range(start, start + length, CHUNK)):
            n = min(CHUNK, start + length - offset)
            if events[turn % 2] is not None:
                events[turn % 2].synchronize()
            view = memoryview(buffers[turn % 2].numpy())[:n]
            got = 0
            while got < n:
                got += f.readinto(view[got:])
            target[offset : offset + n].copy_(buffers[turn % 2][:n], non_blocking=True)
            events[turn % 2] = torch.cuda.Event()
            events[turn % 2].record(stream)
    stream.synchronize()


def read_staged(files: list[Path], device: torch.device, threads: int) -> int:
    moved = 0
    for path in files:
        size = path.stat().st_size
        target = torch.empty(size, dtype=torch.uint8, device=device)
        share = -(-size // threads)
        workers = [
            threading.Thread(
                target=copy_range,
                args=(path, start, min(share, size - start), target, torch.cuda.Stream(device)),
            )
            for start in range(0, size, share)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        moved += size
    return moved


def read_registered(files: list[Path], device: torch.device) -> int:
    cudart = torch.cuda.cudart()
    moved = 0
    for path in files:
        size = path.stat().st_size
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        host = torch.frombuffer(mapped, dtype=torch.uint8)  # read-only: torch warns, nothing writes it
        address = host.data_ptr()
        # cudaHostRegisterReadOnly (8): the mapping is read-only
        status = cudart.cudaHostRegister(address, size, 8)
        if int(status) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {status}")
        try:
            target = torch.empty(size, dtype=torch.uint8, device=device)
            target.copy_(host, non_blocking=True)
            torch.cuda.synchronize(device)
        finally:
            cudart.cudaHostUnregister(address)
            del host
            mapped.close()
        moved += size
    return moved


WAYS = {
    "safetensors": lambda files, device: read_safetensors(files, device),
    "staged": lambda files, device: read_staged(files, device, 1),
    "threads": lambda files, device: read_staged(files, device, 8),
    "registered": lambda files, device: read_registered(files, device),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ways", nargs="+", default=list(WAYS))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    device = torch.device("cuda")
    files = sorted(args.checkpoint.glob("*.safetensors"))
    torch.empty(1, device=device)
    for path in files:  # the first read fills the page cache; every way then reads from memory
        with open(path, "rb") as f:
            while f.read(CHUNK):
                pass
    lines = []
    for r in range(args.rounds):
        ways = args.ways if r % 2 == 0 else list(reversed(args.ways))
        for way in ways:
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            try:
                moved = WAYS[way](files, device)
                torch.cuda.synchronize(device)
                seconds = time.perf_counter() - t0
                line = {
                    "way": way,
                    "round": r + 1,
                    "bytes": moved,
                    "seconds": round(seconds, 3),
                    "gb_per_s": round(moved / seconds / 1e9, 2),
                }
            except Exception as error:  # a way the machine does not allow (registering a mapping, say)
                line = {"way": way, "round": r + 1, "error": repr(error)}
            torch.cuda.empty_cache()
            line.update(
                device=torch.cuda.get_device_name(device),
                cpus=os.cpu_count(),
                machine=platform.platform(),
                checkpoint=str(args.checkpoint),
            )
            print(json.dumps(line), flush=True)
            lines.append(line)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
