"""Hugging Face Text Generation Inference: its own `/generate_stream` protocol and its OpenAI routes.

`/generate_stream` (TGI router `server.rs`, types in `lib.rs`): one SSE event per generated token,
`data:{"index":..,"token":{"id":..,"text":..,"logprob":..,"special":..},"generated_text":null,
"details":null}` (axum writes `data:` without a space); the last token's event carries `generated_text` and,
when the request set `parameters.details`, `details` with `finish_reason`, `generated_tokens` and (3.x)
`input_length`. Errors: `data:{"error":"...","error_type":"..."}`. There is no `[DONE]`.

TGI cannot be told to ignore EOS over HTTP, so the output length is asked for (`max_new_tokens`) but not
forced; the record keeps the wanted and the actual length.

The OpenAI routes (`/v1/chat/completions`, `/v1/completions`) stream one chunk per token; every chat chunk
repeats `"role":"assistant"` next to its content (there is no role-only chunk), completion chunks carry
`"finish_reason":""` until the last one, and usage comes on the last chunk (completions) or in a usage-only
chunk when `stream_options.include_usage` is set (chat). TGI has no continuous usage.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from adapters.base import (
    Adapter,
    HttpRequest,
    MalformedEvent,
    SettingFlags,
    StreamEvent,
    Usage,
    as_int,
    loads_event,
)
from adapters.launch_spec import LaunchSpec, LaunchSpecError, ModelSource, Variant, needs_gpu
from adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter, error_message
from adapters.request_spec import RequestSpec
from adapters.startup_log import clock, pattern

TGI_METRICS = {
    "tgi_queue_size": "requests_waiting",
    "tgi_batch_current_size": "requests_running",
    "tgi_request_count": "requests_total",
    "tgi_request_success": "requests_finished_total",
    "tgi_request_input_length": "prompt_tokens",
    "tgi_request_generated_tokens": "generation_tokens",
    "tgi_request_duration": "e2e_seconds",
    "tgi_request_queue_duration": "queue_seconds",
    "tgi_request_mean_time_per_token_duration": "tpot_seconds",
}


#: text-generation-launcher's start-up lines (launcher, shards and router share one stream). Weights are
#: downloaded (or found), each shard loads the model (`Shard ready in`, Rust's Debug duration, one line per
#: rank), then the router warms the model up, which captures the CUDA graphs, and sizes the KV cache.
TGI_STARTUP = [
    pattern(
        "download_started",
        r"Starting (?:check and )?download process",
        begins="download",
        detail="weights downloaded or found",
    ),
    pattern("download_done", r"Successfully downloaded weights", ends="download"),
    pattern(
        "shard_ready",
        r"Shard ready in (?P<seconds>[\d.]+(?:ns|µs|us|ms|s))",
        phase="shard_load",
        detail="shard loaded the model",
    ),
    pattern(
        "warmup_started",
        r"Warming up model",
        begins="warmup",
        detail="router warm-up: CUDA graphs, KV-cache sizing",
    ),
    pattern("kv_cache_blocks", r"KV-cache blocks: (?P<blocks>\d+), size: (?P<block_size>\d+)"),
    pattern("graphs_enabled", r"Cuda Graphs are enabled for sizes (?P<sizes>\[[\d, ]*\])"),
    pattern(
        "max_batch_total_tokens",
        r"Setting max batch total tokens to (?P<tokens>\d+)",
        memory="kv_tokens",
        ends="warmup",
    ),
    pattern("connected", r"text_generation_router[\w:]*: \S+: Connected$|\bConnected$", ready=True),
]
#: `2024-05-31T05:54:04.410417Z  INFO text_generation_launcher: ...` (tracing's UTC time stamp)
TGI_CLOCK = clock(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", "%Y-%m-%dT%H:%M:%S.%f", utc=True)


TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:latest"  # pin a tag for results you keep


def tgi_flags(model: ModelSource, variant: Variant) -> list[str]:
    """text-generation-launcher's flags for a variant (launcher/src/main.rs: `--cuda-graphs` takes a comma
    list, "0" turns graphs off; `--max-batch-size`; `--max-total-tokens` and `--max-input-tokens` bound a
    request; `--dtype` is float16 or bfloat16)."""
    flags = []
    if variant.graphs is False:
        flags += ["--cuda-graphs", "0"]
    elif variant.graph_sizes:
        flags += ["--cuda-graphs", ",".join(map(str, variant.graph_sizes))]
    if variant.block_size:
        raise LaunchSpecError(
            "TGI has no flag for the KV-cache block size: its attention backend fixes it (flashinfer 1, "
            "flashdecoding 256, paged 16, chosen with the ATTENTION environment variable)"
        )
    if variant.max_num_seqs:
        flags += ["--max-batch-size", str(variant.max_num_seqs)]
    if model.max_model_len:
        flags += [
            "--max-total-tokens",
            str(model.max_model_len),
            "--max-input-tokens",
            str(model.max_model_len - 1),
        ]
    if model.dtype not in ("auto", "float16", "bfloat16"):
        raise LaunchSpecError(f"TGI serves float16 or bfloat16, not {model.dtype}")
    if model.dtype != "auto":
        flags += ["--dtype", model.dtype]
    return flags


#: text-generation-launcher's flags for the audited settings (launcher/src/main.rs): its batch limit, its
#: prefill token budget per batch, its shard count (tensor parallel), its KV-cache dtype
TGI_SETTING_FLAGS: SettingFlags = {
    "max_num_seqs": ("--max-batch-size",),
    "max_batched_tokens": ("--max-batch-prefill-tokens",),
    "tensor_parallel": ("--num-shard",),
    "kv_cache_dtype": ("--kv-cache-dtype",),
}


class _TGILaunch(Adapter):
    """How to start TGI (text-generation-launcher)."""

    server_family = "tgi"
    setting_flags = TGI_SETTING_FLAGS

    @classmethod
    def launch_spec(
        cls,
        model: ModelSource,
        variant: Variant,
        port: int,
        *,
        workdir: Path,
        gpu: bool,
        executable: str | None = None,
    ) -> LaunchSpec:
        flags = tgi_flags(model, variant)
        exe = executable or os.environ.get("LLM_COMPARE_TGI") or "text-generation-launcher"
        spec = LaunchSpec(
            cls.name,
            [exe, "--model-id", model.model, "--hostname", "127.0.0.1", "--port", str(port), *flags],
            TGI_IMAGE,
            # the image's entrypoint is text-generation-launcher (listening on 80 by default)
            ["--model-id", model.in_container(), "--hostname", "0.0.0.0", "--port", "8000", *flags],
            port,
            health_path="/health",
            env={"HF_HUB_OFFLINE": "1"} if model.local else {},
            gpus=gpu,
            shm_size="16g",
            volumes=model.volumes(),
            container_error=None if gpu else needs_gpu("tgi"),
        )
        spec.notes.append("TGI serves one model and ignores the model name in requests")
        return spec


class TGIAdapter(_TGILaunch):
    """TGI's native protocol. Options: `sampling` (extra `parameters`; default greedy `do_sample: false`)."""

    name: ClassVar[str] = "tgi"
    health_path: ClassVar[str] = "/health"
    info_path = "/info"
    metric_names = TGI_METRICS
    startup_patterns = TGI_STARTUP
    log_clock = TGI_CLOCK
    final_event = "done"

    def __init__(self, model: str | None = None, *, sampling: dict[str, Any] | None = None) -> None:
        self.model = model  # TGI serves one model; kept for reports
        self.sampling = {"do_sample": False} if sampling is None else dict(sampling)

    def build_request(self, spec: RequestSpec, stream: bool = True) -> HttpRequest:
        parameters = {"max_new_tokens": spec.wanted_output_tokens, "details": True, **self.sampling}
        body = {"inputs": spec.prompt_text, "parameters": parameters}
        return HttpRequest("/generate_stream" if stream else "/generate", self.with_body(body, spec))

    def parse_event(self, data: bytes | str) -> StreamEvent:
        obj = loads_event(data)
        message = error_message(obj)
        if message is not None:
            return StreamEvent(error=message)
        token = obj.get("token")
        if not isinstance(token, dict):
            raise MalformedEvent(f"TGI stream event without a token object: {str(obj)[:200]}")
        text = token.get("text")
        if not isinstance(text, str):
            raise MalformedEvent(f"TGI token text is not a string: {str(token)[:200]}")
        details = obj.get("details")
        finish, usage = None, None
        if isinstance(details, dict):
            finish = details.get("finish_reason")
            usage = Usage(as_int(details.get("input_length")), as_int(details.get("generated_tokens")))
        is_done = details is not None or obj.get("generated_text") is not None
        return StreamEvent(1, text, finish, usage, is_done=is_done, is_output=True, exact=True)

    def parse_response(self, body: bytes | str) -> StreamEvent:
        obj = loads_event(body)
        message = error_message(obj)
        if message is not None:
            return StreamEvent(error=message)
        if not isinstance(obj.get("generated_text"), str):
            raise MalformedEvent(f"TGI response without generated_text: {str(obj)[:200]}")
        given = obj.get("details")
        details = given if isinstance(given, dict) else {}
        generated = as_int(details.get("generated_tokens"))
        usage = Usage(None, generated) if generated is not None else None
        return StreamEvent(
            generated or 0,
            obj["generated_text"],
            details.get("finish_reason"),
            usage,
            is_done=True,
            is_output=True,
            exact=generated is not None,
        )


