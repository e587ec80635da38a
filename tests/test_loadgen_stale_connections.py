"""The load generator tells its own stale keep-alive connection from a failing server.

A server may close a keep-alive connection after a response (llama.cpp's llama-server does after a stream)
while the client has already put the connection back in its pool; the next request sent on it then fails
before any response byte. That is the client's stale connection, and the request is sent once more on a new
connection (its record says so, and its send time is the second send's). A failure on a new connection, or
after response bytes arrived, or of that second send, stays a failure record.

The servers here are real aiohttp servers on 127.0.0.1 that misbehave on purpose, per connection.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Callable

import pytest
from aiohttp import web

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from workloads.loadgen import PointJob, new_runner, run_load
from workloads.records import ErrorKind, RequestRecord, read_records
from workloads.schedule import ClosedLoop, OpenLoop

#: what a handler decides for one request: (its index on its connection from 0, the server's state)
Decide = Callable[[int, dict], str]


def _chunk(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {data}\n\n".encode()


async def _stream(request: web.Request, tokens: int, cut_after: int | None = None) -> web.StreamResponse:
    """An OpenAI completions stream of `tokens` one-token chunks, usage and [DONE]; with `cut_after`, the
    connection is reset after that many chunks."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(tokens):
        if cut_after is not None and i == cut_after:
            _reset(request)
            return resp
        await resp.write(_chunk({"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}))
    await resp.write(
        _chunk(
            {
                "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 2, "completion_tokens": tokens},
            }
        )
    )
    await resp.write(_chunk("[DONE]"))
    await resp.write_eof()
    return resp


def _reset(request: web.Request) -> None:
    """Abort the connection with a TCP reset (SO_LINGER 0)."""
    transport = request.transport
    assert transport is not None
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def make_app(decide: Decide) -> tuple[web.Application, dict]:
    """An app whose handler asks `decide` what to do with each request: `serve`, `close` (close the
    connection without answering), `reset` (reset it without answering), `cut` (headers and two chunks,
    then a reset) or `close_after` (serve, then close the connection without saying `Connection: close`)."""
    state: dict = {"served": {}, "connections": set(), "actions": []}

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        transport = request.transport
        key = id(transport)
        state["connections"].add(key)
        index = state["served"].get(key, 0)
        state["served"][key] = index + 1
        action = decide(index, state)
        state["actions"].append(action)
        if action == "close":
            assert transport is not None
            transport.close()
            return web.Response()  # never written: the connection is gone
        if action == "reset":
            _reset(request)
            return web.Response()
        if action == "cut":
            return await _stream(request, body["max_tokens"], cut_after=2)
        resp = await _stream(request, body["max_tokens"])
        if action == "close_after" and transport is not None:
            transport.close()  # keep-alive was promised (no Connection: close); the client's pool has it
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    return app, state


def run_against(
    decide: Decide, n: int, schedule, tmp_path, out_tokens: int = 6
) -> tuple[list[RequestRecord], dict]:
    app, state = make_app(decide)
    out = tmp_path / "requests.jsonl"

    async def scenario() -> list[RequestRecord]:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            specs = [RequestSpec(f"r{i}", (1, 2), "stale test", out_tokens) for i in range(n)]
            url = f"http://127.0.0.1:{port}"
            job = PointJob(url, get_adapter("openai"), specs, schedule, output_path=out)
            return await run_load(job)
        finally:
            await runner.cleanup()

    with new_runner() as runner:
        records = runner.run(scenario())
    assert read_records(out) == records
    return sorted(records, key=lambda r: int(r.request_id[1:])), state


def by_index(actions: dict[int, str], otherwise: str = "serve") -> Decide:
    return lambda index, _state: actions.get(index, otherwise)


@pytest.mark.parametrize("stale", ["close", "reset"])
def test_a_closed_keep_alive_connection_is_retried_not_failed(stale, tmp_path):
    """Every connection serves one request; the next one sent on it finds it closed (or reset) before any
    answer, as when the server closed it just as the client reused it."""
    records, state = run_against(by_index({1: stale}), 8, ClosedLoop(1), tmp_path)
    assert [r.error_kind for r in records] == [None] * 8
    assert all(r.output_tokens == 6 and r.usage_completion_tokens == 6 for r in records)
    retried = [r for r in records if r.stale_retry_s is not None]
    # one connection per two requests: the first request opens it, the second is retried on a new one
    assert len(retried) >= 3 and state["actions"].count(stale) == len(retried)
    for r in retried:
        # the intended time stays the request's own; the send recorded is the retry's, after the failure
        assert r.scheduled_s <= r.start_s <= r.stale_retry_s <= r.send_s <= r.headers_s <= r.end_s
    for r in records:
        if r.stale_retry_s is None:
            assert r.start_s <= r.send_s


def test_a_server_closing_after_each_stream_causes_no_failures(tmp_path):
    """The server closes each connection right after its stream without saying so: whether the client's
    pool notices the close in time or sends on the closed connection, no request fails."""
    records, state = run_against(by_index({}, "close_after"), 12, ClosedLoop(2), tmp_path)
    assert [r.error_kind for r in records] == [None] * 12
    assert all(r.output_tokens == 6 for r in records)
    assert len(state["connections"]) >= 6  # every connection served one request (the retries add more)


def test_open_loop_keeps_the_intended_send_time(tmp_path):
    records, _ = run_against(by_index({1: "close"}), 6, OpenLoop(rate=20.0, seed=1), tmp_path)
    assert [r.error_kind for r in records] == [None] * 6
    scheduled = [r.scheduled_s for r in records]
    assert scheduled == sorted(scheduled)
    assert all(r.send_s >= r.scheduled_s for r in records)


@pytest.mark.parametrize(
    "fault,kinds",
    [
        ("close", {ErrorKind.SERVER_DISCONNECTED}),
        ("reset", {ErrorKind.CONNECTION_RESET, ErrorKind.SERVER_DISCONNECTED}),
    ],
)
def test_a_failure_on_a_new_connection_is_a_failure(fault, kinds, tmp_path):
    """Every connection fails at its first request: nothing was reused, so nothing is retried."""
    records, state = run_against(by_index({}, fault), 4, ClosedLoop(1), tmp_path)
    assert all(r.error_kind in kinds for r in records), [(r.error_kind, r.error_message) for r in records]
    assert all(r.stale_retry_s is None and r.events == [] for r in records)
    assert state["actions"] == [fault] * 4


def test_a_reset_after_response_bytes_is_a_failure(tmp_path):
    """The second request of each connection gets its headers and two chunks, then a reset: the server
    failed mid-answer, which no retry hides."""
    records, _ = run_against(by_index({1: "cut"}), 6, ClosedLoop(1), tmp_path)
    failed = [r for r in records if r.error_kind is not None]
    assert failed and all(
        r.error_kind in (ErrorKind.CONNECTION_RESET, ErrorKind.SERVER_DISCONNECTED) for r in failed
    )
    assert all(r.stale_retry_s is None and r.event_tokens == 2 for r in failed)
    assert all(r.output_tokens == 6 for r in records if r.ok)


def test_a_retry_that_fails_too_is_a_failure(tmp_path):
    """The first connection serves one request, then the server resets every connection: the second
    request's stale try is retried once and fails; later requests fail on their own new connections."""

    def decide(index: int, state: dict) -> str:
        return "serve" if len(state["connections"]) == 1 and index == 0 else "reset"

    records, state = run_against(decide, 4, ClosedLoop(1), tmp_path)
    assert records[0].ok
    assert records[1].error_kind in (ErrorKind.CONNECTION_RESET, ErrorKind.SERVER_DISCONNECTED)
    assert records[1].stale_retry_s is not None  # retried once, and the retry failed
    assert all(not r.ok and r.stale_retry_s is None for r in records[2:])
    assert len(state["actions"]) == 5  # four requests, one sent twice


def test_a_server_keeping_connections_alive_is_not_retried(tmp_path):
    """The normal case: one connection, reused for every request, and no retry."""
    records, state = run_against(by_index({}, "serve"), 5, ClosedLoop(1), tmp_path)
    assert all(r.ok and r.stale_retry_s is None for r in records)
    assert len(state["connections"]) == 1
