"""The engine core in a process of its own (`engine_core.py`, `engine_client.py`): the same tokens as the
engine in this process, aborts that free the core's blocks, and a failed step or a dead core surfacing as
errors to in-flight requests (and 503 on /health), never as a hang."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from contextlib import aclosing

import psutil
import pytest
import requests
from servers import reference_server

from reference_engine import Engine, EngineConfig, SamplingParams
from reference_engine.serving.engine_client import EngineClient, launch_engine_core
from reference_engine.serving.request_streams import EngineDeadError, RequestStream

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13], [3] * 20, [40, 41]]


def config(model_dir, **kwargs) -> EngineConfig:
    return EngineConfig(model=str(model_dir), device="cpu", max_model_len=512, **kwargs)


async def started(model_dir, **kwargs) -> EngineClient:
    client = await launch_engine_core(config(model_dir, **kwargs), 1, "INFO", LOG_FORMAT)
    client.start()
    return client


async def collect(stream: RequestStream) -> list[int]:
    tokens = []
    async for out in stream:
        tokens.extend(out.new_token_ids)
    return tokens


async def wait_until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen in {timeout} s")
        await asyncio.sleep(0.01)


def steps_here(model_dir, params: SamplingParams) -> dict[str, list]:
    """Each request's outputs, one per step, from the engine stepped in this process."""
    engine = Engine(config(model_dir))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(prompt, params, request_id=str(i))
    outs: dict[str, list] = {str(i): [] for i in range(len(PROMPTS))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id].append(out)
    return outs


def test_core_streams_the_same_tokens_as_the_engine_here(llama_dir):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=True)
    expected = steps_here(llama_dir, params)

    async def main():
        client = await started(llama_dir)
        try:
            for i, prompt in enumerate(PROMPTS):
                client.submit(str(i), prompt, params)
            outs = {str(i): [] for i in range(len(PROMPTS))}

            async def read(request_id):
                async for out in client.stream(request_id):
                    outs[request_id].append(out)

            await asyncio.gather(*(read(str(i)) for i in range(len(PROMPTS))))
            return outs, client.stats(), client.num_steps
        finally:
            await client.close()

    outs, stats, steps = asyncio.run(main())
    for request_id, want in expected.items():
        got = outs[request_id]
        assert [o.new_token_ids for o in got] == [o.new_token_ids for o in want]
        assert [lp for o in got for lp in o.new_logprobs] == pytest.approx(
            [lp for o in want for lp in o.new_logprobs]
        )
        assert [(o.finished, o.finish_reason) for o in got] == [(o.finished, o.finish_reason) for o in want]
        assert got[-1].finish_reason == "length" and len(got) == 12
    assert steps >= 12 and stats.running == 0 and stats.kv_blocks_used == 0


