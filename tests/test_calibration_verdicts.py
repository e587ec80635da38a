"""Calibration of the verdicts: does "established" mean what `compare.analysis.confidence` says it means?

(a) Statistics, fast: synthetic request tables drawn from known distributions, many seeds, through the real
verdict functions (`compare_latency`, `compare_throughput`, and `selection` for the whole decision).
- A/A (identical distributions): the share of pairs called established stays within the stated false-positive
  rate, 5 %, plus a binomial allowance (the 99th percentile of Binomial(seeds, 0.05), from scipy.stats).
- Drift between turns (each backend's turn 3 % slower than the one before it, as a machine that warms up or
  gets busier): with one launch each the verdict is at most "indicated", never established, even where drift
  alone makes the interval exclude 1; with two launches in alternating order (ABBA) the A/A pair stays within
  the false-positive rate.
- A/B 15 % apart: a 20-request pilot asks the tool how many requests it needs (`requests_needed`, 80 % power);
  at that size, split over two alternating launches, the difference is established in most seeds (at least
  65 %, allowing for the pilot's own noise in that estimate).
(b) Live, short: `compare run` against two identical scripted servers on loopback (same latency
distribution): no established winner.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from compare_cli import run_compare
from scipy import stats

from compare.analysis.confidence import Confidence, requests_needed
from compare.analysis.metrics import window_rate
from compare.analysis.selection import compare_latency, compare_throughput
from instruments.scripted_server import ScriptedSchedule, scripted_server

SEEDS = 200
FALSE_POSITIVE = 0.05
ALLOWED = int(stats.binom.ppf(0.99, SEEDS, FALSE_POSITIVE))  # established A/A pairs allowed in SEEDS (17)
SIGMA = 0.25  # log-normal spread of a request's latency
DRIFT = 0.03  # each turn of a backend 3 % slower than the turn before it
CONCURRENCY = 4


def _turn(rng: np.random.Generator, key: str, repeat: int, n: int, scale: float) -> pd.DataFrame:
    """`n` requests of one backend's turn: a closed loop of CONCURRENCY streams, each request's time
    log-normal around `scale` seconds, 64 output tokens each."""
    e2e = scale * rng.lognormal(0.0, SIGMA, n)
    send, end = np.zeros(n), np.zeros(n)
    free = np.zeros(CONCURRENCY)
    for i in range(n):
        slot = int(np.argmin(free))
        send[i], end[i] = free[slot], free[slot] + e2e[i]
        free[slot] = end[i]
    return pd.DataFrame(
        {
            "backend": key,
            "variant": "",
            "workload": "wl",
            "load_point": f"c={CONCURRENCY}",
            "status": "ok",
            "warmup": False,
            "repeat": repeat,
            "run_id": f"{key}-{repeat}",
            "e2e_s": e2e,
            "ttft_s": 0.1 * e2e,
            "output_tokens": 64.0,
            "send_s": send,
            "end_s": end,
        }
    )


def _table(seed: int, scales: dict[str, float], n: int, launches: int, drift: float) -> pd.DataFrame:
    """Launches in alternating order (A B, then B A, ...): each turn `drift` slower than the one before."""
    rng = np.random.default_rng(seed)
    parts, position = [], 0
    for repeat in range(launches):
        order = list(scales) if repeat % 2 == 0 else list(scales)[::-1]
        for key in order:
            parts.append(_turn(rng, key, repeat, n, scales[key] * (1 + drift) ** position))
            position += 1
    return pd.concat(parts, ignore_index=True)


def _row(requests: pd.DataFrame, key: str) -> dict[str, object]:
    """The summary row `compare_throughput` reads: output tokens over the throughput window, a closed-loop
    point (each launch's window rate, averaged)."""
    mine = requests[requests["backend"] == key]
    rate = float(np.mean([window_rate(g) for _, g in mine.groupby("repeat")]))
    return {
        "backend": key,
        "variant": "",
        "workload": "wl",
        "load_point": f"c={CONCURRENCY}",
        "mode": "closed",
        "output_tok_s": rate,
    }


def _verdicts(seed: int, scales: dict[str, float], n: int, launches: int, drift: float) -> tuple[str, str]:
    """The latency and throughput verdicts of A against B, each oriented to whichever is better."""
    requests = _table(seed, scales, n, launches, drift)
    a, b = _row(requests, "a"), _row(requests, "b")
    latency = compare_latency(requests, a, b, seed)
    throughput = compare_throughput(requests, a, b, goodput=False, seed=seed)
    return latency.verdict.level.value, throughput.verdict.level.value


ESTABLISHED = Confidence.ESTABLISHED.value


@pytest.mark.parametrize("drift", [0.0, DRIFT])
def test_aa_pairs_in_alternating_launches_stay_within_the_false_positive_rate(drift):
    """A/A, 40 requests a launch, two launches ABBA: established in at most ALLOWED of SEEDS seeds, in either
    class, with or without drift between turns."""
    found = [_verdicts(seed, {"a": 1.0, "b": 1.0}, 40, 2, drift) for seed in range(SEEDS)]
    for k, name in enumerate(("latency", "throughput")):
        established = sum(v[k] == ESTABLISHED for v in found)
        assert established <= ALLOWED, (name, established, ALLOWED)


def test_one_launch_each_is_never_established_even_when_drift_separates_the_turns():
    """A/A with 3 % drift between the two turns, 200 requests each: the within-run interval often excludes
    1 (drift looks like a difference), so the verdict may say indicated, never established."""
    found = [_verdicts(seed, {"a": 1.0, "b": 1.0}, 200, 1, DRIFT) for seed in range(SEEDS)]
    levels = {v for pair in found for v in pair}
    assert ESTABLISHED not in levels, levels
    assert Confidence.INDICATED.value in levels  # the drift is seen, and called no more than indicated


def test_ab_pair_is_established_at_the_size_the_tool_asks_for():
    """B 15 % slower: a 20-request pilot gives the tool's `requests_needed`; that many requests, in two
    alternating launches with 3 % drift between turns, establish A as faster in at least 65 % of 60 seeds."""
    seeds, wins, sizes = 60, 0, []
    for seed in range(seeds):
        pilot = _table(10_000 + seed, {"a": 1.0, "b": 1.15}, 20, 1, 0.0)
        cmp = compare_latency(pilot, _row(pilot, "a"), _row(pilot, "b"), seed)
        ratio = max(cmp.ratio, 1 / cmp.ratio)
        lo = cmp.lo if cmp.ratio >= 1 else 1 / cmp.hi
        need = requests_needed(ratio, lo, 20) or 20
        need = min(need, 2000)  # a pilot that happened to see almost no difference
        sizes.append(need)
        per_launch = math.ceil(need / 2)
        requests = _table(seed, {"a": 1.0, "b": 1.15}, per_launch, 2, DRIFT)
        found = compare_latency(requests, _row(requests, "a"), _row(requests, "b"), seed)
        wins += found.verdict.level.value == ESTABLISHED and found.ratio > 1
    assert wins >= 0.65 * seeds, (wins, sorted(sizes))


# -- (b) live: two identical scripted servers --------------------------------------------------------------


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timing
def test_live_aa_pair_through_compare_run_names_no_established_winner(llama_dir, tmp_path):
    """Two scripted servers with the same schedule (TTFT 10 ms, 3 ms a token) on loopback, measured by one
    `compare run` as running endpoints, twice in alternating order (`--repeats 2`, so that established is
    within reach): whatever either verdict says, it is not established."""
    same = ScriptedSchedule(ttft_s=0.01, itl_s=0.003)
    out = tmp_path / "run"
    with (
        scripted_server(flavor="vllm", default_schedule=same) as a,
        scripted_server(flavor="trtllm", default_schedule=same) as b,
    ):
        run_compare(
            "run",
            "--backends",
            "vllm,trtllm",
            "--endpoint",
            f"vllm={a.url}",
            "--endpoint",
            f"trtllm={b.url}",
            "--model",
            "scripted-model",
            "--tokenizer",
            str(llama_dir),
            "--concurrency",
            "1,4",
            "--num-requests",
            "30",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--n-boot",
            "300",
            "--repeats",
            "2",
            "--out",
            str(out),
        )
    report = (out / "report.md").read_text()
    decision = report.split("## Decision", 1)[1].split("## Warnings", 1)[0]
    verdicts = [p for p in decision.split("\n\n") if p.startswith(("**Interactive**", "**Throughput"))]
    assert len(verdicts) == 2, decision
    for verdict in verdicts:
        assert "per launch" in verdict or "ahead in each of" in verdict or ": tie" in verdict, verdict
        assert not re.search(r": established\b", verdict), verdict
