"""What both wire protocols share: running one request and turning engine outputs into per-token events."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from reference_engine.config import SamplingParams
from reference_engine.serving.detokenizer import IncrementalDetokenizer
from reference_engine.serving.request_streams import RequestStream, RequestStreams
from reference_engine.serving.server_metrics import ServerMetrics


@dataclass
class TokenEvent:
    """One generated token as a client sees it."""

    token_id: int
    text: str  # the text this token adds (empty while a character is incomplete or a stop string may follow)
    logprob: float | None
    index: int  # 1-based position among generated tokens
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string; None for EOS or length
    more: bool = False  # the request's next event is ready now: a writer may send both in one socket write


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    params: SamplingParams
    stop: list[str]
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


def new_request_id(prefix: str) -> str:
    """`cmpl-` / `chatcmpl-` and 16 hex digits, as vLLM names its requests."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def generate_tokens(
    async_engine: RequestStreams,
    tokenizer: PreTrainedTokenizerBase,
    metrics: ServerMetrics,
    request_id: str,
    req: GenerationRequest,
) -> AsyncIterator[TokenEvent]:
    """One event per generated token of a request the caller has submitted. Its output stream is taken now,
    not when the caller first reads, so a request that finishes in between still has its outputs."""
    return _token_events(
        async_engine,
        async_engine.stream(request_id),
        tokenizer,
        metrics,
        request_id,
        req,
        time.perf_counter(),
    )


async def _token_events(
    async_engine: RequestStreams,
    stream: RequestStream,
    tokenizer: PreTrainedTokenizerBase,
    metrics: ServerMetrics,
    request_id: str,
    req: GenerationRequest,
    arrival: float,
) -> AsyncIterator[TokenEvent]:
    detok = IncrementalDetokenizer(
        tokenizer, req.prompt_ids, req.stop, req.skip_special_tokens, req.include_stop_str_in_output
    )
    last = arrival
    model = metrics.model
    metrics.prompt_tokens.labels(model).inc(len(req.prompt_ids))
    stop_ids = set(req.params.stop_token_ids)
    index = 0
    async with aclosing(stream) as outputs:
        async for out in outputs:
            now = time.perf_counter()
            for k, token in enumerate(out.new_token_ids):
                index += 1
                metrics.generated.inc()
                (metrics.first_token if index == 1 else metrics.token_gap).observe(now - last)
                last = now
                detok.add(token)
                done = out.finished and k == len(out.new_token_ids) - 1
                event = TokenEvent(token, "", out.new_logprobs[k] if out.new_logprobs else None, index)
                if detok.stop_string is not None:
                    async_engine.abort(request_id)
                    event.finished, event.finish_reason, event.stop_reason = True, "stop", detok.stop_string
                elif done:
                    event.finished, event.finish_reason = True, out.finish_reason
                    if out.finish_reason == "stop" and token in stop_ids:
                        event.stop_reason = token
                event.text = detok.delta(event.finished)
                event.more = not event.finished and (k < len(out.new_token_ids) - 1 or stream.ready())
                if event.finished:
                    metrics.e2e.labels(model).observe(now - arrival)
                    metrics.request_success.labels(model, event.finish_reason).inc()
                yield event
                if event.finished:
                    return
