"""What the server's handlers see of an engine, wherever it runs: submit a request, stream its outputs through
an asyncio queue of its own, abort it, drain on shutdown. Subclasses say how requests reach the engine (a step
thread in this process, or an engine-core process) and feed the outputs back with `_deliver`.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Iterable
from typing import Protocol

from reference_engine.config import SamplingParams
from reference_engine.engine_info import EngineStats


class OverloadedError(RuntimeError):
    """The waiting queue is full; the client should retry later."""


class EngineDeadError(RuntimeError):
    """A step raised or the engine went away: its state can no longer be trusted."""


class StepOutput(Protocol):
    """One request's new tokens after a step (`RequestOutput` in this process, `CoreOutput` from a core)."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[float] | None
    finished: bool
    finish_reason: str | None


class RequestStream:
    """One request's outputs until it finishes; closing it early (disconnect, stop string, error in the
    reader) aborts the request."""

    def __init__(
        self, streams: RequestStreams, request_id: str, queue: asyncio.Queue[StepOutput | BaseException]
    ) -> None:
        self._streams = streams
        self.request_id = request_id
        self._queue = queue
        self._done = False

    def ready(self) -> bool:
        """Whether an output is queued that has not been read: the next `__anext__` will not wait."""
        return not self._queue.empty()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StepOutput:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._done = True  # the request is already gone from the engine
            raise item
        self._done = item.finished
        return item

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._streams.abort(self.request_id)


class RequestStreams(abc.ABC):
    def __init__(self, max_waiting: int | None) -> None:
        self.max_waiting = max_waiting
        self._queues: dict[str, asyncio.Queue[StepOutput | BaseException]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self.error: BaseException | None = None
        self.accepting = True
        self.num_aborted = 0  # requests abandoned before they finished (client gone, stop string, shutdown)
        self.on_abort: Callable[[], None] = lambda: None  # /metrics counts them as they happen
        self.num_steps = 0  # engine steps run, and the seconds spent inside them (/metrics)
        self.step_seconds = 0.0

    # ---- how requests reach the engine ------------------------------------------------------------------

    @abc.abstractmethod
    def start(self) -> None:
        """Begin serving; called from the running event loop."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop serving and release the engine."""

    @property
    @abc.abstractmethod
    def num_waiting(self) -> int:
        """Requests submitted but not yet running."""

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """The engine's latest counters."""

    @abc.abstractmethod
    def _validate(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise ValueError for a request the engine cannot serve."""

    @abc.abstractmethod
    def _send(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        """Pass a validated request on to the engine."""

    @abc.abstractmethod
    def _cancel(self, request_id: str) -> None:
        """Tell the engine to drop a request the client no longer wants."""

    # ---- shared -----------------------------------------------------------------------------------------

    @property
    def num_active(self) -> int:
        return len(self._queues)

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        """Validate and queue a request (raises ValueError, OverloadedError, EngineDeadError)."""
        if self.error is not None:
            raise EngineDeadError(f"the engine failed and is not serving: {self.error}")
        self._validate(prompt, params)
        if self.max_waiting is not None and self.num_waiting >= self.max_waiting:
            raise OverloadedError(
                f"{self.num_waiting} requests are already waiting (--max-waiting {self.max_waiting})"
            )
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        self._queues[request_id] = asyncio.Queue()
        self._idle.clear()
        self._send(request_id, prompt, params)

    def stream(self, request_id: str) -> RequestStream:
        """The outputs of a submitted request, from its queue as it is now: outputs that arrive before the
        caller starts reading are kept, even if the request has finished by then."""
        queue = self._queues.get(request_id)
        if queue is None:
            if self.error is not None:
                raise EngineDeadError(f"the engine failed: {self.error}")
            raise KeyError(f"no request {request_id!r} is in flight")
        return RequestStream(self, request_id, queue)

    def abort(self, request_id: str) -> None:
        if self._queues.pop(request_id, None) is None:
            return
        self.num_aborted += 1
        self.on_abort()
        self._cancel(request_id)
        self._settle()

    def _deliver(self, outputs: Iterable[StepOutput]) -> None:
        for out in outputs:
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)
                if out.finished:
                    del self._queues[out.request_id]
        self._settle()

    def _refuse(self, request_id: str, exc: BaseException) -> None:
        """End one request with an error (the engine refused it)."""
        queue = self._queues.pop(request_id, None)
        if queue is not None:
            queue.put_nowait(exc)
        self._settle()

    def _settle(self) -> None:
        if not self._queues:
            self._idle.set()

    def _fail_all(self, exc: BaseException) -> None:
        if self.error is None:
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
