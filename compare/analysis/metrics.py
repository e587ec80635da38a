"""Every metric of a run, computed from the request records with the declared definitions
(`workloads.timing`; docs/design.md, Metric definitions).

`LATENCY` declares each latency metric once; `request_table` is one row per request, `itl_table` every
inter-token gap, and `summarize` one row per (backend, variant, workload, load point): counts, latency
statistics with intervals (`compare.analysis.statistics`), throughput over the throughput window, goodput,
offered against achieved rate, client lag and the token-count cross-checks. Warm-up requests are never
counted.

The throughput window every rate is counted over is defined in `compare/common/throughput_window.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from compare.analysis.gpu_energy import COLUMNS as GPU_COLUMNS
from compare.analysis.gpu_energy import Window, window_columns
from compare.analysis.statistics import (
    CI_LEVEL,
    N_BOOT,
    PERCENTILES,
    WindowSample,
    bootstrap_ci,
    describe,
    quantile_ci,
    throughput_ci,
)
from compare.common.datatypes import PointInfo, point_info_from_label
from compare.common.throughput_window import (
    IMPORTED,
    ThroughputWindow,
    concurrency_of,
    throughput_window,
)
from workloads import timing
from workloads.records import ErrorKind, RequestRecord

GROUP_KEYS = ["backend", "variant", "workload", "load_point"]
#: one row of summary.csv, as `DataFrame.iterrows` gives it or as a dict of its columns
SummaryRow = pd.Series | Mapping[str, Any]


@dataclass(frozen=True)
class LatencyMetric:
    """A latency metric, declared once: the per-request table, summary.csv, the report's results table,
    plots and definitions, and `compare diff` all read this entry, so a new metric is one more of them."""

    name: str  # column prefix: `{name}_s` per request, `{name}_p50_ms` and the like in summary.csv
    label: str  # as the reports write it
    definition: str  # the report's definition, one sentence or two
    per_request: Callable[[RequestRecord], float | None] | None = None  # seconds; None: ITL, from `itl_table`
    results: bool = True  # p50 [interval] and p99 in the report's results table
    against_throughput: bool = False  # p50 plotted against output tokens/s
    cdf: bool = False  # the per-request distribution plotted
    bars: bool = False  # p50 per load point plotted with its interval
    diff: bool = False  # compared run against run by `compare diff` (per-request metrics only)
    # the from-send metric this one measures again from the intended (scheduled) send instead; such a
    # metric is kept only at points with intended send times (`PointInfo.intended_sends`), empty elsewhere
    intended_of: str = ""

    def of(self, record: RequestRecord) -> float | None:
        """Its seconds for one request (None for ITL, which has a table of its own)."""
        return self.per_request(record) if self.per_request is not None else None


_INTENDED = (
    "so a late send (client lag) counts as time waited, as it would for a user arriving on schedule "
    "(coordinated omission): the from-send value plus the lag. Open-loop and trace points only (`--rate`, "
    "`--trace`): a closed loop sends each request when a previous one ends, so it has no intended time; "
    "left empty there."
)

LATENCY: tuple[LatencyMetric, ...] = (
    LatencyMetric(
        "ttft",
        "TTFT",
        "first event carrying a generated token minus the time the client sent the request (role-only "
        "and empty events do not count).",
        timing.ttft,
        against_throughput=True,
        cdf=True,
        bars=True,
        diff=True,
    ),
    LatencyMetric(
        "tpot",
        "TPOT",
        "(E2E − TTFT) / (output tokens − 1).",
        timing.tpot,
        against_throughput=True,
        cdf=True,
        bars=True,
        diff=True,
    ),
    LatencyMetric(
        "itl",
        "ITL",
        "gaps between token events; an event with k tokens counts as k gaps of gap/k (per-event view in "
        "summary.csv: itl_event_*). Its interval resamples whole requests.",
    ),
    LatencyMetric(
        "e2e",
        "E2E",
        "last token event minus the time the client sent the request.",
        timing.e2e,
        bars=True,
        diff=True,
    ),
    LatencyMetric(
        "ttft_intended",
        "TTFT from intended send",
        f"the TTFT's first token event minus the time the schedule meant the request to be sent, {_INTENDED}",
        timing.ttft_intended,
        results=False,
        diff=True,
        intended_of="ttft",
    ),
    LatencyMetric(
        "e2e_intended",
        "E2E from intended send",
        f"the E2E's last token event minus the time the schedule meant the request to be sent, {_INTENDED}",
        timing.e2e_intended,
        results=False,
        diff=True,
        intended_of="e2e",
    ),
)
PER_REQUEST = tuple(m for m in LATENCY if m.per_request is not None)


# -- per request ------------------------------------------------------------------------------------------


def status_of(record: RequestRecord) -> str:
    if record.error_kind is None:
        return "ok"
    return "cancelled" if record.error_kind == ErrorKind.CANCELLED else "failed"


def request_table(
    records: Iterable[RequestRecord], points: Mapping[str, PointInfo] | None = None
) -> pd.DataFrame:
    """One row per request with its metrics in seconds (NaN where the record has no such time)."""
    points = points or {}
    rows = []
    for r in records:
        info = points.get(r.run_id) or point_info_from_label(r.load_point)
        lag = timing.client_lag(r) if info.lag_measured else None
        intended = info.intended_sends
        rows.append(
            {
                "run_id": r.run_id,
                "request_id": r.request_id,
                "backend": r.backend,
                "variant": r.variant,
                "workload": info.workload,
                "load_point": r.load_point,
                "repeat": info.repeat,
                "warmup": r.warmup,
                "status": status_of(r),
                "error_kind": None if r.error_kind is None else str(r.error_kind),
                "prompt_tokens": r.prompt_tokens,
                "input_tokens": r.usage_prompt_tokens
                if r.usage_prompt_tokens is not None
                else r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "wanted_output_tokens": r.wanted_output_tokens,
                "output_length_forced": r.output_length_forced,
                "output_tokens_source": r.output_tokens_source,
                "token_count_mismatch": r.token_count_mismatch,
                "event_tokens": r.event_tokens,
                "usage_tokens": r.usage_completion_tokens,
                "retokenized_tokens": r.retokenized_tokens,
                "session_id": r.session_id,
                "turn": r.turn,
                "scheduled_s": r.scheduled_s,
                "send_s": _nan(r.send_s),
                "end_s": _nan(r.end_s),
                **{
                    f"{m.name}_s": _nan(m.of(r) if intended or not m.intended_of else None)
                    for m in PER_REQUEST
                },
                "lag_s": _nan(lag),
                "n_token_events": sum(1 for _, n, _ in r.events if n > 0),
            }
        )
    columns = [
        "run_id",
        "request_id",
        "backend",
        "variant",
        "workload",
        "load_point",
        "repeat",
        "warmup",
        "status",
        "error_kind",
        "prompt_tokens",
        "input_tokens",
        "output_tokens",
        "wanted_output_tokens",
        "output_length_forced",
        "output_tokens_source",
        "token_count_mismatch",
        "event_tokens",
        "usage_tokens",
        "retokenized_tokens",
        "session_id",
        "turn",
        "scheduled_s",
        "send_s",
        "end_s",
        *(f"{m.name}_s" for m in PER_REQUEST),
        "lag_s",
        "n_token_events",
    ]
    return pd.DataFrame(rows, columns=columns)


def busy_seconds(requests: pd.DataFrame) -> np.ndarray:
    """Each request's time in service, send to end (the legacy throughput interval's input)."""
    return (requests["end_s"] - requests["send_s"]).to_numpy(dtype=float)


def _nan(value: float | None) -> float:
    return np.nan if value is None else float(value)


def itl_table(records: Sequence[RequestRecord], per_event: bool = False) -> pd.DataFrame:
    """Every inter-token gap of every record: columns `row` (index into `records`) and `gap_s`.

    Per token (default): events of a record that arrived together (the same time) are one arrival, and an
    arrival with k tokens contributes k gaps of (its gap)/k, exactly `timing.itl`.
    `per_event`: one gap per token event after the first (`timing.itl_per_event`)."""
    rows, times, counts = [], [], []
    for i, r in enumerate(records):
        for at, tokens, _ in r.events:
            if tokens > 0:
                rows.append(i)
                times.append(at)
                counts.append(tokens)
    if not rows:
        return pd.DataFrame({"row": np.array([], dtype=np.int64), "gap_s": np.array([], dtype=float)})
    row = np.asarray(rows, dtype=np.int64)
    t = np.asarray(times, dtype=float)
    n = np.asarray(counts, dtype=np.int64)
    if not per_event:  # each run of events of one record at one time is one arrival: its time, their tokens
        starts = np.flatnonzero(np.r_[True, (row[1:] != row[:-1]) | (t[1:] != t[:-1])])
        row, t, n = row[starts], t[starts], np.add.reduceat(n, starts)
    same = row[1:] == row[:-1]  # consecutive token events (arrivals) of one record
    gaps = (t[1:] - t[:-1])[same]
    owner = row[1:][same]
    if per_event:
        return pd.DataFrame({"row": owner, "gap_s": gaps})
    k = n[1:][same]
    return pd.DataFrame({"row": np.repeat(owner, k), "gap_s": np.repeat(gaps / k, k)})


def output_begin(requests: pd.DataFrame) -> np.ndarray:
    """Where each request's output span begins: its first token (send + TTFT), or its send without one."""
    sends = requests["send_s"].to_numpy(dtype=float)
    return sends + np.nan_to_num(requests["ttft_s"].to_numpy(dtype=float), nan=0.0)


