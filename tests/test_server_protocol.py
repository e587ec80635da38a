"""Wire-level behaviour of our server: exact SSE framing, validation in each protocol's error shape, aborts on
disconnect, back-pressure and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import time
from pathlib import Path

import aiohttp
import pytest
import requests
from servers import reference_server


def sse_events(body: bytes, prefix: bytes) -> list[bytes]:
    """Split a raw SSE body into event payloads, asserting the framing byte for byte."""
    assert body.endswith(b"\n\n")
    events = body[:-2].split(b"\n\n")
    for event in events:
        assert event.startswith(prefix), event[:40]
        assert b"\n" not in event
    return [e[len(prefix) :] for e in events]


DATA = Path(__file__).parent / "data"


def json_shape(value):
    """Keys in order and value types, recursively: what must match for a client to parse both alike."""
    if isinstance(value, dict):
        return [(k, json_shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", json_shape(value[0])] if value else ["list"]
    return type(value).__name__


def recorded_chunks(name: str) -> list[dict]:
    payloads = sse_events((DATA / name).read_bytes(), b"data: ")
    assert payloads[-1] == b"[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def our_chunks(url: str, path: str, body: dict) -> list[dict]:
    raw = requests.post(url + path, json=body, timeout=120)
    assert raw.status_code == 200 and raw.headers["Content-Type"].startswith("text/event-stream")
    payloads = sse_events(raw.content, b"data: ")
    assert payloads[-1] == b"[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def test_completion_stream_matches_recorded_vllm(smollm2_server):
    """Same checkpoint and request as the recorded vLLM 0.32 stream: same chunk shapes, same text per chunk
    (empty-text chunks for tokens inside a multi-byte character included), same usage."""
    vllm = recorded_chunks("vllm_cpu_completion_stream.txt")
    ours = our_chunks(
        smollm2_server.url,
        "/v1/completions",
        {
            "model": "smollm2",
            "prompt": "I love sushi 🍣 and ramen",
            "max_tokens": 16,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    assert len(ours) == len(vllm) == 17
    for mine, theirs in zip(ours, vllm, strict=True):
        assert json_shape(mine) == json_shape(theirs)
        assert mine["usage"] == theirs["usage"]
        if mine["choices"]:
            assert mine["choices"][0]["text"] == theirs["choices"][0]["text"]
            assert mine["choices"][0]["finish_reason"] == theirs["choices"][0]["finish_reason"]
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}", ours[0]["id"]) and len({c["id"] for c in ours}) == 1
    assert sum(1 for c in ours if c["choices"] and c["choices"][0]["text"] == "") >= 10


def test_chat_stream_matches_recorded_vllm(smollm2_server):
    vllm = recorded_chunks("vllm_cpu_chat_stream.txt")
    ours = our_chunks(
        smollm2_server.url,
        "/v1/chat/completions",
        {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "What is 'cat' in Japanese? Write it in hiragana."}],
            "max_tokens": 64,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    assert len(ours) == len(vllm)
    for mine, theirs in zip(ours, vllm, strict=True):
        assert json_shape(mine) == json_shape(theirs)
        assert mine["usage"] == theirs["usage"]
        if mine["choices"]:
            assert mine["choices"][0]["delta"] == theirs["choices"][0]["delta"]
    assert ours[-2]["choices"][0]["finish_reason"] == "stop"


def test_stream_without_continuous_usage(tiny_server):
    body = {
        "prompt": "a cache block",
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = our_chunks(tiny_server.url, "/v1/completions", body)
    assert len(chunks) == 6 and all("usage" not in c for c in chunks[:5])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    plain = our_chunks(
        tiny_server.url,
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "ignore_eos": True,
            "stream": True,
        },
    )
    assert len(plain) == 4 and all("usage" not in c for c in plain)
    assert plain[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_tgi_stream_framing(tiny_server):
    body = {"inputs": "a cache block", "parameters": {"max_new_tokens": 4, "details": True}}
    raw = requests.post(tiny_server.url + "/generate_stream", json=body, timeout=60)
    assert raw.status_code == 200
    events = [json.loads(p) for p in sse_events(raw.content, b"data:")]
    assert not any(p.startswith(b" ") for p in sse_events(raw.content, b"data:"))
    assert [e["index"] for e in events] == list(range(1, len(events) + 1))
    for event in events[:-1]:
        assert list(event) == ["index", "token", "generated_text", "details"]
        assert event["generated_text"] is None and event["details"] is None
        assert list(event["token"]) == ["id", "text", "logprob", "special"]
    last = events[-1]
    assert last["generated_text"] == "".join(e["token"]["text"] for e in events)
    assert list(last["details"]) == ["finish_reason", "generated_tokens", "seed", "input_length"]
    assert last["details"]["generated_tokens"] == len(events)
    assert last["details"]["finish_reason"] in ("length", "eos_token")


def _bad_requests(url: str, vocab_error_len: int) -> list[tuple[str, str, object, int]]:
    """(path, kind, body, expected status) for every kind of bad request we refuse."""
    long_prompt = list(range(3, 3 + vocab_error_len))
    return [
        ("/v1/completions", "raw", b'{"prompt": "x", ', 400),
        ("/v1/completions", "raw", b"\xff\xfe\x00not utf-8", 400),
        ("/v1/completions", "raw", b"x" * 70000, 413),
        ("/v1/completions", "json", [1, 2, 3], 400),
        ("/v1/completions", "json", {"max_tokens": 4}, 400),
        ("/v1/completions", "json", {"prompt": 5}, 400),
        ("/v1/completions", "json", {"prompt": "x", "max_tokens": 0}, 400),
        ("/v1/completions", "json", {"prompt": "x", "max_tokens": -3}, 400),
        ("/v1/completions", "json", {"prompt": "x", "max_tokens": "many"}, 400),
        ("/v1/completions", "json", {"prompt": "x", "temperature": -1}, 400),
        ("/v1/completions", "json", {"prompt": "x", "top_p": 0}, 400),
        ("/v1/completions", "json", {"prompt": "x", "top_p": 1.5}, 400),
        ("/v1/completions", "json", {"prompt": "x", "top_k": -5}, 400),
        ("/v1/completions", "json", {"prompt": "x", "n": 2}, 400),
        ("/v1/completions", "json", {"prompt": "x", "model": "no-such-model"}, 404),
        ("/v1/completions", "json", {"prompt": long_prompt, "max_tokens": 1}, 400),
        ("/v1/completions", "json", {"prompt": "x", "max_tokens": 10**6}, 400),
        ("/v1/completions", "json", {"prompt": "x", "stream_options": {"include_usage": True}}, 400),
        ("/v1/completions", "json", {"prompt": ""}, 400),
        ("/v1/completions", "json", {"prompt": [10**9]}, 400),
        ("/v1/completions", "json", {"prompt": "x", "stop": 5}, 400),
        ("/v1/completions", "json", {"prompt": "x", "min_tokens": 9, "max_tokens": 2}, 400),
        ("/v1/completions", "json", {"prompt": "x", "best_of": 3}, 400),
        ("/v1/completions", "json", {"prompt": "x", "logprobs": 5}, 400),
        ("/v1/completions", "json", {"prompt": ["a", "b"]}, 400),
        ("/v1/completions", "json", {"prompt": "x", "stream": "sometimes"}, 400),
        ("/v1/chat/completions", "json", {"messages": []}, 400),
        ("/v1/chat/completions", "json", {"model": "x"}, 400),
        ("/v1/chat/completions", "json", {"messages": [{"role": "user", "content": 5}]}, 400),
        (
            "/v1/chat/completions",
            "json",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}],
                    }
                ]
            },
            400,
        ),
        ("/v1/chat/completions", "json", {"messages": [{"content": "no role"}]}, 400),
        ("/v1/completions", "get", None, 405),
        ("/v1/no-such-route", "json", {}, 404),
        ("/generate", "json", {"parameters": {}}, 422),
        ("/generate", "json", {"inputs": ""}, 422),
        ("/generate", "json", {"inputs": "x", "parameters": {"temperature": 0}}, 422),
        ("/generate", "json", {"inputs": "x", "parameters": {"top_p": 1.0}}, 422),
        ("/generate", "json", {"inputs": "x", "parameters": {"max_new_tokens": 0}}, 422),
        ("/generate", "json", {"inputs": "x", "parameters": {"stop": ["a", "b", "c", "d", "e"]}}, 422),
        ("/generate", "json", {"inputs": "x", "parameters": {"max_new_tokens": 10**6}}, 422),
        ("/generate", "json", {"inputs": "x", "parameters": {"best_of": 2}}, 422),
        ("/generate", "json", {"inputs": "x", "parameters": {"max_new_tokens": "lots"}}, 422),
        ("/generate_stream", "raw", b"{not json", 400),
        ("/", "json", {"inputs": "x", "stream": True, "parameters": {"watermark": True}}, 422),
    ]


def _check_error_shape(path: str, resp: requests.Response, status: int) -> None:
    assert resp.status_code == status, (path, resp.status_code, resp.text)
    body = resp.json()
    if path.startswith("/v1/"):
        assert set(body) == {"error"} and body["error"]["code"] == status
        assert body["error"]["message"] and body["error"]["type"]
    else:
        assert set(body) == {"error", "error_type"} and body["error"] and body["error_type"]


def test_bad_requests_are_refused_and_the_server_keeps_serving(tiny_server):
    cases = _bad_requests(tiny_server.url, 300)
    assert len(cases) >= 30
    for path, kind, body, status in cases:
        url = tiny_server.url + path
        if kind == "raw":
            resp = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=30)
        elif kind == "get":
            resp = requests.get(url, timeout=30)
        else:
            resp = requests.post(url, json=body, timeout=30)
        _check_error_shape(path, resp, status)
    good = requests.post(
        tiny_server.url + "/v1/completions", json={"prompt": "still here", "max_tokens": 3}, timeout=60
    )
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


async def _open_and_drop(url: str, rng: random.Random) -> None:
    # Long enough that no stream can end before its client goes: the engine core steps on its own, so on a
    # loaded machine it may run far ahead of a front end that has yet to notice a dropped connection.
    body = {
        "prompt": "stream me " * rng.randint(1, 20),
        "max_tokens": rng.randint(800, 950),
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        resp = await session.post(url + "/v1/completions", json=body)
        drop_after = rng.choice([0, 0, 1, 2, 5, 20])
        seen = 0
        async for line in resp.content:
            if line.startswith(b"data: "):
                seen += 1
            if seen >= drop_after:
                break
        resp.close()  # drops the connection, mid-stream (or before the first token)


@pytest.mark.timing
def test_dropped_streams_free_every_block(llama_dir, tmp_path):
    flags = ("--max-model-len", "1024", "--max-num-seqs", "32")
    with reference_server(str(llama_dir), tmp_path, *flags) as server:
        _drop_streams_and_check(server.url)


def _drop_streams_and_check(url: str) -> None:
    rng = random.Random()
    before = _metric(requests.get(url + "/metrics", timeout=10).text, "reference:num_aborted_requests_total")

    async def main():
        await asyncio.gather(*(_open_and_drop(url, rng) for _ in range(200)))

    asyncio.run(main())
    deadline = time.monotonic() + 120  # a wait on the server's state: a loaded machine may need a while
    while time.monotonic() < deadline:
        text = requests.get(url + "/metrics", timeout=10).text
        if (
            _metric(text, "reference:kv_cache_blocks_used") == 0
            and _metric(text, "reference:num_requests_running") == 0
            and _metric(text, "reference:num_requests_waiting") == 0
        ):
            break
        time.sleep(0.2)
    assert _metric(text, "reference:kv_cache_blocks_used") == 0, text
    assert _metric(text, "reference:num_requests_running") == 0
    assert _metric(text, "reference:num_requests_waiting") == 0
    assert _metric(text, "reference:kv_cache_blocks_free") > 0
    assert _metric(text, "reference:num_aborted_requests_total") - before >= 150  # most were cut off mid-way
    good = requests.post(url + "/v1/completions", json={"prompt": "after", "max_tokens": 2}, timeout=60)
    assert good.status_code == 200


@pytest.mark.parametrize("protocol", ["openai", "tgi"])
def test_api_key(llama_dir, tmp_path, protocol):
    args = ("--api-key", "s3cret", "--max-model-len", "128")
    with reference_server(str(llama_dir), tmp_path, *args) as server:
        path, body = (
            ("/v1/completions", {"prompt": "x", "max_tokens": 2})
            if protocol == "openai"
            else ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": 2}})
        )
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            _check_error_shape(
                path, requests.post(server.url + path, json=body, headers=headers, timeout=30), 401
            )
        ok = requests.post(
            server.url + path, json=body, headers={"Authorization": "Bearer s3cret"}, timeout=60
        )
        assert ok.status_code == 200
        assert requests.get(server.url + "/health", timeout=10).status_code == 200


@pytest.mark.timing
def test_full_waiting_queue_answers_503_with_retry_after(llama_dir, tmp_path):
    with reference_server(
        str(llama_dir), tmp_path, "--max-num-seqs", "1", "--max-waiting", "2", "--max-model-len", "1024"
    ) as server:

        async def wait_for(session, name: str, value: float) -> None:
            # a wait on the server's state: a loaded machine may need a while
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if _metric(await (await session.get(server.url + "/metrics")).text(), name) == value:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"{name} never reached {value}")

        async def main():
            async with aiohttp.ClientSession() as session:
                body = {"prompt": "long one", "max_tokens": 1000, "ignore_eos": True}
                tasks = [asyncio.create_task(session.post(server.url + "/v1/completions", json=body))]
                await wait_for(session, "reference:num_requests_running", 1)
                tasks += [
                    asyncio.create_task(session.post(server.url + "/v1/completions", json=body))
                    for _ in range(2)
                ]
                await wait_for(session, "reference:num_requests_waiting", 2)
                resp = await session.post(
                    server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}
                )
                status, retry, payload = resp.status, resp.headers.get("Retry-After"), await resp.json()
                tgi = await session.post(server.url + "/generate", json={"inputs": "x"})
                tgi_status, tgi_payload = tgi.status, await tgi.json()
                for t in tasks:
                    t.cancel()
                return status, retry, payload, tgi_status, tgi_payload

        status, retry, payload, tgi_status, tgi_payload = asyncio.run(main())
        assert status == 503 and retry is not None and int(retry) >= 1
        assert payload["error"]["code"] == 503 and "overloaded" in payload["error"]["message"]
        assert tgi_status == 503 and tgi_payload["error_type"] == "overloaded"


@pytest.mark.timing
def test_sigterm_drains_running_requests_and_exits_zero(llama_dir, tmp_path):
    args = ("--max-model-len", "512", "--shutdown-timeout", "20")
    with reference_server(str(llama_dir), tmp_path, *args) as server:

        async def main():
            async with aiohttp.ClientSession() as session:
                body = {"prompt": "drain me", "max_tokens": 200, "ignore_eos": True, "stream": True}
                resp = await session.post(server.url + "/v1/completions", json=body)
                await resp.content.readline()
                server.proc.send_signal(signal.SIGTERM)
                rest = await resp.read()
                refused = None
                try:
                    r = await session.post(server.url + "/v1/completions", json={"prompt": "x"})
                    refused = r.status
                except aiohttp.ClientConnectionError:
                    refused = "closed"
                return rest, refused

        rest, refused = asyncio.run(main())
        assert rest.endswith(b"data: [DONE]\n\n")
        assert b'"finish_reason":"length"' in rest  # it ran to completion, not cut off
        assert refused in (503, "closed")
        assert server.proc.wait(30) == 0
        assert "server stopped" in server.log()
