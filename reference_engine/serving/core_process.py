"""Starting the engine core's process, from a module light enough to import first.

`python -m reference_engine.server` starts the core before it imports the HTTP front end, so that the core
imports torch and builds its engine while the front end imports aiohttp and loads the tokenizer: the two
processes' start-up runs side by side instead of one after the other. The front end's own modules import no
torch, nor does loading a plain tokenizer (`tokenizer.plain_fast_tokenizer`; AutoTokenizer does). The child is
spawned (CUDA cannot be forked) and imports `reference_engine.engine_core` only there.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from reference_engine.config import EngineConfig

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass
class FrontLink:
    """A front end's ends of its two pipes to the engine core."""

    commands: Connection  # the front end sends on it
    results: Connection  # the front end receives on it

    def close(self) -> None:
        self.commands.close()
        self.results.close()


@dataclass
class StartedCore:
    """An engine core's process (the engine may still be building) and one `FrontLink` per front-end process:
    the first is this process's, the others go to the extra front ends (`frontends.py`)."""

    process: BaseProcess
    links: list[FrontLink]


def start_engine_core(
    config: EngineConfig,
    threads: int | None,
    log_level: str,
    log_format: str = LOG_FORMAT,
    num_frontends: int = 1,
) -> StartedCore:
    """Spawn the engine core; it reports `Ready` or `Failed` (`core_messages.py`) on every link."""
    ctx = multiprocessing.get_context("spawn")
    core_ends, front_ends = [], []
    for _ in range(num_frontends):
        commands_recv, commands_send = ctx.Pipe(duplex=False)
        results_recv, results_send = ctx.Pipe(duplex=False)
        core_ends.append((commands_recv, results_send))
        front_ends.append(FrontLink(commands_send, results_recv))
    process = ctx.Process(
        target=_run_core,
        name="engine-core",
        daemon=True,
        args=(config, core_ends, threads, log_level, log_format),
    )
    process.start()
    for commands, results in core_ends:  # the child's ends: ours closed, each side sees the other go as EOF
        commands.close()
        results.close()
    return StartedCore(process, front_ends)


def _run_core(*args) -> None:
    from reference_engine.engine_core import run_engine_core  # in the child: torch and the engine

    run_engine_core(*args)
