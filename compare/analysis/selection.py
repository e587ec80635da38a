"""The framework-selection section: for each SLO class, which backend and variant wins, by how much, with
what confidence, and what it costs to set up, in plain sentences generated from the numbers.

- interactive: the lowest median E2E at the lowest load point every candidate ran (with SLOs: the highest
  share of requests meeting them first); a bootstrap interval of the ratio of medians with a Mann-Whitney
  test on the per-request E2E samples, and the ratio in each launch (`--repeats`) or block.
- throughput / batch: the highest output tokens/s (with SLOs: the highest goodput), at closed-loop points
  where every candidate has one; a bootstrap interval of the ratio that resamples whole requests
  (`compare.analysis.statistics.throughput_ratio_ci`), spanning the windows' ratio too, and the ratio per
  launch.

The confidence is one word of `compare.analysis.confidence`'s ladder (established / indicated / not
established / tie). Set-up is weighed against a difference at least indicated, and a pay-back is established
only when both the difference and the start-up gap are (`setup_gap`).

Failures come first: a candidate with failed requests at the compared point cannot win while one without
failures exists, and the verdict names it before its numbers. What qualifies a verdict (repeated prompts,
unequal settings, points cut short, ...) comes from `compare/analysis/caveats.py` and
`compare/analysis/parity.py` as `compare.analysis.confidence.Qualifier`s, attached to each pick by `qualify`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from compare.analysis.confidence import (
    Confidence,
    Qualifier,
    Verdict,
    qualifier_sentence,
    qualifiers_for,
    requests_needed,
    verdict,
)
from compare.analysis.costs import break_even, graph_pool_trade
from compare.analysis.metrics import SummaryRow, busy_seconds, window_rate, window_samples
from compare.analysis.statistics import mann_whitney, ratio_ci, throughput_ratio_ci
from compare.common.datatypes import ARRIVAL_DRIVEN, Pick, SetupReport, describe_phases, key_of
from compare.common.text import plural

NOT_ESTABLISHED = "never: the difference is not established"
STATED = {"failed requests"}  # qualifier kinds each verdict sentence states itself, ahead of its numbers
BEFORE_NUMBERS = {"points cut short", "interrupted points"}  # missing data: said before the verdict's numbers
LAUNCH_UNITS = ("repeat", "block")  # the columns that tell launches (--repeats) and alternating blocks apart


def _fmt_s(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "n/a"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _fmt_p(p: float) -> str:
    if not np.isfinite(p):
        return "p n/a"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _load_order(row: pd.Series) -> tuple[int, float]:
    if row["mode"] == "closed" and pd.notna(row["concurrency"]):
        return 0, float(row["concurrency"])
    if pd.notna(row["rate"]):
        return 1, float(row["rate"])
    return 2, 0.0


def interactive_pick(
    summary: pd.DataFrame,
    requests: pd.DataFrame,
    workload: str,
    slo: dict[str, float],
    seed: int = 0,
    unmeasured: list[str] | None = None,
) -> Pick:
    """The lowest median E2E at the lowest load point every candidate ran. Failures come first: a candidate
    with failed requests there is ranked after every one without, and the sentence says so before the
    numbers; a winner slower than its runner-up (chosen for having no failures, or for the SLOs) is called
    slower, never faster."""
    pick = Pick("interactive", workload, metric="e2e_p50_ms")
    rows = summary[summary["workload"] == workload].copy()
    if rows.empty:
        return pick
    rows["key"] = [key_of(b, v) for b, v in zip(rows["backend"], rows["variant"], strict=True)]
    keys = list(dict.fromkeys(rows["key"]))
    shared = set.intersection(*(set(rows.loc[rows["key"] == k, "load_point"]) for k in keys))
    candidates = rows[rows["load_point"].isin(shared)] if shared else rows
    order = sorted({(_load_order(r), r["load_point"]) for _, r in candidates.iterrows()})
    point = order[0][1]
    if shared:
        at = candidates[candidates["load_point"] == point]
    else:  # no load point in common: each at its lowest load
        at = pd.DataFrame(
            [min((r for _, r in g.iterrows()), key=_load_order) for _, g in rows.groupby("key")]
        )
    failures = failure_sentences(at, "")
    at = at[at["e2e_n"] > 0]
    where = point if shared else "each one's lowest load point"
    lead = f"**Interactive** ({_where(workload, where)}): "
    if at.empty:
        pick.sentences.append(lead + f"no backend completed a request at {point}; nothing to select.")
        pick.sentences += failures
        return pick
    clean = at[at["requests_failed"] == 0]
    pool = clean if not clean.empty else at
    if slo:
        pool = pool.assign(_rank=-pool["goodput_frac"].round(2), _e2e=pool["e2e_p50_ms"])
        pool = pool.sort_values(["_rank", "_e2e"])
    else:
        pool = pool.sort_values("e2e_p50_ms")
    ranked = list(pool.itertuples()) + [r for r in at.itertuples() if r.Index not in pool.index]
    pick.ranking = [
        {
            "key": r.key,
            "load_point": r.load_point,
            "e2e_p50_ms": r.e2e_p50_ms,
            "ttft_p50_ms": r.ttft_p50_ms,
            "tpot_p50_ms": r.tpot_p50_ms,
            "n": r.e2e_n,
            "failed": r.requests_failed,
            "goodput_frac": r.goodput_frac,
        }
        for r in ranked
    ]
    win = ranked[0]
    pick.winner, pick.load_point, pick.value = win.key, win.load_point, win.e2e_p50_ms / 1e3
    first = " ".join(failures) + " " if failures else ""
    chosen = "Among those without failures, " if failures and not clean.empty else ""
    best = "the lowest median end-to-end latency," if not slo else "the most requests within the SLOs, median"
    head = (
        lead + first + chosen + f"**{win.key}** has {best} "
        f"{_fmt_s(win.e2e_p50_ms / 1e3)} (TTFT p50 {_fmt_s(win.ttft_p50_ms / 1e3)}, TPOT p50 "
        f"{_fmt_s(win.tpot_p50_ms / 1e3)}, n={win.e2e_n})"
    )
    if slo and np.isfinite(win.goodput_frac):
        head += f", {win.goodput_frac:.0%} of its requests within the SLOs"
    if len(ranked) == 1:
        pick.sentences.append(head + ". " + _alone(win.key, unmeasured))
        return pick
    run = ranked[1]
    pick.runner_up, pick.runner_value = run.key, run.e2e_p50_ms / 1e3
    cmp = compare_latency(requests, win, run, seed)
    pick.ratio, pick.ratio_lo, pick.ratio_hi, pick.p_value = cmp.ratio, cmp.lo, cmp.hi, cmp.p
    pick.confidence, pick.decisive, pick.level = cmp.within_run, cmp.decisive, cmp.verdict.level.value
    failed = f", {int(run.requests_failed)} failed" if run.requests_failed else ""
    head += (
        f"; {_times(pick.ratio)} than {run.key} ({_fmt_s(run.e2e_p50_ms / 1e3)}, n={run.e2e_n} ok{failed}): "
        f"{pick.confidence}."
    )
    if unmeasured:
        head += " " + _not_measured(unmeasured)
    pick.sentences.append(head)
    return pick


def _times(ratio: float, better: str = "faster", worse: str = "slower") -> str:
    """ "1.18x faster" for a ratio above 1, "1.47x slower" (the inverse) below: a ratio below 1 is never
    printed as faster."""
    if not np.isfinite(ratio) or ratio <= 0:
        return f"n/a times {better}"
    return f"{ratio:.2f}x {better}" if ratio >= 1 else f"{1 / ratio:.2f}x {worse}"


def _alone(key: str, unmeasured: list[str] | None) -> str:
    if unmeasured:
        return f"{_not_measured(unmeasured)} There is nothing to compare {key} with."
    return "It is the only candidate: there is nothing to compare it with."


def _not_measured(keys: list[str]) -> str:
    one = len(keys) == 1
    return (
        f"{' and '.join(keys)} {'was' if one else 'were'} not measured (the run ended before "
        f"{'its' if one else 'their'} turn)."
    )


@dataclass(frozen=True)
class Comparison:
    """One candidate against another at their compared load points: the one verdict that the decision's
    sentences and the set-up pay-back table both read, so they cannot disagree. `ratio` > 1 favours the
    first; the verdict is about the better of the two (`ratio` or its inverse), `Confidence`'s ladder."""

    ratio: float  # how many times better the first is (below 1: worse)
    lo: float
    hi: float
    p: float
    verdict: Verdict
    launches: dict[int, float]  # the ratio per launch (--repeats) or block

    @property
    def within_run(self) -> str:
        """The confidence in words."""
        return self.verdict.words()

    @property
    def decisive(self) -> bool:
        """Established, and in the first's favour."""
        return self.verdict.decisive and self.ratio > 1