def window_of(requests: pd.DataFrame, concurrency: int | None = None) -> ThroughputWindow:
    """`throughput_window` of one run's measured requests (`request_table` rows); the concurrency from the
    rows' load point label unless given (0: an open loop)."""
    if concurrency is None and len(requests):
        concurrency = concurrency_of(requests["load_point"].iloc[0])
    concurrency = concurrency or None
    begins = output_begin(requests)
    return throughput_window(requests["send_s"], requests["end_s"], concurrency, begin_s=begins)


def window_sample(
    requests: pd.DataFrame, amount: str | None = "output_tokens", window: ThroughputWindow | None = None
) -> WindowSample:
    """What a throughput window counts of one run's measured requests (`request_table` rows): its finished
    ok requests with their output tokens (`amount` None: 1 each, for requests/s), and the window."""
    window = window or window_of(requests)
    ok = requests[(requests["status"] == "ok") & requests["end_s"].notna()]
    amounts = np.ones(len(ok)) if amount is None else ok[amount].to_numpy(dtype=float)
    ends = ok["end_s"].to_numpy(dtype=float)
    return WindowSample(output_begin(ok), ends, amounts, window.start, window.end)


def window_rate(requests: pd.DataFrame, amount: str | None = "output_tokens") -> float:
    """Output tokens/s (`amount` None: requests/s) of one run's measured requests over its throughput
    window, as summary.csv counts them."""
    sample = window_sample(requests, amount)
    seconds = sample.seconds
    return sample.total / seconds if np.isfinite(seconds) and seconds > 0 else np.nan


