"""The reference server's command-line options, and the engine configuration they make.

Kept apart from the server module and light to import (argparse and the configuration only), so that the
command line can start the engine core's process before the front end imports aiohttp, torch and transformers.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from reference_engine.config import EngineConfig

DESCRIPTION = "HTTP server for the reference engine: OpenAI and TGI protocols, health, version, metrics."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m reference_engine.server", description=DESCRIPTION)
    p.add_argument(
        "--model", default="smollm2-135m", help="checkpoint dir, hub id, built-in or random:<shape>"
    )
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--served-model-name", default=None, help="name clients use; defaults to --model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--kv-cache-memory", default=None, help="KV-cache budget, e.g. 2GiB")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="sequences per step (default: 256 on a GPU, 64 on a CPU)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="tokens per step, prefill chunks included (default: 8192 on a GPU, 2048 on a CPU)",
    )
    p.add_argument(
        "--mixed-prefill-tokens",
        type=int,
        default=None,
        metavar="TOKENS",
        help="prompt tokens a step may carry while other sequences decode, so that a wave of "
        "arrivals is prefilled over several short steps rather than stalling every stream "
        "for one long one (default: a share of --max-num-batched-tokens in proportion to "
        "the sequences on their prompt against those decoding, at least 1024)",
    )
    p.add_argument(
        "--mixed-prefill-share",
        choices=("linear", "quadratic"),
        default="linear",
        help="how the default share of prompt tokens beside decodes falls as decodes outnumber "
        "prompts: in proportion to the prompts' fraction of the sequences, or to its square "
        "(default: linear)",
    )
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument(
        "--cudagraph-capture-sizes",
        type=int,
        nargs="+",
        default=None,
        help="decode batch sizes to capture CUDA graphs for (default: buckets up to --max-num-seqs)",
    )
    p.add_argument(
        "--cudagraph-context-bounds",
        type=int,
        nargs="*",
        default=None,
        metavar="TOKENS",
        help="also capture every decode graph for these context bounds below --max-model-len: a "
        "step replays the smallest that holds its longest context, launching attention for "
        "fewer partitions (default: 1024 and each four times the last below max-model-len; "
        "given with no value: max-model-len only)",
    )
    p.add_argument(
        "--mixed-cudagraph-sizes",
        type=int,
        nargs="*",
        default=None,
        metavar="TOKENS",
        help="token counts to capture CUDA graphs of everything but attention for, replayed by "
        "steps that carry prompt tokens (default: 16 to 1024 up to --max-num-batched-tokens; "
        "given with no value: none, such steps run eagerly)",
    )
    p.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--max-waiting", type=int, default=4096, help="answer 503 when this many requests wait")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024**2)
    p.add_argument(
        "--shutdown-timeout", type=float, default=30.0, help="seconds running requests get on SIGTERM"
    )
    p.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="torch threads when serving on the CPU (default: one fewer than the cores, as "
        "vLLM's CPU build keeps one for its API server: OpenMP threads that must share a "
        "core with the event loop stall each other)",
    )
    p.add_argument(
        "--kernels",
        choices=("auto", "torch", "triton"),
        default="auto",
        help="hot-path kernels: auto (Triton on CUDA; on the CPU in float32 the C decode "
        "attention when a C compiler is present), or torch / triton forced",
    )
    p.add_argument(
        "--cpu-linear",
        choices=("onednn", "torch"),
        default="onednn",
        help="float32 linears on the CPU: oneDNN on weights packed at load (default), or F.linear",
    )
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="overlapped decode: queue each pure-decode step before reading the last one's "
        "tokens (fed to it on the device), so the GPU never waits for the host between "
        "steps; steps with a prefill, a preemption or min_tokens still in force run "
        "synchronously. Greedy tokens are the same either way (default: on for CUDA, off on "
        "the CPU, where it cannot overlap anything)",
    )
    p.add_argument(
        "--engine-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the engine core in a child process of its own, so its host work and the "
        "HTTP front end's do not share a GIL (default); --no-engine-process steps it in a "
        "thread of the server's process",
    )
    p.add_argument(
        "--api-server-count",
        type=int,
        default=None,
        metavar="N",
        help="HTTP front-end processes sharing the port (SO_REUSEPORT), each streaming its own "
        "connections' tokens from the one engine core, so that detokenising, JSON and socket "
        "writes at high token rates spread over N cores (default: 4 where an NVIDIA GPU is "
        "present and there are 16 or more cores, else 1; needs --engine-process)",
    )
    p.add_argument(
        "--event-loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="the front end's event loop: uvloop where installed (auto), or asyncio's own",
    )
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    if args.api_server_count is not None and args.api_server_count < 1:
        p.error("--api-server-count must be at least 1")
    if (args.api_server_count or 1) > 1 and not args.engine_process:
        p.error(
            "--api-server-count above 1 needs the engine core in its own process (drop --no-engine-process)"
        )
    if args.api_server_count is None:
        args.api_server_count = default_api_server_count(args.device, args.engine_process)
    return args


def default_api_server_count(device: str, engine_process: bool) -> int:
    """How many front-end processes serve HTTP by default. Several pay only where tokens stream faster than
    one process can write them (a GPU) and there are cores to spare beside the engine core; on a CPU the cores
    belong to the model's arithmetic. Decided without importing torch (this runs before the core starts)."""
    gpu = device.startswith("cuda") or (device == "auto" and Path("/proc/driver/nvidia/version").exists())
    return 4 if engine_process and gpu and (os.cpu_count() or 1) >= 16 else 1


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine's configuration from the parsed options."""
    return EngineConfig(
        model=args.model,
        tokenizer=args.tokenizer,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        mixed_prefill_tokens=args.mixed_prefill_tokens,
        mixed_prefill_share=args.mixed_prefill_share,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        enforce_eager=args.enforce_eager,
        cuda_graph_batch_sizes=args.cudagraph_capture_sizes,
        cuda_graph_context_bounds=args.cudagraph_context_bounds,
        mixed_cuda_graph_sizes=args.mixed_cudagraph_sizes,
        kernels=args.kernels,
        cpu_linear=args.cpu_linear,
        seed=args.seed,
        async_scheduling=args.async_scheduling,
    )