def _oriented(
    ratio: float, lo: float, hi: float, launches: dict[Any, float]
) -> tuple[float, float, list[float]]:
    """The interval and per-launch ratios turned so that > 1 favours whichever of the two is better."""
    if not np.isfinite(ratio) or ratio >= 1:
        return lo, hi, list(launches.values())
    flip = [1 / v if v else math.inf for v in launches.values()]
    return (1 / hi if hi else math.inf), (1 / lo if lo else math.inf), flip


def compare_latency(
    requests: pd.DataFrame, first: SummaryRow, other: SummaryRow, seed: int = 0
) -> Comparison:
    """`first` against `other` by median E2E: bootstrap interval of the ratio with a Mann-Whitney test,
    launch by launch (or block by block) for `established`."""
    a = _samples(requests, first, "e2e_s")
    b = _samples(requests, other, "e2e_s")
    ratio, lo, hi = ratio_ci(b, a, "p50", seed=seed)
    p = mann_whitney(a, b)
    a_runs = _per_launch(requests, first, lambda g: g["e2e_s"].median())
    b_runs = _per_launch(requests, other, lambda g: g["e2e_s"].median())
    launches = {r: b_runs[r] / a_runs[r] for r in sorted(a_runs.keys() & b_runs.keys())}
    olo, ohi, olaunches = _oriented(ratio, lo, hi, launches)  # shown as the sentence reads: faster or slower
    shown = (
        f"95% CI {olo:.2f}-{ohi:.2f}x, Mann-Whitney {_fmt_p(p)}"
        if np.isfinite(lo) and np.isfinite(hi)
        else ""
    )
    found = verdict(olo, ohi, (a.size, b.size), olaunches, p, shown)
    better = max(ratio, 1 / ratio) if ratio > 0 else math.nan
    return Comparison(ratio, lo, hi, p, _with_size_hint(found, better, olo, min(a.size, b.size)), launches)


