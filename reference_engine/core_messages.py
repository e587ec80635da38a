"""What crosses the pipes between the engine core and its front ends (`engine_core.py` on one side,
`serving/engine_client.py` on the other), as typed messages a checker can follow: a new command is a new
class here and a new `case` on each side, not a string matched in three files. Plain data, no torch: a front
end starts without importing it.

Front end to core, in lists (all the commands queued since the last send): `AddRequest`, `AbortRequest`,
`Shutdown`. Core to front end: one `Ready` or `Failed` at start-up, then a `Step` after each step that changed
something for that front end, and `Dead` if a step or a command raised. `Exited` never crosses a pipe: the
front end's reader makes it when the core's pipe closes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

from reference_engine.engine_info import EngineStats

if TYPE_CHECKING:
    from reference_engine.config import SamplingParams
    from reference_engine.engine_info import EngineInfo
    from reference_engine.sequence import RequestOutput


class MessageKind(StrEnum):
    """Every kind of message on the core's pipes (for logs and for code that only needs the kind)."""

    ADD = "add"
    ABORT = "abort"
    SHUTDOWN = "shutdown"
    READY = "ready"
    FAILED = "failed"
    STEP = "step"
    DEAD = "dead"
    EXITED = "exited"


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Admit a request (validated by the front end already; the engine may still refuse it)."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    kind: ClassVar[MessageKind] = MessageKind.ADD


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """Stop a request: its client went away, or its front end is stopping."""

    request_id: str
    kind: ClassVar[MessageKind] = MessageKind.ABORT


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop the core (only the first front end, which owns it, sends this)."""

    kind: ClassVar[MessageKind] = MessageKind.SHUTDOWN


Command = AddRequest | AbortRequest | Shutdown


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
        return (
            out.request_id,
            out.new_token_ids,
            out.new_logprobs,
            out.finished,
            out.finish_reason,
            out.num_cached_tokens,
        )


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


@dataclass(frozen=True, slots=True)
class Ready:
    """The engine is built: what the front end needs of it (limits, model, start-up report)."""

    info: EngineInfo
    kind: ClassVar[MessageKind] = MessageKind.READY


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine could not be built; the front end raises `error` (pickled, or its words if it did not
    pickle)."""

    error: BaseException
    kind: ClassVar[MessageKind] = MessageKind.FAILED


@dataclass(frozen=True, slots=True)
class Step:
    """What one step changed for this front end."""

    report: StepReport
    kind: ClassVar[MessageKind] = MessageKind.STEP


@dataclass(frozen=True, slots=True)
class Dead:
    """A step or a command raised: the engine's state can no longer be trusted and the core has stopped."""

    reason: str
    kind: ClassVar[MessageKind] = MessageKind.DEAD


@dataclass(frozen=True, slots=True)
class Exited:
    """The core's pipe closed (made by the front end's reader, never sent): its process has ended."""

    exitcode: int | None
    kind: ClassVar[MessageKind] = MessageKind.EXITED


Reply = Ready | Failed | Step | Dead | Exited
