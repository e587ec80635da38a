"""The TGI protocol as Hugging Face's text-generation router speaks it: /generate, /generate_stream, the
compatibility route `/` (what the official `text-generation` client posts to) and /info.

Streams are `data:{json}` events (no space, as axum writes them), one token per event; the last event carries
`generated_text` and, when asked, `details`. TGI cannot be told to ignore EOS, and neither can this route.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from reference_engine.config import SamplingParams
from reference_engine.serving.generation import GenerationRequest, TokenEvent
from reference_engine.serving.openai_api import ApiError, EventWriter, dumps, parse_body, read_json

MAX_STOP_SEQUENCES = 4


class TGIParameters(BaseModel):
    model_config = ConfigDict(extra="allow")

    best_of: int | None = None
    temperature: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    do_sample: bool = False
    max_new_tokens: int | None = None
    return_full_text: bool | None = None
    stop: list[str] = Field(default_factory=list)
    truncate: int | None = None
    watermark: bool = False
    details: bool = False
    decoder_input_details: bool = False
    seed: int | None = None
    top_n_tokens: int | None = None
    grammar: dict[str, Any] | None = None
    adapter_id: str | None = None


class TGIRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    inputs: str
    parameters: TGIParameters = Field(default_factory=TGIParameters)
    stream: bool = False  # only read on the compatibility route


def _invalid(message: str) -> ApiError:
    return ApiError(422, f"Input validation error: {message}")


def _finish_reason(ev: TokenEvent, eos_ids: set[int]) -> str:
    if ev.finish_reason == "length":
        return "length"
    if ev.stop_reason is None and ev.token_id in eos_ids:
        return "eos_token"
    return "stop_sequence"


class TGIRoutes:
    def __init__(self, state) -> None:
        self.state = state

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/generate", self.generate),
            web.post("/generate_stream", self.generate_stream),
            web.post("/", self.compat),
            web.get("/info", self.info),
        ]

    async def info(self, request: web.Request) -> web.Response:
        s = self.state
        limit = s.info.max_model_len
        return web.json_response(
            {
                "model_id": s.served_model_name,
                "model_sha": None,
                "model_dtype": s.info.setup.dtype,
                "model_device_type": s.info.device_type,
                "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": s.info.max_num_seqs,
                "max_best_of": 1,
                "max_stop_sequences": MAX_STOP_SEQUENCES,
                "max_input_tokens": limit - 1,
                "max_total_tokens": limit,
                "validation_workers": 1,
                "max_client_batch_size": 1,
                "router": "text-generation-router",
                "version": s.version,
                "sha": None,
                "docker_label": None,
            },
            dumps=dumps,
        )

    def _prepare(self, req: TGIRequest) -> tuple[GenerationRequest, list[int]]:
        p = req.parameters
        checks = [
            (p.best_of not in (None, 1), "`best_of` > 1 is not supported"),
            (p.temperature is not None and p.temperature <= 0, "`temperature` must be strictly positive"),
            (p.top_k is not None and p.top_k <= 0, "`top_k` must be strictly positive"),
            (p.top_p is not None and not 0 < p.top_p < 1, "`top_p` must be > 0.0 and < 1.0"),
            (p.repetition_penalty not in (None, 1.0), "`repetition_penalty` is not supported"),
            (p.frequency_penalty not in (None, 0.0), "`frequency_penalty` is not supported"),
            (p.typical_p not in (None, 1.0), "`typical_p` is not supported"),
            (p.watermark, "`watermark` is not supported"),
            (p.decoder_input_details, "`decoder_input_details` is not supported"),
            (p.top_n_tokens not in (None, 0), "`top_n_tokens` is not supported"),
            (p.grammar is not None, "`grammar` is not supported"),
            (
                len(p.stop) > MAX_STOP_SEQUENCES,
                f"`stop` supports up to {MAX_STOP_SEQUENCES} stop sequences. Given: {len(p.stop)}",
            ),
            (
                p.max_new_tokens is not None and p.max_new_tokens <= 0,
                "`max_new_tokens` must be strictly positive",
            ),
            (p.truncate is not None and p.truncate <= 0, "`truncate` must be strictly positive"),
            (not req.inputs, "`inputs` cannot be empty"),
        ]
        for failed, message in checks:
            if failed:
                raise _invalid(message)
        ids = self.state.tokenizer.encode(req.inputs)
        if p.truncate is not None:
            ids = ids[-p.truncate :]
        limit = self.state.info.max_model_len
        max_new = p.max_new_tokens if p.max_new_tokens is not None else limit - len(ids)
        if len(ids) + max_new > limit:
            raise _invalid(
                f"`inputs` tokens + `max_new_tokens` must be <= {limit}. "
                f"Given: {len(ids)} `inputs` tokens and {max_new} `max_new_tokens`"
            )
        sampling = (
            p.do_sample or (p.temperature not in (None, 1.0)) or bool(p.top_k) or (p.top_p not in (None, 1.0))
        )
        params = SamplingParams(
            max_tokens=max_new,
            temperature=(p.temperature or 1.0) if sampling else 0.0,
            top_k=p.top_k or 0,
            top_p=p.top_p or 1.0,
            seed=p.seed,
            logprobs=True,
        )
        return GenerationRequest(ids, params, list(p.stop)), ids

    def _start(self, req: TGIRequest) -> tuple[str, GenerationRequest, Any]:
        gen, _ = self._prepare(req)
        request_id, events = self.state.start("tgi", gen)
        return request_id, gen, events

    def _token(self, ev: TokenEvent) -> dict[str, Any]:
        return {
            "id": ev.token_id,
            "text": ev.text,
            "logprob": ev.logprob,
            "special": ev.token_id in self.state.special_ids,
        }

    async def generate(
        self, request: web.Request, wrap_in_list: bool = False, req: TGIRequest | None = None
    ) -> web.Response:
        req = req or parse_body(await read_json(request), TGIRequest, 422)
        start = time.perf_counter()
        _, gen, events = self._start(req)
        tokens, last = [], None
        async for ev in events:
            tokens.append(ev)
            last = ev
        text = "".join(t.text for t in tokens)
        if req.parameters.return_full_text:
            text = req.inputs + text
        body: dict[str, Any] = {"generated_text": text}
        if req.parameters.details:
            body["details"] = {
                "finish_reason": _finish_reason(last, self.state.eos_ids),
                "generated_tokens": len(tokens),
                "seed": self._seed(gen),
                "prefill": [],
                "tokens": [self._token(t) for t in tokens],
            }
        headers = {
            "x-compute-type": self.state.compute_type,
            "x-prompt-tokens": str(len(gen.prompt_ids)),
            "x-generated-tokens": str(len(tokens)),
            "x-total-time": str(int((time.perf_counter() - start) * 1000)),
        }
        return web.json_response([body] if wrap_in_list else body, dumps=dumps, headers=headers)

    @staticmethod
    def _seed(gen: GenerationRequest) -> int | None:
        return gen.params.seed if not gen.params.greedy else None

    async def generate_stream(
        self, request: web.Request, req: TGIRequest | None = None
    ) -> web.StreamResponse:
        req = req or parse_body(await read_json(request), TGIRequest, 422)
        _, gen, events = self._start(req)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "x-compute-type": self.state.compute_type,
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        writer = EventWriter(response, prefix="data:")
        parts: list[str] = []
        async for ev in events:
            parts.append(ev.text)
            event: dict[str, Any] = {
                "index": ev.index,
                "token": self._token(ev),
                "generated_text": None,
                "details": None,
            }
            if ev.finished:
                if ev.finish_reason == "abort":
                    await writer.send(
                        {"error": "Request failed during generation: aborted", "error_type": "generation"}
                    )
                    break
                text = "".join(parts)
                event["generated_text"] = req.inputs + text if req.parameters.return_full_text else text
                if req.parameters.details:
                    event["details"] = {
                        "finish_reason": _finish_reason(ev, self.state.eos_ids),
                        "generated_tokens": ev.index,
                        "seed": self._seed(gen),
                        "input_length": len(gen.prompt_ids),
                    }
            await writer.send(event, hold=ev.more)
        await response.write_eof()
        return response

    async def compat(self, request: web.Request) -> web.StreamResponse:
        req = parse_body(await read_json(request), TGIRequest, 422)
        if req.stream:
            return await self.generate_stream(request, req)
        return await self.generate(request, wrap_in_list=True, req=req)