def compare_throughput(
    requests: pd.DataFrame | None, first: SummaryRow, other: SummaryRow, goodput: bool, seed: int = 0
) -> Comparison:
    """`first` against `other` by output tokens/s (goodput: a single number per point, never established):
    a bootstrap interval of the ratio over whole requests (`throughput_ratio_ci`), with the launches (or
    blocks) for `established`. Open-loop points are not compared: the offered load sets their rate."""
    nan = math.nan
    rates = float(_get(first, "output_tok_s")), float(_get(other, "output_tok_s"))
    ratio = rates[0] / rates[1] if rates[1] > 0 else math.inf
    if goodput:
        return Comparison(
            ratio,
            nan,
            nan,
            nan,
            Verdict(Confidence.NOT_ESTABLISHED, "a single measurement per point: no interval for goodput"),
            {},
        )
    launches: dict[int, float] = {}
    if requests is not None:
        a_runs = _per_launch(requests, first, _throughput)
        b_runs = _per_launch(requests, other, _throughput)
        launches = {r: a_runs[r] / b_runs[r] for r in sorted(a_runs.keys() & b_runs.keys())}
    if all(_get(row, "mode") in ARRIVAL_DRIVEN for row in (first, other)):
        words = (
            "at open-loop points the offered load sets the rate, so the difference is not one of capacity "
            "(closed-loop points, --concurrency, measure that)"
        )
        return Comparison(ratio, nan, nan, nan, Verdict(Confidence.NOT_ESTABLISHED, words), launches)
    a, b = _ok_requests(requests, first), _ok_requests(requests, other)
    lo, hi = _throughput_interval(ratio, a, b, seed)
    olo, ohi, olaunches = _oriented(ratio, lo, hi, launches)
    shown = (
        f"95% interval {olo:.2f}-{ohi:.2f}x, over the rates' variation in time and between requests"
        if np.isfinite(lo) and np.isfinite(hi)
        else "no interval: the window is too short to see the rate vary"
    )
    found = verdict(olo, ohi, (len(a), len(b)), olaunches, nan, shown)
    hinted = _with_size_hint(
        found, max(ratio, 1 / ratio), olo, min(len(a), len(b)), "a longer run would not make it a win"
    )
    return Comparison(ratio, lo, hi, nan, hinted, launches)


def _throughput_interval(ratio: float, a: pd.DataFrame, b: pd.DataFrame, seed: int) -> tuple[float, float]:
    """The ratio's 95 % interval, as wide as either way of seeing its uncertainty makes it: the rates'
    variation over time within their windows (batch means over sub-windows, `throughput_ratio_ci` of
    `WindowSample`s), and the requests' variation at the load as measured (whole requests resampled around
    their rate of service, tokens over summed request times, which may differ from the windows' ratio: the
    interval spans both ratios). Either alone passed for a difference in A/A pairs more often than 5 %."""
    if not (len(a) and len(b)):
        return math.nan, math.nan
    windows = throughput_ratio_ci(window_samples(a), window_samples(b), seed=seed)
    served = throughput_ratio_ci(
        (a["output_tokens"].to_numpy(dtype=float), busy_seconds(a)),
        (b["output_tokens"].to_numpy(dtype=float), busy_seconds(b)),
        seed=seed,
    )
    rates = [float(x["output_tokens"].sum()) / float(np.nansum(busy_seconds(x))) for x in (a, b)]
    service = rates[0] / rates[1] if rates[1] > 0 else math.nan
    if not (np.isfinite(windows[0] * windows[1]) or np.isfinite(served[0] * served[1])):
        return math.nan, math.nan
    ends = [ratio, ratio * windows[0], ratio * windows[1]]  # the interval holds the ratio it is about
    if np.isfinite(service):
        ends += [service * served[0], service * served[1]]
    ends = [e for e in ends if np.isfinite(e)]
    return (min(ends), max(ends)) if ends else (math.nan, math.nan)


