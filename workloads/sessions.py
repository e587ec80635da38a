"""Multi-turn sessions: conversations replayed turn by turn, each turn carrying the whole conversation so
far, so that a server's prefix cache can serve the earlier turns (as SGLang's bench_serving, AIPerf and
GuideLLM replay them).

A `Session` holds each user turn's *new* tokens and the output length wanted for it; the load generator
(`workloads/loadgen.py`) sends turn k once turn k-1's answer has arrived and the turn's think time has
passed, with the prompt `conversation_turn` builds: the previous prompt, the model's actual answer (the text
it streamed) and the new user turn.

Exactness: a turn's prompt is the conversation's *text* tokenised as a whole, so it is token-exact as sent
(ids and text agree, whichever form the adapter sends). The answer enters the conversation as the text the
server streamed, re-tokenised: the servers we measure do not send the generated ids, and a random model's
ids need not re-tokenise to themselves, so the answer's tokens in the next prompt may differ from the ones
the server generated (and cached). The earlier prompts' tokens carry over unchanged, except where the
tokenizer merges across a join (the last token or so before it). A prefix cache therefore serves at least
the earlier turns' prompts, to its block granularity, and the answers as far as they re-tokenise alike.

- `multi-turn`: synthetic; `turns` user turns of random token-exact ids per session (the `random` dataset's
  draws), lengths of user turns and answers as `LengthDist`, seeded.
- `sharegpt-turns`: a local ShareGPT file; each conversation's human turns in order (at most `turns`), each
  asking for as many tokens as the recorded answer had. Turns after the first start with a blank line.

Think time (`ThinkTime`): seconds between an answer's arrival and the next turn's send: `S` (fixed),
`uniform:LOW:HIGH` or `exponential:MEAN`, drawn per turn with the dataset's seed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from adapters.request_spec import RequestSpec
from workloads.datasets import (
    Draw,
    LengthDist,
    encode_text,
    ordinary_token_ids,
    parse_distribution,
    read_sharegpt,
    sharegpt_exchanges,
    token_exact_prompt,
)

log = logging.getLogger(__name__)

THINK_FORMS = "S (seconds), uniform:LOW:HIGH or exponential:MEAN"
TURN_SEPARATOR = "\n\n"  # before each ShareGPT user turn after the first


@dataclass(frozen=True)
class ThinkTime:
    """Seconds a user waits after an answer before sending the next turn."""

    kind: Literal["fixed", "uniform", "exponential"]
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, value: ThinkTime | str | float) -> ThinkTime:
        if isinstance(value, ThinkTime):
            return value
        arity = {"fixed": 1, "uniform": 2, "exponential": 1}
        return cls(*parse_distribution(value, arity, "think time", THINK_FORMS))

    def __post_init__(self) -> None:
        if not (self.a >= 0 and self.b >= 0) or not np.isfinite([self.a, self.b]).all():
            raise ValueError(f"think time needs finite values >= 0, got {self.a}, {self.b}")
        if self.kind == "uniform" and self.b < self.a:
            raise ValueError(f"uniform think time needs LOW <= HIGH, got {self.a}:{self.b}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            return np.full(n, self.a)
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b, size=n)
        return rng.exponential(self.a, size=n) if self.a > 0 else np.zeros(n)


@dataclass(frozen=True)
class Session:
    """One conversation to replay: `turns[k]` holds only user turn k's new tokens (ids and text) and the
    output length wanted for its answer; `think_s[k]` is the wait before turn k (0 for the first)."""

    session_id: str
    turns: tuple[RequestSpec, ...]
    think_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError(f"session {self.session_id} has no turns")
        if len(self.think_s) != len(self.turns):
            raise ValueError(f"session {self.session_id}: one think time per turn")

    def turn_id(self, k: int) -> str:
        return f"{self.session_id}-t{k}"


def conversation_turn(
    session: Session, k: int, previous: RequestSpec | None, answer: str, tokenizer: Any
) -> RequestSpec:
    """Turn k's request: the previous turn's prompt, its answer's text and user turn k, tokenised as one
    text (see the module docstring for what that keeps exact). The first turn is the user turn alone."""
    user = session.turns[k]
    if previous is None:
        return RequestSpec(
            session.turn_id(k),
            user.prompt_token_ids,
            user.prompt_text,
            user.wanted_output_tokens,
            group=session.session_id,
        )
    text = previous.prompt_text + answer + user.prompt_text
    ids = tuple(encode_text(tokenizer, text))
    return RequestSpec(session.turn_id(k), ids, text, user.wanted_output_tokens, group=session.session_id)


def synthetic_sessions(
    tokenizer: Any,
    n: int,
    turns: int,
    input_len: LengthDist | str | int,
    output_len: LengthDist | str | int,
    think_time: ThinkTime | str | float = 0.0,
    seed: int | Sequence[int] | Draw = 0,
    id_prefix: str = "session",
) -> list[Session]:
    """`n` sessions of `turns` user turns, each of random token-exact ids of a drawn length, numbered from
    the `Draw`'s first (a plain seed: from 0)."""
    if n < 1 or turns < 1:
        raise ValueError(f"sessions and turns must be >= 1, got {n} and {turns}")
    draw = Draw.of(seed)
    allowed, first_index = draw.allowed, draw.first
    rng = np.random.default_rng(draw.seed)
    ins = LengthDist.parse(input_len).sample(rng, n * turns)
    outs = LengthDist.parse(output_len).sample(rng, n * turns)
    thinks = ThinkTime.parse(think_time).sample(rng, n * turns)
    allowed = ordinary_token_ids(tokenizer) if allowed is None else allowed
    sessions = []
    for i in range(n):
        name = f"{id_prefix}-{first_index + i}"
        specs = []
        for k in range(turns):
            ids, text = token_exact_prompt(tokenizer, int(ins[i * turns + k]), rng, allowed)
            specs.append(RequestSpec(f"{name}-t{k}", tuple(ids), text, int(outs[i * turns + k]), group=name))
        think = (0.0, *(float(t) for t in thinks[i * turns + 1 : (i + 1) * turns]))
        sessions.append(Session(name, tuple(specs), think))
    return sessions


