"""A server whose truth is known: it streams each response on a given schedule and logs when it wrote
every event, so measured TTFT, ITL and TPOT can be checked against what really happened.

    python -m instruments.scripted_server --port 8123 [--host 127.0.0.1] [--flavor vllm|trtllm|tgi]
        [--model NAME] [--default-schedule JSON|@file.json] [--event-log events.jsonl] [--max-streams N]

It serves the OpenAI routes (`/v1/completions`, `/v1/chat/completions`) in vLLM's, TensorRT-LLM's or
TGI's shapes (`--flavor`), TGI's `/generate_stream`, `/generate`, `/info`, Triton's
`/v2/models/<m>/generate_stream`, and `/health`, `/v1/models`, `/metrics`. It binds 127.0.0.1 by default
and prints `listening on http://HOST:PORT` once ready (use `--port 0` for a free port).

The schedule (`ScriptedSchedule`) comes from `--default-schedule` and, per request, from the JSON header
`X-Scripted-Schedule`, whose fields override the default. With `--max-streams N` the server has a known
capacity: at most N requests are served at once, later ones wait in arrival order and their schedule starts
when a slot frees (the log's `slot_s`), so a request of service time S caps throughput at N/S requests/s and,
beyond it, TTFT grows with the queue. Times in the event log are absolute
`time.perf_counter()` seconds (CLOCK_MONOTONIC, shared by every process on the machine), taken just before
the write of the bytes that complete each event, or, where the transport sent them at once, the kernel's
stamp of that send (SO_TIMESTAMPING; the time of the `send` call where there is none): the Python before the
send and any preemption of the server stay out of the truth. A request's `received_s` is the kernel's receive
stamp of the socket read that completed it (workloads/kernel_stamps.py; on Linux, where the server runs
asyncio's own loop for this), so the truth starts when the request reached the server, not when its handler
got to run; `received_clock` says which (`kernel` or `process`), `write_clocks` counts the writes stamped
each way. One JSON line per request:
`{"request_id", "protocol", "flavor", "received_s", "headers_s", "status", "fault", "events": [[t, n_tokens,
kind], ...]}`, kinds `role`, `token`, `usage`, `done`, `error`, `malformed`; one entry per SSE data event,
in order, so it lines up with the client's record. The request id is the client's `X-Request-Id`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from instruments.scripted_formats import TRTLLM_ACCEPTED_FIELDS, Flavor, Protocol, StreamFormat, error_body
from workloads.kernel_stamps import StampedSocket, kernel_stamps_supported, socket_of, stamped_listener
from workloads.loadgen import new_runner

SCHEDULE_HEADER = "X-Scripted-Schedule"
GC_EVERY_REQUESTS = 500
perf_counter = time.perf_counter


class Stall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    after_event: int = Field(ge=1)  # after this many token steps
    seconds: float = Field(ge=0)


class ScriptedSchedule(BaseModel):
    """How the server answers one request. Token steps are due at `received + ttft_s`, then each
    `itl_s` later (a list is cycled); with `step_s` every due time is rounded up to the next multiple of
    `step_s` on the monotonic clock, so concurrent streams emit together like one batched decode step.
    """

    model_config = ConfigDict(extra="forbid")

    flavor: Flavor | None = None  # None: the server's --flavor
    ttft_s: float = Field(0.0, ge=0)
    itl_s: float | list[float] = 0.0
    step_s: float | None = Field(None, gt=0)
    output_tokens: int | None = Field(None, ge=1)  # None: what the request asks for (max_tokens)
    tokens_per_event: int | list[int] = 1  # tokens in one decoding step (a list is cycled)
    empty_text_every: int = Field(0, ge=0)  # every k-th token has empty text (ends inside a character)
    role_chunk: bool = True  # chat: role-only first chunk (vLLM, TensorRT-LLM)
    role_chunk_delay_s: float | None = None  # None: right before the first token, as vLLM does
    usage: Literal["request", "none", "final", "continuous"] = "request"
    headers_delay_s: float = Field(0.0, ge=0)
    stalls: list[Stall] = []
    comment_every: int = Field(0, ge=0)  # an SSE comment (keep-alive) after every k token steps
    split_events: bool = False  # write each event in two pieces, 2 ms apart
    status: int = 200
    error_message: str = "scripted failure"
    fault: Literal["reset", "close", "malformed", "no_final", "error_event"] | None = None
    fault_after_events: int | None = Field(None, ge=0)  # token steps written before it; None: all of them

    def itl_at(self, i: int) -> float:
        return self.itl_s[i % len(self.itl_s)] if isinstance(self.itl_s, list) else self.itl_s

    def steps(self, n_tokens: int) -> list[int]:
        sizes = self.tokens_per_event if isinstance(self.tokens_per_event, list) else [self.tokens_per_event]
        if not sizes or any(k < 1 for k in sizes):
            raise ValueError("tokens_per_event must be >= 1")
        out: list[int] = []
        left = n_tokens
        for k in itertools.cycle(sizes):
            if left <= 0:
                return out
            out.append(min(k, left))
            left -= out[-1]
        return out


def token_texts(n: int, empty_every: int) -> list[str]:
    """Deterministic token texts `" t<k>"`; with `empty_every`, every k-th token has empty text and its
    character arrives with the next token (as a UTF-8 character split across two tokens does)."""
    texts = [f" t{k}" for k in range(n)]
    if empty_every:
        for k in range(empty_every - 1, n, empty_every):
            texts[k] = ""
            if k + 1 < n:
                texts[k + 1] = "\u00e9" + texts[k + 1]
    return texts


def _prompt_len(prompt: Any) -> int:
    if isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return len(prompt.split())
    if isinstance(prompt, list):
        return sum(_prompt_len(p) for p in prompt)
    return 0


@dataclass
class _Request:
    """What the server needs from one parsed request."""

    protocol: Protocol
    flavor: Flavor
    stream: bool
    max_tokens: int
    prompt_tokens: int
    include_usage: bool = False
    continuous_usage: bool = False


class ScriptedServer:
    def __init__(
        self,
        default: ScriptedSchedule,
        flavor: Flavor = "vllm",
        model: str = "scripted-model",
        event_log: Path | None = None,
        max_model_len: int = 4096,
        max_streams: int | None = None,
    ) -> None:
        self.default = default
        # a capacity limit: at most `max_streams` requests are served at once, the others wait in arrival
        # order and their schedule starts when a slot frees, so queueing shows in TTFT as on a full server
        self._slots = asyncio.Semaphore(max_streams) if max_streams else None
        self.flavor = flavor
        self.model = model
        self.max_model_len = max_model_len  # what /v1/models declares (the parity audit reads it)
        self._log: IO[str] | None = event_log.open("a", encoding="utf-8") if event_log else None
        self._ids = itertools.count()
        self.running = 0
        # ids of the requests that have streamed a token and not ended: tests wait on their count, not on time
        self._streaming: dict[int, int] = {}  # request -> token events written, while it streams
        self.requests_total = 0
        self.tokens_total = 0

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        app.add_routes(
            [
                web.post("/v1/completions", self.openai_completions),
                web.post("/v1/chat/completions", self.openai_chat),
                web.post("/generate_stream", self.tgi_stream),
                web.post("/generate", self.tgi_generate),
                web.post("/v2/models/{model}/generate_stream", self.triton_stream),
                web.post("/v2/models/{model}/generate", self.triton_generate),
                web.get("/health", self.health),
                web.get("/v2/health/ready", self.health),
                web.get("/info", self.info),
                web.get("/v1/models", self.models),
                web.get("/v2/models/{model}", self.triton_model),
                web.get("/version", self.version),
                web.get("/metrics", self.metrics),
                web.get("/prometheus/metrics", self.metrics),
            ]
        )
        app.on_cleanup.append(self._close_log)
        return app

    async def _close_log(self, _app: web.Application) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- informational routes ----------------------------------------------------------------------

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def info(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_id": self.model,
                "model_sha": None,
                "model_pipeline_tag": None,
                "max_concurrent_requests": 128,
                "max_best_of": 2,
                "max_stop_sequences": 4,
                "max_input_tokens": 4095,
                "max_total_tokens": 4096,
                "validation_workers": 2,
                "max_client_batch_size": 4,
                "router": "text-generation-router",
                "version": "3.0.1-scripted",
                "sha": None,
                "docker_label": None,
            }
        )

    async def models(self, _request: web.Request) -> web.Response:
        model = {
            "id": self.model,
            "object": "model",
            "created": 0,
            "owned_by": "scripted",
            "max_model_len": self.max_model_len,
        }
        return web.json_response({"object": "list", "data": [model]})

    async def triton_model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        return web.json_response({"name": name, "versions": ["1"], "platform": "ensemble"})

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": "scripted"})

    async def metrics(self, _request: web.Request) -> web.Response:
        fewest = min(self._streaming.values(), default=0)  # token events of the least advanced stream
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{self.model}"}} {self.running}\n'
            "# TYPE scripted:num_requests_streaming gauge\n"
            f'scripted:num_requests_streaming{{model_name="{self.model}"}} {len(self._streaming)}\n'
            "# TYPE scripted:fewest_stream_events gauge\n"
            f'scripted:fewest_stream_events{{model_name="{self.model}"}} {fewest}\n'
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{model_name="{self.model}"}} {self.requests_total}\n'
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="{self.model}"}} {self.tokens_total}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    # -- generation routes -------------------------------------------------------------------------

    async def openai_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, "completions")

    async def openai_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, "chat")

    async def _openai(self, request: web.Request, protocol: Protocol) -> web.StreamResponse:
        received = arrival(request)
        parsed = await self._body_and_schedule(request)
        if isinstance(parsed, web.Response):
            return parsed
        body, schedule = parsed
        flavor = schedule.flavor or self.flavor
        if flavor == "trtllm":
            unknown = sorted(set(body) - TRTLLM_ACCEPTED_FIELDS[protocol])
            problem = (
                "model: field required"
                if "model" not in body
                else f"extra fields not permitted: {', '.join(unknown)}"
                if unknown
                else None
            )
            if problem:
                return web.Response(
                    status=400,
                    body=error_body(flavor, protocol, 400, problem),
                    content_type="application/json",
                )
        options = body.get("stream_options") or {}
        prompt = body.get("messages") if protocol == "chat" else body.get("prompt")
        if protocol == "chat" and isinstance(prompt, list):
            prompt = " ".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        req = _Request(
            protocol,
            flavor,
            bool(body.get("stream")),
            max_tokens,
            _prompt_len(prompt),
            include_usage=bool(options.get("include_usage")),
            continuous_usage=bool(options.get("continuous_usage_stats")),
        )
        return await self._respond(request, received, req, schedule)

    async def tgi_stream(self, request: web.Request) -> web.StreamResponse:
        return await self._tgi(request, stream=True)

    async def tgi_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._tgi(request, stream=False)

    async def _tgi(self, request: web.Request, stream: bool) -> web.StreamResponse:
        received = arrival(request)
        parsed = await self._body_and_schedule(request)
        if isinstance(parsed, web.Response):
            return parsed
        body, schedule = parsed
        params = body.get("parameters") or {}
        req = _Request(
            "tgi",
            "tgi",
            stream,
            int(params.get("max_new_tokens") or 100),
            _prompt_len(body.get("inputs")),
            include_usage=bool(params.get("details")),
        )
        return await self._respond(request, received, req, schedule)

    async def triton_stream(self, request: web.Request) -> web.StreamResponse:
        return await self._triton(request, stream=True)

    async def triton_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._triton(request, stream=False)

    async def _triton(self, request: web.Request, stream: bool) -> web.StreamResponse:
        received = arrival(request)
        parsed = await self._body_and_schedule(request)
        if isinstance(parsed, web.Response):
            return parsed
        body, schedule = parsed
        req = _Request(
            "triton",
            schedule.flavor or self.flavor,
            stream,
            int(body.get("max_tokens") or 16),
            _prompt_len(body.get("text_input")),
        )
        return await self._respond(request, received, req, schedule)

    async def _body_and_schedule(self, request: web.Request) -> tuple[dict, ScriptedSchedule] | web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the request body is not a JSON object")
        except ValueError as exc:
            return web.json_response(
                {
                    "object": "error",
                    "message": f"bad request body: {exc}",
                    "type": "BadRequestError",
                    "code": 400,
                },
                status=400,
            )
        header = request.headers.get(SCHEDULE_HEADER)
        try:
            schedule = self.default
            if header:
                overrides = json.loads(header)
                schedule = ScriptedSchedule.model_validate(
                    {**self.default.model_dump(exclude_unset=True), **overrides}
                )
        except (ValueError, ValidationError) as exc:
            return web.json_response(
                {
                    "object": "error",
                    "message": f"bad {SCHEDULE_HEADER}: {exc}",
                    "type": "BadRequestError",
                    "code": 400,
                },
                status=400,
            )
        return body, schedule

    # -- the response itself -----------------------------------------------------------------------

    async def _respond(
        self, request: web.Request, received: float, req: _Request, schedule: ScriptedSchedule
    ) -> web.StreamResponse:
        rid = request.headers.get("X-Request-Id") or f"scripted-{next(self._ids)}"
        log: dict[str, Any] = {
            "request_id": rid,
            "protocol": req.protocol,
            "flavor": req.flavor,
            "received_s": received,
            "received_clock": "kernel" if _kernel_stamped(request) else "process",
            "headers_s": None,
            "status": schedule.status,
            "fault": schedule.fault,
            "events": [],
        }
        self.running += 1
        slot = False
        try:
            if self._slots is not None:
                waits = self._slots.locked()
                await self._slots.acquire()
                slot = True
                if waits:  # its schedule starts when it gets a slot; the log keeps when it arrived
                    received = log["slot_s"] = perf_counter()
            if schedule.headers_delay_s:
                await asyncio.sleep(schedule.headers_delay_s)
            if schedule.status != 200:
                log["headers_s"] = perf_counter()
                return web.Response(
                    status=schedule.status,
                    content_type="application/json",
                    body=error_body(req.flavor, req.protocol, schedule.status, schedule.error_message),
                )
            n_tokens = schedule.output_tokens or req.max_tokens
            fmt = StreamFormat(
                req.flavor,
                req.protocol,
                self.model,
                rid.replace(" ", "_"),
                int(time.time()),
                req.prompt_tokens,
            )
            if not req.stream:
                return await self._whole(received, schedule, fmt, n_tokens, log)
            return await self._stream(request, received, req, schedule, fmt, n_tokens, log)
        except ConnectionResetError as exc:  # the client went away (its timeout, or it was stopped)
            log["client_gone"] = str(exc)
            raise asyncio.CancelledError from None  # ends the handler without aiohttp logging an error
        finally:
            if slot and self._slots is not None:
                self._slots.release()
            self.running -= 1
            self._streaming.pop(id(log), None)
            self.requests_total += 1
            self._write_log(log)
            if self.requests_total % GC_EVERY_REQUESTS == 0:
                gc.collect()  # here, never between a timestamp and its write (automatic collection is off)

    async def _whole(
        self,
        received: float,
        schedule: ScriptedSchedule,
        fmt: StreamFormat,
        n_tokens: int,
        log: dict[str, Any],
    ) -> web.Response:
        steps = schedule.steps(n_tokens)
        delay = schedule.ttft_s + sum(schedule.itl_at(i) for i in range(len(steps) - 1))
        await _sleep_until(received + delay)
        text = "".join(token_texts(n_tokens, schedule.empty_text_every))
        usage = {
            "prompt_tokens": fmt.prompt_tokens,
            "total_tokens": fmt.prompt_tokens + n_tokens,
            "completion_tokens": n_tokens,
        }
        if fmt.protocol == "tgi":
            details = {
                "finish_reason": "length",
                "generated_tokens": n_tokens,
                "seed": None,
                "prefill": [],
                "tokens": [],
            }
            obj: dict[str, Any] = {"generated_text": text, "details": details}
        elif fmt.protocol == "triton":
            obj = {"model_name": fmt.model, "model_version": "1", "text_output": text}
        elif fmt.protocol == "chat":
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": "length"}
            obj = {
                "id": "chatcmpl-" + fmt.request_id,
                "object": "chat.completion",
                "created": fmt.created,
                "model": fmt.model,
                "choices": [choice],
                "usage": usage,
            }
        else:
            obj = {
                "id": "cmpl-" + fmt.request_id,
                "object": "text_completion",
                "created": fmt.created,
                "model": fmt.model,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": usage,
            }
        log["headers_s"] = perf_counter()
        log["events"].append([log["headers_s"], n_tokens, "token"])
        self.tokens_total += n_tokens
        return web.json_response(obj)

    async def _stream(
        self,
        request: web.Request,
        received: float,
        req: _Request,
        schedule: ScriptedSchedule,
        fmt: StreamFormat,
        n_tokens: int,
        log: dict[str, Any],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        log["headers_s"] = perf_counter()
        await resp.prepare(request)
        events: list[list[Any]] = log["events"]
        clocks: dict[str, int] = log.setdefault("write_clocks", {})  # writes stamped by each clock

        async def write(payload: bytes, entries: list[tuple[str, int]]) -> None:
            if schedule.split_events and len(payload) > 1:
                half = len(payload) // 2
                await resp.write(payload[:half])
                await asyncio.sleep(0.002)
                payload = payload[half:]
            t = perf_counter()
            await resp.write(payload)
            when, clock = sent_at(request, t)
            clocks[clock] = clocks.get(clock, 0) + 1
            events.extend([when, n, kind] for kind, n in entries)

        openai = req.protocol in ("completions", "chat")
        usage_mode = schedule.usage
        if usage_mode == "request":
            usage_mode = "continuous" if req.continuous_usage else "final" if req.include_usage else "none"
        continuous = openai and usage_mode == "continuous"
        role_pending = req.protocol == "chat" and req.flavor != "tgi" and schedule.role_chunk
        if role_pending and schedule.role_chunk_delay_s is not None:
            await _sleep_until(log["headers_s"] + schedule.role_chunk_delay_s)
            await write(fmt.role(continuous), [("role", 0)])
            role_pending = False

        steps = schedule.steps(n_tokens)
        fault_at = (
            len(steps)
            if schedule.fault_after_events is None
            else min(schedule.fault_after_events, len(steps))
        )
        texts = token_texts(n_tokens, schedule.empty_text_every)
        full_text = "".join(texts)
        per_token = req.protocol == "tgi" or req.flavor == "tgi"
        stalls = {s.after_event: s.seconds for s in schedule.stalls}
        # every step's bytes are rendered before the first is due, so writing one costs only the write
        chunks, generated = [], 0
        for i, k in enumerate(steps):
            finish = "length" if i == len(steps) - 1 and schedule.fault is None else None
            generated += k
            piece = texts[generated - k : generated]
            chunks.append(fmt.tokens(piece, finish, generated, continuous, full_text))
        role = fmt.role(continuous) if role_pending else b""
        due = received + schedule.ttft_s
        for i, (k, chunk) in enumerate(zip(steps, chunks, strict=True)):
            if i == fault_at and await self._fault(request, resp, schedule, fmt, write, openai):
                return resp
            if i > 0:
                due += schedule.itl_at(i - 1)
            await _sleep_until(math.ceil(due / schedule.step_s) * schedule.step_s if schedule.step_s else due)
            if role_pending:
                await write(role, [("role", 0)])
                role_pending = False
            await write(chunk, [("token", 1)] * k if per_token else [("token", k)])
            self.tokens_total += k
            self._streaming[id(log)] = self._streaming.get(id(log), 0) + 1
            if schedule.comment_every and (i + 1) % schedule.comment_every == 0:
                await resp.write(b": keep-alive\n\n")
            due += stalls.get(i + 1, 0.0)
        if (
            fault_at == len(steps)
            and schedule.fault is not None
            and await self._fault(request, resp, schedule, fmt, write, openai)
        ):
            return resp
        tgi_completions = req.flavor == "tgi" and req.protocol == "completions"
        if openai and usage_mode in ("final", "continuous") and not tgi_completions:
            await write(fmt.final_usage(generated), [("usage", 0)])
        if openai and not tgi_completions:
            await write(fmt.done(), [("done", 0)])
        await resp.write_eof()
        return resp

    async def _fault(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        schedule: ScriptedSchedule,
        fmt: StreamFormat,
        write: Any,
        openai: bool,
    ) -> bool:
        """Carry out the scheduled fault; True when the response must end here."""
        transport = request.transport
        if schedule.fault == "malformed":
            await write(fmt.malformed(), [("malformed", 0)])
            return False
        if schedule.fault == "error_event":
            await write(fmt.error(schedule.error_message), [("error", 0)])
            if openai:
                await write(fmt.done(), [("done", 0)])
            await resp.write_eof()
            return True
        if schedule.fault == "no_final":
            await resp.write_eof()
            return True
        if transport is not None:
            if schedule.fault == "reset":
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
            else:  # close: FIN without the chunked terminator
                transport.close()
        raise asyncio.CancelledError  # nothing more can be written; ends the handler quietly

    def _write_log(self, log: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.write(json.dumps(log, separators=(",", ":")) + "\n")
            self._log.flush()


async def _sleep_until(when: float) -> None:
    delay = when - perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


# -- reading the event log ---------------------------------------------------------------------------


def read_event_log(
    path: str | Path, expect: Iterable[str] = (), timeout_s: float = 10.0
) -> dict[str, dict[str, Any]]:
    """The server's log as {request_id: entry} (see the module docstring for the entry's fields).

    A client can see a response end a moment before the server has logged it: with `expect`, wait (up to
    `timeout_s`) until every one of those request ids is in the log."""
    wanted = set(expect)
    deadline = time.monotonic() + timeout_s
    while True:
        out: dict[str, dict[str, Any]] = {}
        text = Path(path).read_text(encoding="utf-8") if Path(path).exists() else ""
        for line in text.splitlines():
            if line.strip():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # a line being written right now
                    continue
                out[entry["request_id"]] = entry
        if wanted <= out.keys() or time.monotonic() > deadline:
            return out
        time.sleep(0.02)


def _kernel_stamped(request: web.Request) -> StampedSocket | None:
    """The request's socket, if the kernel has stamped its reads."""
    sock = socket_of(request.transport)
    return sock if sock is not None and sock.kernel_stamped_reads else None


