"""The framework-selection section: for each SLO class, which backend and variant wins, by how much, with
what confidence, and what it costs to set up, in plain sentences generated from the numbers.

- interactive: the lowest median E2E at the lowest load point every candidate ran (with SLOs: the highest
  share of requests meeting them first); confidence from a bootstrap interval of the ratio of medians and
  a Mann-Whitney test on the per-request E2E samples, then launch by launch (`--repeats`): a winner that
  loses one launch is a tie.
- throughput / batch: the highest output tokens/s at any load point (with SLOs: the highest goodput);
  confidence launch by launch when repeated, else from a bootstrap interval of the throughput ratio that
  resamples whole requests (`compare.statistics.throughput_ratio_ci`).

Set-up is weighed against latency (break-even) only where the difference is established (`decisive`).

A candidate with failed requests at the compared point cannot win while one without failures exists, and
every failure is named. What a reader must know before trusting the numbers is `compare/caveats.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from compare.costs import break_even, graph_pool_trade
from compare.datatypes import ARRIVAL_DRIVEN, Pick, SetupReport, describe_phases, key_of
from compare.metrics import busy_seconds, window_rate
from compare.statistics import mann_whitney, ratio_ci, throughput_ratio_ci
from compare.text import plural

NOT_ESTABLISHED = "never: the difference is not established"
MIN_N = 10  # below this many requests a comparison is called low confidence whatever the test says
TIE_MARGIN = 0.02  # a difference whose whole 95% interval lies within 2% either way is a tie, however sure
TIE = f"a tie: the 95% interval lies within {TIE_MARGIN:.0%} either way"


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
    summary: pd.DataFrame, requests: pd.DataFrame, workload: str, slo: dict[str, float], seed: int = 0
) -> Pick:
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
    if at.empty:
        pick.sentences.append(
            f"**Interactive** ({_where(workload, point)}): no backend completed a request at {point}; "
            "nothing to select."
        )
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
    where = point if shared else "each one's lowest load point"
    head = (
        f"**Interactive** ({_where(workload, where)}): **{win.key}** has the lowest median end-to-end "
        "latency, "
        f"{_fmt_s(win.e2e_p50_ms / 1e3)} (TTFT p50 {_fmt_s(win.ttft_p50_ms / 1e3)}, TPOT p50 "
        f"{_fmt_s(win.tpot_p50_ms / 1e3)}, n={win.e2e_n})"
    )
    if slo and np.isfinite(win.goodput_frac):
        head += f", {win.goodput_frac:.0%} of its requests within the SLOs"
    if len(ranked) == 1:
        pick.sentences.append(head + ". It is the only candidate: there is nothing to compare it with.")
        pick.sentences += failures
        return pick
    run = ranked[1]
    pick.runner_up, pick.runner_value = run.key, run.e2e_p50_ms / 1e3
    cmp = compare_latency(requests, win, run, seed)
    pick.ratio, pick.ratio_lo, pick.ratio_hi, pick.p_value = cmp.ratio, cmp.lo, cmp.hi, cmp.p
    pick.confidence, pick.decisive = cmp.within_run, cmp.within_run_decisive
    head += (
        f"; {pick.ratio:.2f}x faster than {run.key} ({_fmt_s(run.e2e_p50_ms / 1e3)}, n={run.e2e_n}; "
        f"95% CI {pick.ratio_lo:.2f}-{pick.ratio_hi:.2f}x, Mann-Whitney {_fmt_p(pick.p_value)}): "
        f"{pick.confidence}."
    )
    head += " " + _launch_check(pick, cmp.launches)
    pick.sentences.append(head)
    pick.sentences += failures
    return pick


@dataclass(frozen=True)
class Comparison:
    """One candidate against another at their compared load points: the one verdict that the decision's
    sentences and the set-up pay-back table both read, so they cannot disagree."""

    ratio: float  # how many times better the first is
    lo: float
    hi: float
    p: float
    within_run: str  # the confidence in words, from the within-run interval and test
    within_run_decisive: bool
    launches: dict[int, float]  # the ratio per launch (--repeats)

    @property
    def decisive(self) -> bool:
        """Established: significant within the run and, when launched more than once, ahead in every
        launch."""
        values = [v for v in self.launches.values() if np.isfinite(v)]
        return self.within_run_decisive and (len(values) < 2 or all(v > 1 for v in values))


def compare_latency(requests: pd.DataFrame, first: Any, other: Any, seed: int = 0) -> Comparison:
    """`first` against `other` by median E2E: bootstrap interval of the ratio, Mann-Whitney, per launch."""
    a = _samples(requests, first, "e2e_s")
    b = _samples(requests, other, "e2e_s")
    ratio, lo, hi = ratio_ci(b, a, "p50", seed=seed)
    p = mann_whitney(a, b)
    confidence = _confidence(lo, hi, p, min(a.size, b.size))
    a_runs = _per_launch(requests, first, lambda g: g["e2e_s"].median())
    b_runs = _per_launch(requests, other, lambda g: g["e2e_s"].median())
    launches = {r: b_runs[r] / a_runs[r] for r in a_runs.keys() & b_runs.keys()}
    decisive = confidence in ("high confidence", "moderate confidence")
    return Comparison(ratio, lo, hi, p, confidence, decisive, launches)


def compare_throughput(
    requests: pd.DataFrame | None, first: Any, other: Any, goodput: bool, seed: int = 0
) -> Comparison:
    """`first` against `other` by output tokens/s (goodput: a single number per point, never established);
    launch by launch when repeated, else from a bootstrap interval of the ratio over whole requests
    (`throughput_ratio_ci`), established when it excludes 1."""
    nan = math.nan
    rates = float(_get(first, "output_tok_s")), float(_get(other, "output_tok_s"))
    ratio = rates[0] / rates[1] if rates[1] > 0 else math.inf
    if goodput:
        return Comparison(
            ratio, nan, nan, nan, "a single measurement per point (no interval for goodput)", False, {}
        )
    launches: dict[int, float] = {}
    if requests is not None:
        a_runs = _per_launch(requests, first, _throughput)
        b_runs = _per_launch(requests, other, _throughput)
        launches = {r: a_runs[r] / b_runs[r] for r in a_runs.keys() & b_runs.keys()}
    if len(launches) >= 2:
        ahead = all(v > 1 for v in launches.values())
        words = (
            f"ahead in each of {plural(len(launches), 'launch', 'launches')}"
            if ahead
            else "not ahead in every launch: a tie"
        )
        return Comparison(ratio, nan, nan, nan, words, ahead, launches)
    if all(_get(row, "mode") in ARRIVAL_DRIVEN for row in (first, other)):
        words = (
            "not established: at open-loop points the offered load sets the rate, so the difference is not "
            "one of capacity (closed-loop points, --concurrency, measure that)"
        )
        return Comparison(ratio, nan, nan, nan, words, False, launches)
    a, b = _ok_requests(requests, first), _ok_requests(requests, other)
    factor = throughput_ratio_ci(
        (a["output_tokens"].to_numpy(dtype=float), busy_seconds(a)),
        (b["output_tokens"].to_numpy(dtype=float), busy_seconds(b)),
        seed=seed,
    )
    lo, hi = ratio * factor[0], ratio * factor[1]
    n = min(len(a), len(b))
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return Comparison(ratio, lo, hi, nan, "no interval available", False, launches)
    shown = f"95% interval {lo:.2f}-{hi:.2f}x, resampling whole requests"
    if n < MIN_N:
        words = f"low confidence (fewer than {MIN_N} requests each; {shown})"
    elif _practically_equal(lo, hi):
        words = f"{TIE} ({shown})"
    elif lo > 1:
        words = f"high confidence ({shown})"
    else:
        words = f"low confidence ({shown}, which holds 1; {_longer_run_hint(ratio, lo, n)})"
    decisive = n >= MIN_N and lo > 1 and not _practically_equal(lo, hi)
    return Comparison(ratio, lo, hi, nan, words, decisive, launches)


def _practically_equal(lo: float, hi: float) -> bool:
    """The whole interval of a ratio lies within `TIE_MARGIN` of 1: whichever is ahead, not by enough to
    choose by (nor to pay back a set-up cost)."""
    return bool(np.isfinite(lo) and np.isfinite(hi) and lo >= 1 / (1 + TIE_MARGIN) and hi <= 1 + TIE_MARGIN)


def _longer_run_hint(ratio: float, lo: float, n: int) -> str:
    """How many requests would make the interval exclude 1, if the spread shrinks as 1/sqrt(n)."""
    if ratio <= 1 or not np.isfinite(lo) or ratio - lo <= 0:
        return "a longer run would not make it a win"
    need = n * ((ratio - lo) / (ratio - 1)) ** 2
    return f"about {plural(math.ceil(need), 'request')} each would establish it if the ratio holds"


def _ok_requests(requests: pd.DataFrame | None, row: Any) -> pd.DataFrame:
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


def _per_launch(requests: pd.DataFrame, row: Any, stat: Any) -> dict[int, float]:
    """`stat` of the row's ok requests in each launch (--repeats) of its backend."""
    return {int(r): float(stat(g)) for r, g in _ok_requests(requests, row).groupby("repeat")}


