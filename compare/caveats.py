"""What a reader must know before trusting the numbers, listed ahead of the decision: failed, cancelled and
interrupted requests, token-count mismatches, outputs shorter than forced, open-loop client lag, launch
notes, load points that `--duration` ended before they reached `--num-requests` (their statistics rest
on fewer requests than asked for, and the selection's confidence with them), load points that sent some of
their prompts more than once (a prefix cache answers the repeats' prefill), and picks whose winner and
runner-up declare unequal settings (`compare.parity`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from adapters.request_spec import is_resend
from compare.datatypes import Pick, SetupReport, key_of
from compare.parity import Declared, differences
from compare.text import plural


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


def repeated_prompt_warnings(records: list[Any]) -> list[str]:
    """One warning per load point whose measured requests reused its prompts: the load generator cycles a
    point's prompts (ids suffixed `~k`) when it runs out, which a duration-bound point does once it has sent
    its pool (DURATION_BOUND_PROMPTS without --num-requests). A server with a prefix cache then computes only
    the last block of a repeated prompt, so prefill cost, TTFT and the stalls prefills cause read low for
    every backend alike, and unlike a workload of distinct prompts."""
    points: dict[str, list[Any]] = {}
    for r in records:
        if not r.warmup:
            points.setdefault(r.run_id, []).append(r)
    out = []
    for point in points.values():
        repeats = sum(1 for r in point if is_resend(r.request_id))
        if repeats:
            first = point[0]
            out.append(
                f"{key_of(first.backend, first.variant)} {first.load_point}: {repeats} of "
                f"{plural(len(point), 'request')} repeated a prompt this point had sent "
                f"({len(point) - repeats} distinct); a prefix cache answers most of their prefill (give "
                "--num-requests at least the requests a point completes, so that each gets a prompt of its "
                "own)."
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


LATE_LAG_S = 0.010  # late: a lag p99 past this and past the mean gap between sends (1 / offered rate) ...
LATE_LEVEL = 0.01  # one-sided level of the test: fewer sent than the arrivals' own variation explains


def late_client(r: Any) -> str:
    """Why an open-loop summary row shows a client that fell behind its schedule, or "". The lag (each send
    against its own intended time) is the direct measure: late when its p99 exceeds both `LATE_LAG_S` and the
    mean gap between arrivals (sends then move past their neighbours'). The achieved rate counts only when it
    is below the offered one by more than the sampling error of the number of arrivals at `LATE_LEVEL`
    (`sweep.send_shortfall_p`), with some lag to show for it: achieving more than offered, or as much with a
    few ms of lag, is a point's own draw of arrivals, not a late client."""
    from compare.sweep import send_shortfall_p

    lag = r.get("lag_p99_ms", np.nan)
    if r["mode"] != "open" or not np.isfinite(lag):
        return ""
    achieved, offered = r.get("achieved_rps", np.nan), r.get("offered_rps", np.nan)
    sent = int(r.get("requests", 0)) // max(1, int(r.get("runs", 1) or 1))
    p = (send_shortfall_p(sent, (sent - 1) / achieved, offered, str(r.get("arrival") or "poisson"))
         if np.isfinite(achieved) and achieved > 0 and np.isfinite(offered) else np.nan)
    behind = achieved < offered and p < LATE_LEVEL and lag > 1.0
    gap_ms = 1e3 / offered if np.isfinite(offered) and offered > 0 else 0.0
    if lag <= max(LATE_LAG_S * 1e3, gap_ms) and not behind:
        return ""
    rates = f"achieved {achieved:.2f} of {offered:.2f} requests/s offered"
    chance = f", fewer than chance explains (p = {p:.2g})" if behind else ""
    return f"lag p99 {lag:.1f} ms, {rates}" + chance


def unequal_settings(pick: Pick, declared: dict[str, Declared]) -> str:
    """A sentence for a pick whose winner and runner-up differ in a setting both declare (empty if none):
    part of the difference it reports may be that setting's, not the backend's."""
    if not pick.winner or not pick.runner_up:
        return ""
    a, b = declared.get(pick.winner), declared.get(pick.runner_up)
    if a is None or b is None:
        return ""
    found = differences(a, b)
    if not found:
        return ""
    return (
        f"This result rests on unequal settings: {pick.winner} and {pick.runner_up} differ in "
        f"{'; '.join(found)} (see Parity of the backends), so part of the difference may be the setting's, "
        "not the backend's."
    )
