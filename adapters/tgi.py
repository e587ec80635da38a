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

from typing import Any, ClassVar

from adapters.base import Adapter, HttpRequest, MalformedEvent, StreamEvent, Usage, as_int, loads_event
from adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter, error_message
from workloads.spec import RequestSpec

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


class TGIAdapter(Adapter):
    """TGI's native protocol. Options: `sampling` (extra `parameters`; default greedy `do_sample: false`)."""

    name: ClassVar[str] = "tgi"
    health_path: ClassVar[str] = "/health"
    info_path: ClassVar[str | None] = "/info"
    metric_names = TGI_METRICS
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
        details = obj.get("details") if isinstance(obj.get("details"), dict) else {}
        generated = as_int(details.get("generated_tokens"))
        usage = Usage(None, generated) if generated is not None else None
        return StreamEvent(generated or 0, obj["generated_text"], details.get("finish_reason"), usage,
                           is_done=True, is_output=True, exact=generated is not None)


class _TGIOpenAIMixin:
    health_path = "/health"
    info_path = "/info"
    metric_names = TGI_METRICS
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
