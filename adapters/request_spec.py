"""What one request asks for, independent of the backend that will serve it.

It sits with the adapters, which turn it into HTTP requests, so that `workloads` (which builds and sends
requests) depends on `adapters` and never the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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
