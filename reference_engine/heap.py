"""The garbage collector in a serving process: start-up objects frozen, long collections logged.

A full collection walks every tracked object of the heap, and while it runs no token leaves the process:
with the modules, tokenizer, weights' wrappers and graphs of a server that is hundreds of thousands of objects
(55-70 ms for 230 k on a 2-core CPU here). Objects built before ready live as long as the process, so both
the front end and the engine core freeze them (`gc.freeze`): later sweeps walk only what serving allocates.
A full collection that still takes long is logged, so that a stall seen by clients can be matched to it.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("reference_engine.heap")
SLOW_COLLECTION_S = 0.05


def freeze_heap() -> None:
    """Collect once and freeze what is left. Called early as well (a front end, once its modules and tokenizer
    are in, while the engine core still builds) so that the collection at ready walks only what came after."""
    gc.collect()
    gc.freeze()


def freeze_startup_heap(process: str) -> Callable[[str, dict], None]:
    """Collect once, freeze what is left, and start logging full collections slower than 50 ms; returns the
    callback that logs them (in `gc.callbacks`)."""
    freeze_heap()
    log.info("%s: %d start-up objects frozen out of the collector's sweeps", process, gc.get_freeze_count())
    started: list[float] = []

    def watch(phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            took = time.perf_counter() - started.pop()
            if took > SLOW_COLLECTION_S:
                log.warning(
                    "%s: a full garbage collection took %.0f ms (%d objects collected)",
                    process,
                    took * 1000,
                    info.get("collected", 0),
                )

    gc.callbacks.append(watch)
    return watch
