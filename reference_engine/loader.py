"""From a model name to weights on a device: checkpoint directories, hub ids, built-ins and random shapes."""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from reference_engine.builtin_models import BUILTIN_MODELS, builtin_checkpoint
from reference_engine.model import LlamaModel
from reference_engine.model_config import ModelSpec, named_shape, read_spec

log = logging.getLogger("reference_engine")

RANDOM_PREFIX = "random:"


@dataclass
class ResolvedModel:
    """Where a model's shape, weights and tokenizer come from."""

    name: str
    spec: ModelSpec
    checkpoint: Path | None  # None: random weights


def resolve_model(name: str) -> ResolvedModel:
    """`random:<shape>`, a built-in name, a local checkpoint directory, or a hub id (network permitting)."""
    if name.startswith(RANDOM_PREFIX):
        return ResolvedModel(name, named_shape(name[len(RANDOM_PREFIX) :]), None)
    if name in BUILTIN_MODELS:
        path = builtin_checkpoint(name)
        return ResolvedModel(name, read_spec(path), path)
    path = Path(name).expanduser()
    if path.is_dir():
        return ResolvedModel(name, read_spec(path), path)
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise FileNotFoundError(
            f"model {name!r} is neither a checkpoint directory, a hub id (org/name), a built-in "
            f"({', '.join(BUILTIN_MODELS)}) nor random:<shape>"
        )
    path = _download(name)
    return ResolvedModel(name, read_spec(path), path)


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.jinja", "*.model"]
            )
        )
    except Exception as exc:  # the hub raises many kinds: offline, gated, missing
        raise FileNotFoundError(f"could not fetch {repo_id!r} from the Hugging Face hub: {exc}") from exc


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "float": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
    }
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return table[dtype]


def _checkpoint_parts(spec: ModelSpec, ours: str) -> list[tuple[str, slice]]:
    """The Hugging Face tensors that make up one of our parameters, and the rows each fills."""
    kv = spec.num_kv_heads * spec.head_dim
    fused = {
        "self_attn.qkv_proj": [
            ("self_attn.q_proj", spec.num_heads * spec.head_dim),
            ("self_attn.k_proj", kv),
            ("self_attn.v_proj", kv),
        ],
        "mlp.gate_up_proj": [
            ("mlp.gate_proj", spec.intermediate_size),
            ("mlp.up_proj", spec.intermediate_size),
        ],
    }
    hf = ours if ours.startswith("lm_head") else "model." + ours
    for fused_name, parts in fused.items():
        if fused_name in hf:
            out, lo = [], 0
            for part, rows in parts:
                out.append((hf.replace(fused_name, part), slice(lo, lo + rows)))
                lo += rows
            return out
    return [(hf, slice(None))]


def load_checkpoint_weights(model: LlamaModel, checkpoint: Path) -> None:
    """Copy every parameter from single or sharded safetensors, fusing q/k/v and gate/up as we go."""
    index_path = checkpoint / "model.safetensors.index.json"
    if index_path.is_file():
        files = sorted(set(json.loads(index_path.read_text())["weight_map"].values()))
    else:
        files = [p.name for p in sorted(checkpoint.glob("*.safetensors"))]
    if not files:
        raise FileNotFoundError(f"{checkpoint} holds no *.safetensors weights")
    targets: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():  # a tied lm_head is the embedding and is listed once
        for hf_name, rows in _checkpoint_parts(model.spec, name):
            targets[hf_name] = param.data[rows]
    loaded: set[str] = set()
    for file in files:
        loaded |= copy_safetensors_file(checkpoint / file, targets)
    missing = sorted(set(targets) - loaded)
    if missing:
        raise ValueError(f"{checkpoint} lacks {len(missing)} tensors, e.g. {', '.join(missing[:4])}")


SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
CUDA_HOST_REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly: the mapping is read-only


