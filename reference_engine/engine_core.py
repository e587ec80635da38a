"""The engine core: an `Engine` in a process of its own, stepping as fast as it can while it has work.

The HTTP front end starts it (spawn context: CUDA cannot be forked) with two one-way pipes. In: lists of
commands, `("add", request_id, prompt, params)`, `("abort", request_id)`, `("shutdown",)`. Out: one
`("ready", EngineInfo)` or `("failed", exception)` at start-up, then one `("step", StepReport)` per step
carrying every request's new tokens, and `("dead", message)` if a step or a command raises. Between steps the
core takes whatever commands have arrived without waiting; with no work it blocks until the next one comes.

Its own Python interpreter means its host work (scheduling, building step inputs) never waits for the front
end's (detokenising, JSON, socket writes) to release a GIL.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import torch

from reference_engine.config import EngineConfig
from reference_engine.config import cpu_threads as default_threads
from reference_engine.engine import Engine, EngineStats
from reference_engine.engine_info import EngineInfo
from reference_engine.heap import freeze_startup_heap
from reference_engine.sequence import RequestOutput

log = logging.getLogger("reference_engine.core")


@dataclass(slots=True)
class CoreOutput:
    """A request's new tokens after one step: `RequestOutput`'s fields that the front end reads. They cross
    the pipe as a plain tuple (`row`): pickling a tuple costs a tenth of pickling this object."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[float] | None
    finished: bool
    finish_reason: str | None
    num_cached_tokens: int

    @staticmethod
    def row(out: RequestOutput) -> tuple:
        return (out.request_id, out.new_token_ids, out.new_logprobs, out.finished, out.finish_reason,
                out.num_cached_tokens)


@dataclass
class StepReport:
    """What one step changed, and the engine's counters after it (for /metrics and back-pressure)."""

    outputs: list[tuple]  # CoreOutput rows
    stats: EngineStats
    num_added: int  # add commands taken so far, so the front end knows how many are still in the pipe
    num_steps: int
    step_seconds: float  # seconds spent inside `Engine.step` so far
    # (request id, why) of adds the engine refused
    rejected: list[tuple[str, str]] = field(default_factory=list)


def run_engine_core(config: EngineConfig, commands: Connection, results: Connection, cpu_threads: int | None,
                    log_level: str, log_format: str) -> None:
    """The child process's entry point: build the engine, report ready, then serve commands until told to stop
    or the front end goes away."""
    # Ctrl-C reaches the whole process group; the front end decides
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=log_format)
    on_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    if cpu_threads is not None or on_cpu:
        threads = default_threads(cpu_threads)
        if on_cpu:
            log.info("CPU serving with %d torch threads", threads)
        torch.set_num_threads(threads)
    try:
        engine = Engine(config)
    except Exception as exc:
        try:
            results.send(("failed", exc))
        except Exception:  # an exception that does not pickle: send its words
            results.send(("failed", RuntimeError(f"{type(exc).__name__}: {exc}")))
        return
    freeze_startup_heap("engine core")  # modules, weights, graphs, kernels: out of the collector's sweeps
    try:
        results.send(("ready", EngineInfo.of(engine)))
        EngineCore(engine, commands, results).serve()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        log.info("engine core: the front end went away; stopping")
    except Exception as exc:  # a step or a command raised: the engine's state can no longer be trusted
        log.exception("engine core failed; it stops")
        with contextlib.suppress(OSError):
            results.send(("dead", f"{type(exc).__name__}: {exc}"))


class EngineCore:
    def __init__(self, engine: Engine, commands: Connection, results: Connection) -> None:
        self.engine = engine
        self.commands = commands
        self.results = results
        self.num_added = 0
        self.num_steps = 0
        self.step_seconds = 0.0
        self.stopping = False

    def serve(self) -> None:
        engine = self.engine
        while not self.stopping:
            # idle: wait for work
            batches = [] if engine.has_unfinished_requests() else [self.commands.recv()]
            while self.commands.poll(0):  # everything that arrived during the step, without waiting
                batches.append(self.commands.recv())
            rejected = [r for batch in batches for r in self._apply(batch)]
            if self.stopping:
                break
            if not engine.has_unfinished_requests():
                if batches:  # aborts or refusals changed what /metrics shows
                    self._report([], rejected)
                continue
            start = time.perf_counter()
            outputs = engine.step()
            self.num_steps += 1
            self.step_seconds += time.perf_counter() - start
            self._report([CoreOutput.row(out) for out in outputs], rejected)

    def _apply(self, batch: list[tuple]) -> list[tuple[str, str]]:
        rejected = []
        for command in batch:
            kind = command[0]
            if kind == "add":
                _, request_id, prompt, params = command
                self.num_added += 1
                try:
                    self.engine.add_request(prompt, params, request_id=request_id)
                # validated by the front end; only a race with engine state lands here
                except ValueError as exc:
                    rejected.append((request_id, str(exc)))
            elif kind == "abort":
                self.engine.abort(command[1])
            elif kind == "shutdown":
                self.stopping = True
        return rejected

    def _report(self, outputs: list[tuple], rejected: list[tuple[str, str]]) -> None:
        report = StepReport(outputs, self.engine.stats(), self.num_added, self.num_steps, self.step_seconds,
                            rejected)
        self.results.send(("step", report))
