"""What a reader must know before trusting the numbers, listed ahead of the decision: failed, cancelled and
interrupted requests, token-count mismatches, outputs shorter than forced, open-loop client lag, launch
notes, load points that `--duration` ended before they reached `--num-requests` (their statistics rest
on fewer requests than asked for, and the selection's confidence with them), load points that sent some of
their prompts more than once (a prefix cache answers the repeats' prefill), points where a backend's own
counters show preemptions or prefix-cache hits among prompts that were all new, and picks whose winner and
runner-up declare unequal settings (`compare.analysis.parity`).

Each is a `compare.analysis.confidence.Qualifier` (`*_qualifiers`): a kind, the clause the Decision prints
with the verdicts it touches, the full warning line (`detail`), and the backends, workload and point it
concerns; the `*_warnings` functions give the lines alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from adapters.request_spec import is_resend
from compare.analysis.confidence import Qualifier
from compare.analysis.metrics import SummaryRow
from compare.analysis.parity import Finding
from compare.common.datatypes import SetupReport, key_of
from compare.common.text import plural
from workloads.catalog import DATASETS

if TYPE_CHECKING:
    from compare.measure.run_dir import RunDir
    from workloads.records import RequestRecord


def duration_cut_qualifiers(run: RunDir, records: list[RequestRecord] | None = None) -> list[Qualifier]:
    """One per measured point (per launch) that the duration bound stopped short of the request count, or,
    for multi-turn sessions, before every session had sent all its turns; interrupted points are warned
    about elsewhere, and imported points had bounds of their own."""
    config = run.manifest.get("config") or {}
    if not config.get("duration_s"):
        return []
    points = {p["run_id"]: p for p in run.manifest.get("points", [])}
    repeated = int(config.get("repeats") or 1) > 1
    sessions = _session_turns(records if records is not None else _records(run))
    wanted_turns = _wanted_turns(config)
    out = []
    for s in run.run_summaries():
        point = points.get(s.run_id)
        if point is None or s.interrupted:
            continue
        # a block, or a capacity point sized for its percentile, has bounds of its own (the manifest's entry)
        asked = point.get("num_requests", config.get("num_requests"))
        duration = point.get("duration_s", config.get("duration_s"))
        if not duration or s.wall_s - s.measured_start_s < duration:  # ended for another reason
            continue
        key = key_of(s.backend, s.variant)
        where = point.get("workload") or ""
        if repeated:
            where += f"{', ' if where else ''}launch {int(point.get('repeat', 0)) + 1}"
        turns = sessions.get(s.run_id, {})
        only = len(config.get("workloads") or []) == 1 and wanted_turns
        want = wanted_turns.get(point.get("workload") or "", 0) or (
            next(iter(wanted_turns.values())) if only else 0
        )
        cut = sorted(n for n in turns.values() if n < want)
        if cut:
            text = (
                f"{s.load_point} on {key}: {len(cut)} of {plural(len(turns), 'session')} cut short by the "
                f"{duration:g} s duration (as few as {cut[0]} of {want} turns)"
            )
            out.append(
                Qualifier(
                    "points cut short",
                    text,
                    (key,),
                    point.get("workload") or "",
                    s.load_point,
                    detail=f"{s.load_point} on {key}{f' ({where})' if where else ''}: {len(cut)} of "
                    f"{plural(len(turns), 'session')} had not sent all {want} turns "
                    f"({cut[0]} at fewest) when the {duration:g} s duration ended the point; "
                    "its later turns rest on fewer sessions "
                    "(raise --duration).",
                )
            )
            continue
        if not asked or s.n_measured >= asked:
            continue
        out.append(
            Qualifier(
                "points cut short",
                f"{s.load_point} on {key}: {s.n_measured} of {asked} requests "
                f"before the {duration:g} s duration",
                (key,),
                point.get("workload") or "",
                s.load_point,
                detail=f"{s.load_point} on {key}{f' ({where})' if where else ''}: "
                f"{s.n_measured} of {asked} requests before the {duration:g} s duration ended the point; "
                "its numbers rest on fewer requests than asked (raise --duration, or lower --num-requests).",
            )
        )
    return out


def _records(run: RunDir) -> list[RequestRecord]:
    try:
        return list(run.records())
    except (OSError, ValueError):
        return []


def _session_turns(records: list[RequestRecord]) -> dict[str, dict[str, int]]:
    """Per point, each session's number of measured turns sent."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        session = getattr(r, "session_id", None)
        if session is None or r.warmup:
            continue
        per = out.setdefault(r.run_id, {})
        per[session] = per.get(session, 0) + 1
    return out


