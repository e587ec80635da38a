"""The comparator's metrics on hand-built records, against answers computed by hand (in the comments)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from compare.analysis.metrics import itl_table, request_table, summarize
from compare.common.datatypes import PointInfo
from workloads import timing
from workloads.records import ErrorKind, RequestRecord


def rec(request_id: str, send: float | None, events: list[tuple[float, int, int]], **kw) -> RequestRecord:
    fields = dict(
        run_id="run1",
        request_id=request_id,
        backend="x",
        variant="v",
        load_point="c=2",
        t0_monotonic=100.0,
        prompt_tokens=10,
        wanted_output_tokens=sum(n for _, n, _ in events),
        output_length_forced=True,
        scheduled_s=(send or 0.0),
        start_s=send,
        send_s=send,
        end_s=(events[-1][0] + 0.01) if events else (send or 0.0) + 0.01,
        events=events,
        http_status=200,
        output_tokens=sum(n for _, n, _ in events),
        event_tokens=sum(n for _, n, _ in events),
    )
    fields.update(kw)
    return RequestRecord(**fields)


@pytest.fixture
def records() -> list[RequestRecord]:
    return [
        # ok: role-only chunk, then 1, 2 (one event carrying two tokens) and 1 tokens
        # ttft 0.10, e2e 0.25, tpot (0.25-0.10)/3 = 0.05; itl [0.025, 0.025, 0.10]; per event [0.05, 0.10]
        rec(
            "r1",
            1.0,
            [(1.05, 0, 0), (1.10, 1, 3), (1.15, 2, 6), (1.25, 1, 3), (1.26, 0, 0)],
            scheduled_s=0.999,
            prompt_tokens=10,
            usage_prompt_tokens=11,
            usage_completion_tokens=4,
            output_tokens_source="usage",
        ),
        # ok: an empty event between the two tokens and a usage-only event at the end
        # ttft 0.20, e2e 0.30, tpot 0.10/1; itl [0.10]; the client's re-tokenisation disagreed
        rec(
            "r2",
            2.0,
            [(2.20, 1, 2), (2.25, 0, 0), (2.30, 1, 2), (2.31, 0, 0)],
            scheduled_s=1.998,
            prompt_tokens=20,
            retokenized_tokens=3,
            token_count_mismatch=True,
        ),
        # failed after one token: counted as failed, never in the latencies
        rec(
            "r3",
            3.0,
            [(3.1, 1, 2)],
            scheduled_s=2.997,
            prompt_tokens=40,
            error_kind=ErrorKind.CONNECTION_RESET,
            error_message="reset",
        ),
        # cancelled before it was sent: no send time, so no lag either
        rec("r4", None, [], scheduled_s=3.5, error_kind=ErrorKind.CANCELLED, error_message="stopped"),
        # warm-up: ignored entirely
        rec("w0", 0.1, [(0.9, 5, 5)], warmup=True, prompt_tokens=999),
        # ok, one token although four were forced: ttft = e2e = 0.40, no tpot, no itl; ends at 4.45
        rec(
            "r6", 4.0, [(4.40, 1, 1)], scheduled_s=3.996, prompt_tokens=30, wanted_output_tokens=4, end_s=4.45
        ),
    ]


def test_request_table_uses_the_declared_definitions(records):
    table = request_table(records).set_index("request_id")
    assert table.loc["r1", "ttft_s"] == pytest.approx(0.10)
    assert table.loc["r1", "e2e_s"] == pytest.approx(0.25)
    assert table.loc["r1", "tpot_s"] == pytest.approx(0.05)
    assert table.loc["r1", "input_tokens"] == 11  # the server's usage wins over our count
    assert table.loc["r2", "tpot_s"] == pytest.approx(0.10)
    assert math.isnan(table.loc["r6", "tpot_s"])
    assert list(table["status"]) == ["ok", "ok", "failed", "cancelled", "ok", "ok"]
    assert math.isnan(table.loc["r4", "lag_s"]) and math.isnan(table.loc["r4", "ttft_s"])
    assert table.loc["r2", "lag_s"] == pytest.approx(0.002)


def test_itl_per_token_and_per_event(records):
    gaps = itl_table(records)
    by_row = gaps.groupby("row")["gap_s"].apply(list)
    assert by_row[0] == pytest.approx([0.025, 0.025, 0.10])
    assert by_row[1] == pytest.approx([0.10])
    assert 5 not in by_row.index  # a single token has no gap
    events = itl_table(records, per_event=True).groupby("row")["gap_s"].apply(list)
    assert events[0] == pytest.approx([0.05, 0.10])


def test_summary_by_hand(records):
    points = {"run1": PointInfo(workload="wl", mode="closed", concurrency=2)}
    s = summarize(records, points, slo={"ttft": 0.25, "tpot": 0.06}, n_boot=200)
    assert len(s) == 1
    row = s.iloc[0]
    assert (row["backend"], row["variant"], row["workload"], row["load_point"]) == ("x", "v", "wl", "c=2")
    assert (row["requests"], row["requests_ok"], row["requests_failed"], row["requests_cancelled"]) == (
        5,
        3,
        1,
        1,
    )
    assert row["errors"] in ("connection_reset: 1; cancelled: 1", "cancelled: 1; connection_reset: 1")
    # TTFT of the ok requests: 0.10, 0.20, 0.40
    assert row["ttft_n"] == 3
    assert row["ttft_mean_ms"] == pytest.approx(700 / 3)
    assert row["ttft_std_ms"] == pytest.approx(152.7525, abs=1e-3)  # sqrt(0.046667 / 2)
    assert row["ttft_p50_ms"] == pytest.approx(200)
    assert row["ttft_p90_ms"] == pytest.approx(360)  # 0.2 + 0.8 * (0.4 - 0.2), numpy's linear rule
    assert row["ttft_p99_ms"] == pytest.approx(396)
    # TPOT 0.05 and 0.10 (r6 has none); E2E 0.25, 0.30, 0.40
    assert row["tpot_n"] == 2 and row["tpot_p50_ms"] == pytest.approx(75)
    assert row["e2e_p50_ms"] == pytest.approx(300)
    # ITL per token 0.025, 0.025, 0.10, 0.10 (the failed request's gaps are not counted)
    assert row["itl_n"] == 4
    assert row["itl_mean_ms"] == pytest.approx(62.5)
    assert row["itl_p50_ms"] == pytest.approx(62.5)
    assert row["itl_p90_ms"] == pytest.approx(100)
    assert row["itl_event_n"] == 3 and row["itl_event_p50_ms"] == pytest.approx(100)
    # the steady window of c=2: from the second first token (r2's, 2.20) to the last (r6's, 4.40), two ends
    # inside it (2.32, 3.11); of the ok requests' output spans only r2's (2.20 to 2.32) lies in it, wholly
    assert row["window"] == "steady" and row["window_requests"] == pytest.approx(1.0)
    assert row["duration_s"] == pytest.approx(2.2)
    assert row["output_tokens"] == 7 and row["output_tok_s"] == pytest.approx(2 / 2.2)
    assert row["input_tokens"] == 11 + 20 + 30 and row["input_tok_s"] == pytest.approx(20 / 2.2)
    assert row["request_rps"] == pytest.approx(1 / 2.2)
    # SLO ttft <= 250 ms and tpot <= 60 ms: only r1 meets both, and it lies before the window
    assert row["goodput_n"] == 1 and row["goodput_rps"] == 0.0
    assert row["goodput_frac"] == pytest.approx(1 / 5)
    # sends at 1, 2, 3, 4 s: achieved 1 request/s; lags 1, 2, 3, 4 ms
    assert row["achieved_rps"] == pytest.approx(1.0)
    assert (
        row["lag_n"] == 4
        and row["lag_p50_ms"] == pytest.approx(2.5)
        and row["lag_max_ms"] == pytest.approx(4)
    )
    assert row["lag_p99_ms"] == pytest.approx(3.97)
    assert row["token_mismatches"] == 1
    assert row["output_short"] == 1  # r6: one token of four forced
    assert row["output_tokens_from_usage"] == 1
    assert row["concurrency"] == 2 and row["mode"] == "closed"
    # intervals bracket their estimates
    for stat in ("mean", "p50"):
        assert row[f"ttft_{stat}_ms_lo"] <= row[f"ttft_{stat}_ms"] <= row[f"ttft_{stat}_ms_hi"]


def test_no_slo_gives_no_goodput_and_groups_split(records):
    other = [r.model_copy(update={"variant": "w", "run_id": "run2"}) for r in records]
    s = summarize(records + other, n_boot=0)
    assert len(s) == 2 and set(s["variant"]) == {"v", "w"}
    assert s["goodput_rps"].isna().all()
    assert s["ttft_p50_ms_lo"].isna().all()  # n_boot=0: no intervals


def test_tpot_slo_is_met_by_a_single_token_output(records):
    s = summarize([records[5]], slo={"tpot": 0.001}, n_boot=0)
    assert s.iloc[0]["goodput_n"] == 1


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def test_vectorised_itl_equals_timing_itl_on_random_records():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    records = []
    for i in range(50):
        n = int(rng.integers(0, 30))
        # about a third of the steps are 0: events read together, which the per-token view merges
        times = np.cumsum(rng.uniform(0, 0.05, n) * (rng.random(n) > 0.3)) + 1.0
        tokens = rng.integers(0, 4, n)
        records.append(rec(f"r{i}", 0.5, [(float(t), int(k), 1) for t, k in zip(times, tokens, strict=True)]))
    gaps = itl_table(records)
    for i, r in enumerate(records):
        assert gaps.loc[gaps["row"] == i, "gap_s"].tolist() == pytest.approx(timing.itl(r)), f"seed {seed}"
    events = itl_table(records, per_event=True)
    for i, r in enumerate(records):
        assert events.loc[events["row"] == i, "gap_s"].tolist() == pytest.approx(timing.itl_per_event(r)), (
            seed
        )


def test_latency_from_the_intended_send_on_random_records():
    """Scheduled, send and token times drawn at random (a fresh seed each run, none of them zero): TTFT and
    E2E from the intended send are the from-send ones plus the lag, kept at open-loop points only."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    records, expected = [], []
    for i in range(40):
        scheduled = float(rng.uniform(0.5, 5.0))
        lag = float(rng.uniform(1e-4, 0.08))
        send = scheduled + lag
        first = float(rng.uniform(0.005, 0.3))  # from the send
        gaps = rng.uniform(0.001, 0.02, int(rng.integers(0, 6)))
        token_times = send + first + np.concatenate([[0.0], np.cumsum(gaps)])
        events = [(send + first / 2, 0, 0)]  # a role-only event does not count
        events += [(float(t), int(rng.integers(1, 4)), 3) for t in token_times]
        events.append((float(token_times[-1]) + 0.001, 0, 0))  # usage-only
        last = float(token_times[-1]) - send
        records.append(rec(f"r{i}", send, events, scheduled_s=scheduled, load_point="r=7", run_id="open"))
        expected.append((first, last, lag + first, lag + last))
    for r, (ttft, e2e, ttft_intended, e2e_intended) in zip(records, expected, strict=True):
        assert timing.ttft(r) == pytest.approx(ttft, abs=1e-12), f"seed {seed}"
        assert timing.e2e(r) == pytest.approx(e2e, abs=1e-12), f"seed {seed}"
        assert timing.ttft_intended(r) == pytest.approx(ttft_intended, abs=1e-12), f"seed {seed}"
        assert timing.e2e_intended(r) == pytest.approx(e2e_intended, abs=1e-12), f"seed {seed}"
    closed = [r.model_copy(update={"run_id": "closed", "load_point": "c=3"}) for r in records]
    points = {"open": PointInfo("wl", "open", rate=7.0), "closed": PointInfo("wl", "closed", concurrency=3)}
    table = request_table(records + closed, points).set_index(["run_id", "request_id"])
    assert table.loc[("open", "r3"), "ttft_intended_s"] == pytest.approx(expected[3][2]), f"seed {seed}"
    assert table.loc["closed", "ttft_intended_s"].isna().all()
    assert table.loc["closed", "e2e_intended_s"].isna().all()
    summary = summarize(records + closed, points, n_boot=0).set_index("load_point")
    for q in (50, 90, 99):
        for col, k in (("ttft_intended", 2), ("e2e_intended", 3), ("ttft", 0)):
            want = np.percentile([e[k] for e in expected], q) * 1e3
            assert summary.loc["r=7", f"{col}_p{q}_ms"] == pytest.approx(want), f"seed {seed}"
    assert summary.loc["r=7", "ttft_intended_n"] == 40 and summary.loc["c=3", "ttft_intended_n"] == 0
    assert math.isnan(summary.loc["c=3", "e2e_intended_p50_ms"])
    assert summary.loc["c=3", "ttft_p50_ms"] == pytest.approx(summary.loc["r=7", "ttft_p50_ms"])
