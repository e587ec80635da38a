"""The report's sections of numbers: the plots, the results per load point, GPU energy, latency from the
intended send, TTFT by turn, normalised costs, and the definitions of every column."""

from __future__ import annotations

import numpy as np

from compare.analysis.metrics import LATENCY
from compare.analysis.results import Results
from compare.analysis.turns import TURN
from compare.common.datatypes import ARRIVAL_DRIVEN, key_of
from compare.common.throughput_window import WINDOW_DEFINITION
from compare.report.blocks import Block, number, with_interval
from compare.report.charts import make_plots


def plots_section(res: Results) -> list[Block]:
    if res.summary.empty:
        return []
    return [("h2", "Plots"), *(("svg", svg) for svg in make_plots(res))]


def results_section(res: Results) -> list[Block]:
    """One row per load point: counts, each latency metric's p50 [interval] and p99 (`LATENCY`), rates."""
    s = res.summary
    shown = [m for m in LATENCY if m.results]
    header = [
        "backend",
        "workload",
        "load",
        "ok/failed/cancelled",
        *(f"{m.label} p{q}" for m in shown for q in (50, 99)),
        "out tok/s",
        "in tok/s",
        "req/s",
        "goodput req/s",
        "offered / sent req/s",
        "lag p99 ms",
        "token mismatches",
    ]
    rows = [
        [
            key_of(r["backend"], r["variant"]),
            r["workload"],
            r["load_point"],
            f"{int(r['requests_ok'])}/{int(r['requests_failed'])}/{int(r['requests_cancelled'])}",
            *(
                cell
                for m in shown
                for cell in (with_interval(r, f"{m.name}_p50_ms"), number(r[f"{m.name}_p99_ms"]))
            ),
            number(r["output_tok_s"]),
            number(r["input_tok_s"]),
            number(r["request_rps"], 2),
            number(r["goodput_rps"], 2),
            f"{number(r['offered_rps'], 2)} / {number(r['achieved_rps'], 2)}",
            number(r["lag_p99_ms"], 2),
            str(int(r["token_mismatches"])),
        ]
        for _, r in s.iterrows()
    ]
    counts = (
        "; ".join(
            f"{key_of(r['backend'], r['variant'])} {r['load_point']}: "
            + ", ".join(f"{m.label} {int(r[f'{m.name}_n'])}" for m in shown)
            for _, r in s.iterrows()
        )
        if not s.empty
        else "–"
    )
    explained = (
        "Latencies in ms over the ok requests: value [95% interval; unbounded where too few values bound "
        "it]; n is the number of values. Throughput over the steady window (Definitions)."
    )
    return [
        ("h2", "Results per load point"),
        ("p", explained),
        ("table", (header, rows)),
        ("p", "n per metric: " + counts),
    ]


GPU_HEADER = [
    "backend",
    "workload",
    "load",
    "energy (J)",
    "J per output token",
    "power mean (W)",
    "power max (W)",
    "memory peak (GiB)",
    "utilisation mean (%)",
    "energy from",
]


def _has_gpu_telemetry(res: Results) -> bool:
    s = res.summary
    return not s.empty and "gpu_energy_j" in s and bool(s["gpu_energy_j"].notna().any())


