"""Who watches a run: the measuring loop and the runner print nothing themselves; they tell a `Watcher` what
happens, each load point's progress and every wait that may pass 2 s, which the command line shows as
messages, progress bars and spinners (`compare/terminal.py`), a Ray cell keeps silent, and tests record."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

#: shows a point's progress: (measured requests so far, output tokens/s or nan, failed requests, phase): the
#: phase is "" while measuring, "warm-up 2/4" (warm-up requests done of those sent first) before
ShowProgress = Callable[[int, float, int, str], None]


#: updates the status line of a wait (`Watcher.wait`) with what it is at now
ShowStatus = Callable[[str], None]


def _silent(_message: str) -> None:
    pass


@contextlib.contextmanager
def _no_progress(_title: str, _total: int | None) -> Iterator[ShowProgress]:
    yield lambda _done, _rate, _errors, _phase: None


@contextlib.contextmanager
def _no_wait(_title: str) -> Iterator[ShowStatus]:
    yield _silent


@dataclass(frozen=True)
class Watcher:
    """Who watches a run: `say(message)` (rich markup) for what happens; `point(title, total)`, a context
    manager around one load point yielding the function that shows its progress; and `wait(title)`, one
    around any wait that may pass 2 s (checkpoint preparation, server start-up) yielding the function that
    updates its status (the console shows a spinner and the time elapsed). Silent by default."""

    say: Callable[[str], None] = _silent
    point: Callable[[str, int | None], AbstractContextManager[ShowProgress]] = _no_progress
    wait: Callable[[str], AbstractContextManager[ShowStatus]] = _no_wait


SILENT = Watcher()  # hears nothing: the default of whoever is not watched