def arrival(request: web.Request) -> float:
    """When the request reached the server: the kernel's stamp of the read that completed it, or now."""
    sock = _kernel_stamped(request)
    return sock.last_rx if sock is not None else perf_counter()


def sent_at(request: web.Request, before_write: float) -> tuple[float, str]:
    """When the bytes just written left, and which clock says so: where the transport sent them at once (the
    usual case), the kernel's stamp of that send (`kernel`), or the moment of the send call where the kernel
    gave none (`send_call`); else (the transport queued them) the stamp taken before the write
    (`before_write`)."""
    sock = socket_of(request.transport)
    transport = request.transport
    if sock is None or transport is None or transport.get_write_buffer_size() or sock.last_tx < before_write:
        if sock is not None and sock.tx_stamps:
            sock.sent_at_kernel()  # drop the stamps of whatever did go out
        return before_write, "before_write"
    kernel = sock.sent_at_kernel() if sock.tx_stamps else None
    return (kernel, "kernel") if kernel is not None else (sock.last_tx, "send_call")


# -- running it ----------------------------------------------------------------------------------------


def _load_schedule(value: str | None) -> ScriptedSchedule:
    if not value:
        return ScriptedSchedule()
    text = Path(value[1:]).read_text(encoding="utf-8") if value.startswith("@") else value
    return ScriptedSchedule.model_validate_json(text)


