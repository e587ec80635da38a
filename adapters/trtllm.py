"""TensorRT-LLM: `trtllm-serve`'s OpenAI server, and Triton's generate endpoint with the TensorRT-LLM backend.

`trtllm-serve` (`tensorrt_llm/serve/openai_protocol.py`, `postprocess_handlers.py`) copies vLLM's protocol
with its own quirks: `model` is required; unknown request fields are rejected (pydantic `extra="forbid"`);
`ignore_eos`, `min_tokens` and `stream_options.continuous_usage_stats` exist; completion chunks are
serialised with every field (`"token_ids":null`, `"avg_decoded_tokens_per_iter":null`, `"usage":null`);
chat chunks leave out null fields, and the first one is role-only (`{"role":"assistant"}` without content)
and written as `data: {...} \\n\\n` with a space before the blank line.

Triton (`/v2/models/<model>/generate_stream`, generate extension): the request is the model's inputs as
JSON (`text_input`, `max_tokens`, `stream`, `min_length` to force the length); every response is one SSE
event `data: {"model_name":..,"model_version":..,"text_output":".."...}` carrying one decoding step's text
(no token count, no usage, no end marker: the stream just ends). Errors come as `data: {"error": "..."}`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import yaml

from adapters.base import Adapter, HttpRequest, MalformedEvent, SettingFlags, StreamEvent, loads_event
from adapters.launch_spec import CONFIG_MOUNT, LaunchSpec, ModelSource, Variant, needs_gpu
from adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter, error_message
from adapters.request_spec import RequestSpec
from adapters.startup_log import clock, pattern

TRTLLM_METRICS = {  # trtllm-serve, served at /prometheus/metrics
    "trtllm_request_success_total": "requests_finished_total",
    "trtllm_e2e_request_latency_seconds": "e2e_seconds",
    "trtllm_time_to_first_token_seconds": "ttft_seconds",
    "trtllm_time_per_output_token_seconds": "tpot_seconds",
    "trtllm_request_queue_time_seconds": "queue_seconds",
}

TRITON_METRICS = {  # Triton, served on the metrics port (8002 by default) at /metrics
    "nv_inference_request_success": "requests_finished_total",
    "nv_inference_request_failure": "requests_failed_total",
    "nv_inference_queue_duration_us": "queue_microseconds_total",
    "nv_inference_request_duration_us": "request_microseconds_total",
}

# Request fields trtllm-serve accepts (its pydantic models forbid any other); checked before sending so a
# typo fails here with a clear message rather than as a 400 from the server.
_COMMON_FIELDS = {
    "model",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "user",
    "lora_request",
    "prompt_ignore_length",
    "use_beam_search",
    "top_k",
    "top_p_min",
    "min_p",
    "repetition_penalty",
    "length_penalty",
    "early_stopping",
    "stop_token_ids",
    "include_stop_str_in_output",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "truncate_prompt_tokens",
    "add_special_tokens",
    "response_format",
    "disaggregated_params",
    "priority",
    "conversation_params",
    "thinking_token_budget",
}
TRTLLM_COMPLETION_FIELDS = _COMMON_FIELDS | {
    "prompt",
    "max_tokens",
    "suffix",
    "return_context_logits",
    "detokenize",
}
TRTLLM_CHAT_FIELDS = _COMMON_FIELDS | {
    "messages",
    "prompt_token_ids",
    "max_tokens",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "thinking",
    "add_generation_prompt",
    "documents",
    "chat_template",
    "chat_template_kwargs",
    "media_io_kwargs",
    "cache_salt",
    "agent_hierarchy",
    "mm_processor_kwargs",
}


#: trtllm-serve's start-up lines (PyTorch backend; the TensorRT backend adds the engine build). The KV cache
#: is sized twice (an estimate, then the real pool after a profiling run), so the last figure wins; the
#: graphs are captured once per sizing round, so their time adds up.
TRTLLM_STARTUP = [
    pattern("weights_size", r"Use (?P<gib>[\d.]+) GB for model weights", memory="weights"),  # GB as 2**30 B
    pattern(
        "model_init",
        r"Model init total -- (?P<seconds>[\d.]+)s",
        phase="weights",
        detail="model built and weights loaded",
    ),
    pattern(
        "engine_generation",
        r"Engine generation completed in (?P<seconds>[\d.]+) seconds",
        phase="engine_build",
        repeat="sum",
        detail="TensorRT engine generation",
    ),
    pattern(
        "engines_built",
        r"Total time of building all engines: (?P<seconds>\d+:\d\d:\d\d)",
        phase="engine_build_total",
        detail="engine build and serialisation",
    ),
    pattern(
        "kv_cache_allocated",
        r"Allocated (?P<gib>[\d.]+) GiB for max tokens in paged KV cache "
        r"\((?P<tokens>\d+)\)",
        memory="kv_cache",
    ),
    pattern("tokens_per_block", r"Number of tokens per block: (?P<block_size>\d+)"),
    pattern(
        "autotune_started",
        r"\[Autotuner\] Autotuning process starts",
        begins="autotune",
        repeat="sum",
        detail="kernel autotuning",
    ),
    pattern("autotune_done", r"\[Autotuner\] Autotuning process ends", ends="autotune"),
    pattern(
        "graphs_started",
        r"Creating CUDA graph instances for (?P<count>\d+) batch sizes",
        begins="cuda_graphs",
        repeat="sum",
        detail="CUDA-graph capture",
    ),
    pattern(
        "graphs_done",
        r"Memory used after loading model weights \(inside torch\)|Setting PyTorch memory "
        r"fraction",
        ends="cuda_graphs",
    ),
    pattern("server_ready", r"Application startup complete|Uvicorn running on", ready=True),
]
#: `[12/20/2025-04:21:37] [TRT-LLM] [I] ...` (local time)
TRTLLM_CLOCK = clock(r"^\[(\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d)\]", "%m/%d/%Y-%H:%M:%S")


TRTLLM_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release:latest"  # pin a tag for results you keep
TRTLLM_OPTIONS = "extra-llm-api-options.yml"


def trtllm_options(model: ModelSource, variant: Variant) -> dict[str, Any]:
    """The LLM API options YAML (`--extra_llm_api_options`) for a variant: `cuda_graph_config: null` turns
    graphs off (left out, the PyTorch backend captures them by default), `cuda_graph_config.batch_sizes`
    picks the sizes, `kv_cache_config.tokens_per_block` sets the KV block size."""
    options: dict[str, Any] = {}
    if variant.graphs is False:
        options["cuda_graph_config"] = None
    elif variant.graph_sizes:
        options["cuda_graph_config"] = {"batch_sizes": list(variant.graph_sizes)}
    if variant.block_size:
        options["kv_cache_config"] = {"tokens_per_block": variant.block_size}
    if model.dtype != "auto":
        options["dtype"] = model.dtype
    return options


#: trtllm-serve's flags for the audited settings: the most requests in a batch, the tokens a batch may
#: carry, tensor and pipeline parallel
TRTLLM_SETTING_FLAGS: SettingFlags = {
    "max_num_seqs": ("--max_batch_size",),
    "max_batched_tokens": ("--max_num_tokens",),
    "tensor_parallel": ("--tp_size",),
    "pipeline_parallel": ("--pp_size",),
}


class _TrtllmLaunch(Adapter):
    """How to start trtllm-serve."""

    server_family = "trtllm"
    setting_flags = TRTLLM_SETTING_FLAGS

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
        flags = ["--backend", "pytorch"]
        if variant.max_num_seqs:
            flags += ["--max_batch_size", str(variant.max_num_seqs)]
        if model.max_model_len:
            flags += ["--max_seq_len", str(model.max_model_len)]
        options = trtllm_options(model, variant)
        files = {TRTLLM_OPTIONS: yaml.safe_dump(options, sort_keys=False)} if options else {}
        host_opts = ["--extra_llm_api_options", str(workdir / TRTLLM_OPTIONS)] if options else []
        box_opts = ["--extra_llm_api_options", f"{CONFIG_MOUNT}/{TRTLLM_OPTIONS}"] if options else []
        exe = executable or os.environ.get("LLM_COMPARE_TRTLLM") or "trtllm-serve"
        volumes = model.volumes()
        if options:
            volumes[str(workdir.resolve())] = {"bind": CONFIG_MOUNT, "mode": "ro"}
        return LaunchSpec(
            cls.name,
            [exe, model.model, "--host", "127.0.0.1", "--port", str(port), *flags, *host_opts],
            TRTLLM_IMAGE,
            # the release image starts no server itself: the command is trtllm-serve
            ["trtllm-serve", model.in_container(), "--host", "0.0.0.0", "--port", "8000", *flags, *box_opts],
            port,
            health_path="/health",
            env={"HF_HUB_OFFLINE": "1"} if model.local else {},
            gpus=gpu,
            shm_size="16g",
            volumes=volumes,
            ulimits={"memlock": -1, "stack": 67108864},  # as NVIDIA's quick start runs the image
            files=files,
            container_error=None if gpu else needs_gpu("trtllm"),
            served_as=model.model,  # trtllm-serve names the model by the argument it was given
            container_served_as=model.in_container(),
        )


class _TrtllmServeMixin(_TrtllmLaunch, OpenAICompletionsAdapter):
    """trtllm-serve's OpenAI routes, which refuse any request field their models do not know."""

    health_path = "/health"
    info_path = "/v1/models"
    metrics_path = "/prometheus/metrics"
    metric_names = TRTLLM_METRICS
    startup_patterns = TRTLLM_STARTUP
    log_clock = TRTLLM_CLOCK
    known_fields: ClassVar[frozenset[str]] = frozenset()

    def __init__(
        self,
        model: str | None = None,
        *,
        continuous_usage: bool = True,
        force_output_length: bool = True,
        **options: Any,
    ) -> None:
        if not model:
            raise ValueError("trtllm-serve requires the model name in every request: pass model=...")
        super().__init__(
            model, continuous_usage=continuous_usage, force_output_length=force_output_length, **options
        )

    def build_request(self, spec: RequestSpec, stream: bool = True) -> HttpRequest:
        request = super().build_request(spec, stream)
        unknown = sorted(set(request.body) - self.known_fields)
        if unknown:
            raise ValueError(f"trtllm-serve rejects unknown request fields: {', '.join(unknown)}")
        return request