def _with_size_hint(found: Verdict, ratio: float, lo: float, n: int, otherwise: str | None = None) -> Verdict:
    """A verdict whose interval holds 1, with how many requests each would find a difference of this size in
    most runs (`requests_needed`), or `otherwise` where no number of requests would."""
    if found.level is not Confidence.NOT_ESTABLISHED or not found.reason.endswith("the interval holds 1"):
        return found
    need = requests_needed(ratio, lo, n)
    hint = (
        f"about {plural(need, 'request')} each would find a difference this size in most runs"
        if need
        else otherwise
    )
    return found if hint is None else Verdict(found.level, f"{found.reason}; {hint}")


def _ok_requests(requests: pd.DataFrame | None, row: SummaryRow) -> pd.DataFrame:
    """The row's measured ok requests."""
    if requests is None:
        return pd.DataFrame(columns=["repeat", "output_tokens", "send_s", "end_s", "e2e_s"])
    mask = (
        (requests["backend"] == _get(row, "backend"))
        & (requests["variant"] == _get(row, "variant"))
        & (requests["workload"] == _get(row, "workload"))
        & (requests["load_point"] == _get(row, "load_point"))
        & (requests["status"] == "ok")
        & ~requests["warmup"].astype(bool)
    )
    return requests[mask]


def _per_launch(
    requests: pd.DataFrame, row: SummaryRow, stat: Callable[[pd.DataFrame], float]
) -> dict[Any, float]:
    """`stat` of the row's ok requests in each launch (--repeats) of its backend, and in each alternating
    block of a point where the run measured in blocks (a `block` column)."""
    ok = _ok_requests(requests, row)
    units = [c for c in LAUNCH_UNITS if c in ok.columns and ok[c].notna().any()]
    if not units or ok.empty:
        return {}
    by = units[0] if len(units) == 1 else units
    return {r: float(stat(g)) for r, g in ok.groupby(by)}


def _get(row: SummaryRow, name: str) -> Any:
    return row[name] if isinstance(row, pd.Series | dict) else getattr(row, name)


def _throughput(group: pd.DataFrame) -> float:
    """Output tokens/s of one launch over its throughput window, as the summary counts it."""
    return window_rate(group)


def failure_sentences(rows: pd.DataFrame, where: str) -> list[str]:
    """Every candidate with failed requests, by name: it is ranked after those without, or not at all."""
    out = []
    for _, r in rows.iterrows():
        if r["requests_failed"]:
            ranked = (
                "is not ranked"
                if r["requests_ok"] == 0
                else "is ranked after the candidates without failures"
            )
            out.append(
                f"{r['key']} {ranked}: {int(r['requests_failed'])} of "
                f"{plural(int(r['requests']), 'request')} failed "
                f"{where or 'at ' + str(r['load_point'])} ({r['errors']})."
            )
    return out