def _get(row: Any, name: str) -> Any:
    return row[name] if isinstance(row, pd.Series | dict) else getattr(row, name)


def _throughput(group: pd.DataFrame) -> float:
    """Output tokens/s of one launch over its throughput window, as the summary counts it."""
    return window_rate(group)


def _launch_check(pick: Pick, ratios: dict[int, float]) -> str:
    """Does the winner win in every launch? The intervals above cover request-to-request variation within a
    run only; separately launched servers also differ by launch, by the order of the runs and by whatever
    else the machine is doing, and only repeating the launches measures that. Downgrades `pick` when the
    launches disagree."""
    values = [ratios[r] for r in sorted(ratios) if np.isfinite(ratios[r])]
    if len(values) < 2:
        return (
            "(One launch each: the interval covers request-to-request variation within this run, not "
            "launch-to-launch variation or the order of the runs; `--repeats 2` or more alternates the order "
            "and checks the winner in each launch.)"
        )
    shown = ", ".join(f"{v:.2f}x" for v in values)
    if not pick.decisive:
        return f"Per launch: {shown}."
    if all(v > 1 for v in values):
        return f"The same winner in each of {plural(len(values), 'launch', 'launches')} ({shown})."
    pick.decisive = False
    pick.confidence = "not consistent across launches"
    return (
        f"But not in every launch ({shown}): the launches differ as much as the candidates do; treat it as "
        "a tie."
    )


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
) -> Pick:
    pick = Pick("throughput", workload)
    rows = summary[summary["workload"] == workload].copy()
    if rows.empty:
        return pick
    rows["key"] = [key_of(b, v) for b, v in zip(rows["backend"], rows["variant"], strict=True)]
    metric = pick.metric = "goodput_rps" if slo else "output_tok_s"
    rows = rows[rows[metric].notna()]
    if rows.empty:
        return pick
    rows["_fail"] = rows["requests_failed"] / rows["requests"].clip(lower=1)
    best = []
    for _, group in rows.groupby("key", sort=False):
        clean = group[group["_fail"] <= 0.01]
        use = clean if not clean.empty else group
        best.append(use.loc[use[metric].idxmax()])
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
    head = (
        f"**Throughput / batch**{f' ({workload})' if workload else ''}: **{win['key']}** reaches "
        f"{_fmt_rate(win[metric])} {unit} at "
        f"{win['load_point']} (n={int(win['requests_ok'])} ok"
    )
    if not slo and np.isfinite(win.get("output_tok_s_lo", np.nan)):
        head += f"; 95% interval {_fmt_rate(win['output_tok_s_lo'])}-{_fmt_rate(win['output_tok_s_hi'])}"
    head += ")"
    if len(table) == 1:
        pick.sentences.append(head + ". It is the only candidate: there is nothing to compare it with.")
        pick.sentences += failures
        return pick
    run = table.iloc[1]
    pick.runner_up, pick.runner_value = run["key"], float(run[metric])
    pick.ratio = pick.value / pick.runner_value if pick.runner_value > 0 else math.inf
    cmp = compare_throughput(requests, win, run, bool(slo), seed)
    pick.confidence, pick.decisive = cmp.within_run, cmp.decisive
    pick.ratio_lo, pick.ratio_hi = cmp.lo, cmp.hi
    launches = cmp.launches
    if slo:
        head = head[:-1] + f"; {_fmt_rate(win['output_tok_s'])} output tokens/s)"
    if pick.runner_value > 0:
        head += (
            f", {pick.ratio:.2f}x {run['key']}'s {_fmt_rate(run[metric])} at {run['load_point']}: "
            f"{pick.confidence}."
        )
        if len(launches) >= 2:
            head += " Per launch: " + ", ".join(f"{launches[r]:.2f}x" for r in sorted(launches)) + "."
        elif not slo:
            head += " " + _launch_check(pick, launches)
    else:
        head += f"; {run['key']} has no request within the SLOs at any load point."
    pick.sentences.append(head)
    pick.sentences += failures
    return pick