def window_samples(requests: pd.DataFrame, amount: str | None = "output_tokens") -> list[WindowSample]:
    """`window_sample` of each run (`run_id`) of a point's measured requests."""
    return [window_sample(part, amount) for _, part in requests.groupby("run_id", sort=False)]


# -- statistics -------------------------------------------------------------------------------------------


def latency_columns(
    prefix: str, values: np.ndarray, clusters: np.ndarray | None, seed: int, n_boot: int
) -> dict[str, float]:
    """`{prefix}_n`, `_mean_ms`, `_std_ms`, `_p50_ms` ... and `_lo`/`_hi` interval columns, in ms (all NaN
    when `n_boot` is 0, or without values).

    The mean's interval is a percentile bootstrap. A percentile's, for independent values (one per request),
    is the distribution-free order-statistic interval (`quantile_ci`): an end the sample cannot give is
    -inf/+inf (unbounded), never the sample's extreme. ITL's gaps within one request are dependent, so the
    order-statistic interval (which assumes independent values) would be too narrow; its percentiles keep
    the cluster bootstrap over whole requests, but an end at or beyond the sample's extreme, which a
    bootstrap cannot exceed, is reported unbounded."""
    d = describe(values)
    out: dict[str, float] = {f"{prefix}_n": d["n"]}
    ci = bootstrap_ci(values, clusters, n_boot=n_boot, seed=seed) if n_boot else {}
    for stat in ("mean", "std", *(f"p{q}" for q in PERCENTILES)):
        out[f"{prefix}_{stat}_ms"] = d[stat] * 1e3
        if stat == "std":
            continue
        lo, hi = ci.get(stat, (np.nan, np.nan))
        if stat != "mean" and n_boot and values.size:
            if clusters is None:
                lo, hi = quantile_ci(values, int(stat[1:]) / 100)
            else:
                lo = -np.inf if not lo > values.min() else lo
                hi = np.inf if not hi < values.max() else hi
        out[f"{prefix}_{stat}_ms_lo"] = lo * 1e3
        out[f"{prefix}_{stat}_ms_hi"] = hi * 1e3
    return out


