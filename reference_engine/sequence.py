"""One request's state as it moves through the engine, and what the engine reports about it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from reference_engine.config import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Tokens so far, the KV blocks that hold them, and how far the cache has computed them."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 arrival: int, generator: torch.Generator | None) -> None:
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
        return self.token_ids[self.prompt_len:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens


@dataclass
class RequestOutput:
    """A request's tokens so far; `new_token_ids` are those the last step added."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    new_token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None  # "stop" (EOS or stop token), "length", "abort"
    num_cached_tokens: int = 0
    new_logprobs: list[float] | None = None  # log-probabilities of new_token_ids, when asked for

    @classmethod
    def of(cls, seq: Sequence, new_token_ids: list[int]) -> RequestOutput:
        logprobs = seq.logprobs[len(seq.logprobs) - len(new_token_ids):] if seq.params.logprobs else None
        return cls(seq.request_id, seq.token_ids[:seq.prompt_len], seq.output_token_ids, new_token_ids,
                   seq.status is Status.FINISHED, seq.finish_reason, seq.num_cached_prompt_tokens, logprobs)
