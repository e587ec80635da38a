"""The statistics (`compare.analysis.statistics`): answers known by hand or by construction, and intervals and
tests checked on fresh random data against the truth they were drawn from."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from compare.analysis.statistics import (
    bootstrap_ci,
    holm,
    mann_whitney,
    ratio_ci,
    throughput_ci,
    throughput_ratio_ci,
)


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def test_mann_whitney_exact_by_hand():
    """Without ties and at small n the p-value is exact: two fully separated samples of 3 are one of the 2
    most extreme of the C(6, 3) = 20 equally likely orderings, so p = 0.1 (the normal approximation gave
    0.081); of 4 and 4, 2 of C(8, 4) = 70."""
    assert mann_whitney(np.array([1.0, 2, 3]), np.array([4.0, 5, 6])) == pytest.approx(0.1)
    assert mann_whitney(np.array([1.0, 2, 3, 4]), np.array([5.0, 6, 7, 8])) == pytest.approx(2 / 70)
    assert mann_whitney(np.array([1.0, 1, 1]), np.array([1.0, 1, 1])) == 1.0
    assert math.isnan(mann_whitney(np.array([]), np.array([1.0])))


def test_mann_whitney_with_ties_by_hand():
    """With ties: the normal approximation with tie and continuity corrections. a = 1,2,3,3 and b = 3,4,5,6
    rank 1,2,4,4 against 4,6,7,8: U = 11 - 10 = 1, mean 8, one tie of 3 takes 24 / 56 off n + 1, so
    sigma = sqrt(16 / 12 * (9 - 3 / 7)) and z = (1 - 8 + 0.5) / sigma."""
    z = -6.5 / math.sqrt(16 / 12 * (9 - 3 / 7))
    p = mann_whitney(np.array([1.0, 2, 3, 3]), np.array([3.0, 4, 5, 6]))
    assert p == pytest.approx(math.erfc(abs(z) / math.sqrt(2)))


@pytest.mark.parametrize("n", [12, 300])  # the exact test (a c=1 point's few requests), the approximation
def test_mann_whitney_rejects_at_its_level_under_the_null_and_finds_a_shift(n):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    trials = 300
    null = [mann_whitney(rng.lognormal(0, 0.5, n), rng.lognormal(0, 0.5, n)) for _ in range(trials)]
    rejected = np.mean(np.array(null) < 0.05)
    assert 0.015 <= rejected <= 0.09, (rejected, seed)
    shifted = [mann_whitney(rng.normal(0, 1, n), rng.normal(1.5, 1, n)) for _ in range(50)]
    assert np.mean(np.array(shifted) < 0.05) > 0.8, seed


def test_ratio_ci_covers_the_true_ratio_of_medians():
    """The true ratio of medians of N(200, 10) and N(100, 5) is 2: its 95 % interval should hold it in about
    95 % of fresh draws."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    trials, covered = 60, 0
    for k in range(trials):
        a, b = rng.normal(200, 10, 200), rng.normal(100, 5, 200)
        ratio, lo, hi = ratio_ci(a, b, "p50", n_boot=400, seed=k)
        assert lo <= ratio <= hi
        covered += lo < 2.0 < hi
    assert covered / trials >= 0.83, (covered, seed)


def test_throughput_interval_covers_the_true_rate_of_service():
    """Requests of exponential length at 50 tokens/s: the interval (factors of the measured rate) should
    hold the true rate in about 95 % of fresh draws, and the ratio of two such points should hold 1."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    trials, covered, ratio_covered = 60, 0, 0
    for k in range(trials):
        busy = [rng.exponential(2.0, 100) for _ in range(2)]
        tokens = [b * 50 + rng.normal(0, 5, b.size) for b in busy]
        measured = tokens[0].sum() / busy[0].sum()
        lo, hi = throughput_ci(tokens[0], busy[0], n_boot=400, seed=k)
        covered += lo * measured <= 50 <= hi * measured
        rlo, rhi = throughput_ratio_ci((tokens[0], busy[0]), (tokens[1], busy[1]), n_boot=400, seed=k)
        truth = 1 / (measured / (tokens[1].sum() / busy[1].sum()))
        ratio_covered += rlo <= truth <= rhi
    assert covered / trials >= 0.83 and ratio_covered / trials >= 0.83, (covered, ratio_covered, seed)
    assert math.isnan(throughput_ci(np.array([5.0]), np.array([1.0]))[0])


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04 with m = 3: 0.03, max(0.03, 0.04) = 0.04, max(0.04, 0.04) = 0.04
    assert holm([0.04, 0.01, 0.02, math.nan]) == pytest.approx([0.04, 0.03, 0.04, math.nan], nan_ok=True)


def test_bootstrap_interval_coverage_of_the_mean():
    """A 95 % interval for the mean of 40 normal draws covers the true mean in roughly 95 % of trials."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    trials, covered = 150, 0
    for k in range(trials):
        x = rng.normal(10.0, 2.0, 40)
        lo, hi = bootstrap_ci(x, n_boot=400, seed=k)["mean"]
        covered += lo <= 10.0 <= hi
    assert 0.85 <= covered / trials <= 0.99, (covered, seed)


def test_bootstrap_is_reproducible_and_shrinks_with_n():
    rng = np.random.default_rng(fresh_seed())
    small, large = rng.exponential(1.0, 50), rng.exponential(1.0, 5000)
    assert bootstrap_ci(small, seed=3) == bootstrap_ci(small, seed=3)
    w_small = np.diff(bootstrap_ci(small)["p90"])[0]
    w_large = np.diff(bootstrap_ci(large)["p90"])[0]
    assert w_large < w_small


def test_cluster_bootstrap_is_wider_for_correlated_gaps():
    """Gaps within a request share its speed: resampling requests (not gaps) must show that uncertainty."""
    rng = np.random.default_rng(fresh_seed())
    speeds = rng.lognormal(0, 0.5, 30)
    values = np.concatenate([s + rng.normal(0, 0.01, 100) for s in speeds])
    owners = np.repeat(np.arange(30), 100)
    naive = np.diff(bootstrap_ci(values)["p50"])[0]
    clustered = np.diff(bootstrap_ci(values, owners)["p50"])[0]
    assert clustered > 2 * naive
