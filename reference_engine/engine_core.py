"""The engine core: an `Engine` in a process of its own, stepping as fast as it can while it has work.

The HTTP server starts it (spawn context: CUDA cannot be forked) with two one-way pipes per front-end process
(a `CoreLink`), carrying the typed messages of `core_messages.py`. In: lists of commands (`AddRequest`,
`AbortRequest`, `Shutdown`). Out: one `Ready` or `Failed` at start-up, then a `Step` after each step that
changed something for that front end (its requests' new tokens, refusals, adds taken, or the engine going
idle; at least every `STATS_EVERY_S` while it runs, so every front end's /metrics stays current), and `Dead`
if a step or a command raises. Between steps the core takes whatever commands have arrived without waiting;
with no work it blocks until the next one comes.

Each request's outputs go to the front end that added it. The first front end owns the core: its shutdown
command or its going away stops it. Another front end going away only aborts its own requests.

Its own Python interpreter means its host work (scheduling, building step inputs) never waits for the front
end's (detokenising, JSON, socket writes) to release a GIL.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import torch

from reference_engine.config import EngineConfig
from reference_engine.config import cpu_threads as default_threads
from reference_engine.core_messages import (
    AbortRequest,
    AddRequest,
    Command,
    CoreOutput,
    Dead,
    Failed,
    Ready,
    Shutdown,
    Step,
    StepReport,
)
from reference_engine.engine import Engine
from reference_engine.engine_info import EngineInfo
from reference_engine.heap import freeze_startup_heap
from reference_engine.sequence import RequestOutput

log = logging.getLogger("reference_engine.core")
STATS_EVERY_S = 0.1  # a front end hears the engine's counters at least this often while the engine runs


@dataclass
class CoreLink:
    """The core's ends of one front end's pipes."""

    commands: Connection  # the core receives on it
    results: Connection  # the core sends on it


def run_engine_core(
    config: EngineConfig,
    pipes: list[tuple[Connection, Connection]],
    cpu_threads: int | None,
    log_level: str,
    log_format: str,
) -> None:
    """The child process's entry point: build the engine, report ready to every front end, then serve commands
    until told to stop or the first front end goes away. `pipes`: (commands, results) per front end."""
    links = [CoreLink(commands, results) for commands, results in pipes]
    # Ctrl-C, and a launcher's SIGTERM to the process group, reach the core too; the first front end decides
    # when it stops (it sends "shutdown" once the requests have drained; if it dies, its pipe's EOF stops us)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
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
            pickle.dumps(exc)
        except Exception:  # an exception that does not pickle: send its words
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        for link in links:
            with contextlib.suppress(OSError):
                link.results.send(Failed(exc))
        return
    freeze_startup_heap("engine core")  # modules, weights, graphs, kernels: out of the collector's sweeps
    core = EngineCore(engine, links)
    try:
        info = EngineInfo.of(engine)
        for link in links:
            link.results.send(Ready(info))
        core.serve()
    except (EOFError, BrokenPipeError, ConnectionResetError):
        log.info("engine core: the front end went away; stopping")
    except Exception as exc:  # a step or a command raised: the engine's state can no longer be trusted
        log.exception("engine core failed; it stops")
        for link in core.links.values():
            with contextlib.suppress(OSError):
                link.results.send(Dead(f"{type(exc).__name__}: {exc}"))


class EngineCore:
    def __init__(self, engine: Engine, links: list[CoreLink]) -> None:
        self.engine = engine
        self.links = dict(enumerate(links))  # front ends still connected, by index; 0 owns the core
        self.owner: dict[str, int] = {}  # request id -> the front end that added it
        self.num_added = [0] * len(links)  # per front end, so each knows how many of its adds are in the pipe
        self.reported_added = [0] * len(links)
        self.last_report = [0.0] * len(links)
        self.num_steps = 0
        self.step_seconds = 0.0
        self.stopping = False

    def serve(self) -> None:
        engine = self.engine
        while not self.stopping:
            ready = self._readable(wait_for_work=not engine.has_unfinished_requests())
            rejected: dict[int, list[tuple[str, str]]] = {}
            for index in ready:
                self._receive(index, rejected)
            if self.stopping:
                break
            if not engine.has_unfinished_requests():
                if ready:  # aborts, refusals or a front end leaving changed what /metrics shows
                    self._report({}, rejected, everyone=True)
                continue
            start = time.perf_counter()
            outputs = engine.step()
            self.num_steps += 1
            self.step_seconds += time.perf_counter() - start
            self._report(self._route(outputs), rejected, everyone=not engine.has_unfinished_requests())

    def _readable(self, wait_for_work: bool) -> list[int]:
        """The front ends with commands waiting; blocks until one has some when there is no work."""
        by_pipe = {link.commands: index for index, link in self.links.items()}
        return [by_pipe[pipe] for pipe in wait(list(by_pipe), None if wait_for_work else 0)]

    def _receive(self, index: int, rejected: dict[int, list[tuple[str, str]]]) -> None:
        """Apply everything front end `index` has sent; a front end that has gone away loses its requests (the
        first one's going away raises EOFError: the server is gone)."""
        link = self.links.get(index)
        if link is None:
            return
        try:
            while link.commands.poll(0):
                for command in link.commands.recv():
                    self._apply(index, command, rejected)
        except (EOFError, OSError):
            if index == 0:
                raise EOFError from None
            self._drop(index)

    def _apply(self, index: int, command: Command, rejected: dict[int, list[tuple[str, str]]]) -> None:
        match command:
            case AddRequest(request_id, prompt, params):
                self.num_added[index] += 1
                try:
                    self.engine.add_request(prompt, params, request_id=request_id)
                    self.owner[request_id] = index
                # validated by the front end; only a race with engine state lands here
                except ValueError as exc:
                    rejected.setdefault(index, []).append((request_id, str(exc)))
            case AbortRequest(request_id):
                if self.owner.pop(request_id, None) is not None:
                    self.engine.abort(request_id)
            case Shutdown():
                self.stopping = True
            case _:
                raise TypeError(f"not a command of the engine core: {command!r}")

    def _drop(self, index: int) -> None:
        """A front end has gone away: abort its requests, stop writing to it."""
        link = self.links.pop(index)
        mine = [request_id for request_id, owner in self.owner.items() if owner == index]
        for request_id in mine:
            del self.owner[request_id]
            self.engine.abort(request_id)
        with contextlib.suppress(OSError):
            link.results.close()
        (log.warning if mine else log.info)(
            "front end %d went away; aborted its %d requests", index, len(mine)
        )

    def _route(self, outputs: list[RequestOutput]) -> dict[int, list[tuple]]:
        """Each output as a `CoreOutput` row, grouped by the front end that added its request."""
        routed: dict[int, list[tuple]] = {}
        owner = self.owner
        for out in outputs:
            index = owner.pop(out.request_id) if out.finished else owner.get(out.request_id)
            if index is not None:
                routed.setdefault(index, []).append(CoreOutput.row(out))
        return routed

    def _report(
        self, routed: dict[int, list[tuple]], rejected: dict[int, list[tuple[str, str]]], everyone: bool
    ) -> None:
        """Send each front end its part of this step, where it has one (or `everyone`), or where its view of
        the engine's counters is older than `STATS_EVERY_S`."""
        stats = self.engine.stats()
        now = time.monotonic()
        for index, link in list(self.links.items()):
            outputs = routed.get(index, [])
            refused = rejected.get(index, [])
            if not (
                everyone
                or outputs
                or refused
                or self.num_added[index] != self.reported_added[index]
                or now - self.last_report[index] >= STATS_EVERY_S
            ):
                continue
            report = StepReport(
                outputs, stats, self.num_added[index], self.num_steps, self.step_seconds, refused
            )
            try:
                link.results.send(Step(report))
            except OSError:
                if index == 0:
                    raise
                self._drop(index)
                continue
            self.reported_added[index] = self.num_added[index]
            self.last_report[index] = now