def gpu_energy_section(res: Results) -> list[Block]:
    """Energy, power, memory and utilisation of each backend's GPUs per load point, where NVML sampled them
    (compare/analysis/gpu_energy.py); nothing without telemetry."""
    if not _has_gpu_telemetry(res):
        return []
    rows = [
        [
            key_of(r["backend"], r["variant"]),
            r["workload"],
            r["load_point"],
            number(r["gpu_energy_j"], 1),
            number(r["gpu_joules_per_out_token"], 3),
            number(r["gpu_power_mean_w"], 1),
            number(r["gpu_power_max_w"], 1),
            number(r["gpu_mem_peak_gib"], 2),
            number(r["gpu_util_mean_pct"], 0),
            r["gpu_energy_source"] if isinstance(r["gpu_energy_source"], str) else "–",
        ]
        for _, r in res.summary.iterrows()
    ]
    entry = res.run.manifest.get("gpu_telemetry") or {}
    sampled = "; ".join(
        f"{key}: GPU {', '.join(map(str, b['gpus'])) or 'none'} ({b['chosen']})"
        for key, b in (entry.get("backends") or {}).items()
    )
    definitions = [
        "Energy: what the backend's GPUs used over the point's throughput window (the steady window of the "
        "throughput columns), summed over its GPUs (and launches): the difference of NVML's "
        "total-energy counter (nvmlDeviceGetTotalEnergyConsumption) at the window's ends, interpolated "
        "between samples; on a GPU without that counter, the trapezoid integral of its power readings "
        "(energy from: power integral).",
        "J per output token: that energy over the output tokens of the ok requests the window counts.",
        "Power mean: that energy over the window's length. Power max: the highest of NVML's power readings "
        "(nvmlDeviceGetPowerUsage; many GPUs average it over the last second), summed over the GPUs.",
        "Memory peak: the most device memory in use (nvmlDeviceGetMemoryInfo: every process on the GPU, "
        "not the server alone), summed over the GPUs. Utilisation: NVML's GPU utilisation (the share of "
        "time a kernel ran), averaged over GPUs and samples.",
        "Power max, memory peak and utilisation count the samples from the one before the window to the one "
        "after it.",
    ]
    intro = f"NVML sampled every {entry.get('interval_s', '?')} s" + (f"; {sampled}." if sampled else ".")
    return [("h2", "GPU energy and power"), ("p", intro), ("table", (GPU_HEADER, rows)), ("ul", definitions)]


def intended_latency_section(res: Results) -> list[Block]:
    """At open-loop and trace points: each from-send latency beside the same one from the intended send,
    so a client that sent late cannot hide the queueing its lateness stood for."""
    s = res.summary
    rows_in = s[s["mode"].isin(ARRIVAL_DRIVEN)] if not s.empty else s
    if rows_in.empty:
        return []
    by_name = {m.name: m for m in LATENCY}
    pairs = [(by_name[m.intended_of], m) for m in LATENCY if m.intended_of]
    header = [
        "backend",
        "workload",
        "load",
        "lag p99 ms",
        *(f"{one.label} p{q}" for pair in pairs for one in pair for q in (50, 99)),
    ]
    rows = [
        [
            key_of(r["backend"], r["variant"]),
            r["workload"],
            r["load_point"],
            number(r["lag_p99_ms"], 2),
            *(
                cell
                for pair in pairs
                for one in pair
                for cell in (with_interval(r, f"{one.name}_p50_ms"), number(r[f"{one.name}_p99_ms"]))
            ),
        ]
        for _, r in rows_in.iterrows()
    ]
    explained = (
        "Open-loop and trace points: latency from the time the client sent each request, and from the time "
        "the schedule meant it to be sent (ms, value [95% interval]). The two differ by the client lag; "
        "where they differ much, the client fell behind the offered load and the from-send numbers leave "
        "out waiting a user arriving on schedule would have had. Closed-loop points have no intended send "
        "time and are not listed."
    )
    return [("h2", "Latency from the intended send"), ("p", explained), ("table", (header, rows))]


NORMALISED_COLUMNS = [
    "backend",
    "workload",
    "load",
    "p50 TTFT per 1k input tokens, c=1 only (ms)",
    "TPOT p50 (ms)",
    "roofline TPOT (ms)",
    "of roofline",
    "$ per 1M output tokens",
]


