"""The OpenAI protocol as vLLM's server speaks it: /v1/models, /v1/completions, /v1/chat/completions.

Response and chunk shapes (field order included) follow vLLM's OpenAI server, so any client or benchmark
written against vLLM reads our stream the same way.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reference_engine.config import SamplingParams
from reference_engine.serving.generation import GenerationRequest, TokenEvent


class ApiError(Exception):
    """A client error, rendered in the protocol's own error shape."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "UnprocessableEntity",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "Error"),
            "param": param,
            "code": status,
        }
    }


def dumps(obj: Any) -> str:
    """Compact JSON with raw UTF-8, as pydantic's model_dump_json writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(BaseModel):
    """Fields common to completions and chat (vLLM's names and defaults)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_tokens: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    best_of: int | None = None

    @field_validator("n")
    @classmethod
    def _single_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def sampling_params(self, max_tokens: int, logprobs: bool) -> SamplingParams:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise ApiError(400, f"{name} is not supported by this server", name)
        if self.best_of not in (None, 1):
            raise ApiError(400, "best_of > 1 is not supported", "best_of")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options can only be given when stream is true", "stream_options")
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                min_tokens=self.min_tokens,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=self.top_k or 0,
                seed=self.seed,
                stop_token_ids=self.stop_token_ids or [],
                ignore_eos=self.ignore_eos,
                logprobs=logprobs,
            )
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


class OpenAIRoutes:
    """Handlers bound to one server state (engine, tokenizer, metrics, served model name)."""

    def __init__(self, state) -> None:
        self.state = state

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/models", self.models),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
        ]

    async def models(self, request: web.Request) -> web.Response:
        s = self.state
        card = {
            "id": s.served_model_name,
            "object": "model",
            "created": s.created,
            "owned_by": "llm-compare",
            "root": s.model_path,
            "parent": None,
            "max_model_len": s.info.max_model_len,
            "permission": [],
        }
        return web.json_response({"object": "list", "data": [card]}, dumps=dumps)

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.state.served_model_name:
            raise ApiError(404, f"The model `{name}` does not exist.", "model")

    def _check_length(self, prompt_len: int, max_tokens: int | None, what: str) -> int:
        limit = self.state.info.max_model_len
        if max_tokens is None:
            max_tokens = limit - prompt_len
        if max_tokens < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        if prompt_len + max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the {what}, "
                f"{max_tokens} in the completion). Please reduce the length of the messages "
                "or completion.",
                "max_tokens",
            )
        return max_tokens

    def _start(
        self,
        prefix: str,
        req: _SamplingFields,
        prompt_ids: list[int],
        max_tokens: int | None,
        what: str,
        logprobs: bool,
    ):
        max_tokens = self._check_length(len(prompt_ids), max_tokens, what)
        gen = GenerationRequest(
            prompt_ids,
            req.sampling_params(max_tokens, logprobs=logprobs),
            req.stop_strings(),
            req.skip_special_tokens,
            req.include_stop_str_in_output,
        )
        return self.state.start(prefix, gen)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = parse_body(await read_json(request), CompletionRequest)
        self._check_model(req.model)
        if req.echo or req.suffix or req.logprobs is not None:
            raise ApiError(400, "echo, suffix and logprobs are not supported by this server")
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise ApiError(
                    400, "batched prompts are not supported; send one prompt per request", "prompt"
                )
            prompt = prompt[0]
        prompt_ids = self.state.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", "prompt")
        request_id, events = self._start("cmpl", req, prompt_ids, req.max_tokens, "prompt", logprobs=False)
        created = int(time.time())
        model = self.state.served_model_name
        if not req.stream:
            text, last = await _collect(events)
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": last.finish_reason,
                "stop_reason": last.stop_reason,
                "prompt_logprobs": None,
            }
            body = {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": {**_usage(len(prompt_ids), last.index), "prompt_tokens_details": None},
                "system_fingerprint": self.state.fingerprint,
            }
            return web.json_response(body, dumps=dumps)
        options = req.stream_options or StreamOptions()
        continuous = options.include_usage and options.continuous_usage_stats
        response = await start_sse(request)
        writer = EventWriter(response)
        n_prompt = len(prompt_ids)
        async for ev in events:
            choice = {
                "index": 0,
                "text": ev.text,
                "logprobs": None,
                "finish_reason": ev.finish_reason,
                "stop_reason": ev.stop_reason,
                "prompt_token_ids": None,
                "token_ids": None,
            }
            chunk: dict[str, Any] = {
                "id": request_id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
            }
            if continuous:
                chunk["usage"] = _usage(n_prompt, ev.index)
            usage_follows = ev.finished and options.include_usage
            await writer.send(chunk, hold=ev.more or usage_follows)
            if usage_follows:
                await writer.send(
                    self._usage_chunk(request_id, "text_completion", created, n_prompt, ev.index)
                )
        await send_done(response)
        return response

    def _usage_chunk(
        self, request_id: str, obj: str, created: int, n_prompt: int, n_out: int
    ) -> dict[str, Any]:
        return {
            "id": request_id,
            "object": obj,
            "created": created,
            "model": self.state.served_model_name,
            "choices": [],
            "usage": _usage(n_prompt, n_out),
            "system_fingerprint": self.state.fingerprint,
        }

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        req = parse_body(await read_json(request), ChatCompletionRequest)
        self._check_model(req.model)
        if req.top_logprobs:
            raise ApiError(400, "top_logprobs is not supported by this server", "top_logprobs")
        prompt_ids = self.state.render_chat(req)
        request_id, events = self._start(
            "chatcmpl",
            req,
            prompt_ids,
            req.max_completion_tokens or req.max_tokens,
            "messages",
            logprobs=req.logprobs,
        )
        created = int(time.time())
        model = self.state.served_model_name
        n_prompt = len(prompt_ids)
        if not req.stream:
            text, last = await _collect(events)
            message = {"role": "assistant", "reasoning_content": None, "content": text, "tool_calls": []}
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": last.finish_reason,
                "stop_reason": last.stop_reason,
            }
            body = {
                "id": request_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": {**_usage(n_prompt, last.index), "prompt_tokens_details": None},
                "prompt_logprobs": None,
                "system_fingerprint": self.state.fingerprint,
            }
            return web.json_response(body, dumps=dumps)
        options = req.stream_options or StreamOptions()
        continuous = options.include_usage and options.continuous_usage_stats
        response = await start_sse(request)

        def chunk(choice: dict[str, Any], completion_tokens: int) -> dict[str, Any]:
            body: dict[str, Any] = {
                "id": request_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [choice],
            }
            if continuous:
                body["usage"] = {**_usage(n_prompt, completion_tokens), "completion_tokens_details": None}
            return body

        first = chunk(
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            },
            0,
        )
        writer = EventWriter(response)
        await writer.send({**first, "prompt_token_ids": None, "prompt_text": None})
        async for ev in events:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": ev.text},
                "logprobs": None,
                "finish_reason": ev.finish_reason,
            }
            if ev.finished:
                choice["stop_reason"] = ev.stop_reason
            choice["token_ids"] = None
            usage_follows = ev.finished and options.include_usage
            await writer.send(chunk(choice, ev.index), hold=ev.more or usage_follows)
            if usage_follows:
                await writer.send(
                    self._usage_chunk(request_id, "chat.completion.chunk", created, n_prompt, ev.index)
                )
        await send_done(response)
        return response


