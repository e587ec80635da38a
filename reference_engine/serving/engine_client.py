"""The front end's handle on an engine-core process (`engine_core.py`): the same interface as `AsyncEngine`.

Two threads carry the pipes so the event loop never blocks on them: a writer sends the commands queued since
its last send as one message, and a reader takes each step's report and hands it to the loop in one callback.
Neither side can stall the other: the reader always drains the core's output, and the core reads commands
between steps. If the core reports a failed step or its process ends, every in-flight request gets
EngineDeadError, `error` is set (so /health answers 503) and new requests are refused.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from multiprocessing.process import BaseProcess

from reference_engine.config import EngineConfig, SamplingParams
from reference_engine.core_messages import (
    AbortRequest,
    AddRequest,
    Command,
    CoreOutput,
    Dead,
    Exited,
    Failed,
    Ready,
    Reply,
    Shutdown,
    Step,
)
from reference_engine.engine_info import EngineInfo, EngineStats
from reference_engine.serving.core_process import FrontLink, start_engine_core
from reference_engine.serving.request_streams import EngineDeadError, RequestStreams

log = logging.getLogger("reference_engine.client")
STOP_TIMEOUT_S = 30.0


async def launch_engine_core(
    config: EngineConfig,
    cpu_threads: int | None,
    log_level: str,
    log_format: str,
    max_waiting: int | None = None,
) -> EngineClient:
    """Start the engine core and wait until its engine is built (`start_engine_core`, then
    `connect_engine_core`)."""
    core = start_engine_core(config, cpu_threads, log_level, log_format)
    return await connect_engine_core(core.links[0], core.process, max_waiting)


async def connect_engine_core(
    link: FrontLink, process: BaseProcess | None, max_waiting: int | None = None
) -> EngineClient:
    """Wait until a started engine core's engine is built, and return the client (not yet started).

    `process`: the core's process where this front end started it and owns it (its close stops the core);
    None in an extra front end, which only closes its link. An engine that fails to build raises here the
    exception it raised in the core (ValueError for a bad config, FileNotFoundError for a missing model,
    ...)."""
    try:
        reply: Reply = await asyncio.to_thread(link.results.recv)
    except EOFError:
        if process is None:
            raise RuntimeError("the engine core exited before it was ready") from None
        await asyncio.to_thread(process.join)
        raise RuntimeError(
            f"the engine core exited with code {process.exitcode} before it was ready"
        ) from None
    if isinstance(reply, Failed):
        if process is not None:
            await asyncio.to_thread(process.join)
        raise reply.error
    if not isinstance(reply, Ready):
        raise RuntimeError(f"the engine core sent {reply.kind} before it was ready")
    if process is not None:
        log.info("engine core running in process %d", process.pid)
    return EngineClient(process, link, reply.info, max_waiting)


class EngineClient(RequestStreams):
    def __init__(
        self, process: BaseProcess | None, link: FrontLink, info: EngineInfo, max_waiting: int | None = None
    ) -> None:
        super().__init__(max_waiting)
        self.process = process  # None: the core belongs to another front end
        self.info = info
        self._link = link
        self._outbox: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self._num_sent = 0  # add commands sent; the core reports how many it has taken
        self._num_taken = 0
        self._stats = EngineStats(0, 0, info.limits.num_kv_blocks, 0, info.limits.num_kv_blocks, 0, 0, 0)
        self._closing = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._threads = [
            threading.Thread(target=self._write, name="engine-core-writer", daemon=True),
            threading.Thread(target=self._read, args=(loop,), name="engine-core-reader", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def num_waiting(self) -> int:
        return self._stats.waiting + self._num_sent - self._num_taken

    def stats(self) -> EngineStats:
        return self._stats

    def _validate(self, prompt: list[int], params: SamplingParams) -> None:
        self.info.limits.validate(prompt, params)

    def _send(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        self._num_sent += 1
        self._outbox.put(AddRequest(request_id, prompt, params))

    def _cancel(self, request_id: str) -> None:
        self._outbox.put(AbortRequest(request_id))

    # ---- the pipes' threads -----------------------------------------------------------------------------

    def _write(self) -> None:
        """Send queued commands, all that have piled up as one message, until the sentinel None."""
        while True:
            batch = [self._outbox.get()]
            while not self._outbox.empty():
                batch.append(self._outbox.get_nowait())
            last = batch[-1] is None
            batch = [command for command in batch if command is not None]
            try:
                if batch:
                    self._link.commands.send(batch)
            except (BrokenPipeError, ConnectionResetError, OSError):
                return  # the core is gone; the reader reports it
            if last:
                return

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand each message of the core to the event loop; report the core's end when its pipe closes."""
        while True:
            message: Reply
            try:
                message = self._link.results.recv()
            except (EOFError, OSError):
                exitcode = None
                if self.process is not None:
                    self.process.join(5.0)
                    exitcode = self.process.exitcode
                message = Exited(exitcode)
            try:
                loop.call_soon_threadsafe(self._on_message, message)
            except RuntimeError:  # the loop is closed: the server has stopped
                return
            if isinstance(message, Exited | Dead):
                return

    # ---- on the event loop ------------------------------------------------------------------------------

    def _on_message(self, message: Reply) -> None:
        match message:
            case Step(report):
                self._stats, self._num_taken = report.stats, report.num_added
                self.num_steps, self.step_seconds = report.num_steps, report.step_seconds
                for request_id, why in report.rejected:
                    self._refuse(request_id, ValueError(why))
                self._deliver(CoreOutput(*row) for row in report.outputs)
            case Dead(reason):
                self._fail_all(EngineDeadError(f"an engine step failed: {reason}"))
            case Exited(exitcode):
                if not self._closing:
                    log.error("the engine core process ended unexpectedly (exit code %s)", exitcode)
                    self._fail_all(EngineDeadError(f"the engine core process ended (exit code {exitcode})"))
            case _:
                log.error("unexpected message from the engine core: %r", message)

    async def close(self) -> None:
        """Ask the core to stop, wait for it (then kill it if it does not), and end the pipe threads. An
        extra front end only closes its link: the core drops its requests and goes on serving the others."""
        self._closing = True
        if self.process is not None:
            self._outbox.put(Shutdown())
        self._outbox.put(None)
        if not self._threads:  # never started: send it ourselves
            self._write()
        if self.process is not None:
            await asyncio.to_thread(self.process.join, STOP_TIMEOUT_S)
            if self.process.is_alive():
                log.warning("the engine core did not stop in %.0f s; killing it", STOP_TIMEOUT_S)
                self.process.kill()  # it ignores SIGTERM (engine_core.py)
                await asyncio.to_thread(self.process.join, 5.0)
        else:
            self._link.commands.close()  # the core sees EOF and answers by closing our results pipe
        for thread in self._threads:
            await asyncio.to_thread(thread.join, 5.0)
        self._link.close()
