"""The prompts of every load point, made before the run or as a point goes, so that no point is answered
from a prefix cache another point filled and every backend gets the same prompts at the same point."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from compare.measure.order import block_budget
from compare.plan.run_options import RunPlan, WorkloadSpec
from workloads.schedule import Schedule

#: prompts per load point of a file dataset (sharegpt, jsonl, sharegpt-turns) when only a duration bounds it,
#: and of any dataset measured by Ray load generators (which cannot make prompts as they go): cycled, ids `~k`
DURATION_BOUND_PROMPTS = 256
#: sessions per chunk of a duration-bound multi-turn point (a session is several requests)
SESSION_CHUNK = 64
#: the most prompts made before a duration-bound open-loop point starts (`expected_sends`)
MAX_RESERVE = 20_000


class Prompts:
    """The requests of every point. Each load point (and block) gets prompts of its own (one backend's
    server would otherwise answer a later point from its prefix cache), and every backend gets the same
    prompts at the same point, in the same order.

    Every request gets a prompt of its own by default: a generated workload (random, fixed, prefix,
    multi-turn) is a `workloads.datasets.PromptStream` per point, seeded by the run's seed, the workload,
    the point and the block, and nothing else, so that the sequence is the same for every backend however
    many requests each gets through. A point of known size (--num-requests) makes its prompts before it
    starts; a duration-bound one makes them as it goes, chunk by chunk ahead of need (`Supply`, whose
    waits the manifest's point entry records). `--prompt-pool N` sends N prompts per point (and block),
    cycled. File datasets hold what the file holds (up to --num-requests, or DURATION_BOUND_PROMPTS),
    cycled beyond that."""

    def __init__(self, plan: RunPlan, tokenizer: Any, points: int) -> None:
        from workloads.datasets import make_dataset

        self.points = points  # the most a launch measures in a workload: each gets a slice of its own
        self.blocks = plan.blocks or 1
        # a running endpoint keeps its prefix cache between repeats and blocks: each has its own slice
        slices = self.points * plan.repeats * self.blocks
        allowed = _Allowed(tokenizer)
        self.workloads = []
        for i, w in enumerate(plan.workloads):
            if _generated(w):
                sizes = [plan.prompt_pool or block_budget(plan, s // self.points % self.blocks)[0]
                         for s in range(slices)]
                streams = [_stream(w, tokenizer, allowed, plan.seed + i, k, sizes[k]) for k in range(slices)]
                self.workloads.append((w, streams))
            else:
                n = plan.prompt_pool or plan.num_requests or DURATION_BOUND_PROMPTS
                self.workloads.append((w, _slices(make_dataset, w, tokenizer, n, slices, plan.seed + i)))
        warm_n = max(plan.warmup_count(s) for s in plan.load_points)
        warm_all = (
            make_dataset(
                "random",
                tokenizer,
                max(warm_n, 1) * slices,
                input_len=16,
                output_len=8,
                seed=plan.seed + 999,
                id_prefix="warmup",
            )
            if warm_n
            else []
        )
        self.warm = [warm_all[k * warm_n : (k + 1) * warm_n] for k in range(slices)]
        # one short request right after each launch is ready: the cold first token (its own prompts)
        self.cold = make_dataset(
            "random",
            tokenizer,
            plan.repeats,
            input_len=16,
            output_len=4,
            seed=plan.seed + 555,
            id_prefix="cold",
        )


def expected_sends(schedule: Schedule, duration: float | None) -> int:
    """How many prompts to make before a duration-bound point starts: an open loop's (or a trace's) sends
    within the duration, counted from its own seeded arrivals, with a margin of a few standard deviations
    of a Poisson count (nothing then is made while it runs); a closed loop's count depends on the server,
    and a burst (rate inf) has none, so only the first chunk (0). At most MAX_RESERVE: beyond, the rest is
    made as the point goes."""
    from workloads.schedule import OpenLoop, TraceReplay

    if duration is None or not isinstance(schedule, OpenLoop | TraceReplay):
        return 0
    if isinstance(schedule, OpenLoop) and not math.isfinite(schedule.rate):
        return 0
    count = 0
    for offset in schedule.iter_offsets():
        if offset >= duration or count >= MAX_RESERVE:
            break
        count += 1
    return min(count + 3 * math.isqrt(count) + 8, MAX_RESERVE)


class _Allowed:
    """The tokenizer's ordinary token ids (`workloads.datasets.ordinary_token_ids`, a pass over the
    vocabulary), found once for every stream of the run and only if one needs them."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: np.ndarray | None = None

    def __call__(self) -> np.ndarray:
        if self.ids is None:
            from workloads.datasets import ordinary_token_ids

            self.ids = ordinary_token_ids(self.tokenizer)
        return self.ids


