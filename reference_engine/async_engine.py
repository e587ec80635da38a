"""The engine behind an asyncio server: one driver task owns the engine and runs each `step()` in a worker
thread, so the event loop keeps serving while the model computes.

Requests and aborts are queued by the handlers and applied by the driver between steps (the engine is never
touched by two threads at once); each request's outputs flow through its own asyncio queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from reference_engine.config import SamplingParams
from reference_engine.engine import Engine
from reference_engine.sequence import RequestOutput

log = logging.getLogger("reference_engine.async")


class OverloadedError(RuntimeError):
    """The waiting queue is full; the client should retry later."""


class EngineDeadError(RuntimeError):
    """A step raised: the engine's state can no longer be trusted."""


class AsyncEngine:
    def __init__(self, engine: Engine, max_waiting: int | None = None) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._to_add: list[tuple[str, list[int], SamplingParams]] = []
        self._to_abort: set[str] = set()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._driver: asyncio.Task | None = None
        self.error: BaseException | None = None
        self.accepting = True
        self.num_aborted = 0  # requests abandoned before they finished (client gone, stop string, shutdown)
        self.num_steps = 0  # engine steps run, and the seconds spent inside them (/metrics)
        self.step_seconds = 0.0

    def start(self) -> None:
        self._driver = asyncio.get_running_loop().create_task(self._drive(), name="engine-driver")

    @property
    def num_active(self) -> int:
        return len(self._queues)

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + len(self._to_add)

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        """Validate and queue a request (raises ValueError, OverloadedError, EngineDeadError)."""
        if self.error is not None:
            raise EngineDeadError(f"the engine failed and is not serving: {self.error}")
        self.engine.validate_request(prompt, params)
        if self.max_waiting is not None and self.num_waiting >= self.max_waiting:
            raise OverloadedError(f"{self.num_waiting} requests are already waiting (--max-waiting {self.max_waiting})")
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        self._queues[request_id] = asyncio.Queue()
        self._to_add.append((request_id, prompt, params))
        self._idle.clear()
        self._wake.set()

    async def stream(self, request_id: str) -> AsyncIterator[RequestOutput]:
        """Outputs of a submitted request until it finishes; leaving early (disconnect, error) aborts it."""
        queue = self._queues[request_id]
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        if self._queues.pop(request_id, None) is None:
            return
        self.num_aborted += 1
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
                for out in outputs:
                    queue = self._queues.get(out.request_id)
                    if queue is not None:
                        queue.put_nowait(out)
                        if out.finished:
                            del self._queues[out.request_id]
            if not self._queues:
                self._idle.set()

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
                queue = self._queues.pop(request_id, None)
                if queue is not None:
                    queue.put_nowait(exc)

    def _fail_all(self, exc: BaseException) -> None:
        self.error = exc
        for queue in self._queues.values():
            queue.put_nowait(EngineDeadError(f"the engine failed: {exc}"))
        self._queues.clear()
        self._idle.set()

    async def drain(self, timeout: float) -> int:
        """Stop accepting, let running requests finish for up to `timeout` s, then abort the rest."""
        self.accepting = False
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return 0
        except TimeoutError:
            remaining = list(self._queues)
            for request_id in remaining:
                queue = self._queues.get(request_id)
                self.abort(request_id)
                if queue is not None:
                    queue.put_nowait(EngineDeadError("the server is shutting down"))
            return len(remaining)

    async def close(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
        self._executor.shutdown(wait=True)
