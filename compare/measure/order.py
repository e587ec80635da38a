"""The order of launches and blocks, and a block's share of a point: what drifts with time on the machine
(other load, caches, clocks) falls on every backend alike instead of on whoever always runs second."""

from __future__ import annotations

from typing import Any

from compare.plan.run_options import RunPlan


def launch_order(backends: list, repeats: int) -> list[tuple[int, Any]]:
    """Each backend `repeats` times, every other round in reverse (A B, B A, A B, ...), so that what drifts
    with time on the machine (other load, caches, clocks) does not favour whoever always runs second."""
    return [(r, b) for r in range(repeats) for b in (backends if r % 2 == 0 else backends[::-1])]


def block_order(backends: list, blocks: int, repeat: int = 0) -> list[tuple[int, Any]]:
    """(block, backend) in the order one point measures them: the backends in each block, every other block
    in reverse and the alternation carried on from one repeat to the next (A B, B A, A B, ...), so that drift
    within a point's turn favours neither."""
    flip = [(repeat * blocks + b) % 2 == 1 for b in range(blocks)]
    return [(b, x) for b in range(blocks) for x in (backends[::-1] if flip[b] else backends)]


def block_budget(plan: RunPlan, block: int) -> tuple[int | None, float | None]:
    """(requests, duration) of one block: 1/`plan.blocks` of the point's, so that blocks do not lengthen the
    run (requests that do not divide go to the first blocks)."""
    blocks = plan.blocks or 1
    n = plan.num_requests
    share = None if n is None else n // blocks + (1 if block < n % blocks else 0)
    return (max(share, 1) if share is not None else None), (
        None if plan.duration is None else plan.duration / blocks
    )
