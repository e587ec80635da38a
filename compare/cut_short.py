"""Load points that `--duration` ended before they reached `--num-requests`: their statistics rest on fewer
requests than asked for, and the selection's confidence with them, so the report and the CLI say so."""

from __future__ import annotations

from typing import Any

from compare.datatypes import key_of


def duration_cut_warnings(run: Any) -> list[str]:
    """One warning per measured point (per launch) that the duration bound stopped short of the request
    count; interrupted points are warned about elsewhere, and imported points had bounds of their own."""
    config = run.manifest.get("config") or {}
    asked, duration = config.get("num_requests"), config.get("duration_s")
    if not asked or not duration:
        return []
    points = {p["run_id"]: p for p in run.manifest.get("points", [])}
    repeated = int(config.get("repeats") or 1) > 1
    out = []
    for s in run.run_summaries():
        point = points.get(s.run_id)
        if point is None or s.interrupted or s.n_measured >= asked:
            continue
        if s.wall_s - s.measured_start_s < duration:  # ended for another reason (too few prompts)
            continue
        where = point.get("workload") or ""
        if repeated:
            where += f"{', ' if where else ''}launch {int(point.get('repeat', 0)) + 1}"
        out.append(
            f"{s.load_point} on {key_of(s.backend, s.variant)}{f' ({where})' if where else ''}: "
            f"{s.n_measured} of {asked} requests before the {duration:g} s duration ended the point; "
            "its numbers rest on fewer requests than asked (raise --duration, or lower --num-requests)."
        )
    return out