async def serve(host: str, port: int, server: ScriptedServer) -> None:
    runner = web.AppRunner(server.make_app(), access_log=None, handle_signals=False)
    await runner.setup()
    if kernel_stamps_supported():
        site: web.BaseSite = web.SockSite(runner, stamped_listener(host, port, stamp_sends=True))
    else:
        site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
    await site.start()
    bound = runner.addresses[0]
    print(f"listening on http://{bound[0]}:{bound[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m instruments.scripted_server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--flavor", choices=["vllm", "trtllm", "tgi"], default="vllm")
    parser.add_argument("--model", default="scripted-model")
    parser.add_argument("--default-schedule", help="ScriptedSchedule as JSON, or @path to a JSON file")
    parser.add_argument("--event-log", type=Path, help="append one JSON line per request here")
    parser.add_argument("--max-model-len", type=int, default=4096, help="declared by /v1/models")
    parser.add_argument(
        "--max-streams",
        type=int,
        default=None,
        help="serve at most N requests at once; the others queue (a known capacity)",
    )
    args = parser.parse_args(argv)
    try:
        default = _load_schedule(args.default_schedule)
    except (OSError, ValueError) as exc:
        parser.error(f"--default-schedule: {exc}")
    server = ScriptedServer(
        default, args.flavor, args.model, args.event_log, args.max_model_len, args.max_streams
    )
    # no automatic garbage collection: a pause between an event's timestamp and its write would be logged as
    # client error; the server collects between requests instead
    gc.collect()
    gc.freeze()
    gc.disable()
    with new_runner() as runner:  # asyncio's own loop where requests' arrivals can be kernel-stamped
        runner.run(serve(args.host, args.port, server))


