"""Reports from a run directory: summary.csv / summary.parquet, report.md and a self-contained report.html.

Everything is recomputed from requests.jsonl, runs.jsonl and manifest.json (`analyze`), so `compare report
RUN_DIR` rebuilds the same files, and a run stopped half-way still gives a report of what it measured.
Both reports are made from one list of blocks (headings, paragraphs, lists, tables, plots): Markdown leaves
the plots out and points to the HTML, whose plots are inline SVG.
"""

from __future__ import annotations

import dataclasses
import html
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from compare.analysis import capacity, gpu_energy, sweep
from compare.analysis.caveats import (
    duration_cut_qualifiers,
    parity_qualifiers,
    point_qualifiers,
    repeated_prompt_qualifiers,
    setup_qualifiers,
)
from compare.analysis.confidence import Qualifier, legend
from compare.analysis.costs import add_normalized
from compare.analysis.declared_settings import declared_settings, forced_lengths
from compare.analysis.import_parity import ImportParity, import_parity
from compare.analysis.metrics import LATENCY, WINDOW_DEFINITION, request_table, summarize
from compare.analysis.parity import Declared, Finding, findings, parity_table
from compare.analysis.selection import break_even_rows, capacity_picks, qualify, selection, touches_a_verdict
from compare.analysis.turns import TURN, turn_table, write_turns
from compare.common.datatypes import ARRIVAL_DRIVEN, Pick, SetupReport, describe_phases, key_of
from compare.launch.serving_match import serving_match_lines
from compare.measure.run_dir import RunDir
from compare.report import plots
from workloads import timing
from workloads.records import RequestRecord

Block = tuple[str, Any]


@dataclass
class Results:
    run: RunDir
    records: list[RequestRecord]
    requests: pd.DataFrame
    summary: pd.DataFrame
    setups: dict[str, SetupReport]
    picks: list[Pick] = field(default_factory=list)
    memory_notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cold_first_token: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    declared: dict[str, Declared] = field(default_factory=dict)  # per backend key, for the parity audit
    parity: list[Finding] = field(default_factory=list)
    imports: ImportParity = field(default_factory=lambda: ImportParity([], [], [], []))  # imported points
    turns: pd.DataFrame = field(default_factory=pd.DataFrame)  # multi-turn sessions: analysis/turns.py
    qualifiers: list[Qualifier] = field(default_factory=list)  # every caveat, by kind: analysis/confidence.py
    telemetry: pd.DataFrame = field(default_factory=pd.DataFrame)  # GPU samples: measure/gpu_sampling.py


