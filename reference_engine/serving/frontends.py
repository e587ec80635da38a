"""Extra HTTP front-end processes (`--api-server-count N`): the same server on the same port, each process
with its own pipes to the one engine core.

At the token rates of a small model on a GPU, one front end's event loop is the limit: detokenising, JSON and
a socket write per stream per step, all on one core, so tokens reach clients in bursts behind the engine. With
N front ends every process listens on the port with SO_REUSEPORT and the kernel spreads new connections over
them; each streams its own connections' requests, and the core sends each request's tokens to the front end
that added it.

The process started from the command line is the first front end: it owns the core and the others. It says
ready only when all of them listen, and on SIGTERM it stops them before the core. An extra front end stops
when told (SIGTERM or SIGINT: draining its requests as the first does), and on its own when the first has gone
(its parent changed), so none is left holding the port.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from reference_engine.serving.core_process import LOG_FORMAT, FrontLink

log = logging.getLogger("reference_engine.frontends")
STOP_GRACE_S = 5.0  # beyond --shutdown-timeout, before a front end that has not stopped is terminated
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multiprocess mode (server_metrics.py)


def share_metrics_between_processes() -> str:
    """Point prometheus_client at a fresh multiprocess directory, so that a scrape of any front end counts
    every front end's requests. Called before prometheus_client is imported (it reads the environment then),
    in the process that starts the others (they inherit it); the directory goes when this process exits."""
    if "prometheus_client" in sys.modules and MULTIPROCESS_ENV not in os.environ:
        raise RuntimeError("prometheus_client was imported before its multiprocess directory was set")
    directory = tempfile.mkdtemp(prefix="reference-metrics-")
    os.environ[MULTIPROCESS_ENV] = directory
    owner = os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(directory, ignore_errors=True))
    return directory


@dataclass
class ExtraFrontend:
    index: int
    process: BaseProcess
    status: Connection  # it sends ("listening",) or ("failed", message) once


class ExtraFrontends:
    """The extra front ends the first one starts and stops (`--api-server-count` minus one)."""

    def __init__(self, args: argparse.Namespace, links: list[FrontLink]) -> None:
        """Spawn a front end for each link (their indices count from 1: 0 is this process's)."""
        ctx = multiprocessing.get_context("spawn")
        self.members: list[ExtraFrontend] = []
        for index, link in enumerate(links, start=1):
            status_recv, status_send = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=_run_frontend,
                name=f"front-end-{index}",
                daemon=True,
                args=(args, index, link, status_send),
            )
            process.start()
            status_send.close()  # the child's ends: ours closed, so the child's exit reads as EOF
            link.close()
            self.members.append(ExtraFrontend(index, process, status_recv))

    def __len__(self) -> int:
        return len(self.members)

    async def wait_listening(self) -> None:
        """Return when every one listens; raise RuntimeError for one that failed or exited first."""
        for member in self.members:
            try:
                message = await asyncio.to_thread(member.status.recv)
            except EOFError:
                await asyncio.to_thread(member.process.join, STOP_GRACE_S)
                raise RuntimeError(
                    f"front end {member.index} exited with code {member.process.exitcode} before it listened"
                ) from None
            if message[0] != "listening":
                raise RuntimeError(f"front end {member.index} failed to start: {message[1]}")

    def watch(self, stopping: asyncio.Event) -> list[asyncio.Future]:
        """Log a front end that ends while the server is not stopping: its connections are gone, the others'
        go on."""

        async def watch_one(member: ExtraFrontend) -> None:
            await asyncio.to_thread(member.process.join)
            if not stopping.is_set():
                log.error(
                    "front end %d (process %d) exited unexpectedly with code %s",
                    member.index,
                    member.process.pid,
                    member.process.exitcode,
                )

        return [asyncio.ensure_future(watch_one(member)) for member in self.members]

    async def stop(self, drain_timeout: float) -> None:
        """SIGTERM each (they drain for up to `drain_timeout` s, as the first does), then wait; terminate one
        that outlives that by STOP_GRACE_S."""
        for member in self.members:
            if member.process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member.process.pid, signal.SIGTERM)
        for member in self.members:
            await asyncio.to_thread(member.process.join, drain_timeout + STOP_GRACE_S)
            if member.process.is_alive():
                log.warning("front end %d did not stop; terminating it", member.index)
                member.process.terminate()
                await asyncio.to_thread(member.process.join, STOP_GRACE_S)
            member.status.close()


def _run_frontend(args: argparse.Namespace, index: int, link: FrontLink, status: Connection) -> None:
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    from reference_engine.serving.server import run_on_loop, serve_extra

    try:
        code = run_on_loop(serve_extra(args, index, link, status), args.event_loop)
    except Exception as exc:
        log.exception("front end %d failed", index)
        with contextlib.suppress(OSError):
            status.send(("failed", f"{type(exc).__name__}: {exc}"))
        code = 1
    raise SystemExit(code)
