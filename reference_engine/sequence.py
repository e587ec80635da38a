"""One request's state as it moves through the engine, and what the engine reports about it."""

from __future__ import annotations

import enum

import torch

from reference_engine.config import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Tokens so far, the KV blocks that hold them, and how far the cache has computed them."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival: int,
        generator: torch.Generator | None,
    ) -> None:
        self.request_id = request_id
        self.prompt_len = len(prompt_token_ids)
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt, then every generated token
        self.params = params
        self.arrival = arrival
        self.generator = generator  # per-request seeded sampling; None draws from the engine's generator
        self.status = Status.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full blocks registered so far
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_prompt_tokens = 0  # prompt tokens found in the prefix cache at first admission
        self.num_preemptions = 0
        self.finish_reason: str | None = None
        self.logprobs: list[float] = []  # one per generated token, when params.logprobs

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens


class RequestOutput:
    """A request's state after a step; `new_token_ids` are the tokens that step added.

    Token lists are sliced from the sequence only when read (a step must not copy every prompt), at the
    length the sequence had when this output was made, so an output never changes after the fact."""

    __slots__ = (
        "_length",
        "_seq",
        "finish_reason",
        "finished",
        "new_logprobs",
        "new_token_ids",
        "num_cached_tokens",
        "request_id",
    )

    def __init__(self, seq: Sequence, new_token_ids: list[int]) -> None:
        self._seq = seq
        self._length = len(seq.token_ids)
        self.request_id = seq.request_id
        self.new_token_ids = new_token_ids
        self.finished = seq.status is Status.FINISHED
        self.finish_reason: str | None = seq.finish_reason  # "stop" (EOS or stop token), "length", "abort"
        self.num_cached_tokens = seq.num_cached_prompt_tokens
        n = len(new_token_ids)
        self.new_logprobs = seq.logprobs[len(seq.logprobs) - n :] if seq.params.logprobs else None

    @classmethod
    def of(cls, seq: Sequence, new_token_ids: list[int]) -> RequestOutput:
        return cls(seq, new_token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._seq.token_ids[: self._seq.prompt_len]

    @property
    def token_ids(self) -> list[int]:
        """Generated tokens so far."""
        return self._seq.token_ids[self._seq.prompt_len : self._length]

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id!r}, token_ids={self.token_ids}, "
            f"finished={self.finished}, finish_reason={self.finish_reason!r})"
        )