def turns_section(res: Results) -> list[Block]:
    """Multi-turn sessions: TTFT by turn index at each load point (compare/analysis/turns.py), none without
    them."""
    t = res.turns
    if t.empty:
        return []
    header = [
        "backend",
        "workload",
        "load",
        "turn (1 = first)",
        "n",
        "prompt tokens",
        "TTFT p50",
        "TTFT p90",
        "E2E p50",
    ]
    rows = [
        [
            key_of(r["backend"], r["variant"]),
            r["workload"],
            r["load_point"],
            str(int(r[TURN])),
            str(int(r["n"])),
            number(r["prompt_tokens_mean"], 0),
            number(r["ttft_p50_ms"]),
            number(r["ttft_p90_ms"]),
            number(r["e2e_p50_ms"]),
        ]
        for _, r in t.iterrows()
    ]
    explained = (
        "Each turn of a session carries the whole conversation so far (earlier user turns and the model's "
        "answers), so its prompt grows turn by turn. A backend that serves the earlier turns from its prefix "
        "cache keeps the later turns' TTFT near the first turn's; without one it grows with the prompt. "
        "Latencies in ms over the ok requests of each turn (turns.csv has them)."
    )
    return [("h2", "TTFT by turn"), ("p", explained), ("table", (header, rows))]


def normalised_section(res: Results) -> list[Block]:
    """Prefill per 1k input tokens, TPOT against the roofline, cost per million output tokens."""
    config = res.run.manifest.get("config") or {}
    rows = []
    for _, r in res.summary.iterrows():
        eff = r["roofline_efficiency"]
        rows.append(
            [
                key_of(r["backend"], r["variant"]),
                r["workload"],
                r["load_point"],
                number(r["prefill_ms_per_1k_in"]),
                number(r["tpot_p50_ms"]),
                number(r["roofline_tpot_ms"], 3),
                f"{eff:.0%}" if np.isfinite(eff) else "–",
                number(r["usd_per_1m_out"], 3),
            ]
        )
    blocks: list[Block] = [
        ("h2", "Normalised"),
        ("table", (NORMALISED_COLUMNS, rows)),
        (
            "p",
            "TTFT per 1k input tokens is given at single-stream points (c=1) only: under more load a TTFT is "
            "mostly time queued behind other requests, not prefill, and the server's own prefill time is not "
            "recorded.",
        ),
    ]
    missing = []
    if not config.get("mem_bandwidth_gbs"):
        missing.append(
            "roofline: give the memory bandwidth (`--mem-bandwidth GB/s`) and, unless the backend logs its "
            "weights, `--model-bytes`"
        )
    if config.get("gpu_price_per_hour") is None:
        missing.append("cost per token: give `--gpu-price` (per hour)")
    if missing:
        blocks.append(("p", "Not computed — " + "; ".join(missing) + "."))
    return blocks


JOULES_PER_TOKEN = (
    "Joules per output token: the energy the backend's GPUs used over the measured window (NVML's energy "
    "counter, or its power readings integrated where a GPU has no counter) over the output tokens of the ok "
    "requests in it; lower is better. Only where GPU telemetry sampled the backend's GPUs "
    "(`--gpu-telemetry`)."
)


def definitions_section(res: Results) -> list[Block]:
    """Each latency metric's declared definition (`LATENCY`), then the counting and statistics rules."""
    return [
        ("h2", "Definitions"),
        (
            "ul",
            [
                *(f"{m.label}: {m.definition}" for m in LATENCY),
                "Output tokens: the server's usage when given, else the stream's per-event counts; "
                "re-tokenisation is a cross-check only.",
                "Goodput: ok requests meeting every SLO, counted as requests/s are (below), per second of "
                "the throughput window. Client lag: send "
                "minus scheduled time (open-loop and trace points; a closed loop schedules each request as "
                "it sends it).",
                "Percentiles: numpy's linear interpolation; their 95% intervals are distribution-free "
                "(order statistics), unbounded where the sample is too small to bound them (ITL: a bootstrap "
                "over whole requests, unbounded where it reaches the largest or smallest gap); means: 95% "
                "percentile bootstrap (1000 resamples).",
                f"Output tokens/s and requests/s: {WINDOW_DEFINITION}.",
                *([JOULES_PER_TOKEN] if _has_gpu_telemetry(res) else []),
            ],
        ),
    ]