def test_abort_frees_the_cores_blocks_and_others_finish(llama_dir):
    async def main():
        client = await started(llama_dir)
        try:
            client.submit("long", [5, 6, 7], SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
            client.submit("short", [8, 9], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
            # taken now, as a handler does: it may finish before it is read
            short_stream = client.stream("short")
            seen = 0
            async with aclosing(client.stream("long")) as stream:
                async for out in stream:
                    seen += len(out.new_token_ids)
                    if seen >= 3:
                        break  # leaving the stream early aborts the request
            short = await collect(short_stream)
            await wait_until(
                lambda: client.stats().running == 0 and client.stats().kv_blocks_used == 0,
                "the core freeing the aborted request",
            )
            return short, client.num_aborted, client.num_active, client.error
        finally:
            await client.close()

    short, aborted, active, error = asyncio.run(main())
    assert len(short) == 6 and aborted == 1 and active == 0 and error is None


def test_a_failed_step_fails_in_flight_requests_and_refuses_new_ones(llama_dir):
    async def main():
        client = await started(llama_dir)
        try:
            client.submit("good", [5, 6, 7], SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
            first = client.stream("good")
            await first.__anext__()  # running before the bad request arrives
            bad = SamplingParams(max_tokens=4, temperature=0.7, top_p=0.5)
            bad.top_p = "not a number"  # passes the front end's checks, breaks the sampler inside a step
            client.submit("bad", [8, 9], bad)
            errors = []
            for stream in (first, client.stream("bad")):
                with pytest.raises(EngineDeadError) as info:
                    async for _ in stream:
                        pass
                errors.append(str(info.value))
            with pytest.raises(EngineDeadError):
                client.submit("late", [1, 2], SamplingParams(max_tokens=2))
            await wait_until(lambda: not client.process.is_alive(), "the core exiting")
            return errors, client.error
        finally:
            await client.close()

    errors, error = asyncio.run(main())
    assert all("TypeError" in e for e in errors) and error is not None


def test_a_killed_core_fails_in_flight_requests(llama_dir):
    async def main():
        client = await started(llama_dir)
        try:
            client.submit("a", [5, 6, 7], SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
            stream = client.stream("a")
            await stream.__anext__()
            os.kill(client.process.pid, signal.SIGKILL)
            with pytest.raises(EngineDeadError, match="exit code -9"):
                async for _ in stream:
                    pass
            return client.error
        finally:
            await client.close()

    assert asyncio.run(main()) is not None


def test_a_config_the_engine_refuses_raises_at_launch(llama_dir):
    with pytest.raises(ValueError, match="max_model_len 100000 exceeds"):
        asyncio.run(
            launch_engine_core(
                EngineConfig(model=str(llama_dir), device="cpu", max_model_len=100000), 1, "INFO", LOG_FORMAT
            )
        )


def test_server_answers_503_and_ends_streams_when_its_core_dies(llama_dir, tmp_path):
    with reference_server(str(llama_dir), tmp_path, "--max-model-len", "512") as server:
        body = {"prompt": "stream me", "max_tokens": 400, "ignore_eos": True, "stream": True}
        with requests.post(server.url + "/v1/completions", json=body, stream=True, timeout=60) as resp:
            lines = resp.iter_lines()
            assert next(line for line in lines if line).startswith(b"data: {")
            pid = re.search(r"engine core running in process (\d+)", server.log())
            core = psutil.Process(int(pid.group(1)))
            assert core.ppid() == server.proc.pid
            core.kill()
            try:
                rest = b"\n".join(lines)  # ends, rather than waiting forever for tokens
            except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError) as exc:
                assert "timed out" not in str(exc)
                rest = b""
        assert b"[DONE]" not in rest
        health = requests.get(server.url + "/health", timeout=10)
        assert health.status_code == 503 and "engine core process ended" in health.text
        refused = requests.post(
            server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10
        )
        assert refused.status_code == 503
        assert server.stop() == 0
        assert "the engine core process ended unexpectedly" in server.log()


def test_both_server_paths_stream_the_same_greedy_tokens(llama_dir, tmp_path):
    """The engine in a child process or in a thread of the server: same text, same step count, clean exit."""
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 9, "temperature": 0.0, "ignore_eos": True}
    texts = {}
    for flag in ("--engine-process", "--no-engine-process"):
        with reference_server(str(llama_dir), tmp_path, "--max-model-len", "512", flag) as server:
            resp = requests.post(server.url + "/v1/completions", json=body, timeout=60)
            metrics = requests.get(server.url + "/metrics", timeout=10).text
            assert server.stop() == 0
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 9
        assert re.search(r"reference:engine_steps_total\{[^}]*\} (\S+)", metrics).group(1) == "9.0"
        assert ("engine core running in process" in server.log()) is (flag == "--engine-process")
        assert "server stopped" in server.log()
        texts[flag] = resp.json()["choices"][0]["text"]
    assert texts["--engine-process"] == texts["--no-engine-process"] and texts["--engine-process"]


def test_every_pipe_message_is_typed_and_survives_the_pipe():
    """Each kind of message crosses a real pipe as itself, and the core refuses what is not a command (a
    front end that sent the old tuples would be told, not ignored)."""
    import multiprocessing
    import random

    from reference_engine.core_messages import (
        AbortRequest,
        AddRequest,
        Dead,
        Exited,
        Failed,
        MessageKind,
        Shutdown,
    )
    from reference_engine.engine_core import EngineCore

    rng = random.Random()
    prompt = [rng.randrange(1, 30_000) for _ in range(rng.randrange(1, 40))]
    params = SamplingParams(max_tokens=rng.randrange(1, 64), temperature=0.0)
    messages = [
        AddRequest(f"r{rng.random()}", prompt, params),
        AbortRequest("a"),
        Shutdown(),
        Failed(ValueError("bad config")),
        Dead("step failed"),
        Exited(rng.choice([None, 1, -9])),
    ]
    receive, send = multiprocessing.Pipe(duplex=False)
    send.send(messages)
    back = receive.recv()
    assert [type(m) for m in back] == [type(m) for m in messages]
    assert back[0] == messages[0] and back[1:3] == messages[1:3] and back[4:] == messages[4:]
    assert str(back[3].error) == "bad config"
    assert {m.kind for m in messages} | {MessageKind.READY, MessageKind.STEP} == set(MessageKind)
    core = EngineCore.__new__(EngineCore)
    with pytest.raises(TypeError, match="not a command"):
        core._apply(0, ("add", "r1", prompt, params), {})  # type: ignore[arg-type]