def analyze(run: RunDir, n_boot: int = 1000, seed: int = 0) -> Results:
    records = run.records()
    points = run.points()
    slo = run.slo()
    config = run.manifest.get("config") or {}
    setups = combine_setups(run.setups())
    telemetry = run.telemetry()
    summary = summarize(records, points, slo, n_boot=n_boot, seed=seed, telemetry=telemetry)
    summary = add_normalized(
        summary,
        setups,
        config.get("gpu_price_per_hour"),
        config.get("mem_bandwidth_gbs"),
        config.get("model_bytes"),
    )
    requests = request_table([r for r in records if not r.warmup], points)
    results = Results(run, records, requests, summary, setups, seed=seed, telemetry=telemetry)
    results.turns = turn_table(requests)
    results.imports = import_parity(summary, run.manifest)  # imported points of another workload: not ranked
    ranked = summary.drop(index=results.imports.excluded)
    planned = [b.get("key", "") for b in config.get("backends") or [] if isinstance(b, dict)]
    results.picks, results.memory_notes = selection(ranked, requests, setups, slo, seed, planned)
    if config.get("capacity") and slo:  # with a capacity search, its ranking leads the decision
        percentile = int(config.get("capacity_percentile") or 99)
        found = capacity_picks(ranked, requests, slo, percentile)
        # the capacity is the throughput within the SLO: a goodput read off one point (an open loop's own
        # draw of arrivals can run ahead of its rate) is not set beside it to claim a rate beyond its bracket
        searched = {p.workload for p in found}
        results.picks = found + [p for p in results.picks
                                 if not (p.slo_class == "throughput" and p.workload in searched)]
    forced = forced_lengths(requests)
    results.declared = {key: declared_settings(st, forced.get(key), run.path) for key, st in setups.items()}
    results.parity = findings(results.declared)
    workloads = {p["run_id"]: p.get("workload", "") for p in run.manifest.get("points", [])}
    results.qualifiers = (
        (point_qualifiers(summary) if not summary.empty else [])
        + duration_cut_qualifiers(run, records)
        + repeated_prompt_qualifiers(records, workloads)
        + parity_qualifiers(results.parity)
        + setup_qualifiers(setups)
    )
    qualify(results.picks, results.qualifiers)
    results.warnings = (
        list(run.manifest.get("notes") or []) + results.imports.sentences + grouped_warning_lines(results)
    )
    first: dict[str, RequestRecord] = {}
    for r in records:
        if r.send_s is None:
            continue
        key = key_of(r.backend, r.variant)
        if key not in first or (r.t0_monotonic + r.send_s) < (first[key].t0_monotonic + first[key].send_s):
            first[key] = r
    for key, r in first.items():
        value = timing.ttft(r)
        if value is not None:
            results.cold_first_token[key] = value
    for key, setup in setups.items():  # measured at launch, from ready: what the first user waits for
        if setup.cold_first_token_s is not None:
            results.cold_first_token[key] = setup.cold_first_token_s
    return results


def combine_setups(reports: list[SetupReport]) -> dict[str, SetupReport]:
    """One set-up per backend key: with several launches (--repeats) the first launch's phases, the median
    time to ready (every launch's kept in `ready_runs`) and the highest peak memory."""
    groups: dict[str, list[SetupReport]] = {}
    for report in reports:
        groups.setdefault(report.key, []).append(report)
    out = {}
    for key, group in groups.items():
        group.sort(key=lambda s: s.repeat)
        first = dataclasses.replace(group[0], memory=dict(group[0].memory), notes=list(group[0].notes))
        readies = [s.ready_s for s in group if s.ready_s is not None]
        if len(group) > 1:
            first.ready_runs = readies
            first.ready_s = float(np.median(readies)) if readies else None
            peaks = [s.memory.get("peak_rss", 0.0) for s in group]
            if max(peaks) > 0:
                first.memory["peak_rss"] = max(peaks)
            first.notes += [n for s in group[1:] for n in s.notes if n not in first.notes]
        out[key] = first
    return out


def write_reports(results: Results) -> None:
    results.run.write_summary(results.summary)
    write_turns(results.run.path, results.turns)
    blocks = build_blocks(results)
    (results.run.path / "report.md").write_text(to_markdown(blocks), encoding="utf-8")
    (results.run.path / "report.html").write_text(
        to_html(blocks, results.run.manifest.get("run_id", "")), encoding="utf-8"
    )


# -- content ------------------------------------------------------------------------------------------