def _wanted_turns(config: dict[str, Any]) -> dict[str, int]:
    """The turns a session of each workload should have: `--turns` where the workload says, else 0 (no
    telling; sharegpt-turns conversations differ in length)."""
    out = {}
    for w in config.get("workloads") or []:
        turns = w.get("turns")
        declared = DATASETS.get(str(w.get("dataset"))) if turns is None else None
        if declared is not None and "turns" in declared.options:
            turns = declared.options["turns"].default  # the dataset's own default (multi-turn's)
        if turns:
            out[w.get("label") or w.get("name") or ""] = int(turns)
    return out


PREFIX_HIT_SHARE = 0.10  # of the prompt tokens a prefix cache looked up: noticed where every prompt was new


def server_counter_qualifiers(run: RunDir) -> list[Qualifier]:
    """From the backends' own counters over each point (`RunSummary.server_metrics`, read from their
    `/metrics` around it): one per point where the backend preempted sequences (their KV cache was dropped
    and recomputed, so its latencies there count the recompute and rest on its KV-cache size), and one where
    its prefix cache answered at least `PREFIX_HIT_SHARE` of the prompt tokens it looked up although every
    request had a prompt of its own (the run's default; not a pool, a file, a dataset of shared prefixes or
    multi-turn sessions, which are meant to hit): the prefix cache is then credited for part of its prefill.
    Each line names the server's counter."""
    config = run.manifest.get("config") or {}
    points = {p["run_id"]: p for p in run.manifest.get("points", [])}
    repeated = int(config.get("repeats") or 1) > 1
    out = []
    for s in run.run_summaries():
        counters, point = s.server_metrics or {}, points.get(s.run_id) or {}
        key, workload = key_of(s.backend, s.variant), point.get("workload") or ""
        where = _where(f"{s.load_point} on {key}", point, repeated)
        named = _counter_names(s.backend)
        preempted = counters.get("preemptions_total", 0.0)
        if preempted > 0:
            n = plural(round(preempted), "sequence")
            out.append(
                Qualifier(
                    "preemptions",
                    f"{s.load_point} on {key}: {n} preempted",
                    (key,),
                    workload,
                    s.load_point,
                    detail=f"{where}: the server preempted {n} during the point "
                    f"({named('preemptions_total')} grew by {preempted:g}); their KV cache was freed and "
                    "recomputed, so its latencies there count the recompute and rest on its KV-cache size "
                    "(more KV-cache memory, or a lower batch limit, avoids it).",
                )
            )
        hits, queries = (
            counters.get("prefix_cache_hits_total", 0.0),
            counters.get("prefix_cache_queries_total"),
        )
        if queries and hits / queries >= PREFIX_HIT_SHARE and _own_prompts(point, config):
            out.append(
                Qualifier(
                    "prefix-cache hits",
                    f"{s.load_point} on {key}: prefix cache hit {hits / queries:.0%} of prompt tokens",
                    (key,),
                    workload,
                    s.load_point,
                    detail=f"{where}: its prefix cache answered {hits / queries:.0%} of the prompt tokens "
                    f"it looked up ({named('prefix_cache_hits_total')} {hits:g} of "
                    f"{named('prefix_cache_queries_total')} {queries:g}) although every request had a "
                    "prompt of its own; the prefix cache is credited for part of its prefill (prompts "
                    "sharing a template or a system prompt, or sent before), so its TTFT reads low.",
                )
            )
    return out


def _where(label: str, point: dict[str, Any], repeated: bool) -> str:
    """`label` ("c=8 on vllm") with the point's workload, and its launch where the run had several."""
    where = point.get("workload") or ""
    if repeated:
        where += f"{', ' if where else ''}launch {int(point.get('repeat', 0)) + 1}"
    return f"{label} ({where})" if where else label


def _counter_names(backend: str) -> Callable[[str], str]:
    """common counter name -> the backend's own metric for it (its adapter's `metric_names`), or the common
    name where it maps none."""
    from adapters import ADAPTERS

    cls = ADAPTERS.get(backend)
    own: dict[str, str] = {}
    for name, common in (cls.metric_names if cls is not None else {}).items():
        own.setdefault(common, name)
    return lambda common: own.get(common, common)