async def _collect(events) -> tuple[str, TokenEvent]:
    parts, last = [], None
    async for ev in events:
        parts.append(ev.text)
        last = ev
    return "".join(parts), last


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, or an ApiError that says what is wrong with it."""
    raw = await request.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, f"the request body is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc


def parse_body(body: Any, model: type[BaseModel], status: int = 400) -> Any:
    """Validate a parsed body; schema errors get `status` (OpenAI servers say 400, TGI's router 422)."""
    if not isinstance(body, dict):
        raise ApiError(status, f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(
            status, f"{where}: {first['msg']} ({exc.error_count()} error(s) in the request)", where
        ) from exc


async def start_sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    return response


class EventWriter:
    """The server-sent events of one response. Events ready together leave in one socket write: with many
    streams, a write (a system call each) is the front end's largest cost per token, and when it falls behind
    the engine, a stream's tokens of several steps are ready at once."""

    def __init__(self, response: web.StreamResponse, prefix: str = "data: ") -> None:
        self.response = response
        self.prefix = prefix
        self._held: list[str] = []

    async def send(self, body: dict[str, Any], hold: bool = False) -> None:
        """Write the event, with any held before it; `hold`: keep it for the next write (one follows now)."""
        self._held.append(f"{self.prefix}{dumps(body)}\n\n")
        if not hold:
            data = "".join(self._held).encode()
            self._held.clear()
            await self.response.write(data)


async def send_done(response: web.StreamResponse) -> None:
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