def _where(workload: str, point: str) -> str:
    return f"{workload}, {point}" if workload else point


def _fmt_rate(value: float) -> str:
    if not np.isfinite(value):
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _samples(requests: pd.DataFrame, row: Any, column: str) -> np.ndarray:
    return _ok_requests(requests, row)[column].dropna().to_numpy(dtype=float)


def _confidence(ratio_lo: float, ratio_hi: float, p: float, n: int) -> str:
    if n < MIN_N:
        return f"low confidence (fewer than {MIN_N} requests each)"
    if _practically_equal(ratio_lo, ratio_hi):
        return TIE
    if np.isfinite(ratio_lo) and ratio_lo > 1 and p < 0.01:
        return "high confidence"
    if p < 0.05:
        return "moderate confidence"
    return "not a significant difference: treat it as a tie"


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
    if not pick.decisive:
        out.append(
            f"The difference from {pick.runner_up} is not established, so no set-up cost is paid back."
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
            f"{pick.winner} is also the quicker to start ({win.ready_s:.1f} s against {run.ready_s:.1f} s): "
            "nothing to pay back."
        )
    else:
        out.append(
            f"{pick.winner} takes {be.setup_delta_s:.1f} s longer to be ready than {pick.runner_up} "
            f"({win.ready_s:.1f} s against {run.ready_s:.1f} s) and saves "
            f"{_fmt_s(be.per_request_delta_s)} per "
            f"request ({basis}): it pays back {be.verdict}."
        )
    return out


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