def _own_prompts(point: dict[str, Any], config: dict[str, Any]) -> bool:
    """Whether every request of the point had a prompt of its own: made per request (the manifest's
    `prompts` note), by a dataset that shares no prefix among its prompts and makes no sessions."""
    if (point.get("prompts") or {}).get("kind") != "per_request":
        return False
    for w in config.get("workloads") or []:
        if (w.get("label") or w.get("name")) == point.get("workload"):
            declared = DATASETS.get(str(w.get("dataset")))
            return declared is None or not (declared.sessions or "prefix_len" in declared.options)
    return True


def repeated_prompt_warnings(records: list[Any]) -> list[str]:
    """`repeated_prompt_qualifiers` as warning lines."""
    return [q.detail for q in repeated_prompt_qualifiers(records)]


def repeated_prompt_qualifiers(
    records: list[Any], workloads: dict[str, str] | None = None
) -> list[Qualifier]:
    """One per load point whose measured requests reused its prompts: the load generator cycles a point's
    prompts (ids suffixed `~k`) when it runs out: with --prompt-pool, with a file dataset smaller than the
    point, on Ray load generators, and in runs made before every request had a prompt of its own. A server
    with a prefix cache then computes only the last block of a repeated prompt, so prefill cost, TTFT and
    the stalls prefills cause read low for every backend alike, and unlike a workload of distinct prompts.
    `workloads`: run id -> workload."""
    points: dict[str, list[Any]] = {}
    for r in records:
        if not r.warmup:
            points.setdefault(r.run_id, []).append(r)
    out = []
    for run_id, point in points.items():
        repeats = sum(1 for r in point if is_resend(r.request_id))
        if repeats:
            first = point[0]
            key = key_of(first.backend, first.variant)
            share = f"{repeats} of {plural(len(point), 'request')}"
            out.append(
                Qualifier(
                    "repeated prompts",
                    f"{key} {first.load_point}: {share} repeated a prompt "
                    f"({repeats / len(point):.0%}), answered "
                    "mostly from a prefix cache",
                    (key,),
                    (workloads or {}).get(run_id, ""),
                    first.load_point,
                    detail=f"{key} {first.load_point}: {share} repeated a prompt this point had sent "
                    f"({len(point) - repeats} distinct); a prefix cache answers most of their prefill "
                    "(without "
                    "--prompt-pool every request of a generated dataset gets a prompt of its own).",
                )
            )
    return out


def point_caveats(summary: pd.DataFrame, setups: dict[str, SetupReport]) -> list[str]:
    """The caveats read from the summary's rows and the launches' notes."""
    out: list[str] = []
    for _, r in summary.iterrows():
        key = f"{key_of(r['backend'], r['variant'])} {r['workload']} {r['load_point']}"
        if r["requests_failed"]:
            out.append(
                f"{key}: {int(r['requests_failed'])} of {plural(int(r['requests']), 'request')} failed "
                f"({r['errors']})."
            )
        if r["interrupted"] or r["requests_cancelled"]:
            out.append(
                f"{key}: interrupted; {plural(int(r['requests_cancelled']), 'request')} cancelled, "
                "numbers are partial."
            )
        if r["token_mismatches"]:
            example = r.get("mismatch_example") or ""
            server = int(r.get("token_mismatches_server", 0) or 0)
            what = (
                f"{server} where the server's usage and the stream's own count differ (a backend or adapter "
                "problem)"
                if server
                else "all between the generated count and the client's re-tokenisation of "
                "the text, which does not always give back the generated tokens"
            )
            out.append(
                f"{key}: {int(r['token_mismatches'])} of {plural(int(r['requests_ok']), 'response')} "
                f"{'disagrees' if int(r['token_mismatches']) == 1 else 'disagree'} on their "
                f"token count{example}, {what}; the metrics use the server's usage, else the stream's count."
            )
        if r["output_short"]:
            out.append(
                f"{key}: {plural(int(r['output_short']), 'response')} "
                f"{'is' if int(r['output_short']) == 1 else 'are'} shorter than the forced output length."
            )
        late = late_client(r)
        if late:
            out.append(
                f"{key}: the client sent late ({late}): the offered load was not the load applied; the "
                "latencies from the intended send count the wait."
            )
    for s in setups.values():
        out.extend(f"{s.key}: {note}" for note in s.notes if "endpoint" not in note)
    return out


