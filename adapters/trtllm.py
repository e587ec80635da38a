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

from typing import Any, ClassVar

from adapters.base import Adapter, HttpRequest, MalformedEvent, StreamEvent, loads_event
from adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter, error_message
from workloads.spec import RequestSpec

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
    "model", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "n", "presence_penalty",
    "seed", "stop", "stream", "stream_options", "temperature", "top_p", "user", "lora_request",
    "prompt_ignore_length", "use_beam_search", "top_k", "top_p_min", "min_p", "repetition_penalty",
    "length_penalty", "early_stopping", "stop_token_ids", "include_stop_str_in_output", "ignore_eos",
    "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "add_special_tokens", "response_format", "disaggregated_params", "priority", "conversation_params",
    "thinking_token_budget",
}
TRTLLM_COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "max_tokens", "suffix", "return_context_logits",
                                             "detokenize"}
TRTLLM_CHAT_FIELDS = _COMMON_FIELDS | {
    "messages", "prompt_token_ids", "max_tokens", "max_completion_tokens", "top_logprobs", "tools",
    "tool_choice", "parallel_tool_calls", "reasoning_effort", "thinking", "add_generation_prompt",
    "documents", "chat_template", "chat_template_kwargs", "media_io_kwargs", "cache_salt",
    "agent_hierarchy", "mm_processor_kwargs",
}


class _TrtllmServeMixin:
    health_path = "/health"
    info_path = "/v1/models"
    metrics_path = "/prometheus/metrics"
    metric_names = TRTLLM_METRICS
    known_fields: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, model: str | None = None, *, continuous_usage: bool = True,
                 force_output_length: bool = True, **options: Any) -> None:
        if not model:
            raise ValueError("trtllm-serve requires the model name in every request: pass model=...")
        super().__init__(model, continuous_usage=continuous_usage, force_output_length=force_output_length,
                         **options)

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
    metric_names = TRITON_METRICS
    final_event = "none"

    def __init__(self, model: str = "ensemble", *, force_output_length: bool = True,
                 min_length_field: str = "min_length", sampling: dict[str, Any] | None = None) -> None:
        self.model = model
        self.forces_output_length = force_output_length
        self.min_length_field = min_length_field
        self.sampling = dict(sampling or {})

    @property
    def info_path(self) -> str:  # type: ignore[override]
        return f"/v2/models/{self.model}"

    def build_request(self, spec: RequestSpec, stream: bool = True) -> HttpRequest:
        body: dict[str, Any] = {"text_input": spec.prompt_text, "max_tokens": spec.wanted_output_tokens,
                                "stream": stream, **self.sampling}
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
