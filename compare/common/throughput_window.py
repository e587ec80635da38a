"""The throughput window, defined once: the span of a load point's run over which its rates are counted.
The progress bar of a running point (`running_output_rate`) and summary.csv (`compare.analysis.metrics`)
count alike, so what a run shows as it goes is what its report says.

Every rate of a point (output and input tokens/s, requests/s, goodput), its interval and its GPU energy
count only the time in which measured requests alone keep the server busy. The window runs from the first
token of the concurrency-th measured request to begin its output (closed loop; by then every worker has sent
a measured request, so every warm-up request has ended), or from the first measured request's end (open
loop: its warm-up ends before the schedule starts, and the server starts empty), to the first token of the
last measured request (until then measured requests are waiting or in hand; after it the load drains).
Each ok request counts the share of its output span (first token to end; send to end without a token) that
lies inside the window, and its tokens likewise, as if they arrived evenly over the span (token arrivals, as
SGLang's and vLLM's benchmarks count them); a rate is that sum over the window's length. By Little's law
this is the pace at which requests pass through decoding, whatever the queue before it (a saturated open
loop reads the server's pace, not the offered rate), and it does not depend on where the window's ends fall
among completions that finish together (a batch), which a count of completions would. A run too short for
such a window (fewer than `MIN_STEADY_COMPLETIONS` ends inside it) uses the first measured send to the last
end instead, every request wholly counted; summary.csv's `window` column says which (`steady`, `full`, or
`imported`: the other tool's own duration).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from compare.common.datatypes import PointInfo, point_info_from_label
from workloads import timing
from workloads.records import RequestRecord

WINDOW_DEFINITION = (
    "over the steady window: from the first token of the concurrency-th measured request to begin its "
    "output (closed loop: by then every warm-up request has ended; open loop: from the first request's end) "
    "to the first token of the last, so the warm-up's tail, the ramp and the drain are not counted. Each ok "
    "request counts the share of its output span (first token to end) inside the window, with its tokens "
    "as if they arrived evenly over the span, over the window's length. summary.csv `window`: steady, or "
    "full where a point is too short for one (first send to last end). Its interval, and the throughput "
    "decision's, come from the rate's variation over time: the window cut into up to 10 equal sub-windows "
    "(batch means) and a t interval"
)
STEADY = "steady"  # the `window` column: the steady window (module doc)
FULL = "full"  # too short for one, or no full load: first send to last end, every request counted
IMPORTED = "imported"  # imported results: the other tool's own benchmark duration
MIN_STEADY_COMPLETIONS = 2  # a steady window in which fewer requests end than this is not used


@dataclass(frozen=True)
class ThroughputWindow:
    """The window a point's rates are counted over, [start, end], and which kind it is (`STEADY`, `FULL`)."""

    start: float
    end: float
    kind: str

    @property
    def seconds(self) -> float:
        return self.end - self.start if self.end > self.start else np.nan

    def shares(self, begin_s: Iterable[float], end_s: Iterable[float]) -> np.ndarray:
        """Per request, the share of its output span (`output_begin`: first token to end) inside the window
        (`time_shares`); 0 for a request not finished."""
        return time_shares(_floats(begin_s), _floats(end_s), self.start, self.end)


def _floats(values: Iterable[float]) -> np.ndarray:
    return values.to_numpy(dtype=float) if isinstance(values, pd.Series) else np.asarray(list(values), float)