def throughput_pick(
    summary: pd.DataFrame,
    workload: str,
    slo: dict[str, float],
    requests: pd.DataFrame | None = None,
    seed: int = 0,
    unmeasured: list[str] | None = None,
) -> Pick:
    """The highest output tokens/s (with SLOs: goodput) at any load point, at closed-loop points where every
    candidate has one (at open-loop points the offered load sets the rate); failures first, as
    `interactive_pick`."""
    pick = Pick("throughput", workload)
    rows = summary[summary["workload"] == workload].copy()
    if rows.empty:
        return pick
    rows["key"] = [key_of(b, v) for b, v in zip(rows["backend"], rows["variant"], strict=True)]
    metric = pick.metric = "goodput_rps" if slo else "output_tok_s"
    rows = rows[rows[metric].notna()]
    if rows.empty:
        return pick
    closed = rows[~rows["mode"].isin(ARRIVAL_DRIVEN)]
    if not slo and not closed.empty and set(closed["key"]) == set(rows["key"]):
        rows = closed
    if slo and "offered_rps" in rows:  # an open-loop point serves at most what is offered to it
        rows[metric] = [
            min(g, f * o) if m in ARRIVAL_DRIVEN and np.isfinite(o) and np.isfinite(f) else g
            for g, f, o, m in zip(
                rows[metric], rows["goodput_frac"], rows["offered_rps"], rows["mode"], strict=True
            )
        ]
    rows["_fail"] = rows["requests_failed"] / rows["requests"].clip(lower=1)
    best = []
    for _, group in rows.groupby("key", sort=False):
        clean = group[group["_fail"] <= 0.01]
        use = clean if not clean.empty else group
        best.append(use.iloc[int(np.nanargmax(use[metric].to_numpy(dtype=float)))])  # its first highest
    table = pd.DataFrame(best)
    table["_clean"] = table["_fail"] <= 0.01
    failures = [
        f"{r['key']} failed requests at every load point (at {r['load_point']}: "
        f"{int(r['requests_failed'])} of {int(r['requests'])}, {r['errors']}) and is ranked last."
        for _, r in table.iterrows()
        if not r["_clean"]
    ]
    table = table.sort_values(["_clean", metric], ascending=[False, False])
    pick.ranking = [
        {
            "key": r["key"],
            "load_point": r["load_point"],
            metric: r[metric],
            "output_tok_s": r["output_tok_s"],
            "n": r["requests_ok"],
            "failed": r["requests_failed"],
        }
        for _, r in table.iterrows()
    ]
    win = table.iloc[0]
    pick.winner, pick.load_point, pick.value = win["key"], win["load_point"], float(win[metric])
    unit = "requests/s within the SLOs" if slo else "output tokens/s"
    lead = f"**Throughput / batch**{f' ({workload})' if workload else ''}: "
    lead += "".join(f + " " for f in failures)
    head = (
        lead + f"**{win['key']}** reaches "
        f"{_fmt_rate(win[metric])} {unit} at "
        f"{win['load_point']} (n={int(win['requests_ok'])} ok"
    )
    if not slo and np.isfinite(win.get("output_tok_s_lo", np.nan)):
        head += f"; 95% interval {_fmt_rate(win['output_tok_s_lo'])}-{_fmt_rate(win['output_tok_s_hi'])}"
    head += ")"
    if len(table) == 1:
        pick.sentences.append(head + ". " + _alone(win["key"], unmeasured))
        return pick
    run = table.iloc[1]
    pick.runner_up, pick.runner_value = run["key"], float(run[metric])
    pick.ratio = pick.value / pick.runner_value if pick.runner_value > 0 else math.inf
    cmp = compare_throughput(requests, win, run, bool(slo), seed)
    pick.confidence, pick.decisive, pick.level = cmp.within_run, cmp.decisive, cmp.verdict.level.value
    pick.ratio_lo, pick.ratio_hi = cmp.lo, cmp.hi
    if slo:
        head = head[:-1] + f"; {_fmt_rate(win['output_tok_s'])} output tokens/s)"
    if pick.runner_value > 0:
        times = f"{pick.ratio:.2f}x" if pick.ratio >= 1 else f"{1 / pick.ratio:.2f}x less than"
        head += (
            f", {times} {run['key']}'s {_fmt_rate(run[metric])} at {run['load_point']}: {pick.confidence}."
        )
    else:
        head += f"; {run['key']} has no request within the SLOs at any load point."
    if unmeasured:
        head += " " + _not_measured(unmeasured)
    pick.sentences.append(head)
    return pick


def _where(workload: str, point: str) -> str:
    return f"{workload}, {point}" if workload else point


def _fmt_rate(value: float) -> str:
    if not np.isfinite(value):
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _samples(requests: pd.DataFrame, row: SummaryRow, column: str) -> np.ndarray:
    return _ok_requests(requests, row)[column].dropna().to_numpy(dtype=float)


def setup_sentences(pick: Pick, summary: pd.DataFrame, setups: dict[str, SetupReport]) -> list[str]:
    """What the winner costs to set up, and when that pays back against the runner-up."""
    out: list[str] = []
    if pick.winner is None:
        return out
    win = setups.get(pick.winner)
    run = setups.get(pick.runner_up) if pick.runner_up else None
    if win is not None and win.launcher == "endpoint" and (run is None or run.launcher == "endpoint"):
        names = " and ".join(k for k in (pick.winner, pick.runner_up) if k)
        return [
            f"Set-up not measured: {names} "
            f"{'were running endpoints' if pick.runner_up else 'was a running endpoint'}."
        ]
    out.append(f"Set-up of {pick.winner}: {describe_setup(win)}.")
    if pick.runner_up is None:
        return out
    if win is None or run is None or win.ready_s is None or run.ready_s is None:
        out.append(
            f"Set-up of {pick.runner_up}: {describe_setup(run)}; no break-even without both set-up times."
        )
        return out
    gap = setup_gap(win, run)
    if not _pays(pick.level, pick.ratio):
        out.append(
            f"The difference from {pick.runner_up} is not established, so no set-up cost is paid back "
            f"(set-up: {gap.words()})."
        )
        return out
    per_win, per_run = (
        _per_request_s(pick, summary, pick.winner),
        _per_request_s(pick, summary, pick.runner_up),
    )
    if not (np.isfinite(per_win) and np.isfinite(per_run)):
        return out
    be = break_even(win.ready_s, run.ready_s, per_win, per_run)
    basis = (
        "median end-to-end latency"
        if pick.slo_class == "interactive"
        else "time per request at the measured rate"
    )
    if be.requests is None:
        out.append(
            f"{pick.winner} is not faster per request than {pick.runner_up} by {basis}: no break-even."
        )
    elif be.requests == 0:
        out.append(
            f"{pick.winner} also took less time to be ready ({win.ready_s:.1f} s against "
            f"{run.ready_s:.1f} s; {gap.words()}): nothing to pay back."
        )
    else:
        sure = gap.decisive and pick.decisive
        out.append(
            f"{pick.winner} took {be.setup_delta_s:.1f} s longer to be ready than {pick.runner_up} "
            f"({win.ready_s:.1f} s against {run.ready_s:.1f} s; {gap.words()}) and saves "
            f"{_fmt_s(be.per_request_delta_s)} per "
            f"request ({basis}): {'it pays back' if sure else 'it would pay back'} {be.verdict}"
            + ("." if sure else f", {_payback_level(pick.level, gap)}.")
        )
    return out


