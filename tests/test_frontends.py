"""Several HTTP front-end processes on one engine core (`--api-server-count`, `serving/frontends.py`): each
request's tokens reach the front end that added it and no other, the kernel spreads connections over the
front ends, /metrics counts every front end's requests whichever one is scraped, and no process outlives the
server however it ends."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import socket
import time

import aiohttp
import psutil
import pytest
import requests
from servers import free_port, reference_server, reference_server_cmd

from reference_engine import Engine, EngineConfig, SamplingParams
from reference_engine.serving.core_process import start_engine_core
from reference_engine.serving.engine_client import connect_engine_core
from reference_engine.serving.options import default_api_server_count, parse_args

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def config(model_dir) -> EngineConfig:
    return EngineConfig(model=str(model_dir), device="cpu", max_model_len=512)


def random_prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 200) for _ in range(rng.randrange(2, 30))] for _ in range(n)]


def tokens_here(model_dir, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    engine = Engine(config(model_dir))
    return [out.token_ids for out in engine.generate(prompts, params)]


async def collect(client, request_id: str) -> list[int]:
    tokens = []
    async for out in client.stream(request_id):
        tokens.extend(out.new_token_ids)
    return tokens


def test_each_front_end_gets_only_its_own_requests_and_one_leaving_spares_the_others(llama_dir):
    prompts = random_prompts(8, seed=random.randrange(1 << 30))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    expected = tokens_here(llama_dir, prompts, params)

    async def main() -> None:
        core = start_engine_core(config(llama_dir), 1, "INFO", LOG_FORMAT, num_frontends=2)
        first = await connect_engine_core(core.links[0], core.process)
        second = await connect_engine_core(core.links[1], None)
        first.start()
        second.start()
        try:
            for i, prompt in enumerate(prompts):
                (first if i % 2 == 0 else second).submit(f"r{i}", prompt, params)
            got = await asyncio.gather(
                *[collect(first if i % 2 == 0 else second, f"r{i}") for i in range(len(prompts))]
            )
            assert got == expected
            assert first.num_active == second.num_active == 0

            # the second goes away with a request running: the core aborts it and serves the first on
            long = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
            second.submit("gone", prompts[0], long)
            stream = second.stream("gone")
            await stream.__anext__()
            await second.close()
            assert first.error is None
            first.submit("after", prompts[1], params)
            assert await collect(first, "after") == expected[1]
            deadline = time.monotonic() + 60
            while first.stats().running:  # the departed front end's request was aborted, not left running
                assert time.monotonic() < deadline, "the departed front end's request kept running"
                await asyncio.sleep(0.05)
        finally:
            await first.close()
        assert core.process.exitcode == 0

    asyncio.run(main())


def established_by_process(pids: list[int], port: int) -> dict[int, int]:
    """Accepted connections on `port` held by each of `pids`."""
    counts = {}
    for pid in pids:
        conns = psutil.Process(pid).net_connections(kind="tcp")
        counts[pid] = sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port)
    return counts


def core_pid(server) -> int:
    return int(re.search(r"engine core running in process (\d+)", server.log()).group(1))


def front_end_pids(server) -> list[int]:
    core = core_pid(server)
    children = [
        p.pid
        for p in psutil.Process(server.proc.pid).children()
        if p.pid != core and "resource_tracker" not in " ".join(p.cmdline())
    ]
    return [server.proc.pid, *children]


async def stream_completion(url: str, prompt: list[int], max_tokens: int) -> str:
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    text = []
    # a connection of its own per request, so the kernel places each on any front end
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
        session.post(url + "/v1/completions", json=body) as resp,
    ):
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: {"):
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text)


def wait_for_line(server, text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in server.log():
        assert time.monotonic() < deadline, f"no {text!r} in the server's log"
        time.sleep(0.05)


def assert_port_free(port: int) -> None:
    """Nobody listens on `port` (closed connections may linger in TIME_WAIT; SO_REUSEADDR ignores them)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def stream_all(url: str, prompts: list[list[int]], max_tokens: int) -> list[str]:
    async def all_of_them() -> list[str]:
        streams = [stream_completion(url, p, max_tokens) for p in prompts]
        return await asyncio.wait_for(asyncio.gather(*streams), 120)

    return asyncio.run(all_of_them())


def metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M))