def pair_decisive(
    pick: Pick, summary: pd.DataFrame, requests: pd.DataFrame, first: str, other: str, seed: int = 0
) -> bool:
    """Is `first` established as better than `other` in the pick's class? The pick's own verdict for its
    winner and runner-up; the same comparison for any other pair."""
    if {first, other} == {pick.winner, pick.runner_up}:
        return pick.decisive and first == pick.winner
    a, b = _summary_row(pick, summary, first), _summary_row(pick, summary, other)
    if a is None or b is None:
        return False
    if pick.slo_class == "interactive":
        return compare_latency(requests, a, b, seed).decisive
    return compare_throughput(requests, a, b, pick.metric == "goodput_rps", seed).decisive


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


def selection(
    summary: pd.DataFrame,
    requests: pd.DataFrame,
    setups: dict[str, SetupReport],
    slo: dict[str, float],
    seed: int = 0,
) -> tuple[list[Pick], list[str]]:
    """The picks per workload and SLO class (with their set-up sentences), and the memory trade notes."""
    picks: list[Pick] = []
    if summary.empty:
        return picks, []
    described: set[str] = set()
    for workload in dict.fromkeys(summary["workload"]):
        for pick in (
            interactive_pick(summary, requests, workload, slo, seed),
            throughput_pick(summary, workload, slo, requests, seed),
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
    verdict. A pair whose difference is not established (`pair_decisive`, the decision's own verdict) pays
    nothing back."""
    rows = []
    for pick in picks:
        if pick.slo_class == "capacity":  # ranks rates served, not time per request: nothing to pay back
            continue
        keys = [
            r["key"] for r in pick.ranking if setups.get(r["key"]) and setups[r["key"]].ready_s is not None
        ]
        for i, a in enumerate(keys):
            for b in keys[i + 1 :]:
                per = {k: _per_request_s(pick, summary, k) for k in (a, b)}
                if not all(np.isfinite(v) for v in per.values()):
                    continue
                fast, slow = (a, b) if per[a] <= per[b] else (b, a)
                be = break_even(setups[fast].ready_s, setups[slow].ready_s, per[fast], per[slow])
                verdict = "never (no faster per request)" if be.requests is None else be.verdict
                if be.requests and not pair_decisive(pick, summary, requests, fast, slow, seed):
                    verdict = NOT_ESTABLISHED
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
    each bracket, `compare.capacity`). A winner whose lower end is at or above the runner-up's upper end is
    ahead beyond the search's precision; otherwise the brackets overlap and the order is not established."""
    from compare.capacity import capacity_of
    from compare.sweep import sweep_of

    found = {key: capacity_of(points, slo, percentile) for key, points in sweep_of(summary, requests).items()}
    picks = []
    for workload in dict.fromkeys(summary["workload"]):
        ranked = sorted(
            ((key_of(b, v), c) for (b, v, w), c in found.items() if w == workload and c is not None),
            key=lambda kc: -kc[1].lo,
        )
        if not ranked:
            continue
        pick = Pick("capacity", workload, winner=ranked[0][0], value=ranked[0][1].lo, metric="capacity_rps")
        pick.ranking = [{"key": k, "capacity_rps": c.lo, "bracket_hi_rps": c.hi} for k, c in ranked]
        names = ", ".join(f"{k} {_fmt_bracket(c.lo, c.hi)} requests/s" for k, c in ranked)
        pick.sentences.append(
            f"**Capacity under the SLO** (p{percentile}; {workload}): {names}."
        )
        if len(ranked) > 1:
            (first, a), (second, b) = ranked[0], ranked[1]
            pick.runner_up, pick.runner_value = second, b.lo
            pick.decisive = b.hi is not None and a.lo >= b.hi
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


def _fmt_bracket(lo: float, hi: float | None) -> str:
    return f">= {lo:.4g} (every rate measured met it)" if hi is None else f"[{lo:.4g}, {hi:.4g})"