def _pays(level: str, ratio: float) -> bool:
    """A set-up cost is weighed only against a difference at least indicated, in the winner's favour."""
    return level in (Confidence.ESTABLISHED.value, Confidence.INDICATED.value) and ratio > 1


def _payback_level(level: str, gap: Verdict) -> str:
    """Why a pay-back is indicated, not established: the per-request difference, the start-up gap, or both."""
    why = []
    if level != Confidence.ESTABLISHED.value:
        why.append("the per-request difference is only indicated")
    if not gap.decisive:
        why.append("the start-up gap is not established")
    return "indicated, not established: " + " and ".join(why)


def setup_gap(first: SetupReport, other: SetupReport) -> Verdict:
    """Is the difference in time to ready a property of the backends? One launch each cannot say (the same
    binary's start varies by seconds from launch to launch): indicated at most. With two or more launches
    each, established only when every launch of one was ready before every launch of the other (their
    ranges do not overlap); a tie when the ranges overlap."""
    a = first.ready_runs or ([first.ready_s] if first.ready_s is not None else [])
    b = other.ready_runs or ([other.ready_s] if other.ready_s is not None else [])
    if not a or not b:
        return Verdict(Confidence.NOT_ESTABLISHED, "a time to ready is missing")
    if min(len(a), len(b)) < 2:
        return Verdict(
            Confidence.INDICATED, "from one launch each: a process's start varies from launch to launch"
        )
    ranges = (
        f"{min(a):.1f}-{max(a):.1f} s against {min(b):.1f}-{max(b):.1f} s over {len(a)} and {len(b)} launches"
    )
    if max(a) < min(b) or max(b) < min(a):
        return Verdict(Confidence.ESTABLISHED, f"the launches' ranges do not overlap: {ranges}")
    return Verdict(Confidence.NOT_ESTABLISHED, f"the launches' ranges overlap: {ranges}")


def _summary_row(pick: Pick, summary: pd.DataFrame, key: str) -> pd.Series | None:
    """`key`'s summary row at the load point the pick compared it at."""
    rows = summary[(summary["workload"] == pick.workload)]
    rows = rows[[key_of(b, v) == key for b, v in zip(rows["backend"], rows["variant"], strict=True)]]
    ranked = {r["key"]: r for r in pick.ranking}
    point = ranked.get(key, {}).get("load_point", pick.load_point)
    rows = rows[rows["load_point"] == point]
    return None if rows.empty else rows.iloc[0]


def _per_request_s(pick: Pick, summary: pd.DataFrame, key: str) -> float:
    row = _summary_row(pick, summary, key)
    if row is None:
        return math.nan
    if pick.slo_class == "interactive":
        return row["e2e_p50_ms"] / 1e3
    return 1.0 / row["request_rps"] if row["request_rps"] > 0 else math.nan


def pair_level(
    pick: Pick, summary: pd.DataFrame, requests: pd.DataFrame, first: str, other: str, seed: int = 0
) -> str:
    """How sure is it that `first` is better than `other` in the pick's class (a `Confidence` value, "" when
    `first` is the worse)? The pick's own verdict for its winner and runner-up; the same comparison for any
    other pair."""
    if {first, other} == {pick.winner, pick.runner_up}:
        return pick.level if first == pick.winner and pick.ratio > 1 else ""
    a, b = _summary_row(pick, summary, first), _summary_row(pick, summary, other)
    if a is None or b is None:
        return ""
    if pick.slo_class == "interactive":
        cmp = compare_latency(requests, a, b, seed)
    else:
        cmp = compare_throughput(requests, a, b, pick.metric == "goodput_rps", seed)
    return cmp.verdict.level.value if cmp.ratio > 1 else ""