class TrtllmCompletionsAdapter(_TrtllmServeMixin, OpenAICompletionsAdapter):
    name = "trtllm"
    known_fields = frozenset(TRTLLM_COMPLETION_FIELDS)


class TrtllmChatAdapter(_TrtllmServeMixin, OpenAIChatAdapter):
    name = "trtllm-chat"
    known_fields = frozenset(TRTLLM_CHAT_FIELDS)


class TritonGenerateAdapter(Adapter):
    """Triton's generate extension in front of a TensorRT-LLM model (default the `ensemble` model).

    Options: `model`; `force_output_length` sends `min_length` (the TensorRT-LLM backend's input name;
    `min_length_field` changes it); `sampling` adds model inputs such as `temperature`.
    Every event is counted as one token (one decoding step); with speculative decoding a step can carry
    more, which this protocol does not say: re-tokenisation is the only check then.
    """

    name: ClassVar[str] = "trtllm-triton"
    health_path: ClassVar[str] = "/v2/health/ready"
    own_model_name = True  # a Triton model (`ensemble`), not the checkpoint's served name
    metric_names = TRITON_METRICS
    final_event = "none"

    def __init__(
        self,
        model: str = "ensemble",
        *,
        force_output_length: bool = True,
        min_length_field: str = "min_length",
        sampling: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.forces_output_length = force_output_length
        self.min_length_field = min_length_field
        self.sampling = dict(sampling or {})
        self.info_path = f"/v2/models/{model}"

    def build_request(self, spec: RequestSpec, stream: bool = True) -> HttpRequest:
        body: dict[str, Any] = {
            "text_input": spec.prompt_text,
            "max_tokens": spec.wanted_output_tokens,
            "stream": stream,
            **self.sampling,
        }
        if self.forces_output_length:
            body[self.min_length_field] = spec.wanted_output_tokens
        route = "generate_stream" if stream else "generate"
        return HttpRequest(f"/v2/models/{self.model}/{route}", self.with_body(body, spec))

    def parse_event(self, data: bytes | str) -> StreamEvent:
        obj = loads_event(data)
        message = error_message(obj)
        if message is not None:
            return StreamEvent(error=message)
        text = obj.get("text_output")
        if not isinstance(text, str):
            raise MalformedEvent(f"Triton response without text_output: {str(obj)[:200]}")
        return StreamEvent(1, text, is_output=True)

    def parse_response(self, body: bytes | str) -> StreamEvent:
        event = self.parse_event(body)
        event.n_tokens = 0  # a whole response: the count is unknown without re-tokenising
        event.is_done = True
        return event
