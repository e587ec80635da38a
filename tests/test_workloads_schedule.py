"""Arrival schedules: seeded gaps with the right statistics, traces, bad settings refused."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from workloads.schedule import ClosedLoop, OpenLoop, TraceReplay

DATA = Path(__file__).parent / "data"


def test_constant_gaps_are_exact():
    offsets = OpenLoop(rate=4.0, arrival="constant").offsets(9)
    assert offsets == pytest.approx(np.arange(9) * 0.25)


@pytest.mark.parametrize("arrival,burstiness", [("poisson", 1.0), ("gamma", 0.25), ("gamma", 4.0)])
def test_gap_statistics(arrival, burstiness):
    rate = 7.5
    gaps = np.diff(OpenLoop(rate, arrival, burstiness, seed=5).offsets(100_001))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.02)
    # gamma with shape k has coefficient of variation 1/sqrt(k); Poisson arrivals have k = 1
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.03)


def test_seeded_and_lazy_draws_agree():
    schedule = OpenLoop(3.0, "gamma", 0.5, seed=17)
    eager = schedule.offsets(5000)
    lazy = list(itertools.islice(schedule.iter_offsets(), 5000))
    assert eager.tolist() == lazy
    assert schedule.offsets(10).tolist() == OpenLoop(3.0, "gamma", 0.5, seed=17).offsets(10).tolist()
    assert schedule.offsets(10).tolist() != OpenLoop(3.0, "gamma", 0.5, seed=18).offsets(10).tolist()


def test_trace_file():
    trace = TraceReplay.from_file(DATA / "trace.txt", time_scale=2.0)
    assert trace.offsets(6).tolist() == pytest.approx([0.0, 0.5, 1.0, 3.0, 3.0, 6.0])
    assert trace.rate == pytest.approx(5 / 6.0)
    assert trace.label == "trace=trace.txt"
    with pytest.raises(ValueError, match="has 6 send times"):
        trace.offsets(7)


def test_bad_settings(tmp_path):
    with pytest.raises(ValueError):
        ClosedLoop(0)
    with pytest.raises(ValueError):
        OpenLoop(0.0)
    with pytest.raises(ValueError):
        OpenLoop(1.0, "weibull")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        OpenLoop(1.0, "gamma", burstiness=0.0)
    with pytest.raises(ValueError, match="increasing"):
        TraceReplay((1.0, 0.5))
    bad = tmp_path / "t.txt"
    bad.write_text("0.1\nsoon\n")
    with pytest.raises(ValueError, match=r"t\.txt:2"):
        TraceReplay.from_file(bad)
    assert ClosedLoop(8).label == "c=8" and OpenLoop(2.0).label == "r=2"
