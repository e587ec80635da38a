"""What one request asks for, independent of the backend that will serve it.

It sits with the adapters, which turn it into HTTP requests, so that `workloads` (which builds and sends
requests) depends on `adapters` and never the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


def lap_id(spec_id: str, lap: int) -> str:
    """A request's id when a load generator sends a spec for the `lap`-th time after its first (lap 0: the
    spec's own id); a server keyed by request id sees every send as a request of its own."""
    return spec_id if lap == 0 else f"{spec_id}~{lap}"


def spec_id_of(request_id: str) -> str:
    """The id of the spec a request was sent from (the inverse of `lap_id`)."""
    return request_id.rsplit("~", 1)[0]


def is_resend(request_id: str) -> bool:
    """Whether a request was a spec sent again (`lap_id` with a lap above 0)."""
    return "~" in request_id


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A token-exact request: the prompt as token ids and as text, and the output length we want.

    `prompt_token_ids` are the ids the target tokenizer gives for `prompt_text` (without special tokens),
    so either form can be sent. `extra_headers` and `extra_body` pass through to the HTTP request unchanged
    (the body keys are merged into the adapter's JSON body: a backend that rejects unknown fields will).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    prompt_text: str
    wanted_output_tokens: int
    group: str | None = None  # requests that share a prompt prefix carry the same group
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    extra_body: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.wanted_output_tokens < 1:
            raise ValueError(
                f"{self.request_id}: wanted_output_tokens must be >= 1, got {self.wanted_output_tokens}"
            )

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)
