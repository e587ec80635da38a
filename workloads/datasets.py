"""Datasets of token-exact requests: each `RequestSpec` holds the prompt as token ids and as text, and the
output length wanted. What a run may name, with its options and label, is declared in `workloads/catalog.py`,
which calls these functions.

- `random`: random tokens, input and output lengths fixed or drawn (uniform, normal, lognormal), seeded.
  The text of the ids is re-encoded and the ids adjusted until the target tokenizer gives back exactly the
  wanted count, so the prompt has that many tokens whichever form is sent.
- `fixed`: the seed scenario, 512 tokens in, 128 out.
- `sharegpt`: a local ShareGPT JSON file (first human turn as prompt, the answer's length as output).
- `jsonl`: a prompts file, one `{"prompt": ..., "output_tokens": ...}` per line (output optional).
- `prefix`: groups of requests sharing one prefix (token-exact, kept intact at the join), to exercise
  prefix caching.

Lengths are given as `LengthDist` or a string: `"512"`, `"fixed:512"`, `"uniform:LOW:HIGH"`,
`"normal:MEAN:STD"`, `"lognormal:MEDIAN:SIGMA"` (draws are rounded and kept >= 1).
The tokenizer is any Hugging Face tokenizer (`encode(text, add_special_tokens=False)`, `decode(ids)`).
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import numpy as np

from adapters.request_spec import RequestSpec

log = logging.getLogger(__name__)
T = TypeVar("T")


LENGTH_FORMS = "N, fixed:N, uniform:LOW:HIGH, normal:MEAN:STD or lognormal:MEDIAN:SIGMA"


def parse_distribution(value: str | float, arity: dict[str, int], what: str, forms: str) -> tuple[Any, ...]:
    """(kind, *numbers) of a distribution written `N` (fixed) or `KIND:A[:B]`, `arity` giving each kind's
    count of numbers; the error names `what` and the accepted `forms`."""
    parts = str(value).strip().split(":")
    try:
        if len(parts) == 1:
            return ("fixed", float(parts[0]))
        kind, numbers = parts[0], [float(p) for p in parts[1:]]
    except ValueError:
        raise ValueError(f"cannot read {what} {value!r}: use {forms}") from None
    if kind not in arity or len(numbers) != arity[kind]:
        raise ValueError(f"cannot read {what} {value!r}: use {forms}")
    return (kind, *numbers)


@dataclass(frozen=True)
class LengthDist:
    kind: Literal["fixed", "uniform", "normal", "lognormal"]
    a: float
    b: float = 0.0

    @classmethod
    def parse(cls, value: LengthDist | str | int) -> LengthDist:
        if isinstance(value, LengthDist):
            return value
        arity = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}
        return cls(*parse_distribution(value, arity, "length", LENGTH_FORMS))

    def __post_init__(self) -> None:
        if self.kind in ("fixed", "uniform", "normal", "lognormal") and self.a < 1 and self.kind != "normal":
            raise ValueError(f"{self.kind} length needs a first value >= 1, got {self.a}")
        if self.kind == "uniform" and self.b < self.a:
            raise ValueError(f"uniform length needs LOW <= HIGH, got {self.a}:{self.b}")
        if self.kind in ("normal", "lognormal") and self.b < 0:
            raise ValueError(f"{self.kind} length needs a spread >= 0, got {self.b}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            values = np.full(n, self.a)
        elif self.kind == "uniform":
            values = rng.integers(int(self.a), int(self.b), size=n, endpoint=True)
        elif self.kind == "normal":
            values = rng.normal(self.a, self.b, size=n)
        else:
            values = np.exp(rng.normal(np.log(self.a), self.b, size=n))
        return np.maximum(np.rint(values), 1).astype(int)


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return _decode_batch(tokenizer, [list(ids)])[0]


def _encode(tokenizer: Any, text: str) -> list[int]:
    return _encode_batch(tokenizer, [text])[0]


def _backend(tokenizer: Any) -> Any:
    """A fast Hugging Face tokenizer's own `tokenizers.Tokenizer`, when calling it directly gives what the
    wrapper gives (no truncation or padding set): its batch calls skip the wrapper's per-token Python (a
    fifth of a prompt's making) and release the GIL, which matters when prompts are made while a point
    runs (`Supply`)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return None
    return backend


