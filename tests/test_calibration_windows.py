"""Throughput windows and intervals against servers of known capacity.

Cases and tolerances:
- window rules on simulated FIFO servers (`window_sim`: `slots` requests at once, service time S, so the
  capacity is slots / S exactly), fresh seeds each run:
  - closed loops at concurrency 16 and 32 beyond 4 x 0.2 s and 8 x 0.4 s servers (20 requests/s), with a
    warm-up of a random size (none, fewer than the concurrency, more): requests/s and output tokens/s within
    1 % of 20 and 20 x 8 (the requests finish `slots` at a time; a window counting completions would be off
    by up to a group, the output spans' shares are not), and the window starts only after the last warm-up
    request has ended;
  - open loops: constant arrivals well below capacity give the offered rate (1 %), Poisson arrivals at
    twice the capacity give the capacity, not the offered rate, within 3 %;
  - too short for a steady window: the full window (first send to last end), flagged `full`;
  - the sweep's completion rate, the selection's per-launch throughput and the live progress rate are the
    summary's numbers.
- the throughput interval (batch means over the window) on simulated closed loops with exponential and
  nearly constant service times: over 200 fresh draws its 95 % interval holds the true capacity at least
  87 % of the time, and the ratio interval of two identical servers holds 1 at least 87 % of the time (they
  do 92-96 % of the time; below 87 % by chance is under 1 in 500).
- percentile intervals: distribution-free, +inf where the sample cannot bound the quantile.
- live (loopback): the scripted server with `--max-streams` 4 x 0.2 s at concurrency 16 and 8 x 0.4 s at 32,
  two fresh warm-up and request counts each: within -12 % / +3 % of slots / S (the server's own overhead per
  request on a busy machine only lowers its capacity; the client's clock reads a token a little after the
  server wrote it, which can shift a span's share by a fraction of a percent).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest
from window_sim import TOKENS, FifoServer, closed_loop, open_loop

from compare.analysis import selection
from compare.analysis.metrics import itl_table, latency_columns, request_table, summarize, window_samples
from compare.analysis.statistics import quantile_ci, throughput_ci, throughput_ratio_ci
from compare.analysis.sweep import point_facts
from compare.common.throughput_window import FULL, STEADY, running_output_rate, throughput_window

CASES = [(16, 4, 0.2), (32, 8, 0.4)]  # (concurrency, slots, service s): 20 requests/s each


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


@pytest.mark.parametrize(("concurrency", "slots", "service_s"), CASES)
def test_closed_loop_window_counts_only_measured_work(concurrency, slots, service_s):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    capacity = slots / service_s
    for warmup in (0, int(rng.integers(1, concurrency)), int(rng.integers(concurrency, 3 * concurrency))):
        records = closed_loop(concurrency, warmup, 200, FifoServer(slots, lambda s=service_s: s))
        row = summarize(records, n_boot=0).iloc[0]
        assert row["window"] == STEADY, (warmup, seed)
        assert row["request_rps"] == pytest.approx(capacity, rel=0.01), (warmup, seed)
        assert row["output_tok_s"] == pytest.approx(capacity * TOKENS, rel=0.01), (warmup, seed)
        measured = [r for r in records if not r.warmup]
        window = throughput_window([r.send_s for r in measured], [r.end_s for r in measured], concurrency)
        assert window.start >= max((r.end_s for r in records if r.warmup), default=-math.inf)
        assert window.end <= max(r.send_s for r in measured)
        if warmup >= concurrency:  # the old window (first measured send to last end) read clearly low
            old = len(measured) / (max(r.end_s for r in measured) - min(r.send_s for r in measured))
            assert old < 0.96 * capacity


def test_open_loop_windows():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    # constant arrivals at 10/s, service 0.2 s on ample slots: the offered pace, less what the server,
    # empty when the window opens, has not yet begun (under one output span, 0.175 s of 15 s: 1 % allowed)
    steady = open_loop(np.arange(150) / 10.0, int(rng.integers(0, 20)), FifoServer(100, lambda: 0.2))
    row = summarize(steady, n_boot=0).iloc[0]
    assert row["window"] == STEADY and row["request_rps"] == pytest.approx(10.0, rel=0.01)
    # Poisson arrivals at twice a 4 x 0.2 s server's capacity: the window reads the capacity
    flood = open_loop(np.cumsum(rng.exponential(1 / 40, 300)), 8, FifoServer(4, lambda: 0.2))
    row = summarize(flood, n_boot=0).iloc[0]
    assert row["window"] == STEADY and row["request_rps"] == pytest.approx(20.0, rel=0.03), seed


def test_too_short_for_a_steady_window_falls_back_to_the_full_window():
    records = closed_loop(16, 4, 10, FifoServer(4, lambda: 0.2))  # fewer requests than the concurrency
    measured = [r for r in records if not r.warmup]
    row = summarize(records, n_boot=0).iloc[0]
    span = max(r.end_s for r in measured) - min(r.send_s for r in measured)
    assert row["window"] == FULL
    assert row["duration_s"] == pytest.approx(span) and row["request_rps"] == pytest.approx(10 / span)
    window = throughput_window([], [], 4)
    assert window.kind == FULL and math.isnan(window.seconds)


def test_sweep_selection_and_progress_use_the_summary_window():
    rng = np.random.default_rng(fresh_seed())
    records = closed_loop(8, 5, 120, FifoServer(3, lambda: float(rng.uniform(0.1, 0.3))))
    row = summarize(records, n_boot=0).iloc[0]
    table = request_table([r for r in records if not r.warmup])
    # the sweep's throughput reading is the summary's (its completion pace, for the saturation test, counts
    # ends against sends instead: compare.analysis.sweep)
    assert point_facts(row.to_dict(), table).throughput_rps == pytest.approx(row["request_rps"])
    assert selection._throughput(table[table["status"] == "ok"]) == pytest.approx(row["output_tok_s"])
    last_end = max(r.end_s for r in records)
    assert running_output_rate(records, last_end) == pytest.approx(row["output_tok_s"])


@pytest.mark.parametrize("shape", [1.0, 50.0])  # exponential, and nearly constant (completions in groups)
def test_throughput_interval_covers_the_true_capacity(shape):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    slots, mean_s = 4, 0.2

    def service() -> float:
        return float(rng.gamma(shape, mean_s / shape))

    def draw() -> pd.DataFrame:
        records = closed_loop(16, int(rng.integers(0, 32)), 250, FifoServer(slots, service))
        return request_table([r for r in records if not r.warmup])

    trials, covered, ratio_covered, widths = 200, 0, 0, []
    for _ in range(trials):
        a, b = draw(), draw()
        sa, sb = window_samples(a, None), window_samples(b, None)
        rate = sum(s.total for s in sa) / sum(s.seconds for s in sa)
        lo, hi = throughput_ci(sa)
        covered += lo * rate <= slots / mean_s <= hi * rate
        rb = sum(s.total for s in sb) / sum(s.seconds for s in sb)
        rlo, rhi = throughput_ratio_ci(sa, sb)
        ratio_covered += rlo * rate / rb <= 1 <= rhi * rate / rb
        widths.append(hi - lo)
    assert covered / trials >= 0.87 and ratio_covered / trials >= 0.87, (covered, ratio_covered, seed)
    assert np.median(widths) < 0.5  # informative: about 230 requests pin the rate to some 10-20 %


def test_throughput_interval_needs_enough_completions_and_keeps_the_legacy_form():
    records = closed_loop(4, 0, 8, FifoServer(2, lambda: 0.1))
    samples = window_samples(request_table(records), None)
    assert all(math.isnan(v) for v in throughput_ci(samples))  # under 2 sub-windows of 5 completions
    rng = np.random.default_rng(fresh_seed())
    busy = rng.exponential(1.0, 50)
    lo, hi = throughput_ci(busy * 10, busy, n_boot=200)  # (tokens, request seconds): requests resampled
    assert lo <= 1 <= hi


def test_percentile_intervals_are_distribution_free_and_unbounded_beyond_the_data():
    rng = np.random.default_rng(fresh_seed())
    records = closed_loop(4, 0, 60, FifoServer(2, lambda: float(rng.uniform(0.05, 0.15))))
    row = summarize(records, n_boot=200).iloc[0]
    e2e = request_table(records)["e2e_s"].to_numpy(dtype=float)
    lo, hi = quantile_ci(e2e, 0.5)
    assert row["e2e_p50_ms_lo"] == pytest.approx(lo * 1e3) and row["e2e_p50_ms_hi"] == pytest.approx(hi * 1e3)
    assert row["e2e_p99_ms_hi"] == math.inf  # 60 values cannot bound a p99 from above
    assert row["e2e_p50_ms_lo"] <= row["e2e_p50_ms"] <= row["e2e_p50_ms_hi"]
    gaps = itl_table(records)["gap_s"].to_numpy() * 1e3
    assert row["itl_p99_ms_hi"] == math.inf or row["itl_p99_ms_hi"] < gaps.max()  # never the largest gap
    # three requests' gaps: the cluster bootstrap's p99 reaches the largest gap, so it is reported unbounded
    cols = latency_columns("itl", np.repeat([0.01, 0.02, 0.05], 3), np.repeat([0, 1, 2], 3), 0, 200)
    assert cols["itl_p99_ms_hi"] == math.inf and cols["itl_p50_ms_lo"] == -math.inf
    assert row["itl_mean_ms_lo"] <= row["itl_mean_ms"] <= row["itl_mean_ms_hi"] < math.inf


@pytest.mark.live
@pytest.mark.timing
@pytest.mark.parametrize(("concurrency", "slots", "service_s"), CASES)
def test_scripted_server_closed_loop_reads_its_capacity(tmp_path, concurrency, slots, service_s):
    from adapters import get_adapter
    from adapters.request_spec import RequestSpec
    from instruments.scripted_server import ScriptedSchedule, scripted_server
    from workloads.loadgen import PointJob, run_load_sync
    from workloads.records import read_records
    from workloads.schedule import ClosedLoop

    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    tokens = 4
    schedule = ScriptedSchedule(ttft_s=service_s / tokens, itl_s=service_s / tokens, output_tokens=tokens)
    capacity = slots / service_s
    with scripted_server(default_schedule=schedule, max_streams=slots) as server:
        for k in range(2):
            warm = int(rng.integers(1, 2 * concurrency))
            n = concurrency + int(rng.uniform(6, 8) * capacity)  # a steady window of 6-8 s
            specs = [RequestSpec(f"q{k}-{i}", (5, 6, 7), "a b c", tokens) for i in range(n)]
            warmup = [RequestSpec(f"w{k}-{i}", (5, 6, 7), "a b c", tokens) for i in range(warm)]
            path = tmp_path / f"r{k}.jsonl"
            run_load_sync(
                PointJob(
                    server.url,
                    get_adapter("vllm"),
                    specs,
                    ClosedLoop(concurrency),
                    warmup_specs=warmup,
                    output_path=path,
                    run_id=f"run{k}",
                )
            )
            row = summarize(read_records(path), n_boot=0).iloc[0]
            assert row["requests_ok"] == n and row["window"] == STEADY, (k, seed)
            assert 0.88 * capacity <= row["request_rps"] <= 1.03 * capacity, (row["request_rps"], warm, seed)


def test_report_writes_an_unbounded_end_as_such():
    from compare.report.blocks import with_interval

    row = pd.Series({"x": 10.0, "x_lo": 9.0, "x_hi": math.inf, "y": 5.0, "y_lo": -math.inf, "y_hi": math.inf})
    assert with_interval(row, "x") == "10.0 [9.0–unbounded]" and with_interval(row, "y") == "5.0 [unbounded]"
    row = pd.Series({"x": 10.0, "x_lo": math.nan, "x_hi": math.nan})
    assert with_interval(row, "x") == "10.0"