def sharegpt_sessions(
    path: str | Path,
    tokenizer: Any,
    n: int | None = None,
    turns: int | None = None,
    think_time: ThinkTime | str | float = 0.0,
    seed: int = 0,
    min_turns: int = 2,
    id_prefix: str = "sharegpt",
) -> list[Session]:
    """Conversations of a local ShareGPT file with at least `min_turns` human turns that have an answer:
    their first `turns` (None: all) human turns, each wanting its recorded answer's token count. Shuffled
    with `seed`; the first `n` kept."""
    path = Path(path)
    data = read_sharegpt(path)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(data))
    think = ThinkTime.parse(think_time)
    sessions: list[Session] = []
    for index in order:
        if n is not None and len(sessions) >= n:
            break
        pairs = [p for p in sharegpt_exchanges(data[index]) if p[0].strip()][:turns]
        if len(pairs) < max(min_turns, 1):
            continue
        entry = data[index]
        name = f"{id_prefix}-{entry.get('id', index) if isinstance(entry, dict) else index}"
        specs = []
        for k, (question, answer) in enumerate(pairs):
            text = question if k == 0 else TURN_SEPARATOR + question
            out = max(len(encode_text(tokenizer, answer)), 1)
            ids = tuple(encode_text(tokenizer, text))
            specs.append(RequestSpec(f"{name}-t{k}", ids, text, out, group=name))
        thinks = (0.0, *(float(t) for t in think.sample(rng, len(specs) - 1)))
        sessions.append(Session(name, tuple(specs), thinks))
    if not sessions:
        raise ValueError(f"{path}: no conversation with {min_turns} or more answered human turns")
    log.info("%s: %d sessions of %d turns in all", path, len(sessions), sum(len(s.turns) for s in sessions))
    return sessions


def session_requests(sessions: Sequence[Session]) -> int:
    """How many requests the sessions send (one per turn)."""
    return sum(len(s.turns) for s in sessions)