@dataclass
class ServerHandle:
    url: str
    port: int
    event_log: Path | None
    process: subprocess.Popen

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def _gauge(self, name: str) -> int:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        line = next(x for x in text.splitlines() if x.startswith(f"scripted:{name}"))
        return int(float(line.rsplit(" ", 1)[1]))

    def streaming(self) -> int:
        """How many requests have streamed a token and not ended, read from the server's /metrics."""
        return self._gauge("num_requests_streaming")

    def wait_streaming(self, count: int, timeout_s: float = 60.0, min_events: int = 1) -> None:
        """Block until at least `count` requests are streaming, each with at least `min_events` token events
        written: a test acts on that state, not after a fixed sleep that a loaded machine can outrun."""
        deadline = time.monotonic() + timeout_s
        while (now := self.streaming()) < count or self._gauge("fewest_stream_events") < min_events:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{now} of {count} requests streaming after {timeout_s} s")
            time.sleep(0.01)

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Block until no request is streaming: streams an earlier test dropped end only when the server next
        writes to them, and until then they would count towards a later test's `wait_streaming`."""
        deadline = time.monotonic() + timeout_s
        while (now := self.streaming()) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{now} requests still streaming after {timeout_s} s")
            time.sleep(0.01)

    def kill(self) -> None:
        """SIGKILL: the server dies mid-run, as a crashed backend would."""
        self.process.kill()
        self.process.wait()