POINT_KINDS = (  # how `point_caveats`' lines read, to their kind; whether it can change a verdict
    ("failed (", "failed requests", True),
    ("interrupted;", "interrupted points", True),
    ("token count", "token counts", False),
    ("shorter than the forced", "short outputs", True),
    ("sent late", "late client", True),
)


def point_qualifiers(summary: pd.DataFrame) -> list[Qualifier]:
    """`point_caveats` row by row, each with its kind and the backend and point it is about. Token-count
    notes where only the client's re-tokenisation differs change no number (the metrics use the server's
    count): they cannot qualify a verdict."""
    out = []
    for i in range(len(summary)):
        row = summary.iloc[i]
        key = key_of(row["backend"], row["variant"])
        for text in point_caveats(summary.iloc[[i]], {}):
            kind, matters = next(((k, m) for s, k, m in POINT_KINDS if s in text), ("other", True))
            if kind == "token counts" and int(row.get("token_mismatches_server", 0) or 0):
                matters = True
            short = text.split(": ", 1)[-1] if ": " in text else text
            out.append(
                Qualifier(
                    kind,
                    f"{key} {row['load_point']}: {short.split(': ')[0].rstrip('.')}",
                    (key,),
                    str(row["workload"]),
                    str(row["load_point"]),
                    verdict=matters,
                    detail=text,
                )
            )
    return out


LATE_LAG_S = 0.010  # late: a lag p99 past this and past the mean gap between sends (1 / offered rate) ...
LATE_LEVEL = 0.01  # one-sided level of the test: fewer sent than the arrivals' own variation explains


def late_client(r: SummaryRow) -> str:
    """Why an open-loop summary row shows a client that fell behind its schedule, or "". The lag (each send
    against its own intended time) is the direct measure: late when its p99 exceeds both `LATE_LAG_S` and the
    mean gap between arrivals (sends then move past their neighbours'). The achieved rate counts only when it
    is below the offered one by more than the sampling error of the number of arrivals at `LATE_LEVEL`
    (`sweep.send_shortfall_p`), with some lag to show for it: achieving more than offered, or as much with a
    few ms of lag, is a point's own draw of arrivals, not a late client."""
    from compare.analysis.sweep import send_shortfall_p

    lag = r.get("lag_p99_ms", np.nan)
    if r["mode"] != "open" or not np.isfinite(lag):
        return ""
    achieved, offered = r.get("achieved_rps", np.nan), r.get("offered_rps", np.nan)
    sent = int(r.get("requests", 0)) // max(1, int(r.get("runs", 1) or 1))
    p = (
        send_shortfall_p(sent, (sent - 1) / achieved, offered, str(r.get("arrival") or "poisson"))
        if np.isfinite(achieved) and achieved > 0 and np.isfinite(offered)
        else np.nan
    )
    behind = achieved < offered and p < LATE_LEVEL and lag > 1.0
    gap_ms = 1e3 / offered if np.isfinite(offered) and offered > 0 else 0.0
    if lag <= max(LATE_LAG_S * 1e3, gap_ms) and not behind:
        return ""
    rates = f"achieved {achieved:.2f} of {offered:.2f} requests/s offered"
    chance = f", fewer than chance explains (p = {p:.2g})" if behind else ""
    return f"lag p99 {lag:.1f} ms, {rates}" + chance


def parity_qualifiers(found: list[Finding]) -> list[Qualifier]:
    """Each parity finding (a setting two or more backends declare differently) as a qualifier of the
    verdicts between those backends."""
    return [
        Qualifier(
            "unequal settings",
            f.sentence().rstrip(".").removeprefix("Unequal "),
            tuple(f.values),
            between=True,
            detail=f"{f.sentence()} Results between these backends rest on it.",
        )
        for f in found
    ]


def setup_qualifiers(setups: dict[str, SetupReport]) -> list[Qualifier]:
    """The launches' notes (not those of running endpoints), listed with the warnings."""
    return [
        Qualifier("launch notes", note, (s.key,), verdict=False, detail=f"{s.key}: {note}")
        for s in setups.values()
        for note in s.notes
        if "endpoint" not in note
    ]
