"""Normalisation, break-even and memory trade-offs: hand-computed answers."""

from __future__ import annotations

import math

import pytest

from compare.analysis.costs import (
    break_even,
    cost_per_million_tokens,
    graph_pool_trade,
    prefill_ms_per_1k,
    roofline_tpot_ms,
)
from compare.common.datatypes import SetupReport


def test_prefill_roofline_and_cost():
    assert prefill_ms_per_1k(50.0, 500.0) == pytest.approx(100.0)  # 50 ms for 500 tokens = 100 ms per 1k
    # 16 GB of weights at 4000 GB/s: 4 ms per decode step
    assert roofline_tpot_ms(16e9, 4000.0) == pytest.approx(4.0)
    # plus 8 sequences x 1000 tokens x 128 KiB of KV: 16e9 + 1.048576e9 bytes
    assert roofline_tpot_ms(16e9, 4000.0, 8, 1000, 131072) == pytest.approx(
        (16e9 + 8 * 1000 * 131072) / 4e12 * 1e3
    )
    assert math.isnan(roofline_tpot_ms(16e9, 0.0))
    # $3.60 an hour at 1000 tokens/s: 3.6e6 tokens per hour -> $1 per million
    assert cost_per_million_tokens(3.6, 1000.0) == pytest.approx(1.0)
    assert math.isnan(cost_per_million_tokens(None, 1000.0))


def test_break_even_by_hand():
    # A starts 60 s later but serves a request 0.5 s sooner (1.5 s against 2.0 s): 120 requests,
    # which at A's 1.5 s per request is 180 s = 0.05 h
    be = break_even(90.0, 30.0, 1.5, 2.0)
    assert be.requests == pytest.approx(120) and be.hours == pytest.approx(0.05)
    assert be.verdict == "after 120 requests (3 min of serving)"
    assert break_even(10.0, 30.0, 1.5, 2.0).requests == 0  # faster and quicker to start
    assert break_even(90.0, 30.0, 2.5, 2.0).requests is None  # slower per request: never
    assert break_even(90.0, 30.0, 2.0, 2.0).verdict == "never"


def test_graph_pool_trade():
    setup = SetupReport(
        "reference",
        "graphs",
        "process",
        "http://x",
        memory={"graph_pool": 2**30, "kv_cache": 8 * 2**30, "kv_tokens": 65536},
    )
    trade = graph_pool_trade(setup, seq_tokens=512)
    # 8 GiB for 65536 tokens = 128 KiB per token; 1 GiB of pool = 8192 tokens = 16 sequences of 512
    assert trade.kv_tokens == pytest.approx(8192) and trade.sequences == pytest.approx(16)
    assert graph_pool_trade(SetupReport("r", "eager", "process", "x", memory={"kv_cache": 1.0}), 10) is None


def test_ttft_per_input_token_only_where_no_request_queues():
    """At c=4 a TTFT is mostly waiting behind the other streams: dividing it by the prompt length is not
    a prefill cost, so only a single-stream point gets the normalised TTFT."""
    import pandas as pd

    from compare.analysis.costs import add_normalized

    summary = pd.DataFrame(
        {
            "backend": ["b"] * 3,
            "variant": [""] * 3,
            "mode": ["closed", "closed", "open"],
            "concurrency": [1, 4, None],
            "ttft_p50_ms": [50.0, 26000.0, 400.0],
            "tpot_p50_ms": [10.0, 12.0, 11.0],
            "input_tokens_mean": [500.0, 500.0, 500.0],
            "output_tokens_mean": [100.0, 100.0, 100.0],
            "output_tok_s": [90.0, 300.0, 200.0],
        }
    )
    out = add_normalized(summary, {}, None, None, None)
    assert out["prefill_ms_per_1k_in"].iloc[0] == pytest.approx(100.0)
    assert out["prefill_ms_per_1k_in"].iloc[1:].isna().all()


def test_counted_words_agree_with_their_number():
    from compare.analysis.costs import BreakEven
    from compare.common.text import plural

    assert plural(1, "request") == "1 request" and plural(2, "request") == "2 requests"
    assert plural(0, "launch", "launches") == "0 launches" and plural(1200, "token") == "1,200 tokens"
    assert plural(0.6, "request") == "1 request"  # agrees with the number shown, not the one computed
    assert BreakEven(3.0, 5.0, 1.0, 0.001).verdict.startswith("after 1 request (")
    assert BreakEven(3.0, 1.0, 3.0, 0.001).verdict.startswith("after 3 requests (")


def test_warnings_count_one_in_the_singular():
    import pandas as pd

    from compare.analysis.caveats import point_caveats

    row = {
        "backend": "b",
        "variant": "",
        "workload": "wl",
        "load_point": "c=1",
        "requests": 1,
        "requests_ok": 1,
        "requests_failed": 1,
        "errors": "timeout: 1",
        "interrupted": True,
        "requests_cancelled": 1,
        "token_mismatches": 1,
        "token_mismatches_server": 0,
        "output_short": 1,
        "mode": "closed",
    }
    text = " ".join(point_caveats(pd.DataFrame([row]), {}))
    assert "1 of 1 request failed" in text and "1 request cancelled" in text
    assert "1 of 1 response disagrees" in text and "1 response is shorter" in text
    assert "requests" not in text and "responses" not in text
