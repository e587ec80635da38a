"""What the run directory says once read back: the records, the per-request table, summary.csv's rows with
costs, the decision and every caveat, the parity audit and the GPU samples (`analyze`). Every report, the
terminal's summary and `compare report` start from these `Results`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from compare.analysis.caveats import (
    duration_cut_qualifiers,
    parity_qualifiers,
    point_qualifiers,
    repeated_prompt_qualifiers,
    server_counter_qualifiers,
    setup_qualifiers,
)
from compare.analysis.confidence import Qualifier
from compare.analysis.costs import add_normalized
from compare.analysis.declared_settings import declared_settings, forced_lengths
from compare.analysis.import_parity import ImportParity, import_parity
from compare.analysis.metrics import request_table, summarize
from compare.analysis.parity import Declared, Finding, findings
from compare.analysis.selection import capacity_picks, qualify, selection
from compare.analysis.turns import turn_table
from compare.analysis.warning_groups import grouped_warning_lines
from compare.common.datatypes import Pick, SetupReport, key_of
from compare.measure.run_dir import RunDir
from workloads import timing
from workloads.records import RequestRecord


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
        results.picks = found + [
            p for p in results.picks if not (p.slo_class == "throughput" and p.workload in searched)
        ]
    forced = forced_lengths(requests)
    results.declared = {key: declared_settings(st, forced.get(key), run.path) for key, st in setups.items()}
    results.parity = findings(results.declared)
    workloads = {p["run_id"]: p.get("workload", "") for p in run.manifest.get("points", [])}
    results.qualifiers = (
        (point_qualifiers(summary) if not summary.empty else [])
        + duration_cut_qualifiers(run, records)
        + repeated_prompt_qualifiers(records, workloads)
        + server_counter_qualifiers(run)
        + parity_qualifiers(results.parity)
        + setup_qualifiers(setups)
    )
    qualify(results.picks, results.qualifiers)
    results.warnings = (
        list(run.manifest.get("notes") or [])
        + results.imports.sentences
        + grouped_warning_lines(results.qualifiers, results.picks)
    )
    first: dict[str, tuple[float, RequestRecord]] = {}  # per backend: when its first request was sent, and it
    for r in records:
        if r.send_s is None:
            continue
        key = key_of(r.backend, r.variant)
        sent = r.t0_monotonic + r.send_s
        if key not in first or sent < first[key][0]:
            first[key] = (sent, r)
    for key, (_, r) in first.items():
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
