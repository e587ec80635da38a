"""The report's "Sweep and capacity" section: per backend and workload of a swept run, its points with the
knee and the saturation marked, and after a capacity search each bracket with its ends' percentiles."""

from __future__ import annotations

from compare.analysis import capacity, sweep
from compare.analysis.results import Results
from compare.common.datatypes import key_of
from compare.report.blocks import Block, number

SWEEP_COLUMNS = [
    "backend",
    "workload",
    "sync TTFT p50 ms",
    "most served (req/s)",
    "knee (req/s)",
    "saturated at (req/s)",
    "why saturated",
]


def sweep_capacity_section(res: Results) -> list[Block]:
    """With --sweep: per backend and workload, its knee and saturation point; with --capacity, the highest
    rate meeting the SLO with its bracket and the percentile's intervals at both ends."""
    config = res.run.manifest.get("config") or {}
    if not config.get("sweep") or res.summary.empty:
        return []
    slo, q = res.run.slo(), int(config.get("capacity_percentile") or 99)
    searched = bool(config.get("capacity") and slo)
    rows, cap_rows, sentences = [], [], []
    for (backend, variant, workload), points in sweep.sweep_of(res.summary, res.requests).items():
        sync = points[0]
        if sync.concurrency != 1 or sync.offered_rps is not None:
            continue
        key, bend, saturated = key_of(backend, variant), sweep.knee(points, sync), None
        found = sweep.first_saturated(points, sync)
        most = sweep.most_served(points)
        served = f"{number(most.throughput_rps, 2)} at {most.label}"
        rows.append(
            [
                key,
                workload,
                number(sync.ttft_p50_s * 1e3),
                served,
                "none" if bend is None else f"{bend.offered_rps:.4g}",
                "not reached" if found is None else f"{found[0].offered_rps:.4g}",
                "" if found is None else found[1],
            ]
        )
        top = max(p.offered_rps or 0.0 for p in points)
        saturated = (
            f"saturated at {found[0].offered_rps:.4g} requests/s"
            if found is not None
            else f"not saturated up to {top:.4g} requests/s offered"
            if top
            else "no open-loop point"
        )
        sentence = (
            f"{key} ({workload}): knee at "
            f"{'no rate' if bend is None else f'{bend.offered_rps:.4g} requests/s'}, {saturated}; "
            f"most served {most.throughput_rps:.3g} requests/s (at {most.label})"
        )
        cap = capacity.capacity_of(points, slo, q) if searched else None
        if cap is not None:
            cap_rows.append(capacity_row(key, workload, cap, slo))
            sentence += "; " + capacity_sentence(cap, slo)
        sentences.append(sentence + ".")
    explained = (
        "A sweep runs concurrency 1 and a saturating closed loop, then open-loop rates from the first's "
        "throughput up, each with its own seeded draw of arrivals, until the backend saturates: it completes "
        "requests clearly slower than they were sent, the client falls behind its own schedule, a tenth of "
        "the requests fail, or the TTFT p50 exceeds 4 x the synchronous one and rises within the point (the "
        "rate and rise tests at the 1 % level, so that the sampling error of a point's arrivals does not "
        "call a server far below its capacity saturated). The knee is the highest offered rate before that "
        "whose TTFT p50 stays within 2 x the synchronous one. Most served: the highest rate of ok requests "
        "over a point's measured window, at any point. Plots mark the knee and the saturated point."
    )
    blocks: list[Block] = [("h2", "Sweep and capacity"), ("p", explained), ("table", (SWEEP_COLUMNS, rows))]
    if searched:
        limits = ", ".join(f"{k} p{q} <= {v * 1e3:g} ms" for k, v in slo.items())
        blocks += [
            (
                "p",
                f"Capacity: the highest open-loop rate at which the SLO ({limits}; TTFT and E2E from the "
                "intended send; a failed request misses it; an unsaturated point) holds, bracketed by the "
                "lowest rate that misses it, found by bisection. A rate holds when the one-sided 95 % "
                f"distribution-free bound of each p{q} (from the order statistics of the point's requests) "
                f"is within its limit, misses when the other bound is beyond it, and is undetermined "
                f"otherwise: fewer than {capacity.min_n_for_bound(q / 100)} requests a point can never "
                f"show that a p{q} holds. The intervals are two-sided 95 % distribution-free intervals, n "
                "the requests.",
            ),
            ("table", (CAPACITY_COLUMNS, cap_rows)),
        ]
    return [*blocks, ("ul", sentences)]


CAPACITY_COLUMNS = [
    "backend",
    "workload",
    "capacity (req/s)",
    "bracket (req/s)",
    "width",
    "at lower end",
    "at upper end",
    "undetermined (req/s)",
]


def capacity_row(key: str, workload: str, cap: capacity.Capacity, slo: dict[str, float]) -> list[str]:
    def ends(end: str) -> str:
        values = cap.intervals.get(end) or {}
        cells = [f"{k} {v[0]:.1f} [{v[1]:.1f}, {v[2]:.1f}] n={v[3]}" for k, v in values.items()]
        return "; ".join(cells) or "-"

    hi = "open" if cap.hi is None else f"{cap.hi:.4g}"
    return [
        key,
        workload,
        f"{cap.lo:.4g}" if cap.decided else "undetermined",
        f"[{cap.lo:.4g}, {hi})",
        number(cap.width, 2),
        ends("lo"),
        ends("hi"),
        ", ".join(f"{r:.4g}" for r in cap.undetermined) or "-",
    ]


def capacity_sentence(cap: capacity.Capacity, slo: dict[str, float]) -> str:
    if not cap.sync_meets:
        return "the SLO is missed even at one request at a time: no capacity"
    short = cap.smallest_n < cap.needed_n
    if not cap.decided:
        why = (
            f"a point of {cap.smallest_n} requests cannot show a p{cap.percentile} holds (it takes "
            f"{cap.needed_n}; raise --num-requests or --duration)"
            if short
            else "no rate measured was shown to hold it"
        )
        return (
            "capacity under the SLO undetermined: "
            + why
            + ("" if cap.hi is None else f"; it missed at {cap.hi:.4g} requests/s")
        )
    if cap.hi is None:
        text = f"the SLO held at every rate decided, up to {cap.lo:.4g} requests/s (capacity at least that)"
    else:
        text = (
            f"capacity under the SLO {cap.lo:.4g} requests/s, within {cap.width:.3g} (the SLO holds "
            f"there with 95 % confidence and was missed at {cap.hi:.4g})"
        )
    if cap.undetermined:
        text += (
            f"; undetermined at {', '.join(f'{r:.4g}' for r in cap.undetermined)} requests/s, so the "
            "capacity may be higher"
        )
    if cap.met_above:
        text += (
            f"; {', '.join(f'{r:.4g}' for r in cap.met_above)} requests/s, above the bracket, held it: the "
            "SLO is not monotone in the rate here, so the bracket may be low"
        )
    return text