def _f(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _ci(row: pd.Series, col: str) -> str:
    v, lo, hi = row.get(col), row.get(col + "_lo"), row.get(col + "_hi")
    if v is None or not np.isfinite(v):
        return "–"
    if lo is None or hi is None or np.isnan(lo) or np.isnan(hi):
        return f"{v:,.1f}"
    if not (np.isfinite(lo) or np.isfinite(hi)):
        return f"{v:,.1f} [unbounded]"  # too few values to bound this percentile either way
    low = f"{lo:,.1f}" if np.isfinite(lo) else "unbounded"
    return f"{v:,.1f} [{low}–{hi:,.1f}]" if np.isfinite(hi) else f"{v:,.1f} [{low}–unbounded]"


def _header(res: Results) -> list[Block]:
    """Title, status, model, machine, command and the SLOs in force."""
    m = res.run.manifest
    config = m.get("config") or {}
    status = m.get("status", "unknown")
    partial = " — a partial report of what was measured before the run stopped."
    head = [
        f"Status: **{status}**" + (partial if status == "interrupted" else "."),
        f"Model: `{config.get('model', '?')}`; created {m.get('created', '?')}.",
    ]
    mach = m.get("machine") or {}
    if mach:
        gpus = mach.get("gpus") or "none"
        head.append(
            f"Machine: {mach.get('cpus', '?')} CPUs ({mach.get('processor', '?')}), "
            f"{mach.get('memory_gib', '?')} GiB, "
            f"GPUs: {gpus if isinstance(gpus, str) else ', '.join(gpus) or 'none'}."
            + (f" CPU pinning: {m['pinning']}." if m.get("pinning") else "")
        )
    if m.get("command"):
        head.append("Command: `" + " ".join(m["command"]) + "`")
    blocks: list[Block] = [("h1", f"llm-compare report: {m.get('run_id', res.run.path.name)}")]
    blocks.append(("p", " ".join(head[:2])))
    blocks += [("p", h) for h in head[2:]]
    slo = config.get("slo_s") or {}
    if slo:
        limits = ", ".join(f"{k} ≤ {v * 1e3:g} ms" for k, v in slo.items())
        blocks.append(("p", f"SLOs: {limits}; goodput counts the requests within all of them."))
    else:
        blocks.append(
            (
                "p",
                "No SLO given (`--slo ttft=200ms,tpot=50ms`): goodput is not computed; the interactive "
                "class ranks by median end-to-end latency, the batch class by output tokens/s.",
            )
        )
    return blocks


def _decision(res: Results) -> list[Block]:
    """The picks' sentences, memory trade notes and the CPU note."""
    config = res.run.manifest.get("config") or {}
    blocks: list[Block] = [("h2", "Decision")]
    if config.get("candidates_reason"):
        blocks.append(("p", config["candidates_reason"]))
    if res.summary.empty:
        blocks.append(("p", "No request was measured: there is nothing to decide."))
    blocks += [
        ("p", " ".join(pick.sentences))
        for pick in res.picks
        if pick.sentences
    ]
    if any(pick.confidence for pick in res.picks):
        blocks += [("p", "Confidence, one ladder for every comparison above:"), ("ul", legend())]
    blocks += [("p", note) for note in res.memory_notes]
    blocks += [("p", sentence) for sentence in res.imports.sentences]
    cpu_note = _cpu_note(res)
    if cpu_note:
        blocks.append(("p", cpu_note))
    return blocks


def _warnings(res: Results) -> list[Block]:
    """The run's notes, then the caveats grouped by kind with counts per backend and point: first the kinds
    that touch a verdict in the Decision, then the rest; a kind that can change no number (re-tokenisation
    notes) is one line of counts."""
    notes = list(res.run.manifest.get("notes") or [])
    if not notes and not res.qualifiers:
        none = "None: no failed or cancelled requests, no token-count mismatch, no client lag."
        return [("h2", "Warnings"), ("p", none)]
    blocks: list[Block] = [("h2", "Warnings")]
    if notes:
        blocks.append(("ul", notes))
    for kind, head, lines in _warning_groups(res):
        blocks.append(("p", f"**{kind}**{head.removeprefix(kind)}"))  # each heading starts with its kind
        if lines:
            blocks.append(("ul", lines))
    return blocks


def _warning_groups(res: Results) -> list[tuple[str, str, list[str]]]:
    """Per kind of caveat, the verdict-touching kinds first: (kind, its heading with its counts per backend
    and point, whether it touches a verdict and the advice its lines share, its lines). A kind that can
    change no number is its heading alone. The report's Warnings and the terminal's both read this."""
    out = []
    for kind, found in _grouped(res):
        touching = any(touches_a_verdict(q, res.picks) for q in found)
        head = f"{kind} ({_counts(found)})" + (": touches a verdict in the Decision." if touching else ".")
        if _collapsed(kind, found):
            out.append((kind, f"{head} {COLLAPSED[kind]}", []))
            continue
        lines, advice = _common_tail([q.detail for q in found])
        out.append((kind, f"{head} {advice}" if advice else head, lines))
    return out


def _grouped(res: Results) -> list[tuple[str, list[Qualifier]]]:
    """The qualifiers by kind, the kinds that touch a verdict first (in the order found otherwise)."""
    groups: dict[str, list[Qualifier]] = {}
    for q in res.qualifiers:
        groups.setdefault(q.kind, []).append(q)
    return sorted(groups.items(), key=lambda kv: not any(touches_a_verdict(q, res.picks) for q in kv[1]))


def _collapsed(kind: str, found: list[Qualifier]) -> bool:
    """A kind of note that changes no number is one line of counts."""
    return kind in COLLAPSED and not any(q.verdict for q in found)


WARNING_ITEM = "  - "  # a line of `grouped_warning_lines` that belongs to the heading above it


def grouped_warning_lines(res: Results) -> list[str]:
    """The caveats as the terminal shows them, grouped as the report's Warnings (`_warning_groups`): each
    kind's heading, then its lines, each starting with `WARNING_ITEM`."""
    return [
        line for _, head, lines in _warning_groups(res) for line in (head, *(WARNING_ITEM + x for x in lines))
    ]


def _common_tail(lines: list[str]) -> tuple[list[str], str]:
    """Lines of one kind end in the same explanation: say it once, after the kind's heading."""
    if len(lines) < 2:
        return lines, ""
    tail = lines[0]
    for line in lines[1:]:
        while not line.endswith(tail):
            tail = tail[1:]
    cut = tail.find("; ")
    if cut < 0 or len(tail) - cut < 20:
        return lines, ""
    advice = tail[cut + 2 :]
    return [line[: len(line) - len(advice) - 2] + "." for line in lines], advice[:1].upper() + advice[1:]


COLLAPSED = {  # what a kind of note that changes no number says, once for all its points
    "token counts": "The client's re-tokenisation of the text does not always give back the generated "
    "tokens; the metrics use the server's usage, else the stream's count, so no number changes.",
}


def _counts(found: list[Qualifier]) -> str:
    """"3 on vllm (c=1, c=16, r=85), 1 on reference:graphs (c=1)"."""
    per: dict[str, list[str]] = {}
    for q in found:
        for key in q.keys or ("all backends",):
            per.setdefault(key, []).append(q.load_point)
    return ", ".join(
        f"{len(points)} on {key}"
        + (f" ({', '.join(dict.fromkeys(p for p in points if p))})" if any(points) else "")
        for key, points in per.items()
    )


def _parity(res: Results) -> list[Block]:
    """What each backend declares of itself, side by side, with the settings they differ on flagged, and
    what the launch could not give every backend alike (`compare.launch.serving_match`)."""
    if not res.declared and not res.imports.rows:
        return []
    header, rows = parity_table(res.declared)
    explained = (
        "What each backend declares of itself, and where it said so (models route: its `GET /v1/models` "
        "answer; log: its start-up log; metrics: its `/metrics` info gauges; command: the flags it was "
        "launched with; default: its documented default; launch: its tokenizer files' hash, or its name "
        "where the files are not on this machine; records: whether every forced output came back at the "
        "length asked for). Unknown is never counted as a difference (why, where known, in brackets); ⚠ "
        "marks a setting two backends declare differently."
    )
    verdict: Block = (
        ("ul", [f.sentence() for f in res.parity])
        if res.parity
        else ("p", "No difference among the settings the backends declare.")
    )
    matching = serving_match_lines(res.run.manifest, res.declared)
    blocks: list[Block] = [("h2", "Parity of the backends")]
    if res.declared:
        blocks += [("p", explained), ("table", (header, rows)), verdict]
    blocks += [("p", "Serving settings matched at launch:"), ("ul", matching)] if matching else []
    if res.imports.rows:
        blocks += [
            ("p", "Imported points against this run's (mean lengths: theirs against ours); one that measured "
             "another model or other lengths is never ranked against ours:"),
            ("table", (res.imports.header, res.imports.rows)),
        ]
    return blocks


def _plots(res: Results) -> list[Block]:
    if res.summary.empty:
        return []
    return [("h2", "Plots"), *(("svg", svg) for svg in make_plots(res))]


SETUP_COLUMNS = [
    "backend",
    "launcher",
    "ready (s, measured)",
    "ready (s, logged)",
    "phases (s)",
    "weights GiB",
    "KV GiB",
    "graph pool GiB",
    "peak RSS GiB",
    "GPU memory GiB",
    "device",
    "cold first token (ms)",
]


def _setup_cost(res: Results) -> list[Block]:
    """One row per launched backend: time to ready, its phases, memory, and the cold first token."""
    explained = (
        "Ready: spawn (process or container) to the first healthy answer, as measured here, and as the "
        "server logs it about itself. Phases: from the server's own start-up lines, in its words. Cold "
        "first token: for a launched server, from ready to the first token of the first request sent "
        "right after it; for a running endpoint, the first measured request's TTFT. Peak RSS: the "
        "server's processes' peak resident memory summed (a container: its highest memory reading). GPU "
        "memory: what the launch added on the visible GPUs by ready (nvidia-smi, before and after)."
    )
    rows = []
    for key, st in res.setups.items():
        mem = st.memory
        rows.append(
            [
                key,
                st.launcher,
                _f(st.ready_s, 2),
                _f(st.server_ready_s, 2),
                describe_phases([p for p in st.phases if p.name != "server_ready"], 2, "") or "–",
                *(
                    _f(mem.get(k, math.nan) / 2**30, 3)
                    for k in ("weights", "kv_cache", "graph_pool", "peak_rss", "device_used")
                ),
                st.device or "–",
                _f(res.cold_first_token.get(key, math.nan) * 1e3, 1),
            ]
        )
    return [("h2", "Set-up cost"), ("p", explained), ("table", (SETUP_COLUMNS, rows))]


def _break_even(res: Results) -> list[Block]:
    """Every pair of launched candidates: when the faster one's longer start pays back."""
    s = res.summary
    pairs = break_even_rows(res.picks, s, res.setups, res.requests, res.seed) if not s.empty else []
    if not pairs:
        return []
    explained = (
        "For each pair of launched candidates: the one faster per request, how long each took to be "
        "ready, and after how many requests the faster one's longer start pays back (set-up + N x "
        "time per request equal, N rounded up), with how long serving those takes at its measured rate. A "
        "difference not established (as in the decision) pays nothing back; one only indicated, or a "
        "start-up gap from one launch each, gives a pay-back that is indicated, never established."
    )
    header = [
        "workload",
        "class (time per request)",
        "faster",
        "other",
        "ready s",
        "per request",
        "pays back",
    ]
    return [("h2", "Set-up cost against latency"), ("p", explained), ("table", (header, pairs))]


def _results(res: Results) -> list[Block]:
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
            *(cell for m in shown for cell in (_ci(r, f"{m.name}_p50_ms"), _f(r[f"{m.name}_p99_ms"]))),
            _f(r["output_tok_s"]),
            _f(r["input_tok_s"]),
            _f(r["request_rps"], 2),
            _f(r["goodput_rps"], 2),
            f"{_f(r['offered_rps'], 2)} / {_f(r['achieved_rps'], 2)}",
            _f(r["lag_p99_ms"], 2),
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


def _gpu_energy(res: Results) -> list[Block]:
    """Energy, power, memory and utilisation of each backend's GPUs per load point, where NVML sampled them
    (compare/analysis/gpu_energy.py); nothing without telemetry."""
    if not _has_gpu_telemetry(res):
        return []
    rows = [
        [
            key_of(r["backend"], r["variant"]),
            r["workload"],
            r["load_point"],
            _f(r["gpu_energy_j"], 1),
            _f(r["gpu_joules_per_out_token"], 3),
            _f(r["gpu_power_mean_w"], 1),
            _f(r["gpu_power_max_w"], 1),
            _f(r["gpu_mem_peak_gib"], 2),
            _f(r["gpu_util_mean_pct"], 0),
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


def _intended_latency(res: Results) -> list[Block]:
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
            _f(r["lag_p99_ms"], 2),
            *(
                cell
                for pair in pairs
                for one in pair
                for cell in (_ci(r, f"{one.name}_p50_ms"), _f(r[f"{one.name}_p99_ms"]))
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


SWEEP_COLUMNS = [
    "backend",
    "workload",
    "sync TTFT p50 ms",
    "most served (req/s)",
    "knee (req/s)",
    "saturated at (req/s)",
    "why saturated",
]


def _sweep_capacity(res: Results) -> list[Block]:
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
        served = f"{_f(most.throughput_rps, 2)} at {most.label}"
        rows.append([key, workload, _f(sync.ttft_p50_s * 1e3), served,
                     "none" if bend is None else f"{bend.offered_rps:.4g}",
                     "not reached" if found is None else f"{found[0].offered_rps:.4g}",
                     "" if found is None else found[1]])
        top = max(p.offered_rps or 0.0 for p in points)
        saturated = (f"saturated at {found[0].offered_rps:.4g} requests/s" if found is not None
                     else f"not saturated up to {top:.4g} requests/s offered" if top
                     else "no open-loop point")
        sentence = (f"{key} ({workload}): knee at "
                    f"{'no rate' if bend is None else f'{bend.offered_rps:.4g} requests/s'}, {saturated}; "
                    f"most served {most.throughput_rps:.3g} requests/s (at {most.label})")
        cap = capacity.capacity_of(points, slo, q) if searched else None
        if cap is not None:
            cap_rows.append(_capacity_row(key, workload, cap, slo))
            sentence += "; " + _capacity_sentence(cap, slo)
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
            ("p", f"Capacity: the highest open-loop rate at which the SLO ({limits}; TTFT and E2E from the "
                  "intended send; a failed request misses it; an unsaturated point) holds, bracketed by the "
                  "lowest rate that misses it, found by bisection. A rate holds when the one-sided 95 % "
                  f"distribution-free bound of each p{q} (from the order statistics of the point's requests) "
                  f"is within its limit, misses when the other bound is beyond it, and is undetermined "
                  f"otherwise: fewer than {capacity.min_n_for_bound(q / 100)} requests a point can never "
                  f"show that a p{q} holds. The intervals are two-sided 95 % distribution-free intervals, n "
                  "the requests."),
            ("table", (CAPACITY_COLUMNS, cap_rows)),
        ]
    return [*blocks, ("ul", sentences)]


CAPACITY_COLUMNS = ["backend", "workload", "capacity (req/s)", "bracket (req/s)", "width", "at lower end",
                    "at upper end", "undetermined (req/s)"]


def _capacity_row(key: str, workload: str, cap: capacity.Capacity, slo: dict[str, float]) -> list[str]:
    def ends(end: str) -> str:
        values = cap.intervals.get(end) or {}
        cells = [f"{k} {v[0]:.1f} [{v[1]:.1f}, {v[2]:.1f}] n={v[3]}" for k, v in values.items()]
        return "; ".join(cells) or "-"

    hi = "open" if cap.hi is None else f"{cap.hi:.4g}"
    return [key, workload, f"{cap.lo:.4g}" if cap.decided else "undetermined", f"[{cap.lo:.4g}, {hi})",
            _f(cap.width, 2), ends("lo"), ends("hi"), ", ".join(f"{r:.4g}" for r in cap.undetermined) or "-"]


def _capacity_sentence(cap: capacity.Capacity, slo: dict[str, float]) -> str:
    if not cap.sync_meets:
        return "the SLO is missed even at one request at a time: no capacity"
    short = cap.smallest_n < cap.needed_n
    if not cap.decided:
        why = (f"a point of {cap.smallest_n} requests cannot show a p{cap.percentile} holds (it takes "
               f"{cap.needed_n}; raise --num-requests or --duration)" if short
               else "no rate measured was shown to hold it")
        return "capacity under the SLO undetermined: " + why + (
            "" if cap.hi is None else f"; it missed at {cap.hi:.4g} requests/s")
    if cap.hi is None:
        text = f"the SLO held at every rate decided, up to {cap.lo:.4g} requests/s (capacity at least that)"
    else:
        text = (f"capacity under the SLO {cap.lo:.4g} requests/s, within {cap.width:.3g} (the SLO holds "
                f"there with 95 % confidence and was missed at {cap.hi:.4g})")
    if cap.undetermined:
        text += (f"; undetermined at {', '.join(f'{r:.4g}' for r in cap.undetermined)} requests/s, so the "
                 "capacity may be higher")
    if cap.met_above:
        text += (
            f"; {', '.join(f'{r:.4g}' for r in cap.met_above)} requests/s, above the bracket, held it: the "
            "SLO is not monotone in the rate here, so the bracket may be low"
        )
    return text


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


def _turns(res: Results) -> list[Block]:
    """Multi-turn sessions: TTFT by turn index at each load point (compare/analysis/turns.py), none without
    them."""
    t = res.turns
    if t.empty:
        return []
    header = ["backend", "workload", "load", "turn (1 = first)", "n", "prompt tokens", "TTFT p50", "TTFT p90",
              "E2E p50"]
    rows = [
        [
            key_of(r["backend"], r["variant"]),
            r["workload"],
            r["load_point"],
            str(int(r[TURN])),
            str(int(r["n"])),
            _f(r["prompt_tokens_mean"], 0),
            _f(r["ttft_p50_ms"]),
            _f(r["ttft_p90_ms"]),
            _f(r["e2e_p50_ms"]),
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


def _normalised(res: Results) -> list[Block]:
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
                _f(r["prefill_ms_per_1k_in"]),
                _f(r["tpot_p50_ms"]),
                _f(r["roofline_tpot_ms"], 3),
                f"{eff:.0%}" if np.isfinite(eff) else "–",
                _f(r["usd_per_1m_out"], 3),
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


def _definitions(res: Results) -> list[Block]:
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


#: The report's sections, in order: each makes its blocks from the results. A new section is a function
#: here and its place in this list.
SECTIONS: list[Callable[[Results], list[Block]]] = [
    _header,
    _decision,
    _warnings,
    _parity,
    _plots,
    _setup_cost,
    _break_even,
    _results,
    _gpu_energy,
    _intended_latency,
    _sweep_capacity,
    _turns,
    _normalised,
    _definitions,
]


def build_blocks(res: Results) -> list[Block]:
    return [block for section in SECTIONS for block in section(res)]


def _cpu_note(res: Results) -> str:
    cpu = [
        k
        for k, st in res.setups.items()
        if st.device and st.device.startswith("cpu") and st.backend.startswith("reference")
    ]
    if not cpu:
        return ""
    graphs = [k for k in cpu if k.endswith(":graphs")]
    note = (
        f"{', '.join(cpu)} ran on the CPU, where the reference engine never uses CUDA graphs: every "
        "variant runs eager"
    )
    if graphs:
        note += f" ({', '.join(graphs)} included), so a difference between its variants is noise, not graphs"
    return note + "."


# -- plots --------------------------------------------------------------------------------------------


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
        label = p["load_point"] + (f" {p['workload']}" if several["workload"] else "") + (
            f" (launch {int(p.get('repeat', 0)) + 1})" if several["repeat"] else ""
        )
        mine = lines.setdefault(key_of(p["backend"], p["variant"]), [])
        color = plots.PALETTE[len(mine) % len(plots.PALETTE)]
        dash = plots.DASHES[len(mine) // len(plots.PALETTE) % len(plots.DASHES)]
        seconds = (ticks["t"] - ticks["t"].iloc[0]).tolist()
        mine.append(plots.Series(label, seconds, ticks["power_w"].tolist(), color, dash, markers=False))
    return [
        plots.line_chart(series, f"{POWER_TITLE}: {key}", "seconds since the load point started",
                         "power (W), summed over its GPUs")
        for key, series in lines.items()
    ]


# -- rendering -----------------------------------------------------------------------------------------------


def to_markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    svg_noted = False
    for kind, content in blocks:
        if kind == "h1":
            out.append(f"# {content}\n")
        elif kind == "h2":
            out.append(f"## {content}\n")
        elif kind == "p":
            out.append(f"{content}\n")
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in content) + "\n")
        elif kind == "table":
            header, rows = content
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
            out.append("\n".join(lines) + "\n")
        elif kind == "svg" and not svg_noted:
            power = any(k == "svg" and POWER_TITLE in c for k, c in blocks)
            out.append(
                "The plots (latency against throughput, TTFT and TPOT CDFs, bars with intervals, set-up "
                f"timeline{', GPU power over time' if power else ''}) are in report.html.\n"
            )
            svg_noted = True
    return "\n".join(out)


_BOLD = re.compile(r"\*\*(.+?)\*\*")
_CODE = re.compile(r"`([^`]+)`")


def _inline(text: str) -> str:
    text = html.escape(str(text))
    text = _BOLD.sub(r"<strong>\1</strong>", text)
    return _CODE.sub(r"<code>\1</code>", text)


CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2em auto; max-width: 1800px;
       color: #222; line-height: 1.45; padding: 0 1em; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; max-width: 100%; margin: 0.5em 0 1em; }
table { border-collapse: collapse; font-size: 12px; overflow-wrap: normal; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
code { background: #f4f4f4; padding: 0 3px; }
.plots { display: grid; grid-template-columns: minmax(0, 1fr); gap: 12px; }
@media (min-width: 1280px) { .plots { grid-template-columns: repeat(2, minmax(0, 1fr)); } }
.plots svg { border: 1px solid #ddd; width: 100%; height: auto; box-sizing: border-box; }
"""
# Plots: one column, two from 1280 px; each svg scales to its column (they all have a viewBox). Tables
# scroll sideways inside their own box rather than widening the page.


def to_html(blocks: list[Block], title: str) -> str:
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>llm-compare report {html.escape(title)}</title>",
        f"<style>{CSS}</style></head><body>",
    ]
    in_plots = False
    for kind, content in blocks:
        if kind == "svg":
            if not in_plots:
                out.append('<div class="plots">')
                in_plots = True
            out.append(content)
            continue
        if in_plots:
            out.append("</div>")
            in_plots = False
        if kind in ("h1", "h2"):
            out.append(f"<{kind}>{_inline(content)}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{_inline(content)}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in content) + "</ul>")
        elif kind == "table":
            header, rows = content
            out.append(
                '<div class="scroll"><table><thead><tr>'
                + "".join(f"<th>{_inline(h)}</th>" for h in header)
                + "</tr></thead><tbody>"
            )
            out += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in rows]
            out.append("</tbody></table></div>")
    if in_plots:
        out.append("</div>")
    out.append("</body></html>")
    return "\n".join(out)