@contextlib.contextmanager
def scripted_server(
    *,
    flavor: Flavor = "vllm",
    model: str = "scripted-model",
    default_schedule: ScriptedSchedule | None = None,
    event_log: Path | None = None,
    port: int = 0,
    startup_timeout_s: float = 30.0,
    max_model_len: int = 4096,
    max_streams: int | None = None,
) -> Iterator[ServerHandle]:
    """Start the scripted server as a separate process on 127.0.0.1 and stop it afterwards."""
    cmd = [
        sys.executable,
        "-m",
        "instruments.scripted_server",
        "--port",
        str(port),
        "--flavor",
        flavor,
        "--model",
        model,
        "--max-model-len",
        str(max_model_len),
    ]
    if max_streams is not None:
        cmd += ["--max-streams", str(max_streams)]
    if default_schedule is not None:
        cmd += ["--default-schedule", default_schedule.model_dump_json(exclude_unset=True)]
    if event_log is not None:
        cmd += ["--event-log", str(event_log)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")])
        ),
    }
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env)
    handle = None
    try:
        line = _read_line(process, startup_timeout_s)
        if not line.startswith("listening on "):
            raise RuntimeError(f"scripted server did not start: {line!r}")
        url = line.split()[-1]
        handle = ServerHandle(url, int(url.rsplit(":", 1)[1]), event_log, process)
        yield handle
    finally:
        if handle is not None:
            handle.stop()
        elif process.poll() is None:
            process.kill()
            process.wait()


def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
    import selectors

    assert process.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(process.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise TimeoutError(f"scripted server printed nothing within {timeout_s} s")
    return process.stdout.readline().strip()


if __name__ == "__main__":
    main()
