"""A server whose capacity is known exactly, for calibrating `compare run --sweep` and `--capacity`: an
OpenAI-compatible streaming `/v1/completions` (with `/health` and `/v1/models`) that serves `slots` requests
at a time, first come first served, each holding its slot for a service time drawn from a seeded
distribution (constant, exponential or lognormal, of mean `service_s`). The first token goes out after
`TTFT_SHARE` of the service time, the others evenly over the rest, so the last one ends the service. Its
capacity is `slots / service_s` requests/s, and the TTFT of a request is its wait for a slot plus
`TTFT_SHARE` x its service time: `simulate_ttft` computes that for any arrival times.

Written apart from `instruments/scripted_server.py`, on purpose: a calibration against the tool's own test
server could share its mistakes. Run as a subprocess (`known_server`), so that the server's event loop does
not compete with the load generator's for one interpreter: `python tests/known_servers.py --slots 2 ...`
prints `PORT <n>` once it listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TTFT_SHARE = 0.4  # the share of a request's service time before its first token
MODEL = "known-model"


@dataclass(frozen=True)
class KnownServer:
    """What a test knows of the server it started."""

    url: str
    slots: int
    service_s: float  # mean service time
    distribution: str  # constant | exponential | lognormal
    seed: int

    @property
    def capacity_rps(self) -> float:
        return self.slots / self.service_s


def service_times(distribution: str, mean_s: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` service times of mean `mean_s`: constant, exponential, or lognormal with sigma 0.5."""
    if distribution == "constant":
        return np.full(n, mean_s)
    if distribution == "exponential":
        return rng.exponential(mean_s, n)
    if distribution == "lognormal":
        sigma = 0.5
        return rng.lognormal(np.log(mean_s) - sigma**2 / 2, sigma, n)
    raise ValueError(f"unknown service-time distribution {distribution!r}")


def simulate_ttft(arrivals: np.ndarray, services: np.ndarray, slots: int) -> np.ndarray:
    """The TTFT (from each arrival) of requests arriving at `arrivals` (sorted) with `services`, at a FIFO
    server of `slots` slots: the wait for the first slot to free, plus `TTFT_SHARE` of the service."""
    free = np.zeros(slots)
    out = np.empty(arrivals.size)
    for i, (t, s) in enumerate(zip(arrivals, services, strict=True)):
        k = int(np.argmin(free))
        start = max(t, free[k])
        free[k] = start + s
        out[i] = start - t + TTFT_SHARE * s
    return out


class _Slots:
    """`n` slots handed out strictly in arrival order."""

    def __init__(self, n: int) -> None:
        self.free = n
        self.waiting: collections.deque[asyncio.Future] = collections.deque()

    async def take(self) -> None:
        if self.free and not self.waiting:
            self.free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self.waiting.append(waiter)
        await waiter  # the slot is handed over by give(), never counted free in between

    def give(self) -> None:
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


def _app(slots: int, service_s: float, distribution: str, seed: int):
    from aiohttp import web

    rng = np.random.default_rng(seed)
    gate = _Slots(slots)

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body.get("prompt", "")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else max(1, len(str(prompt).split()))
        n_out = max(1, int(body.get("max_tokens") or 16))
        await gate.take()
        try:
            service = float(service_times(distribution, service_s, 1, rng)[0])  # drawn in admission order
            loop = asyncio.get_running_loop()
            start = loop.time()
            first = TTFT_SHARE * service
            gap = (service - first) / max(1, n_out - 1)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for k in range(n_out):
                delay = start + first + k * gap - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": k + 1,
                    "total_tokens": prompt_tokens + k + 1,
                }
                chunk = {
                    "id": "cmpl-known",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "usage": usage,
                    "choices": [
                        {"index": 0, "text": " token", "finish_reason": "length" if k == n_out - 1 else None}
                    ],
                }
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        finally:
            gate.give()  # the slot frees with the last token, as a server's sequence slot does
        final = {
            "id": "cmpl-known",
            "object": "text_completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [],
            "usage": usage,
        }
        await response.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.add_routes(
        [web.get("/health", health), web.get("/v1/models", models), web.post("/v1/completions", completions)]
    )
    return app


async def _serve(slots: int, service_s: float, distribution: str, seed: int, lifetime_s: float) -> None:
    from aiohttp import web

    runner = web.AppRunner(_app(slots, service_s, distribution, seed), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(f"PORT {port}", flush=True)
    try:
        await asyncio.sleep(lifetime_s)  # bounded: a server a test forgot cannot outlive it for long
    finally:
        await runner.cleanup()


@contextmanager
def known_server(
    slots: int, service_s: float, distribution: str = "constant", seed: int = 0, lifetime_s: float = 600.0
) -> Iterator[KnownServer]:
    """Start the server in a subprocess on a free loopback port; always stopped on exit."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--slots",
        str(slots),
        "--service-s",
        str(service_s),
        "--distribution",
        distribution,
        "--seed",
        str(seed),
        "--lifetime-s",
        str(lifetime_s),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("PORT "):
            proc.kill()
            error = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"known server did not start: {line!r} {error}")
        yield KnownServer(f"http://127.0.0.1:{int(line.split()[1])}", slots, service_s, distribution, seed)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--service-s", type=float, required=True)
    parser.add_argument(
        "--distribution", default="constant", choices=("constant", "exponential", "lognormal")
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lifetime-s", type=float, default=600.0)
    args = parser.parse_args()
    asyncio.run(_serve(args.slots, args.service_s, args.distribution, args.seed, args.lifetime_s))


if __name__ == "__main__":
    main()