class _TGIOpenAIMixin(_TGILaunch, OpenAICompletionsAdapter):
    """TGI's OpenAI routes: its start-up log and metrics, one chunk per token."""

    health_path = "/health"
    info_path = "/info"
    metric_names = TGI_METRICS
    startup_patterns = TGI_STARTUP
    log_clock = TGI_CLOCK
    final_event = "finish"  # the last token's chunk has finish_reason; older TGI sends no [DONE]

    def estimate_tokens(self, text: str | None, role_only: bool, finish: str | None) -> int:
        return 1  # TGI streams exactly one chunk per generated token


class TGIOpenAIChatAdapter(_TGIOpenAIMixin, OpenAIChatAdapter):
    name = "tgi-openai"

    def __init__(self, model: str | None = "tgi", **options: Any) -> None:
        if options.get("continuous_usage"):
            raise ValueError("TGI has no continuous usage (stream_options.continuous_usage_stats)")
        if options.get("force_output_length"):
            raise ValueError("TGI cannot force the output length (no ignore_eos/min_tokens)")
        super().__init__(model, **options)


class TGIOpenAICompletionsAdapter(_TGIOpenAIMixin, OpenAICompletionsAdapter):
    name = "tgi-openai-completions"

    def __init__(self, model: str | None = "tgi", **options: Any) -> None:
        if options.get("continuous_usage"):
            raise ValueError("TGI has no continuous usage (stream_options.continuous_usage_stats)")
        if options.get("force_output_length"):
            raise ValueError("TGI cannot force the output length (no ignore_eos/min_tokens)")
        options.setdefault("include_usage", False)  # TGI's completions route has no stream_options
        super().__init__(model, **options)
