"""Streams when the front end falls behind the engine: outputs that arrive before a handler reads are kept,
the events ready together are marked, and a writer sends them in one socket write with the same bytes."""

from __future__ import annotations

import asyncio
import time

from aiohttp import ClientSession, web

from reference_engine import Engine, EngineConfig, SamplingParams
from reference_engine.serving.async_engine import AsyncEngine
from reference_engine.serving.generation import GenerationRequest, generate_tokens
from reference_engine.serving.openai_api import EventWriter
from reference_engine.serving.server_metrics import ServerMetrics


def test_a_request_finished_before_it_is_read_streams_every_token_marked_ready(llama_dir):
    async def main():
        engine = Engine(EngineConfig(model=str(llama_dir), device="cpu", max_model_len=256))
        streams = AsyncEngine(engine)
        streams.start()
        try:
            gen = GenerationRequest(
                [5, 6, 7], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True), []
            )
            streams.submit("r", gen.prompt_ids, gen.params)
            events = generate_tokens(streams, engine.tokenizer, ServerMetrics("m"), "r", gen)
            deadline = time.monotonic() + 60
            while streams.num_active:  # the engine has finished the request before anything reads it
                assert time.monotonic() < deadline, "the request never finished"
                await asyncio.sleep(0.01)
            return [(ev.index, ev.more, ev.finished) async for ev in events]
        finally:
            await streams.close()

    assert asyncio.run(main()) == [
        (1, True, False),
        (2, True, False),
        (3, True, False),
        (4, True, False),
        (5, False, True),
    ]


def test_held_events_leave_in_one_write_with_the_same_bytes():
    writes: list[bytes] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        real_write = response.write

        async def counted(data: bytes) -> None:
            writes.append(data)
            await real_write(data)

        response.write = counted  # type: ignore[method-assign]
        writer = EventWriter(response)
        for i, hold in enumerate((True, True, False, False)):
            await writer.send({"n": i}, hold=hold)
        await response.write_eof()
        return response

    async def main() -> bytes:
        app = web.Application()
        app.router.add_get("/", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as resp:
                return await resp.read()
        finally:
            await runner.cleanup()

    body = asyncio.run(main())
    assert body == b'data: {"n":0}\n\ndata: {"n":1}\n\ndata: {"n":2}\n\ndata: {"n":3}\n\n'
    assert writes == [b'data: {"n":0}\n\ndata: {"n":1}\n\ndata: {"n":2}\n\n', b'data: {"n":3}\n\n']