def describe_setup(setup: SetupReport | None) -> str:
    if setup is None:
        return "not measured (imported results, or not started by llm-compare)"
    if setup.launcher == "endpoint":
        return "a running endpoint (set-up not measured)"
    parts = [f"ready in {setup.ready_s:.1f} s" if setup.ready_s is not None else "never became ready"]
    if len(setup.ready_runs) > 1:
        runs = ", ".join(f"{r:.1f}" for r in setup.ready_runs)
        parts[0] += f" (median of {plural(len(setup.ready_runs), 'launch', 'launches')}: {runs} s)"
    phases = [p for p in setup.phases if p.seconds >= 0.05 and p.name != "server_ready"]
    if phases:
        parts.append(f"({describe_phases(phases)})")
    mem = setup.memory
    bits = [
        f"{name.replace('_', ' ')} {mem[k] / 2**30:.2f} GiB"
        for k, name in (
            ("weights", "weights"),
            ("kv_cache", "KV cache"),
            ("graph_pool", "CUDA-graph pool"),
            ("peak_rss", "peak RSS"),
            ("device_used", "GPU memory"),
        )
        if mem.get(k)
    ]
    if bits:
        parts.append("; " + ", ".join(bits))
    if setup.device:
        parts.append(f"on {setup.device}")
    return " ".join(parts).replace(" ;", ";")


def compared_points(pick: Pick) -> dict[str, str | None]:
    """The pick's winner and runner-up, each with the load point it was compared at (None: every point)."""
    at = {r["key"]: r.get("load_point") for r in pick.ranking}
    return {k: at.get(k) for k in (pick.winner, pick.runner_up) if k}


def touches_a_verdict(q: Qualifier, picks: list[Pick]) -> bool:
    """Does the qualifier concern a comparison some pick makes?"""
    return q.verdict and any(q.touches(p.workload, compared_points(p)) for p in picks)


def qualify(picks: list[Pick], found: list[Qualifier]) -> None:
    """Give each pick the qualifiers touching its compared candidates at their compared points, and their
    sentence right after the verdict's (so the report's Decision and the terminal print it), whatever their
    kind. Failures are stated in the verdict itself."""
    for pick in picks:
        pick.qualifiers = [
            q for q in qualifiers_for(found, pick.workload, compared_points(pick)) if q.kind not in STATED
        ]
        first = [q for q in pick.qualifiers if q.kind in BEFORE_NUMBERS]
        rest = [q for q in pick.qualifiers if q.kind not in BEFORE_NUMBERS]
        if not pick.sentences:
            continue
        if first:  # missing data goes in the verdict sentence, after its class and point, before its numbers
            head, sep, tail = pick.sentences[0].partition("): ")
            said = qualifier_sentence(first).removeprefix("Qualified by ")
            if sep:
                pick.sentences[0] = f"{head}{sep}{said[:1].upper()}{said[1:]} {tail}"
        if rest:
            pick.sentences.insert(1, qualifier_sentence(rest))


def selection(
    summary: pd.DataFrame,
    requests: pd.DataFrame,
    setups: dict[str, SetupReport],
    slo: dict[str, float],
    seed: int = 0,
    planned: list[str] | None = None,
) -> tuple[list[Pick], list[str]]:
    """The picks per workload and SLO class (with their set-up sentences), and the memory trade notes.
    `planned`: every candidate the run was to measure; those with no measured request are named as not
    measured, not left out."""
    picks: list[Pick] = []
    if summary.empty:
        return picks, []
    measured = {key_of(b, v) for b, v in zip(summary["backend"], summary["variant"], strict=True)}
    unmeasured = [k for k in dict.fromkeys(planned or []) if k and k not in measured]
    described: set[str] = set()
    for workload in dict.fromkeys(summary["workload"]):
        for pick in (
            interactive_pick(summary, requests, workload, slo, seed, unmeasured),
            throughput_pick(summary, workload, slo, requests, seed, unmeasured),
        ):
            extra = setup_sentences(pick, summary, setups)
            if pick.winner in described and extra:  # its set-up was described already
                extra = extra[1:]
            described.add(pick.winner or "")
            pick.sentences += extra
            picks.append(pick)
    memory = []
    seq = float((summary["input_tokens_mean"] + summary["output_tokens_mean"]).mean())
    for key, setup in setups.items():
        trade = graph_pool_trade(setup, seq)
        if trade is not None:
            memory.append(
                f"{key}: its CUDA-graph pool of {trade.pool_bytes / 2**30:.2f} GiB would hold "
                f"{plural(trade.kv_tokens, 'token')} of KV cache, "
                f"{plural(trade.sequences, 'more concurrent sequence')} of {plural(seq, 'token')}."
            )
    return picks, memory


