"""The prompts of every load point, made before the run or as a point goes, so that no point is answered
from a prefix cache another point filled and every backend gets the same prompts at the same point."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from compare.measure.order import block_budget
from compare.plan.run_options import RunPlan, WorkloadSpec
from workloads.schedule import Schedule

#: prompts per load point of a file dataset (`workloads.catalog.FromFile`) when only a duration bounds it, and
#: of any dataset measured by Ray load generators (which cannot make prompts as they go): cycled, ids `~k`
DURATION_BOUND_PROMPTS = 256
#: the most prompts made before a duration-bound open-loop point starts (`expected_sends`)
MAX_RESERVE = 20_000


class Prompts:
    """The requests of every point. Each load point (and block) gets prompts of its own (one backend's
    server would otherwise answer a later point from its prefix cache), and every backend gets the same
    prompts at the same point, in the same order.

    Every request gets a prompt of its own by default: a generated workload (`workloads.catalog.Generated`)
    is a `workloads.datasets.PromptStream` per point, seeded by the run's seed, the workload, the point and
    the block, and nothing else, so that the sequence is the same for every backend however many requests
    each gets through. A point of known size (--num-requests) makes its prompts before it starts; a
    duration-bound one makes them as it goes, chunk by chunk ahead of need (`Supply`, whose waits the
    manifest's point entry records). `--prompt-pool N` sends N prompts per point (and block), cycled. File
    datasets (`workloads.catalog.FromFile`) hold what the file holds (up to --num-requests, or
    DURATION_BOUND_PROMPTS), cycled beyond that."""

    def __init__(self, plan: RunPlan, tokenizer: Any, points: int) -> None:
        from workloads.catalog import Generated, dataset_named
        from workloads.datasets import random_dataset

        self.points = points  # the most a launch measures in a workload: each gets a slice of its own
        self.blocks = plan.blocks or 1
        # a running endpoint keeps its prefix cache between repeats and blocks: each has its own slice
        slices = self.points * plan.repeats * self.blocks
        allowed = _Allowed(tokenizer)
        self.workloads: list[tuple[WorkloadSpec, list[Any]]] = []  # per slice: a stream, or a list
        for i, w in enumerate(plan.workloads):
            dataset = dataset_named(w.dataset)
            if isinstance(dataset, Generated):  # as many as a point needs: a stream per slice
                sizes = [
                    plan.prompt_pool or block_budget(plan, s // self.points % self.blocks)[0]
                    for s in range(slices)
                ]
                streams = [
                    dataset.stream(w, tokenizer, plan.seed + i, k, sizes[k], allowed) for k in range(slices)
                ]
                self.workloads.append((w, streams))
            else:  # what its file holds: a list per slice
                n = plan.prompt_pool or plan.num_requests or DURATION_BOUND_PROMPTS
                specs = dataset.read(w, tokenizer, n * slices, plan.seed + i)
                self.workloads.append((w, [specs[k * n : (k + 1) * n] or specs for k in range(slices)]))
        warm_n = max(plan.warmup_count(s) for s in plan.load_points)
        warm_all = (
            random_dataset(
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
        self.cold = random_dataset(
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
