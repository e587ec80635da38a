"""Any OpenAI-compatible server: `/v1/completions` and `/v1/chat/completions`, streamed as SSE.

Stream shape (OpenAI, and the servers that copy it): `data: {...chunk...}` events, each with `choices`
(completions: `choices[0].text`; chat: `choices[0].delta.content`, the first chat chunk often carrying only
the role), optionally a final usage-only chunk (`choices: []`, asked for with
`stream_options.include_usage`), then `data: [DONE]`. Errors inside a stream come as
`{"error": {...}}` or `{"object": "error", "message": ...}`.

The plain OpenAI API has no way to force the output length, so by default nothing is forced and the
length is recorded; servers that accept `ignore_eos`/`min_tokens` (vLLM, TensorRT-LLM) have their own
adapters that do force it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from adapters.base import (
    Adapter,
    HttpRequest,
    MalformedEvent,
    StreamEvent,
    Usage,
    as_int,
    loads_event,
)
from adapters.request_spec import RequestSpec

DONE = "[DONE]"


def error_message(obj: dict[str, Any]) -> str | None:
    """The error a JSON event or body reports, in any of the shapes servers use, else None."""
    err = obj.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err)
    if isinstance(err, str):
        kind = obj.get("error_type")
        return f"{err} ({kind})" if kind else err
    if obj.get("object") == "error":
        return str(obj.get("message") or obj)
    return None


def read_usage(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None
    return Usage(as_int(value.get("prompt_tokens")), as_int(value.get("completion_tokens")))


class OpenAICompletionsAdapter(Adapter):
    """OpenAI completions protocol. Options:

    - `model`: sent as `model` (required by OpenAI and TensorRT-LLM, optional for vLLM)
    - `include_usage`: ask for the final usage chunk (`stream_options.include_usage`)
    - `continuous_usage`: ask for cumulative usage on every chunk (vLLM/TensorRT-LLM
      `stream_options.continuous_usage_stats`), which makes per-event token counts exact
    - `force_output_length`: send `ignore_eos` and `min_tokens` so the server emits exactly the wanted count
    - `prompt_as_token_ids`: send the prompt as token ids instead of text (completions only)
    - `sampling`: extra sampling fields; default greedy (`temperature: 0`)
    """

    name: ClassVar[str] = "openai"
    route: ClassVar[str] = "/v1/completions"
    chat: ClassVar[bool] = False
    health_path: ClassVar[str] = "/v1/models"  # the OpenAI API has no /health
    info_path = "/v1/models"

    def __init__(
        self,
        model: str | None = None,
        *,
        include_usage: bool = True,
        continuous_usage: bool = False,
        force_output_length: bool = False,
        prompt_as_token_ids: bool = False,
        sampling: dict[str, Any] | None = None,
    ) -> None:
        if prompt_as_token_ids and self.chat:
            raise ValueError(f"{self.name}: prompt_as_token_ids needs the completions route, not chat")
        self.model = model
        self.include_usage = include_usage or continuous_usage
        self.cumulative_usage = continuous_usage
        self.forces_output_length = force_output_length
        self.prompt_as_token_ids = prompt_as_token_ids
        self.sampling = {"temperature": 0.0} if sampling is None else dict(sampling)

    # -- request ------------------------------------------------------------------------------------

    def build_request(self, spec: RequestSpec, stream: bool = True) -> HttpRequest:
        body: dict[str, Any] = {}
        if self.model is not None:
            body["model"] = self.model
        if self.chat:
            body["messages"] = [{"role": "user", "content": spec.prompt_text}]
        else:
            body["prompt"] = list(spec.prompt_token_ids) if self.prompt_as_token_ids else spec.prompt_text
        body["max_tokens"] = spec.wanted_output_tokens
        body.update(self.sampling)
        if self.forces_output_length:
            body["ignore_eos"] = True
            body["min_tokens"] = spec.wanted_output_tokens
        if stream:
            body["stream"] = True
            options = self.stream_options()
            if options:
                body["stream_options"] = options
        return HttpRequest(self.route, self.with_body(body, spec))

    def stream_options(self) -> dict[str, bool]:
        options: dict[str, bool] = {}
        if self.include_usage:
            options["include_usage"] = True
        if self.cumulative_usage:
            options["continuous_usage_stats"] = True
        return options

    # -- response -----------------------------------------------------------------------------------

    def parse_event(self, data: bytes | str) -> StreamEvent:
        if data.strip() in (b"[DONE]", DONE):
            return StreamEvent(is_done=True)
        obj = loads_event(data)
        message = error_message(obj)
        if message is not None:
            return StreamEvent(error=message)
        usage = read_usage(obj.get("usage"))
        choices = obj.get("choices")
        if choices is None and usage is not None:
            return StreamEvent(usage=usage)
        if not isinstance(choices, list):
            raise MalformedEvent(f"OpenAI chunk without a choices list: {str(obj)[:200]}")
        if not choices:
            return StreamEvent(usage=usage)  # the usage-only chunk
        choice = choices[0]
        if not isinstance(choice, dict):
            raise MalformedEvent(f"OpenAI choice is not an object: {str(choice)[:200]}")
        finish = choice.get("finish_reason") or None
        if self.chat:
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                raise MalformedEvent(f"chat chunk without a delta object: {str(choice)[:200]}")
            text, role_only = self._read_delta(delta, finish)
        else:
            raw = choice.get("text")
            if raw is not None and not isinstance(raw, str):
                raise MalformedEvent(f"completion chunk text is not a string: {str(choice)[:200]}")
            text, role_only = raw, False
        token_ids = choice.get("token_ids")
        if isinstance(token_ids, list):
            n, exact = len(token_ids), True
        else:
            n, exact = self.estimate_tokens(text, role_only, finish), False
        return StreamEvent(n, text or "", finish, usage, is_output=True, exact=exact)

    @staticmethod
    def _read_delta(delta: dict[str, Any], finish: str | None) -> tuple[str | None, bool]:
        parts = [delta.get(key) for key in ("reasoning_content", "reasoning", "content")]
        if any(p is not None and not isinstance(p, str) for p in parts):
            raise MalformedEvent(f"chat delta text is not a string: {str(delta)[:200]}")
        pieces = [p for p in parts if p]
        text = "".join(pieces) if pieces else delta.get("content")
        has_tools = bool(delta.get("tool_calls"))
        role_only = "role" in delta and not pieces and not has_tools and finish is None
        if has_tools and text is None:
            text = ""
        return text, role_only

    def estimate_tokens(self, text: str | None, role_only: bool, finish: str | None) -> int:
        """Tokens in a chunk when the server does not say: none for a role-only chunk or a closing chunk
        without text, else one (a token may decode to empty text inside a multi-byte character)."""
        if role_only or text is None:
            return 0
        if text == "" and finish is not None:
            return 0
        return 1

    def parse_response(self, body: bytes | str) -> StreamEvent:
        obj = loads_event(body)
        message = error_message(obj)
        if message is not None:
            return StreamEvent(error=message)
        usage = read_usage(obj.get("usage"))
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise MalformedEvent(f"OpenAI response without choices: {str(obj)[:200]}")
        choice = choices[0]
        text = (choice.get("message") or {}).get("content") if self.chat else choice.get("text")
        n = usage.completion_tokens if usage and usage.completion_tokens is not None else 0
        return StreamEvent(
            n,
            text or "",
            choice.get("finish_reason"),
            usage,
            is_done=True,
            is_output=True,
            exact=usage is not None,
        )

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "route": self.route, "model": self.model}


class OpenAIChatAdapter(OpenAICompletionsAdapter):
    """OpenAI chat completions protocol (same options, prompt sent as one user message)."""

    name = "openai-chat"
    route = "/v1/chat/completions"
    chat = True
