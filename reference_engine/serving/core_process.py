"""Starting the engine core's process, from a module light enough to import first.

`python -m reference_engine.server` starts the core before it imports the HTTP front end, so that the core
imports torch and builds its engine while the front end imports aiohttp, torch and transformers: the two
processes' start-up runs side by side instead of one after the other. The child is spawned (CUDA cannot be
forked) and imports `reference_engine.engine_core` only there.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from reference_engine.config import EngineConfig

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass
class StartedCore:
    """An engine core's process and the front end's ends of its two pipes (the engine may still be
    building)."""

    process: BaseProcess
    commands: Connection  # the front end sends on it
    results: Connection  # the front end receives on it


def start_engine_core(config: EngineConfig, threads: int | None, log_level: str, log_format: str = LOG_FORMAT
                      ) -> StartedCore:
    """Spawn the engine core; it reports ("ready", EngineInfo) or ("failed", exception) on `results`."""
    ctx = multiprocessing.get_context("spawn")
    commands_recv, commands_send = ctx.Pipe(duplex=False)
    results_recv, results_send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_run_core, name="engine-core", daemon=True,
                          args=(config, commands_recv, results_send, threads, log_level, log_format))
    process.start()
    commands_recv.close()  # the child's ends: closing ours lets each side see the other go away as EOF
    results_send.close()
    return StartedCore(process, commands_send, results_recv)


def _run_core(*args) -> None:
    from reference_engine.engine_core import run_engine_core  # in the child: torch and the engine

    run_engine_core(*args)