def meets_slo(frame: pd.DataFrame, slo: Mapping[str, float]) -> pd.Series:
    """Per request: ok and within every SLO given. A single-token output has no TPOT and cannot miss it;
    an ok request without a token has no TTFT and misses a TTFT or E2E SLO."""
    ok = frame["status"] == "ok"
    for key, limit in slo.items():
        col = frame[f"{key}_s"]
        ok &= (col <= limit) | (col.isna() if key == "tpot" else False)
    return ok


# -- aggregation ------------------------------------------------------------------------------------------


def summarize(
    records: Sequence[RequestRecord],
    points: Mapping[str, PointInfo] | None = None,
    slo: Mapping[str, float] | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
    telemetry: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per (backend, variant, workload, load point) of the measured (non-warm-up) records; the GPU
    columns from `telemetry`'s samples (`RunDir.telemetry()`), NaN without them."""
    points = dict(points or {})
    slo = dict(slo or {})
    measured = [r for r in records if not r.warmup]
    t0 = {r.run_id: r.t0_monotonic for r in measured}  # one per run: its load generator's start stamp
    table = request_table(measured, points)
    gaps = itl_table(measured)
    gaps_event = itl_table(measured, per_event=True)
    rows = []
    if table.empty:
        return pd.DataFrame(columns=summary_columns())
    for key, group in table.groupby(GROUP_KEYS, sort=False, dropna=False):
        row = _summarize_group(
            dict(zip(GROUP_KEYS, key, strict=True)), group, gaps, gaps_event, points, slo, n_boot, seed
        )
        rows.append(row | _gpu_columns(group, t0, telemetry, points))
    out = pd.DataFrame(rows)
    return out[
        [c for c in summary_columns() if c in out.columns]
        + [c for c in out.columns if c not in summary_columns()]
    ]


def _summarize_group(
    key: dict[str, Any],
    group: pd.DataFrame,
    gaps: pd.DataFrame,
    gaps_event: pd.DataFrame,
    points: Mapping[str, PointInfo],
    slo: Mapping[str, float],
    n_boot: int,
    seed: int,
) -> dict[str, Any]:
    run_ids = list(dict.fromkeys(group["run_id"]))
    infos = [points.get(rid) or point_info_from_label(key["load_point"]) for rid in run_ids]
    info = infos[0]
    ok = group[group["status"] == "ok"]
    row: dict[str, Any] = dict(key)
    row.update(
        {
            "mode": info.mode,
            "concurrency": info.concurrency,
            "rate": info.rate,
            "arrival": info.arrival,
            "source": info.source,
            "runs": len(run_ids),
            "interrupted": any(i.interrupted for i in infos),
            "requests": len(group),
            "requests_ok": len(ok),
            "requests_failed": int((group["status"] == "failed").sum()),
            "requests_cancelled": int((group["status"] == "cancelled").sum()),
            "errors": "; ".join(f"{k}: {v}" for k, v in group["error_kind"].dropna().value_counts().items()),
        }
    )
    for metric in PER_REQUEST:
        values = ok[f"{metric.name}_s"].dropna().to_numpy(dtype=float)
        row.update(latency_columns(metric.name, values, None, seed, n_boot))
    ok_rows = ok.index.to_numpy()
    mine = gaps[gaps["row"].isin(ok_rows)]  # ITL, the one metric per gap: its interval resamples requests
    row.update(
        latency_columns("itl", mine["gap_s"].to_numpy(dtype=float), mine["row"].to_numpy(), seed, n_boot)
    )
    per_event = gaps_event[gaps_event["row"].isin(ok_rows)]["gap_s"].to_numpy(dtype=float)
    d = describe(per_event)
    row.update(
        {"itl_event_n": d["n"], "itl_event_p50_ms": d["p50"] * 1e3, "itl_event_p99_ms": d["p99"] * 1e3}
    )

    row.update(_throughput_columns(group, ok, run_ids, infos, slo, n_boot, seed))
    row.update(_send_columns(group, run_ids, info))
    row.update(_token_columns(ok))
    return row


def _throughput_columns(
    group: pd.DataFrame,
    ok: pd.DataFrame,
    run_ids: list[str],
    infos: list[PointInfo],
    slo: Mapping[str, float],
    n_boot: int,
    seed: int,
) -> dict[str, Any]:
    """Throughput over each run's throughput window (`throughput_window`), summed over the point's runs
    (repeats of a point add up): the ok requests' time shares inside each window (with their tokens) over
    the windows' length; `window` says which kind of window was used, `window_requests` how many requests'
    worth it counted. Goodput likewise."""
    row: dict[str, Any] = {}
    duration, kinds = 0.0, []
    share = pd.Series(0.0, index=group.index)
    samples = []
    for rid, pinfo in zip(run_ids, infos, strict=True):
        part = group[group["run_id"] == rid]
        if pinfo.duration_s is not None:  # imported: the other tool's duration, every request counted
            kind, seconds = IMPORTED, pinfo.duration_s
            share[part.index] = 1.0
        else:
            window = window_of(part, concurrency_of("", pinfo) or 0)
            kind, seconds = window.kind, window.seconds
            share[part.index] = window.shares(output_begin(part), part["end_s"])
            samples.append(window_sample(part, "output_tokens", window))
        kinds.append(kind)
        duration += seconds if np.isfinite(seconds) else 0.0
    w = share[ok.index]
    row["duration_s"] = duration if duration > 0 else np.nan
    row["window"] = ", ".join(dict.fromkeys(kinds))
    row["window_requests"] = float(w.sum())
    row["input_tokens"] = int(ok["input_tokens"].sum())
    row["output_tokens"] = int(ok["output_tokens"].sum())
    row["input_tok_s"] = float((ok["input_tokens"] * w).sum()) / duration if duration > 0 else np.nan
    row["output_tok_s"] = float((ok["output_tokens"] * w).sum()) / duration if duration > 0 else np.nan
    row["request_rps"] = float(w.sum()) / duration if duration > 0 else np.nan
    lo, hi = throughput_ci(samples, level=CI_LEVEL) if n_boot and samples else (np.nan, np.nan)
    row["output_tok_s_lo"], row["output_tok_s_hi"] = row["output_tok_s"] * lo, row["output_tok_s"] * hi
    if slo:
        meets = meets_slo(group, slo)
        row["goodput_n"] = int(meets.sum())
        row["goodput_rps"] = float(share[meets].sum()) / duration if duration > 0 else np.nan
        row["goodput_frac"] = row["goodput_n"] / len(group) if len(group) else np.nan
    else:
        row["goodput_n"], row["goodput_rps"], row["goodput_frac"] = np.nan, np.nan, np.nan
    return row


def _gpu_columns(
    group: pd.DataFrame,
    t0: Mapping[str, float],
    telemetry: pd.DataFrame | None,
    points: Mapping[str, PointInfo],
) -> dict[str, Any]:
    """GPU energy, power, memory and utilisation over each run's throughput window (the throughput
    columns' window) and the output tokens it counts, on the samples' clock: the records' start stamp plus
    the window's offsets."""
    windows = []
    if telemetry is not None and len(telemetry):
        for rid, part in group.groupby("run_id", sort=False):
            run_id = str(rid)
            concurrency = concurrency_of(part["load_point"].iloc[0], points.get(run_id))
            window = window_of(part, concurrency or 0)
            shares = window.shares(output_begin(part), part["end_s"]) * (part["status"] == "ok").to_numpy()
            tokens = float((part["output_tokens"].to_numpy(dtype=float) * shares).sum())
            windows.append(Window(run_id, t0[run_id] + window.start, t0[run_id] + window.end, tokens))
    return window_columns(telemetry, windows)


def _send_columns(group: pd.DataFrame, run_ids: list[str], info: PointInfo) -> dict[str, Any]:
    """Offered against achieved send rate, and client lag."""
    row: dict[str, Any] = {}
    row["offered_rps"] = info.rate if info.rate is not None else np.nan
    achieved = []
    for rid in run_ids:
        sends = np.sort(group.loc[group["run_id"] == rid, "send_s"].dropna().to_numpy(dtype=float))
        if sends.size > 1 and sends[-1] > sends[0]:
            achieved.append((sends.size - 1) / (sends[-1] - sends[0]))
    row["achieved_rps"] = float(np.mean(achieved)) if achieved else np.nan
    lags = group["lag_s"].dropna().to_numpy(dtype=float)
    row["lag_n"] = int(lags.size)
    row["lag_p50_ms"] = float(np.percentile(lags, 50)) * 1e3 if lags.size else np.nan
    row["lag_p99_ms"] = float(np.percentile(lags, 99)) * 1e3 if lags.size else np.nan
    row["lag_max_ms"] = float(lags.max()) * 1e3 if lags.size else np.nan
    return row


def _token_columns(ok: pd.DataFrame) -> dict[str, Any]:
    """Token counts: the cross-check flags and means."""
    row: dict[str, Any] = {}
    row["token_mismatches"] = int(ok["token_count_mismatch"].sum())
    both = ok["usage_tokens"].notna()
    row["token_mismatches_server"] = int((both & (ok["usage_tokens"] != ok["event_tokens"])).sum())
    bad = ok[ok["token_count_mismatch"]]
    if len(bad):
        first = bad.iloc[0]
        counts = [
            f"{name} {int(first[col])}"
            for name, col in (
                ("usage", "usage_tokens"),
                ("stream", "event_tokens"),
                ("re-tokenised", "retokenized_tokens"),
            )
            if pd.notna(first[col])
        ]
        row["mismatch_example"] = f" (e.g. {', '.join(counts)})"
    forced = ok[ok["output_length_forced"]]
    row["output_short"] = int((forced["output_tokens"] < forced["wanted_output_tokens"]).sum())
    row["output_tokens_from_usage"] = int((ok["output_tokens_source"] == "usage").sum())
    row["input_tokens_mean"] = float(ok["input_tokens"].mean()) if len(ok) else np.nan
    row["output_tokens_mean"] = float(ok["output_tokens"].mean()) if len(ok) else np.nan
    return row


def summary_columns() -> list[str]:
    """The leading columns of summary.csv, in order (interval and detail columns follow)."""
    lat = []
    for name in (m.name for m in LATENCY):
        lat += [f"{name}_n", f"{name}_mean_ms", f"{name}_std_ms"] + [f"{name}_p{q}_ms" for q in PERCENTILES]
    return [
        *GROUP_KEYS,
        "mode",
        "concurrency",
        "rate",
        "arrival",
        "requests",
        "requests_ok",
        "requests_failed",
        "requests_cancelled",
        "errors",
        *lat,
        "itl_event_n",
        "itl_event_p50_ms",
        "itl_event_p99_ms",
        "duration_s",
        "window",
        "window_requests",
        "input_tokens",
        "output_tokens",
        "input_tok_s",
        "output_tok_s",
        "request_rps",
        "goodput_n",
        "goodput_rps",
        "goodput_frac",
        "offered_rps",
        "achieved_rps",
        "lag_n",
        "lag_p50_ms",
        "lag_p99_ms",
        "lag_max_ms",
        "token_mismatches",
        "token_mismatches_server",
        "output_short",
        "output_tokens_from_usage",
        "input_tokens_mean",
        "output_tokens_mean",
        *GPU_COLUMNS,
        "source",
        "runs",
        "interrupted",
    ]
