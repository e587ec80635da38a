"""The report's plots, as inline SVG (`compare/report/plots.py`): latency against throughput with a sweep's
knee and saturation marked, latency CDFs, medians with their intervals, the set-up phases, and GPU power over
time."""

from __future__ import annotations

import math

from compare.analysis import gpu_energy, sweep
from compare.analysis.metrics import LATENCY
from compare.analysis.results import Results
from compare.common.datatypes import key_of
from compare.report import plots


def sweep_marks(res: Results) -> dict[tuple[str, str], dict[str, str]]:
    """(backend key, workload) -> {load point: "knee" | "saturated"} of a swept run, for the plots."""
    config = res.run.manifest.get("config") or {}
    if not config.get("sweep") or res.summary.empty:
        return {}
    out: dict[tuple[str, str], dict[str, str]] = {}
    for (backend, variant, workload), points in sweep.sweep_of(res.summary, res.requests).items():
        sync, mine = points[0], out.setdefault((key_of(backend, variant), workload), {})
        bend, found = sweep.knee(points, sync), sweep.first_saturated(points, sync)
        if bend is not None:
            mine[bend.label] = "knee"
        if found is not None:
            mine[found[0].label] = "saturated"
    return out


def make_plots(res: Results) -> list[str]:
    s = res.summary.assign(
        key=[key_of(b, v) for b, v in zip(res.summary["backend"], res.summary["variant"], strict=True)]
    )
    req = res.requests.assign(
        key=[key_of(b, v) for b, v in zip(res.requests["backend"], res.requests["variant"], strict=True)]
    )
    out = []
    marks = sweep_marks(res)
    keys = list(dict.fromkeys(s["key"]))
    color = {k: plots.PALETTE[i % len(plots.PALETTE)] for i, k in enumerate(keys)}
    for workload in dict.fromkeys(s["workload"]):
        ws = s[s["workload"] == workload]
        suffix = f" ({workload})" if workload else ""
        for metric, label in (
            (f"{m.name}_p50_ms", f"{m.label} p50 (ms)") for m in LATENCY if m.against_throughput
        ):
            series = []
            for k in keys:
                rows = ws[ws["key"] == k].sort_values("output_tok_s")
                if not rows.empty:
                    series.append(
                        plots.Series(
                            k,
                            rows["output_tok_s"].tolist(),
                            rows[metric].tolist(),
                            color[k],
                            point_labels=rows["load_point"].tolist(),
                            marks=marks.get((k, workload), {}),
                        )
                    )
            out.append(
                plots.line_chart(
                    series, f"Latency against throughput: {label}{suffix}", "output tokens/s", label
                )
            )
        wr = req[(req["workload"] == workload) & (req["status"] == "ok")]
        points = list(dict.fromkeys(ws["load_point"]))
        for metric, label in ((f"{m.name}_s", m.label) for m in LATENCY if m.cdf):
            series = []
            for k in keys:
                for j, point in enumerate(points):
                    sel = wr[(wr["load_point"] == point) & (wr["key"] == k)]
                    if len(sel):
                        series.append(
                            plots.cdf_series(
                                (sel[metric].dropna() * 1e3).tolist(),
                                f"{k} {point}",
                                color[k],
                                plots.DASHES[j % len(plots.DASHES)],
                            )
                        )
            out.append(
                plots.line_chart(
                    series, f"{label} CDF{suffix}", f"{label} (ms)", "fraction of requests", x_from_zero=False
                )
            )
        for metric, label in ((f"{m.name}_p50_ms", f"{m.label} p50") for m in LATENCY if m.bars):
            bars = []
            for k in keys:
                vals, los, his = [], [], []
                for point in points:
                    row = ws[(ws["load_point"] == point) & (ws["key"] == k)]
                    r = row.iloc[0] if len(row) else None
                    vals.append(float(r[metric]) if r is not None else math.nan)
                    los.append(float(r.get(metric + "_lo", math.nan)) if r is not None else math.nan)
                    his.append(float(r.get(metric + "_hi", math.nan)) if r is not None else math.nan)
                bars.append((k, color[k], vals, los, his))
            out.append(plots.bar_chart(points, bars, f"{label} with 95% intervals{suffix}", f"{label} (ms)"))
    rows = []
    for key, st in res.setups.items():
        phases = [
            (p.name, max(0.0, (p.end_s or 0.0) - p.seconds), p.end_s or 0.0)
            for p in st.phases
            if p.end_s is not None and p.name != "server_ready"
        ]
        if phases or st.ready_s:
            rows.append((key, phases, st.ready_s))
    out.append(plots.timeline(rows, "Set-up phases (spawn to healthy)"))
    return out + power_plots(res)


MAX_PLOTTED_SAMPLES = 600  # per line of a power plot: longer points are thinned evenly


POWER_TITLE = "GPU power over time"


def power_plots(res: Results) -> list[str]:
    """Per backend, the power its GPUs drew (summed) against seconds since each load point's first sample,
    taken as its load started: one line per point."""
    t = res.telemetry
    if t.empty:
        return []
    points = {p["run_id"]: p for p in res.run.manifest.get("points", [])}
    several = {k: len({p.get(k) for p in points.values()}) > 1 for k in ("workload", "repeat")}
    lines: dict[str, list[plots.Series]] = {}
    for run_id, samples in t.groupby("run_id", sort=False):
        p = points.get(str(run_id))
        if p is None:
            continue
        ticks = gpu_energy.tick_totals(samples)
        ticks = ticks.iloc[:: max(1, math.ceil(len(ticks) / MAX_PLOTTED_SAMPLES))]
        label = (
            p["load_point"]
            + (f" {p['workload']}" if several["workload"] else "")
            + (f" (launch {int(p.get('repeat', 0)) + 1})" if several["repeat"] else "")
        )
        mine = lines.setdefault(key_of(p["backend"], p["variant"]), [])
        color = plots.PALETTE[len(mine) % len(plots.PALETTE)]
        dash = plots.DASHES[len(mine) // len(plots.PALETTE) % len(plots.DASHES)]
        seconds = (ticks["t"] - ticks["t"].iloc[0]).tolist()
        mine.append(plots.Series(label, seconds, ticks["power_w"].tolist(), color, dash, markers=False))
    return [
        plots.line_chart(
            series,
            f"{POWER_TITLE}: {key}",
            "seconds since the load point started",
            "power (W), summed over its GPUs",
        )
        for key, series in lines.items()
    ]