def break_even_rows(
    picks: list[Pick],
    summary: pd.DataFrame,
    setups: dict[str, SetupReport],
    requests: pd.DataFrame,
    seed: int = 0,
) -> list[list[str]]:
    """Every pair of launched candidates, per workload and class: which one is faster per request, how much
    longer it takes to be ready, and after how many requests (and how long at its measured rate) that pays
    back. Rows: workload, class, faster, other, ready s (faster / other), per request (faster / other),
    verdict. A pair whose difference is not established (`pair_level`, the decision's own verdict) pays
    nothing back."""
    rows = []
    for pick in picks:
        if pick.slo_class == "capacity":  # ranks rates served, not time per request: nothing to pay back
            continue
        ready = {
            r["key"]: s.ready_s
            for r in pick.ranking
            if (s := setups.get(r["key"])) is not None and s.ready_s is not None
        }
        keys = list(ready)
        for i, a in enumerate(keys):
            for b in keys[i + 1 :]:
                per = {k: _per_request_s(pick, summary, k) for k in (a, b)}
                if not all(np.isfinite(v) for v in per.values()):
                    continue
                fast, slow = (a, b) if per[a] <= per[b] else (b, a)
                be = break_even(ready[fast], ready[slow], per[fast], per[slow])
                verdict = "never (no faster per request)" if be.requests is None else be.verdict
                level = pair_level(pick, summary, requests, fast, slow, seed)
                if be.requests and not _pays(level, 2.0):
                    verdict = NOT_ESTABLISHED
                elif be.requests:
                    gap = setup_gap(setups[fast], setups[slow])
                    if not (gap.decisive and level == Confidence.ESTABLISHED.value):
                        verdict += f" ({_payback_level(level, gap)})"
                rows.append(
                    [
                        pick.workload,
                        "interactive (median E2E)"
                        if pick.slo_class == "interactive"
                        else "batch (1 / requests/s)",
                        fast,
                        slow,
                        f"{setups[fast].ready_s:.1f} / {setups[slow].ready_s:.1f}",
                        f"{_fmt_s(per[fast])} / {_fmt_s(per[slow])}",
                        verdict,
                    ]
                )
    return rows


def capacity_picks(
    summary: pd.DataFrame, requests: pd.DataFrame, slo: dict[str, float], percentile: int
) -> list[Pick]:
    """With --capacity: per workload, the backends ranked by their capacity under the SLO (the lower end of
    each bracket, `compare.analysis.capacity`: a rate at which the SLO was shown to hold). A winner whose
    lower end is at or above the runner-up's upper end is ahead beyond the search's precision; otherwise the
    brackets overlap and the order is not established. A backend no rate of which was shown to hold the SLO
    has an undetermined capacity, never a rate above its own bracket."""
    from compare.analysis.capacity import capacity_of
    from compare.analysis.sweep import sweep_of

    found = {key: capacity_of(points, slo, percentile) for key, points in sweep_of(summary, requests).items()}
    picks = []
    for workload in dict.fromkeys(summary["workload"]):
        ranked = sorted(
            ((key_of(b, v), c) for (b, v, w), c in found.items() if w == workload and c is not None),
            key=lambda kc: (not kc[1].decided, -kc[1].lo),
        )
        if not ranked:
            continue
        pick = Pick("capacity", workload, winner=ranked[0][0], value=ranked[0][1].lo, metric="capacity_rps")
        pick.ranking = [
            {"key": k, "capacity_rps": c.lo, "bracket_hi_rps": c.hi, "decided": c.decided} for k, c in ranked
        ]
        names = ", ".join(f"{k} {_fmt_bracket(c.lo, c.hi, c.decided)}" for k, c in ranked)
        pick.sentences.append(f"**Capacity under the SLO** (p{percentile}; {workload}): {names}.")
        (first, a) = ranked[0]
        if not a.decided:
            pick.winner, pick.value = None, math.nan
            pick.sentences.append(
                f"No backend was shown to hold the SLO at any rate (a point needs at least {a.needed_n} "
                f"requests before its p{percentile} can be shown to hold): no capacity is established."
            )
        elif len(ranked) > 1:
            second, b = ranked[1]
            pick.runner_up, pick.runner_value = second, b.lo
            pick.decisive = b.decided and b.hi is not None and a.lo >= b.hi
            pick.sentences.append(
                f"{first} serves the most within the SLO"
                + (
                    f", beyond the search's precision: its lower end {a.lo:.4g} is at or above {second}'s "
                    f"upper end {b.hi:.4g}."
                    if pick.decisive
                    else f"; its bracket overlaps {second}'s, so the order between them is not established."
                )
            )
        picks.append(pick)
    return picks


def _fmt_bracket(lo: float, hi: float | None, decided: bool = True) -> str:
    if not decided:
        return "undetermined" + ("" if hi is None else f" (missed at {hi:.4g} requests/s)")
    return (
        f">= {lo:.4g} requests/s (every rate decided held it)"
        if hi is None
        else f"[{lo:.4g}, {hi:.4g}) requests/s"
    )
