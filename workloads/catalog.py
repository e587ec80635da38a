"""The datasets a run can name, one declaration each: the only place that knows a dataset by its name.

A declaration is a `Dataset` subclass registered with `@register`. It says
- its `name` (`--dataset NAME`) and what it is, in a few words for `--dataset`'s help (`about`);
- the workload options it reads (`options`: what each means for it, its default there where it has one of its
  own, and its check), and whether it reads a file (`--dataset-path`: the `FromFile` datasets);
- whether its items are multi-turn `Session`s rather than single requests (`sessions`);
- its label in the manifest, summary.csv and the report (`label`, e.g. `random-512x128`);
- how a load point gets its requests. A `Generated` dataset makes as many as the point needs, chunk by chunk
  (a `PromptStream` whose chunk c is made by `chunks(...)(c)` from the seed (run, slice, c) alone), so that
  every request gets a prompt of its own and every backend the same sequence. A `FromFile` dataset holds what
  its file holds (`read`): a point cycles them.

compare/ plans, checks, labels and makes workloads from `DATASETS` alone (`dataset_named`); adding a dataset
is a declaration here and its test (docs/design.md, "Adding a dataset"). The way of making requests may be
the declaration's own, or the functions of `workloads/datasets.py` and `workloads/sessions.py` it calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from workloads import datasets
from workloads.datasets import (
    Draw,
    LengthDist,
    PromptStream,
    group_prefixes,
    jsonl_dataset,
    prefix_dataset,
    random_dataset,
    sharegpt_dataset,
)
from workloads.sessions import ThinkTime, sharegpt_sessions, synthetic_sessions

#: sessions per chunk of a duration-bound multi-turn point (a session is several requests)
SESSION_CHUNK = 64
#: the dataset of a workload that names none
DEFAULT_DATASET = "random"


class Workload(Protocol):
    """What a declaration reads of a planned workload (compare's `WorkloadSpec`): the values of the options
    (`--input-len` ...), as the plan checked and kept them; those a dataset does not read may be None."""

    @property
    def dataset(self) -> str: ...
    @property
    def input_len(self) -> str: ...
    @property
    def output_len(self) -> str: ...
    @property
    def path(self) -> str | None: ...
    @property
    def prefix_len(self) -> int | None: ...
    @property
    def prefix_groups(self) -> int | None: ...
    @property
    def turns(self) -> int | None: ...
    @property
    def think_time(self) -> str | None: ...


@dataclass(frozen=True)
class Option:
    """A workload option a dataset reads (a field of `Workload`): what it means for this dataset (for the
    option's help), its default here where it differs from the option's own, and a check of a value given
    (raising ValueError with the reason; None: the plan's reading of the option is check enough)."""

    means: str
    default: Any = None
    check: Callable[[Any], object] | None = None


def reads(**options: Option) -> Mapping[str, Option]:
    """The options a dataset reads, by name: `reads(input_len=length("prompt tokens"), ...)`."""
    return MappingProxyType(options)


def length(means: str) -> Option:
    """A length option (`--input-len`, `--output-len`): N or a distribution (`LengthDist`)."""
    return Option(means, check=LengthDist.parse)


def think(means: str = "seconds from an answer to the next turn") -> Option:
    """`--think-time`: S, or a distribution of seconds (`ThinkTime`)."""
    return Option(means, check=ThinkTime.parse)


class Dataset(ABC):
    """One dataset: see the module's docstring. Subclass `Generated` or `FromFile`, not this."""

    name: ClassVar[str]
    about: ClassVar[str]
    options: ClassVar[Mapping[str, Option]] = MappingProxyType({})
    sessions: ClassVar[bool] = False  # items are `Session`s (multi-turn), sent in a closed loop only
    needs_path: ClassVar[bool] = False  # reads --dataset-path

    def label(self, w: Workload) -> str:
        """The workload's name in the manifest, summary.csv and the report (when it is not given one)."""
        return self.name

    def check(self, key: str, value: Any) -> None:
        """Raise ValueError, with the reason, if `value` is not one the dataset can take for option `key`
        (one of `options`)."""
        check = self.options[key].check
        if check is not None:
            check(value)


class Generated(Dataset):
    """A dataset whose requests are made, as many as a point needs: a `PromptStream` per point slice."""

    #: the first part of its request ids; the slice's number follows (`random3-17`, `session3-2`)
    id_stem: ClassVar[str] = ""

    def chunk_size(self, w: Workload, n: int | None) -> int:
        """Items per chunk of a stream of `n` items (None: bounded by the point's duration alone)."""
        return datasets.STREAM_CHUNK if n is None else min(datasets.STREAM_CHUNK, n)

    @abstractmethod
    def chunks(
        self,
        w: Workload,
        tokenizer: Any,
        seed: Sequence[int],
        size: int,
        allowed: Callable[[], np.ndarray],
        id_prefix: str,
    ) -> Callable[[int], list]:
        """The maker of chunk c of a stream: `size` items, numbered from c * size, made from the seed
        `(*seed, c)` alone. `allowed()` gives the tokenizer's ordinary token ids (found once per run)."""

    def stream(
        self, w: Workload, tokenizer: Any, seed: int, k: int, n: int | None, allowed: Callable[[], np.ndarray]
    ) -> PromptStream:
        """Slice `k` (a point, launch and block) of a run seeded `seed`: `n` items, or as many as its
        duration needs (None). Chunk c is seeded by (seed, k, c) alone; ids carry k, so that each is unique
        in the run."""
        size = self.chunk_size(w, n)
        make = self.chunks(w, tokenizer, [seed, k], size, allowed, f"{self.id_stem or self.name}{k}")
        return PromptStream(make, size, limit=n)


class FromFile(Dataset):
    """A dataset read from a file (`--dataset-path`): a point holds what the file holds, cycled."""

    needs_path = True

    def label(self, w: Workload) -> str:
        return f"{self.name}-{Path(w.path).stem}" if w.path else self.name

    @abstractmethod
    def read(self, w: Workload, tokenizer: Any, n: int, seed: int) -> list:
        """Up to `n` requests (sessions) of the file, chosen with `seed` where the file holds more."""


#: every dataset, by name, in the order of `--dataset`'s help: of the two kinds, so that a type check knows
#: what is not `Generated` is `FromFile`
DATASETS: dict[str, Generated | FromFile] = {}
D = TypeVar("D", bound=type[Generated | FromFile])


def register(cls: D) -> D:
    """Class decorator: the dataset in `DATASETS`, under its name."""
    if cls.name in DATASETS:
        raise ValueError(f"dataset {cls.name!r} is declared twice")
    DATASETS[cls.name] = cls()
    return cls


def dataset_named(name: str) -> Generated | FromFile:
    """The declaration of dataset `name`, or a ValueError naming the known ones."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}") from None


# -- the datasets -----------------------------------------------------------------------------------------


@register
class Random(Generated):
    name = "random"
    about = "random token-exact prompts"
    options = reads(input_len=length("prompt tokens"), output_len=length("output tokens"))

    def label(self, w: Workload) -> str:
        return f"random-{w.input_len}x{w.output_len}"

    def lengths(self, w: Workload) -> tuple[str | int, str | int]:
        return w.input_len, w.output_len

    def chunks(
        self,
        w: Workload,
        tokenizer: Any,
        seed: Sequence[int],
        size: int,
        allowed: Callable[[], np.ndarray],
        id_prefix: str,
    ) -> Callable[[int], list]:
        ins, outs = self.lengths(w)

        def make(c: int) -> list:
            return random_dataset(
                tokenizer,
                size,
                ins,
                outs,
                seed=[*seed, c],
                id_prefix=id_prefix,
                allowed=allowed(),
                first_index=c * size,
            )

        return make


@register
class Fixed(Random):
    name = "fixed"
    about = "the seed scenario: random prompts of 512 tokens, 128 out"
    options = reads()

    def label(self, w: Workload) -> str:
        return self.name

    def lengths(self, w: Workload) -> tuple[str | int, str | int]:
        return 512, 128


@register
class ShareGPT(FromFile):
    name = "sharegpt"
    about = "a ShareGPT file's first questions, each wanting its answer's length"

    def read(self, w: Workload, tokenizer: Any, n: int, seed: int) -> list:
        assert w.path is not None
        return sharegpt_dataset(w.path, tokenizer, n=n, seed=seed)


def _whole_length(value: str) -> None:
    if not str(value).strip().isdigit():
        raise ValueError(f"the default output length of jsonl lines is a whole number N, got {value!r}")
    LengthDist.parse(value)


@register
class JsonLines(FromFile):
    name = "jsonl"
    about = 'a prompts file, one {"prompt": ..., "output_tokens": ...} per line'
    options = reads(output_len=Option("N for the lines without their own", check=_whole_length))

    def read(self, w: Workload, tokenizer: Any, n: int, seed: int) -> list:
        assert w.path is not None
        return jsonl_dataset(w.path, tokenizer, output_tokens=int(w.output_len))


@register
class SharedPrefix(Generated):
    name = "prefix"
    about = "groups of prompts sharing a prefix: --prefix-len, --prefix-groups"
    options = reads(
        input_len=length("tokens after the shared prefix"),
        output_len=length("output tokens"),
        prefix_len=Option("tokens the requests of a group share"),
        prefix_groups=Option("groups, each with a prefix of its own"),
    )

    def label(self, w: Workload) -> str:
        return f"prefix-{w.prefix_groups}x{w.prefix_len}+{w.input_len}x{w.output_len}"

    def chunk_size(self, w: Workload, n: int | None) -> int:
        """Whole groups per chunk (`n` cuts the last)."""
        groups = self._groups(w)
        return -(-super().chunk_size(w, n) // groups) * groups

    def chunks(
        self,
        w: Workload,
        tokenizer: Any,
        seed: Sequence[int],
        size: int,
        allowed: Callable[[], np.ndarray],
        id_prefix: str,
    ) -> Callable[[int], list]:
        """The groups keep their prefixes, drawn once per slice (`seed`), from one chunk to the next, so that
        no point is served from the prefix cache another filled."""
        groups = self._groups(w)
        per = size // groups
        assert w.prefix_len is not None
        prefixes = group_prefixes(tokenizer, groups, w.prefix_len, list(seed), allowed())

        def make(c: int) -> list:
            return prefix_dataset(
                tokenizer,
                groups,
                per,
                prefixes,
                w.input_len,
                w.output_len,
                seed=Draw([*seed, c], allowed(), first=c * per),
                id_prefix=id_prefix,
            )

        return make

    @staticmethod
    def _groups(w: Workload) -> int:
        assert w.prefix_groups is not None
        return w.prefix_groups


@register
class MultiTurn(Generated):
    name = "multi-turn"
    about = "sessions of --turns random user turns of --input-len, answers of --output-len"
    sessions = True
    id_stem = "session"
    options = reads(
        input_len=length("tokens of each user turn"),
        output_len=length("output tokens of each answer"),
        turns=Option("user turns per session", default=3),
        think_time=think(),
    )

    def label(self, w: Workload) -> str:
        return f"multi-turn-{w.turns}x{w.input_len}x{w.output_len}"

    def chunk_size(self, w: Workload, n: int | None) -> int:
        return SESSION_CHUNK if n is None else min(SESSION_CHUNK, n)

    def chunks(
        self,
        w: Workload,
        tokenizer: Any,
        seed: Sequence[int],
        size: int,
        allowed: Callable[[], np.ndarray],
        id_prefix: str,
    ) -> Callable[[int], list]:
        def make(c: int) -> list:
            return synthetic_sessions(
                tokenizer,
                size,
                w.turns or 1,
                w.input_len,
                w.output_len,
                w.think_time or 0.0,
                seed=Draw([*seed, c], allowed(), first=c * size),
                id_prefix=id_prefix,
            )

        return make


@register
class ShareGPTTurns(FromFile):
    name = "sharegpt-turns"
    about = "a ShareGPT file's conversations, turn by turn"
    sessions = True
    options = reads(
        turns=Option("at most this many turns of each conversation [default: all]"),
        think_time=think(),
    )

    def read(self, w: Workload, tokenizer: Any, n: int, seed: int) -> list:
        assert w.path is not None
        return sharegpt_sessions(
            w.path, tokenizer, n=n, turns=w.turns, think_time=w.think_time or 0.0, seed=seed
        )
