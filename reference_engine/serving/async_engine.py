"""The engine behind an asyncio server, in the server's own process: one driver task owns the engine and runs
each `step()` in a worker thread, so the event loop keeps serving while the model computes.

Requests and aborts are queued by the handlers and applied by the driver between steps (the engine is never
touched by two threads at once); each request's outputs flow through its own asyncio queue. The step thread
and the event loop share one GIL; `engine_client.EngineClient` runs the engine in a process of its own
instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from reference_engine.config import SamplingParams
from reference_engine.engine import Engine
from reference_engine.engine_info import EngineStats
from reference_engine.sequence import RequestOutput
from reference_engine.serving.request_streams import EngineDeadError, OverloadedError, RequestStreams

__all__ = ["AsyncEngine", "EngineDeadError", "OverloadedError"]

log = logging.getLogger("reference_engine.async")


class AsyncEngine(RequestStreams):
    def __init__(self, engine: Engine, max_waiting: int | None = None) -> None:
        super().__init__(max_waiting)
        self.engine = engine
        self._to_add: list[tuple[str, list[int], SamplingParams]] = []
        self._to_abort: set[str] = set()
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._driver: asyncio.Task | None = None

    def start(self) -> None:
        self._driver = asyncio.get_running_loop().create_task(self._drive(), name="engine-driver")

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + len(self._to_add)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def _validate(self, prompt: list[int], params: SamplingParams) -> None:
        self.engine.validate_request(prompt, params)

    def _send(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        self._to_add.append((request_id, prompt, params))
        self._wake.set()

    def _cancel(self, request_id: str) -> None:
        pending = [entry for entry in self._to_add if entry[0] != request_id]
        if len(pending) == len(self._to_add):
            self._to_abort.add(request_id)
            self._wake.set()
        self._to_add = pending

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                self._apply_pending()
                if not self.engine.has_unfinished_requests():
                    break
                try:
                    outputs = await loop.run_in_executor(self._executor, self._timed_step)
                except Exception as exc:
                    log.exception("engine step failed; failing all requests")
                    self._fail_all(exc)
                    return
                self._deliver(outputs)

    def _timed_step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        try:
            return self.engine.step()
        finally:
            self.num_steps += 1
            self.step_seconds += time.perf_counter() - start

    def _apply_pending(self) -> None:
        for request_id in self._to_abort:
            self.engine.abort(request_id)
        self._to_abort.clear()
        adds, self._to_add = self._to_add, []
        for request_id, prompt, params in adds:
            try:
                self.engine.add_request(prompt, params, request_id=request_id)
            except ValueError as exc:  # validated on submit; only a race with engine state lands here
                self._refuse(request_id, exc)

    async def close(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
        self._executor.shutdown(wait=True)