def test_front_ends_share_the_port_the_tokens_and_the_metrics(llama_dir, tmp_path):
    prompts = random_prompts(6, seed=random.randrange(1 << 30))
    with reference_server(str(llama_dir), tmp_path, "--max-model-len", "512") as single:
        alone = stream_all(single.url, prompts, 10)
    with reference_server(
        str(llama_dir), tmp_path, "--max-model-len", "512", "--api-server-count", "3"
    ) as server:
        wait_for_line(server, "server ready at")  # a moment after the port first answers
        assert "3 front-end processes share the port" in server.log()
        pids = front_end_pids(server)
        assert len(pids) == 3
        # the kernel spreads new connections over the three listening sockets
        sockets = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(30)]
        try:
            deadline = time.monotonic() + 60
            while sum((counts := established_by_process(pids, server.port)).values()) < 30:
                assert time.monotonic() < deadline, counts
                time.sleep(0.05)
            assert sum(1 for n in counts.values() if n) >= 2, counts
        finally:
            for s in sockets:
                s.close()

        # every prompt twice over, each on a connection of its own: the tokens of one server
        texts = stream_all(server.url, prompts * 2, 10)
        assert texts == alone * 2

        # any front end's /metrics counts all twelve requests; the engine's steps are not multiplied
        for _ in range(6):
            with requests.Session() as fresh:  # a new connection: another front end, most likely
                text = fresh.get(server.url + "/metrics", timeout=10).text
            assert metric(text, "reference:request_success_total") == 12
            assert metric(text, "reference:generation_tokens_total") == 120
            assert metric(text, "reference:time_to_first_token_seconds_count") == 12
            assert 10 <= metric(text, "reference:engine_steps_total") <= 120
        processes = [psutil.Process(pid) for pid in [*pids, core_pid(server)]]
        assert server.stop() == 0
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert not alive
    assert server.log().count("shutting down: draining") == 3
    assert_port_free(server.port)


def test_a_dead_extra_front_end_loses_only_its_connections(llama_dir, tmp_path):
    with reference_server(
        str(llama_dir), tmp_path, "--max-model-len", "512", "--api-server-count", "2"
    ) as server:
        extra = psutil.Process(front_end_pids(server)[1])
        extra.kill()
        extra.wait(30)
        wait_for_line(server, "exited unexpectedly")
        texts = stream_all(server.url, random_prompts(4, seed=7), 5)
        assert all(texts)
        assert requests.get(server.url + "/health", timeout=10).status_code == 200
        assert server.stop() == 0
    assert "front end 1 " in server.log()


def test_a_sigterm_to_the_process_group_stops_every_process_cleanly(llama_dir, tmp_path):
    """What a launcher does (compare's, a container runtime's): every process gets the signal; the core waits
    for the first front end's word, so none reports another's end as a failure."""
    with reference_server(
        str(llama_dir), tmp_path, "--max-model-len", "512", "--api-server-count", "2"
    ) as server:
        wait_for_line(server, "server ready at")
        processes = [psutil.Process(pid) for pid in [*front_end_pids(server), core_pid(server)]]
        os.killpg(server.proc.pid, signal.SIGTERM)
        assert server.proc.wait(60) == 0
        _, alive = psutil.wait_procs(processes, timeout=30)
        assert not alive
    log = server.log()
    assert "server stopped" in log and "unexpectedly" not in log and "ERROR" not in log


def test_nothing_outlives_a_killed_first_front_end(llama_dir, tmp_path):
    from servers import ServerProcess

    port = free_port()
    server = ServerProcess(
        reference_server_cmd(str(llama_dir), port, "--max-model-len", "512", "--api-server-count", "3"),
        port,
        tmp_path / "server.log",
    )
    try:
        server.wait_healthy()
        children = psutil.Process(server.proc.pid).children()
        assert len(children) >= 3  # the core, two front ends (and multiprocessing's resource tracker)
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
        _, alive = psutil.wait_procs(children, timeout=60)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        server.stop()
    assert_port_free(port)


def test_api_server_count_options():
    assert parse_args(["--api-server-count", "3"]).api_server_count == 3
    assert parse_args(["--device", "cpu"]).api_server_count == 1
    for bad in (["--api-server-count", "0"], ["--api-server-count", "2", "--no-engine-process"]):
        with pytest.raises(SystemExit) as exc:
            parse_args(bad)
        assert exc.value.code == 2
    assert default_api_server_count("cpu", True) == 1
    assert default_api_server_count("cuda", False) == 1


def test_default_api_server_count_on_a_gpu_host(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert default_api_server_count("cuda", True) == 4
    assert default_api_server_count("cuda:0", True) == 4
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert default_api_server_count("cuda", True) == 1
