"""What crosses the pipes from the engine core to its front ends after a step (`engine_core.py` sends,
`serving/engine_client.py` reads). Plain data, no torch: a front end starts without importing it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from reference_engine.engine_info import EngineStats

if TYPE_CHECKING:
    from reference_engine.sequence import RequestOutput


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