def _decode_batch(tokenizer: Any, batch: list[list[int]]) -> list[str]:
    if not batch:
        return []
    if (backend := _backend(tokenizer)) is not None:
        return backend.decode_batch(batch, skip_special_tokens=False)
    if hasattr(tokenizer, "batch_decode"):
        return tokenizer.batch_decode(batch, clean_up_tokenization_spaces=False)
    return tokenizer.decode_batch(batch)  # a `tokenizers.Tokenizer`


def _encode_batch(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    if (backend := _backend(tokenizer)) is not None:
        return [list(e.ids) for e in backend.encode_batch(texts, add_special_tokens=False)]
    if hasattr(tokenizer, "encode_batch"):  # a `tokenizers.Tokenizer`
        return [list(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


encode_text = _encode  # a public name for the other dataset modules (workloads/sessions.py)


def ordinary_token_ids(tokenizer: Any) -> np.ndarray:
    """Token ids to draw random prompts from: not special (BOS, EOS, pad, ...), and decoding on their own to
    whole characters (byte-level vocabularies also hold lone UTF-8 bytes, whose random sequences are not
    text)."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.get_vocab_size()
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    keep = []
    for i in range(size):
        if i in special:
            continue
        piece = _decode(tokenizer, [i])
        if piece and "\ufffd" not in piece:
            keep.append(i)
    if not keep:
        raise ValueError("the tokenizer has no ordinary tokens to draw prompts from")
    return np.array(keep, dtype=np.int64)


def token_exact_prompt(
    tokenizer: Any, n: int, rng: np.random.Generator, allowed: np.ndarray | None = None, attempts: int = 50
) -> tuple[list[int], str]:
    """A random prompt of exactly `n` tokens: returns `(ids, text)` with `encode(text) == ids` and
    `decode(ids) == text` (`token_exact_prompts` for one)."""
    return token_exact_prompts(tokenizer, [n], rng, allowed, attempts)[0]


def token_exact_prompts(
    tokenizer: Any,
    lengths: Sequence[int],
    rng: np.random.Generator,
    allowed: np.ndarray | None = None,
    attempts: int = 50,
) -> list[tuple[list[int], str]]:
    """Random prompts of exactly `lengths[i]` tokens each, as `(ids, text)` with `encode(text) == ids` and
    `decode(ids) == text`.

    Random ids are decoded and re-encoded (merges change the count); a re-encoding that is too long is cut
    back to a whole character and topped up with new random ids, until the count holds. Every prompt still
    unsettled is decoded and encoded in one batch per round: a fast tokenizer spreads a batch over its
    threads, and a duration-bound point needs thousands of prompts (one at a time: 7 ms each for 512 tokens
    on a 2-core machine)."""
    if any(n < 1 for n in lengths):
        raise ValueError(f"a prompt needs at least one token, got {min(lengths)}")
    pool = ordinary_token_ids(tokenizer) if allowed is None else allowed
    done: list[tuple[list[int], str] | None] = [None] * len(lengths)
    pending = {i: rng.choice(pool, n).tolist() for i, n in enumerate(lengths)}
    for _ in range(attempts):
        if not pending:
            break
        order = list(pending)
        backs = dict(
            zip(
                order, _encode_batch(tokenizer, _decode_batch(tokenizer, list(pending.values()))), strict=True
            )
        )
        exact = [i for i in order if len(backs[i]) == lengths[i]]
        agains = _decode_batch(tokenizer, [backs[i] for i in exact])
        for i, again, back in zip(exact, agains, _encode_batch(tokenizer, agains), strict=True):
            if back == backs[i]:
                done[i] = (back, again)
        for i, back in backs.items():
            if done[i] is not None:
                del pending[i]
                continue
            n = lengths[i]
            if len(back) > n:
                keep = n
                while keep > 0 and "\ufffd" in _decode(tokenizer, back[:keep]):
                    keep -= 1  # do not cut a character's bytes apart
                back = back[:keep]
            pending[i] = back + rng.choice(pool, n - len(back)).tolist()
    if pending:
        raise ValueError(
            f"could not find a {lengths[min(pending)]}-token prompt that survives decode/encode "
            f"in {attempts} tries"
        )
    found = [pair for pair in done if pair is not None]
    assert len(found) == len(done), "a prompt left the pending set without being found"
    return found


def random_dataset(
    tokenizer: Any,
    n: int,
    input_len: LengthDist | str | int,
    output_len: LengthDist | str | int,
    seed: int | Sequence[int] = 0,
    id_prefix: str = "random",
    allowed: np.ndarray | None = None,
    first_index: int = 0,
) -> list[RequestSpec]:
    """`n` random token-exact prompts with drawn input and output lengths, numbered from `first_index`
    (`allowed`: `ordinary_token_ids(tokenizer)` when already known; it takes a pass over the vocabulary)."""
    rng = np.random.default_rng(seed)
    ins = LengthDist.parse(input_len).sample(rng, n)
    outs = LengthDist.parse(output_len).sample(rng, n)
    pool = ordinary_token_ids(tokenizer) if allowed is None else allowed
    prompts = token_exact_prompts(tokenizer, [int(k) for k in ins], rng, pool)
    return [
        RequestSpec(f"{id_prefix}-{first_index + i}", tuple(ids), text, int(outs[i]))
        for i, (ids, text) in enumerate(prompts)
    ]


def fixed_dataset(tokenizer: Any, n: int, seed: int = 0, id_prefix: str = "fixed") -> list[RequestSpec]:
    """The seed scenario: 512 tokens in, 128 out."""
    return random_dataset(tokenizer, n, 512, 128, seed, id_prefix)


@dataclass(frozen=True)
class PairLimits:
    """Which ShareGPT prompt/answer pairs are kept, in tokens: both at least `min_tokens`, neither over its
    maximum (None: no maximum)."""

    min_tokens: int = 4
    max_input: int | None = None
    max_output: int | None = None

    def keep(self, prompt_tokens: int, output_tokens: int) -> bool:
        return (
            prompt_tokens >= self.min_tokens
            and output_tokens >= self.min_tokens
            and not (self.max_input and prompt_tokens > self.max_input)
            and not (self.max_output and output_tokens > self.max_output)
        )


def sharegpt_dataset(
    path: str | Path,
    tokenizer: Any,
    n: int | None = None,
    seed: int = 0,
    output_len: LengthDist | str | int | None = None,
    limits: PairLimits | None = None,
    id_prefix: str = "sharegpt",
) -> list[RequestSpec]:
    """Conversations from a local ShareGPT file: the first human turn is the prompt; the wanted output
    length is the token count of the answer (or drawn from `output_len`). Pairs outside the `limits` are
    left out, the rest shuffled with `seed` and the first `n` kept."""
    limits = limits or PairLimits()
    path = Path(path)
    data = read_sharegpt(path)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(data))
    drawn = LengthDist.parse(output_len) if output_len is not None else None
    specs: list[RequestSpec] = []
    skipped = 0
    for index in order:
        if n is not None and len(specs) >= n:
            break
        pair = _first_exchange(data[index])
        if pair is None:
            skipped += 1
            continue
        prompt_ids = _encode(tokenizer, pair[0])
        out = int(drawn.sample(rng, 1)[0]) if drawn else len(_encode(tokenizer, pair[1]))
        if not limits.keep(len(prompt_ids), out):
            skipped += 1
            continue
        entry = data[index]
        name = entry.get("id", index) if isinstance(entry, dict) else index
        specs.append(RequestSpec(f"{id_prefix}-{name}", tuple(prompt_ids), pair[0], out))
    if skipped:
        log.info(
            "%s: %d conversations left out (no human/answer pair, or outside the length limits)",
            path,
            skipped,
        )
    if not specs:
        raise ValueError(f"{path}: no usable conversation (human turn then answer, within the length limits)")
    return specs


def read_sharegpt(path: Path) -> list:
    """The conversations of a ShareGPT JSON file (a list), with clear errors for a missing or wrong file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"ShareGPT file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ValueError(f"{path}: a ShareGPT file is a JSON list of conversations")
    return data


def sharegpt_exchanges(entry: Any) -> list[tuple[str, str]]:
    """A ShareGPT conversation's (human turn, answer) pairs in order: each human turn directly followed by an
    answer (a human turn without one, or a malformed entry, is skipped)."""
    if not isinstance(entry, dict):
        return []
    turns = entry.get("conversations") or entry.get("conversation")
    if not isinstance(turns, list):
        return []
    return [
        (first["value"], second["value"])
        for first, second in pairwise(turns)
        if isinstance(first, dict)
        and isinstance(second, dict)
        and first.get("from") in ("human", "user")
        and second.get("from") in ("gpt", "assistant", "chatgpt")
        and isinstance(first.get("value"), str)
        and isinstance(second.get("value"), str)
    ]


def _first_exchange(entry: Any) -> tuple[str, str] | None:
    pairs = sharegpt_exchanges(entry)
    return pairs[0] if pairs else None


def read_json_lines(path: Path, error: type[ValueError] = ValueError) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for every non-blank line of a JSON-lines file; a line that is not JSON
    raises `error` naming the file and line."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{number}: not a JSON line: {exc}") from exc


def jsonl_dataset(
    path: str | Path, tokenizer: Any, output_tokens: int | None = None, id_prefix: str = "jsonl"
) -> list[RequestSpec]:
    """A prompts file: one JSON object per line with `prompt` and optionally `output_tokens` (or
    `max_tokens`) and `id`. Lines without an output length take `output_tokens`."""
    path = Path(path)
    specs = []
    for number, obj in read_json_lines(path):
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise ValueError(f'{path}:{number}: each line needs a non-empty string "prompt"')
        out = obj.get("output_tokens", obj.get("max_tokens", output_tokens))
        if not isinstance(out, int) or isinstance(out, bool) or out < 1:
            raise ValueError(
                f'{path}:{number}: no usable output length (give "output_tokens" >= 1 on the '
                f"line, or a default)"
            )
        ids = _encode(tokenizer, obj["prompt"])
        specs.append(RequestSpec(f"{id_prefix}-{obj.get('id', number)}", tuple(ids), obj["prompt"], out))
    if not specs:
        raise ValueError(f"{path}: no prompts")
    return specs


JOIN_ATTEMPTS = 100  # fresh suffixes tried per request before a prefix is given up on


@dataclass(frozen=True)
class Draw:
    """Where one chunk of a stream of generated requests comes from: its seed, the token ids prompts may use
    (None: the tokenizer's ordinary ones, which takes a pass over the vocabulary) and the number of its first
    item in the stream (so that ids run on across chunks)."""

    seed: int | Sequence[int] = 0
    allowed: np.ndarray | None = None
    first: int = 0

    @staticmethod
    def of(seed: int | Sequence[int] | Draw) -> Draw:
        return seed if isinstance(seed, Draw) else Draw(seed)


def prefix_dataset(
    tokenizer: Any,
    n_groups: int,
    per_group: int,
    prefix_len: int | Sequence[Sequence[int]],
    suffix_len: LengthDist | str | int,
    output_len: LengthDist | str | int,
    seed: int | Sequence[int] | Draw = 0,
    id_prefix: str = "prefix",
) -> list[RequestSpec]:
    """`n_groups` x `per_group` requests; those of one group share their first `prefix_len` tokens
    exactly (the join with each suffix is checked not to merge tokens), interleaved group by group.
    `prefix_len` may instead be the groups' prefixes (from `group_prefixes`), drawn elsewhere so that later
    requests of the same groups (members numbered from the `Draw`'s first) can be made apart from the
    first."""
    if n_groups < 1 or per_group < 1:
        raise ValueError("n_groups and per_group must be >= 1")
    draw = Draw.of(seed)
    rng = np.random.default_rng(draw.seed)
    allowed = ordinary_token_ids(tokenizer) if draw.allowed is None else draw.allowed
    prefixes = None if isinstance(prefix_len, int) else prefix_len
    first_member = draw.first
    suffixes = LengthDist.parse(suffix_len).sample(rng, n_groups * per_group)
    outs = LengthDist.parse(output_len).sample(rng, n_groups * per_group)
    groups = []
    for g in range(n_groups):
        if prefixes is None:
            assert isinstance(prefix_len, int)
            prefix_ids, _ = token_exact_prompt(tokenizer, prefix_len, rng, allowed)
        else:
            prefix_ids = list(prefixes[g])
        members = []
        for j in range(first_member, first_member + per_group):
            k = g * per_group + j - first_member
            for _ in range(JOIN_ATTEMPTS):
                suffix_ids, _ = token_exact_prompt(tokenizer, int(suffixes[k]), rng, allowed)
                text = _decode(tokenizer, prefix_ids + suffix_ids)
                ids = _encode(tokenizer, text)
                if ids == prefix_ids + suffix_ids:  # the join did not merge or split tokens
                    break
            else:
                raise ValueError(
                    f"could not join a suffix to group {g}'s prefix without merging tokens "
                    f"in {JOIN_ATTEMPTS} tries"
                )
            members.append(
                RequestSpec(f"{id_prefix}-g{g}-{j}", tuple(ids), text, int(outs[k]), group=f"g{g}")
            )
        groups.append(members)
    return [members[j] for j in range(per_group) for members in groups]


def group_prefixes(
    tokenizer: Any,
    n_groups: int,
    prefix_len: int,
    seed: int | Sequence[int],
    allowed: np.ndarray | None = None,
) -> list[list[int]]:
    """`n_groups` random token-exact prefixes of `prefix_len` tokens, for `prefix_dataset` in place of a
    length."""
    rng = np.random.default_rng(seed)
    allowed = ordinary_token_ids(tokenizer) if allowed is None else allowed
    return [ids for ids, _ in token_exact_prompts(tokenizer, [prefix_len] * n_groups, rng, allowed)]


#: requests per chunk of a `PromptStream` made for a duration-bound point. Measured on a busy 2-core machine
#: with a 49k-token vocabulary, token-exact random prompts take 3.5 ms each at 128 tokens and 18 ms at 512
#: (most of it the tokenizer's batch encode), so a chunk is 1-5 s of work there and far less on a many-core
#: GPU host
STREAM_CHUNK = 256


class PromptStream(Generic[T]):
    """A lazily extended, deterministic sequence of requests (or sessions): chunk k is `make_chunk(k)`, a
    list of `chunk_size`, made from a seed of its own (the caller's `make_chunk` derives it from k), so item
    i is the same whoever reads it, whenever, and however far the sequence was read before: every backend
    gets the same prompts in the same order at a point, however many it gets through. Items are not kept
    (a long point needs more than memory should hold); reading a chunk twice makes it twice.

    `first(n)` makes the first n items at once (a point whose count is known); `supply()` hands them out
    one by one for a point bounded only by its duration (`Supply`), the first `reserve` made before the
    point starts. `supplied` holds each finished supply's `stats()`, for the run directory."""

    def __init__(
        self,
        make_chunk: Callable[[int], Sequence[T]],
        chunk_size: int = STREAM_CHUNK,
        limit: int | None = None,
        reserve: int = 0,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.make_chunk, self.chunk_size, self.limit, self.reserve = make_chunk, chunk_size, limit, reserve
        self.supplied: list[dict[str, Any]] = []
        self._head: list[T] | None = None  # chunk 0 as last made, until a supply takes it

    def with_reserve(self, reserve: int) -> PromptStream[T]:
        """The same sequence, `reserve` items of it made before a supply hands out the first."""
        return PromptStream(self.make_chunk, self.chunk_size, self.limit, reserve)

    def chunk(self, k: int) -> list[T]:
        if k == 0 and self._head is not None:
            return list(self._head)
        items = list(self.make_chunk(k))
        if len(items) != self.chunk_size:
            raise ValueError(f"chunk {k} has {len(items)} items, not {self.chunk_size}")
        if k == 0:
            self._head = items
        return items

    def first(self, n: int) -> list[T]:
        """The first `n` items (at most `limit`)."""
        n = n if self.limit is None else min(n, self.limit)
        out: list[T] = []
        k = 0
        while len(out) < n:
            out += self.chunk(k)[: n - len(out)]
            k += 1
        return out

    def supply(self, prepare: Callable[[T], Any] | None = None, ahead: int = 1) -> Supply:
        """The items one by one, each through `prepare` (e.g. building its HTTP request): see `Supply`."""
        return Supply(self, prepare or (lambda item: item), ahead)


class Supply(Iterator[Any]):
    """A `PromptStream`'s items, prepared chunk by chunk: the stream's `reserve` (at least one chunk) now,
    before anything is sent, and from then on, whenever fewer than `ahead` chunks are left ready, the next
    one in a background thread (`ahead` 1: the next chunk is begun when the last one ready is begun, so
    that no chunk is made long before it is needed, competing for the CPU for nothing).

    Why not all first: a closed loop bounded by its duration has no bound on its request count but the
    server's speed (hundreds of requests a second on a GPU), and a worst case made in advance would cost
    more time and memory than the point itself. Where the count is known ahead (an open loop's arrivals
    within the duration), the caller makes it the reserve, and nothing is made while the point runs unless
    the estimate falls short. While the point runs, the thread competes with the load generator for the
    CPU (its tokenizer calls release the GIL); a chunk not ready when its first item is needed is waited
    for, and counted (`stats`: waits, seconds waited), so a run directory says whether generation ever
    held a send back."""

    def __init__(self, stream: PromptStream, prepare: Callable[[Any], Any], ahead: int) -> None:
        self.stream, self.prepare, self.ahead = stream, prepare, max(ahead, 1)
        self.handed = self.waits = 0
        self.wait_s = 0.0
        self._made = 0
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prompt-supply")
        self._current: collections.deque = collections.deque()
        self._pending: collections.deque[Future] = collections.deque()
        self._next = 0
        reserve = max(stream.reserve, 1)
        if stream.limit is not None:
            reserve = min(reserve, stream.limit)
        while len(self._current) < reserve and self._more():
            self._current.extend(self._make(self._next))
            self._next += 1
        stream._head = None  # not kept for the whole run: a later reader makes it again
        self._top_up()

    def _more(self) -> bool:
        limit = self.stream.limit
        return limit is None or self._next * self.stream.chunk_size < limit

    def _make(self, k: int) -> list:
        self._made += 1
        return [self.prepare(item) for item in self.stream.chunk(k)]

    def _top_up(self) -> None:
        """Start the next chunks while fewer than `ahead` chunks are ready or under way, once the reserve
        (what the point was expected to need) is handed out."""
        if self.handed < self.stream.reserve:
            return
        size = self.stream.chunk_size
        while len(self._current) + len(self._pending) * size < self.ahead * size and self._more():
            self._pending.append(self._pool.submit(self._make, self._next))
            self._next += 1

    def __next__(self) -> Any:
        limit = self.stream.limit
        if limit is not None and self.handed >= limit:
            self.close()
            raise StopIteration
        if not self._current:
            if not self._pending:
                self.close()
                raise StopIteration
            future = self._pending.popleft()
            if not future.done():
                self.waits += 1
                start = time.perf_counter()
                wait([future])
                self.wait_s += time.perf_counter() - start
            self._current = collections.deque(future.result())
        self.handed += 1
        item = self._current.popleft()
        self._top_up()
        return item

    def stats(self) -> dict[str, Any]:
        """What it handed out (a closed loop's workers each take one they do not send when the duration is
        over) and whether generation kept up: JSON-ready."""
        return {
            "handed": self.handed,
            "chunk": self.stream.chunk_size,
            "reserve": self.stream.reserve,
            "chunks_made": self._made,
            "waits": self.waits,
            "wait_s": round(self.wait_s, 6),
        }

    def close(self) -> None:
        """Stop making chunks, waiting for one under way (at the end of a point, so that it does not compete
        with the next); record the stats once."""
        if self._closed:
            return
        self._closed = True
        for future in self._pending:
            future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.stream.supplied.append(self.stats())