def throughput_window(
    send_s: Iterable[float],
    end_s: Iterable[float],
    concurrency: int | None = None,
    now: float | None = None,
    begin_s: Iterable[float] | None = None,
) -> ThroughputWindow:
    """The throughput window of one run of a point from its measured requests' send, end and output-begin
    times (`output_begin`: first token; the sends when not given), warm-up requests excluded, on the clock
    of the times given (module doc: `WINDOW_DEFINITION`).

    Steady: from the `concurrency`-th output begin (closed loop) to the last. The concurrency-th begin is
    never before the concurrency-th send, when each worker has sent its first measured request and so every
    warm-up request has ended (a worker sends its first measured request when its last warm-up one ends),
    and from then on the server holds `concurrency` measured requests; until the last measured request
    begins its output the server has measured work waiting or in hand, and after it the load drains. An open
    loop (`concurrency` None; its warm-up ends before its schedule starts) starts empty, so its window opens
    at its first end, not its first begin: before it the outputs begun before the window, which a loaded
    server would hold, are missing, and the rate would read low by about half an output span over the
    window.

    Fallback (`FULL`): where fewer than `MIN_STEADY_COMPLETIONS` requests end inside the steady window (a
    point too short, or a closed loop with fewer requests than its concurrency), the first measured send to
    the last end (or `now`)."""
    sends = _floats(send_s)
    begins = np.sort(sends if begin_s is None else _floats(begin_s))
    ends = _floats(end_s)
    sends, begins, ends = sends[np.isfinite(sends)], begins[np.isfinite(begins)], ends[np.isfinite(ends)]
    if not sends.size:
        return ThroughputWindow(np.nan, np.nan, FULL)
    if concurrency is None:  # not before the first output has ended: an empty server's start
        full_from = max(begins[0], ends.min()) if begins.size and ends.size else np.nan
    elif 1 <= concurrency <= begins.size:
        full_from = begins[concurrency - 1]
    else:
        full_from = np.nan
    if np.isfinite(full_from):
        inside = (ends >= full_from) & (ends <= begins[-1])
        if begins[-1] > full_from and inside.sum() >= MIN_STEADY_COMPLETIONS:
            return ThroughputWindow(float(full_from), float(begins[-1]), STEADY)
    end = now if now is not None else (ends.max() if ends.size else np.nan)
    return ThroughputWindow(float(sends.min()), float(end), FULL)


def concurrency_of(load_point: str, info: PointInfo | None = None) -> int | None:
    """The closed loop's concurrency of a point, None for an open loop or trace (`throughput_window`)."""
    info = info or point_info_from_label(str(load_point))
    return info.concurrency if info.mode == "closed" else None


def running_output_rate(records: Iterable[RequestRecord], now: float) -> float:
    """Output tokens/s of a point still running, as the summary will count it: the measured ok requests'
    output tokens over its throughput window so far (a steady window once one exists, else the first send
    to `now`; record time base: each record's t0_monotonic plus its offsets). At the point's last end it is
    the summary's output_tok_s."""
    sends, begins, ends, tokens, concurrency = [], [], [], [], None
    for r in records:
        if r.warmup or r.send_s is None:
            continue
        concurrency = concurrency_of(r.load_point)
        sends.append(r.t0_monotonic + r.send_s)
        begins.append(sends[-1] + (timing.ttft(r) or 0.0))
        ends.append(np.nan if r.end_s is None else r.t0_monotonic + r.end_s)
        tokens.append(r.output_tokens if r.error_kind is None and r.end_s is not None else 0)
    window = throughput_window(sends, ends, concurrency, None, begins)
    if window.kind != STEADY:
        window = ThroughputWindow(window.start, now, FULL)
    counted = float((np.asarray(tokens, dtype=float) * window.shares(begins, ends)).sum()) if sends else 0.0
    seconds = window.seconds
    return counted / seconds if np.isfinite(seconds) and seconds > 0 else np.nan


def time_shares(begin_s: np.ndarray, end_s: np.ndarray, start: float, end: float) -> np.ndarray:
    """Per request, the share of its span (begin to end) that falls within [start, end]; a span of no
    length counts wholly when it ends inside. NaN times count nothing."""
    sends, ends = np.asarray(begin_s, dtype=float), np.asarray(end_s, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        inside = np.clip(np.minimum(ends, end) - np.maximum(sends, start), 0.0, None)
        share = np.where(ends > sends, inside / (ends - sends), ((ends >= start) & (ends <= end)) * 1.0)
    return np.nan_to_num(share, nan=0.0)