def copy_safetensors_file(path: Path, targets: dict[str, torch.Tensor]) -> set[str]:
    """Copy every tensor of one safetensors file that `targets` names into it; return their names.

    The file is memory-mapped and, for a GPU, the mapping is registered with CUDA (page-locked where it
    lies), so each tensor goes to the device in one DMA copy straight from the page cache. On the H200 host
    that moved a checkpoint at 13.2-13.6 GB/s, against 3.3-3.4 GB/s through safetensors' `get_tensor` and a
    copy from pageable memory (`benchmarks/weight_read.py`, results/h200/weight-read.jsonl): about 1 s of
    copying for the 7B's 12.8 GiB; the server's whole weights phase there takes 0.9-1.1 s (allocation and
    filling are timed apart in the log)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_len))
        mapped = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) if size else None
    header.pop("__metadata__", None)
    base = 8 + header_len
    wanted = {key: entry for key, entry in header.items() if key in targets}
    if not wanted or mapped is None:
        return set()
    with warnings.catch_warnings():  # read-only memory: torch warns that writing would fail; nothing writes
        warnings.simplefilter("ignore", UserWarning)
        data = torch.frombuffer(mapped, dtype=torch.uint8)
    cuda = next(iter(targets.values())).is_cuda
    registered = cuda and _register(data)
    raw = None
    try:
        for key, entry in wanted.items():
            target, shape = targets[key], tuple(entry["shape"])
            if tuple(target.shape) != shape:
                raise ValueError(f"{key}: checkpoint shape {shape} != model {tuple(target.shape)}")
            dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
            if dtype is None:
                raise ValueError(f"{key}: dtype {entry['dtype']} is not supported")
            begin, end = (base + offset for offset in entry["data_offsets"])
            if end > size:
                raise ValueError(f"{key}: the file ends inside the tensor's data")
            raw = data[begin:end]
            if begin % dtype.itemsize:  # the format aligns tensors, but a writer need not
                raw = raw.clone()
            target.copy_(raw.view(dtype).view(shape), non_blocking=registered)
        if registered:
            torch.cuda.synchronize(target.device)  # every copy has left the mapping before it goes
    finally:
        if registered:
            torch.cuda.cudart().cudaHostUnregister(data.data_ptr())
        del data, raw
        with contextlib.suppress(BufferError):  # a view outlived the copies (an error mid-way): it goes later
            mapped.close()
    return set(wanted)


def _register(data: torch.Tensor) -> bool:
    """Page-lock a host mapping for direct copies to the GPU; False where CUDA refuses (then copies go
    through pageable memory, as before)."""
    status = torch.cuda.cudart().cudaHostRegister(data.data_ptr(), data.numel(), CUDA_HOST_REGISTER_READ_ONLY)
    return int(status) == 0


def init_random_weights(model: LlamaModel, seed: int) -> None:
    """Random normal weights (std 0.02), unit norms: the right shapes and realistic magnitudes for latency
    work."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=gen)


def allocate_empty(model: torch.nn.Module, device: torch.device) -> None:
    """Give each of a meta-device model's parameters and buffers uninitialised memory on `device`; a tensor
    shared by two modules (a tied LM head) stays shared. `Module.to_empty` does the same through
    `empty_like`, whose meta-device kernel imports torch's symbolic shapes (sympy): 0.4-1.5 s of start-up."""
    made: dict[int, torch.Tensor] = {}  # by the meta tensor's id (the model keeps each alive meanwhile)
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) not in made:
                memory = torch.empty(param.shape, dtype=param.dtype, device=device)
                made[id(param)] = torch.nn.Parameter(memory, requires_grad=param.requires_grad)
            setattr(module, name, made[id(param)])
        for name, buffer in module.named_buffers(recurse=False):
            if id(buffer) not in made:
                made[id(buffer)] = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)
            setattr(module, name, made[id(buffer)])


def build_model(
    resolved: ResolvedModel, max_len: int, device: torch.device, dtype: torch.dtype, ops, seed: int = 0
) -> LlamaModel:
    """Allocate the model straight on its device in its dtype (no CPU copy, no float32 copy first) and fill
    its weights. Logs the two parts' times: allocation (which pays for CUDA's start) and filling."""
    start = time.perf_counter()
    with torch.device("meta"):
        model = LlamaModel(resolved.spec, max_len, ops).to(dtype)  # on meta: shapes only, no memory
    allocate_empty(model, device)
    model.rotary.reset_tables()  # float32, computed on the device, after the dtype cast
    allocated = time.perf_counter()
    if resolved.checkpoint is None:
        init_random_weights(model, seed)
    else:
        load_checkpoint_weights(model, resolved.checkpoint)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    filled = time.perf_counter()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    log.info(
        "model allocated on %s in %.3f s; weights filled (%s) in %.3f s, %.2f GB/s",
        device,
        allocated - start,
        "checkpoint" if resolved.checkpoint else "random",
        filled - allocated,
        size / max(filled - allocated, 1e-9) / 1e9,
    )
    return model.eval().requires_grad_(False)