def _generated(w: WorkloadSpec) -> bool:
    """Whether the workload's prompts are made here (as many as a point needs), not read from a file."""
    return w.dataset in ("random", "fixed", "prefix", "multi-turn")


def _stream(w: WorkloadSpec, tokenizer: Any, allowed: _Allowed, seed: int, k: int, n: int | None) -> Any:
    """The prompts of slice `k` (a point, launch and block) of a generated workload: `n` of them, or as many
    as its duration needs (None). Chunk c is seeded by (seed, k, c) alone. A shared-prefix workload keeps its
    groups' prefixes, drawn per slice, so that no point is served from the prefix cache another filled. Ids
    carry the slice (`random3-17`, `prefix3-g0-4`, `session3-2`), so that each is unique in the run."""
    from workloads.datasets import (
        STREAM_CHUNK,
        Draw,
        PromptStream,
        group_prefixes,
        prefix_dataset,
        random_dataset,
    )

    size = STREAM_CHUNK if n is None else min(STREAM_CHUNK, n)
    make: Callable[[int], list]
    if w.dataset in ("random", "fixed"):
        ins, outs = (w.input_len, w.output_len) if w.dataset == "random" else (512, 128)

        def make(c: int) -> list:
            return random_dataset(tokenizer, size, ins, outs, seed=[seed, k, c], id_prefix=f"{w.dataset}{k}",
                                  allowed=allowed(), first_index=c * size)

    elif w.dataset == "prefix":
        assert w.prefix_groups is not None and w.prefix_len is not None
        groups = w.prefix_groups
        per = -(-size // groups)
        size = per * groups  # whole groups per chunk (`n` cuts the last)
        prefixes = group_prefixes(tokenizer, groups, w.prefix_len, [seed, k], allowed())

        def make(c: int) -> list:
            return prefix_dataset(tokenizer, groups, per, prefixes, w.input_len, w.output_len,
                                  seed=Draw([seed, k, c], allowed(), first=c * per), id_prefix=f"prefix{k}")

    else:  # multi-turn: sessions
        from workloads.sessions import synthetic_sessions

        assert w.turns is not None
        size = SESSION_CHUNK if n is None else min(SESSION_CHUNK, n)

        def make(c: int) -> list:
            return synthetic_sessions(tokenizer, size, w.turns or 1, w.input_len, w.output_len,
                                      w.think_time or 0.0, seed=Draw([seed, k, c], allowed(), first=c * size),
                                      id_prefix=f"session{k}")

    return PromptStream(make, size, limit=n)


def _slices(make_dataset: Any, w: WorkloadSpec, tokenizer: Any, n: int, slices: int, seed: int) -> list[list]:
    """`slices` lists of `n` requests of a file dataset, one per load point, launch and block (a file
    shorter than that: its requests in each)."""
    specs = _dataset(make_dataset, w, tokenizer, n * slices, seed)
    return [specs[k * n : (k + 1) * n] or specs for k in range(slices)]


def _dataset(make_dataset: Any, w: WorkloadSpec, tokenizer: Any, n: int, seed: int) -> list:
    """`n` requests of a file dataset (sharegpt-turns: `n` sessions)."""
    if w.sessions:
        from workloads.sessions import sharegpt_sessions

        think = w.think_time or 0.0
        assert w.path is not None  # a file dataset (the plan requires its path)
        return sharegpt_sessions(w.path, tokenizer, n=n, turns=w.turns, think_time=think, seed=seed)
    if w.dataset == "sharegpt":
        return make_dataset("sharegpt", w.path, tokenizer, n=n, seed=seed)
    return make_dataset("jsonl", w.path, tokenizer, output_tokens=int(w.output_len))
