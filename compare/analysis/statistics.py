"""The statistics every comparison rests on, in one place and on `scipy.stats`: summary figures, percentile
bootstrap intervals (`scipy.stats.bootstrap`), distribution-free order-statistic intervals for quantiles
(`scipy.stats.quantile_test`: a tail's interval never ends inside the data when the data cannot bound it) and
the Mann-Whitney U test (`scipy.stats.mannwhitneyu`).

The one thing scipy does not do for us is the cluster bootstrap: inter-token gaps of one request are not
independent, so their intervals resample whole requests (`bootstrap_ci` with `clusters`), which scipy's
resampling of single observations is made to do by resampling cluster labels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from scipy import stats

from compare.common.throughput_window import time_shares

PERCENTILES = (50, 90, 95, 99)
CI_LEVEL = 0.95
N_BOOT = 1000
MIN_BOOT = 200  # never fewer resamples than this, whatever is asked or capped
MAX_CELLS = 20_000_000  # resamples x values per interval: caps the work for very large inputs
BATCH_CELLS = 4_000_000  # resamples x values held in memory at once
EXACT_MAX_N = 100  # Mann-Whitney: the exact distribution up to this many values per sample (without ties)


def describe(values: np.ndarray) -> dict[str, float]:
    """n, mean, std (ddof=1), p50/p90/p95/p99 of `values` (NaN-free), NaN where undefined."""
    n = int(values.size)
    out = {"n": n, "mean": np.nan, "std": np.nan, **{f"p{q}": np.nan for q in PERCENTILES}}
    if n:
        out["mean"] = float(values.mean())
        out["std"] = float(values.std(ddof=1)) if n > 1 else np.nan
        for q, v in zip(PERCENTILES, np.percentile(values, PERCENTILES), strict=True):
            out[f"p{q}"] = float(v)
    return out


def quantile_ci(values: np.ndarray, q: float, level: float = CI_LEVEL) -> tuple[float, float]:
    """Distribution-free two-sided interval for the `q`-quantile (0 < q < 1) of the population `values`
    were drawn from, from their order statistics (`scipy.stats.quantile_test`). A bound the sample is too
    small to give is infinite: below about 3.7 / (1 - q) values (367 for p99 at 95 %) the upper bound of a
    high quantile is +inf, which is the honest answer, not the sample maximum."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return -math.inf, math.inf
    ci = stats.quantile_test(x, q=float(np.quantile(x, q)), p=q).confidence_interval(level)
    lo, hi = float(ci.low), float(ci.high)
    return (lo if np.isfinite(lo) else -math.inf), (hi if np.isfinite(hi) else math.inf)


def quantile_bound(values: np.ndarray, q: float, side: str, level: float = CI_LEVEL) -> float:
    """One-sided distribution-free bound for the `q`-quantile: `side="upper"`, a value the quantile is below
    with probability `level` (+inf when the sample is too small: fewer than log(1 - level) / log(q) values);
    `"lower"`, one it is above (-inf when too small)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return math.inf if side == "upper" else -math.inf
    alternative = "less" if side == "upper" else "greater"
    ci = stats.quantile_test(x, q=float(np.quantile(x, q)), p=q, alternative=alternative).confidence_interval(
        level
    )
    value = float(ci.high if side == "upper" else ci.low)
    if np.isfinite(value):
        return value
    return math.inf if side == "upper" else -math.inf


def min_n_for_bound(q: float, level: float = CI_LEVEL) -> int:
    """The fewest values whose largest gives a one-sided `level` upper bound for the `q`-quantile: below
    this many, no sample can show that a tail holds (299 for p99 at 95 %, 59 for p95, 29 for p90)."""
    return math.ceil(math.log(1 - level) / math.log(q))


def slo_verdict(values: np.ndarray, q: float, limit: float, level: float = CI_LEVEL) -> str:
    """Does the `q`-quantile of the population meet `limit`? "holds" when its one-sided upper bound is
    within it, "misses" when its one-sided lower bound is beyond it, else "undetermined" (too few values,
    or the quantile too close to the limit to tell)."""
    if quantile_bound(values, q, "upper", level) <= limit:
        return "holds"
    if quantile_bound(values, q, "lower", level) > limit:
        return "misses"
    return "undetermined"


def _mean_and_percentiles(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.stack([x.mean(axis=axis), *np.percentile(x, PERCENTILES, axis=axis)])


def _percentile_interval(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., np.ndarray],
    n_resamples: int,
    level: float,
    seed: int,
    vectorized: bool = True,
    paired: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """scipy's percentile bootstrap, in batches that keep about `BATCH_CELLS` values in memory."""
    size = max(len(d) for d in data)
    res = stats.bootstrap(
        data,
        statistic,
        n_resamples=n_resamples,
        batch=max(1, BATCH_CELLS // size) if vectorized else None,
        vectorized=vectorized,
        paired=paired,
        confidence_level=level,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return np.asarray(res.confidence_interval.low), np.asarray(res.confidence_interval.high)


def bootstrap_ci(
    values: np.ndarray,
    clusters: np.ndarray | None = None,
    n_boot: int = N_BOOT,
    level: float = CI_LEVEL,
    seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """Percentile-bootstrap intervals for the mean and p50/p90/p95/p99 of `values`.

    With `clusters` (one label per value) whole clusters are resampled, so values that belong together (a
    request's gaps) move together. Large inputs get fewer resamples (`MAX_CELLS`), never fewer than
    `MIN_BOOT`."""
    keys = ["mean", *(f"p{q}" for q in PERCENTILES)]
    n = int(values.size)
    nan = {key: (np.nan, np.nan) for key in keys}
    if n < 2:
        return nan
    boots = max(MIN_BOOT, min(n_boot, MAX_CELLS // n))
    if clusters is None:
        lo, hi = _percentile_interval((values,), _mean_and_percentiles, boots, level, seed)
    else:
        labels, owner = np.unique(np.asarray(clusters), return_inverse=True)
        if labels.size < 2:
            return nan
        order = np.argsort(owner, kind="stable")
        grouped, sizes = values[order], np.bincount(owner)
        starts = np.cumsum(sizes) - sizes

        def pooled(ids: np.ndarray) -> np.ndarray:
            """The statistics over the values of the clusters `ids` (a cluster drawn twice counts twice)."""
            lengths = sizes[ids]
            offsets = np.repeat(starts[ids] - np.cumsum(lengths) + lengths, lengths)
            return _mean_and_percentiles(grouped[offsets + np.arange(lengths.sum())])

        lo, hi = _percentile_interval((np.arange(labels.size),), pooled, boots, level, seed, vectorized=False)
    return {key: (float(lo[i]), float(hi[i])) for i, key in enumerate(keys)}


def mann_whitney(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of the Mann-Whitney U test: could `a` and `b` come from one distribution? Exact at
    the small samples a concurrency-1 point gives (when no values tie), else the normal approximation with
    tie and continuity corrections. 1.0 when every value is the same; NaN when either sample is empty."""
    if a.size == 0 or b.size == 0:
        return np.nan
    both = np.concatenate([a, b])
    if np.all(both == both[0]):
        return 1.0
    exact = max(a.size, b.size) <= EXACT_MAX_N and np.unique(both).size == both.size
    return float(
        stats.mannwhitneyu(a, b, alternative="two-sided", method="exact" if exact else "asymptotic").pvalue
    )


def ratio_ci(
    a: np.ndarray,
    b: np.ndarray,
    stat: str = "p50",
    n_boot: int = N_BOOT,
    level: float = CI_LEVEL,
    seed: int = 0,
) -> tuple[float, float, float]:
    """`stat(a) / stat(b)` (`stat`: mean or pNN) and a percentile-bootstrap interval, each sample resampled
    on its own."""
    if a.size < 2 or b.size < 2:
        return np.nan, np.nan, np.nan
    q = float(stat[1:]) if stat.startswith("p") else None

    def f(x: np.ndarray, axis: int = -1) -> np.ndarray:
        return x.mean(axis=axis) if q is None else np.percentile(x, q, axis=axis)

    def ratio(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return f(x, axis) / f(y, axis)

    boots = max(MIN_BOOT, min(n_boot, BATCH_CELLS // max(a.size, b.size)))
    lo, hi = _percentile_interval((a, b), ratio, boots, level, seed)
    return float(ratio(a, b)), float(lo), float(hi)


def _rate(tokens: np.ndarray, busy_s: np.ndarray, axis: int = -1) -> np.ndarray:
    """Rate of service: output tokens over the summed request times (send to end)."""
    return tokens.sum(axis=axis) / busy_s.sum(axis=axis)


def _usable(tokens: np.ndarray, busy_s: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The requests with a finite, positive time; None when fewer than 2 remain or no token was produced."""
    tokens, busy_s = np.asarray(tokens, dtype=float), np.asarray(busy_s, dtype=float)
    keep = np.isfinite(tokens) & np.isfinite(busy_s) & (busy_s > 0)
    tokens, busy_s = tokens[keep], busy_s[keep]
    return (tokens, busy_s) if tokens.size >= 2 and tokens.sum() > 0 else None


@dataclass(frozen=True)
class WindowSample:
    """What a throughput window (`compare.common.throughput_window.throughput_window`) counts of one run: each
    finished ok request's output span (first token to end; send to end without a token), amount (output
    tokens, or 1 for requests/s), and the window (start, end). A request counts the share of its span that
    lies inside the window (`time_shares`), as if its tokens arrived evenly over it."""

    begin_s: np.ndarray
    end_s: np.ndarray
    amounts: np.ndarray
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start if self.end > self.start else math.nan

    @property
    def total(self) -> float:
        """The amount the window counts: each request's amount times its share inside the window."""
        shares = time_shares(self.begin_s, self.end_s, self.start, self.end)
        return float((np.asarray(self.amounts, dtype=float) * shares).sum())


MAX_BATCHES = 10  # a window is cut into at most this many sub-windows, ...
SPANS_PER_BATCH = 2.0  # ... each at least this many median output spans long; fewer than 2: no interval


def window_batches(sample: WindowSample) -> tuple[np.ndarray, np.ndarray]:
    """The window cut into equal consecutive sub-windows (batch means): the amount each counts (requests'
    shares within it) and its length. A sub-window lasts at least `SPANS_PER_BATCH` median output spans,
    so that neighbouring sub-windows, which share the requests that straddle their boundary, are
    nearly independent. Empty when the window is too short for two."""
    sends, ends = np.asarray(sample.begin_s, dtype=float), np.asarray(sample.end_s, dtype=float)
    amounts = np.asarray(sample.amounts, dtype=float)
    seconds = sample.seconds
    if not np.isfinite(seconds) or not ends.size:
        return np.array([]), np.array([])
    sojourn = float(np.nanmedian(ends - sends))
    k = MAX_BATCHES if sojourn <= 0 else min(MAX_BATCHES, int(seconds / (SPANS_PER_BATCH * sojourn)))
    if k < 2:
        return np.array([]), np.array([])
    edges = np.linspace(sample.start, sample.end, k + 1)
    counted = np.array([(amounts * time_shares(sends, ends, lo, hi)).sum() for lo, hi in pairwise(edges)])
    return counted, np.diff(edges)


MIN_BATCHES = 4  # fewer sub-windows give a t interval (df < 3) too wide to say anything: none is given


def _batch_rate(samples: list[WindowSample]) -> tuple[float, float, int]:
    """Rate over the samples' windows together (amount over seconds), the standard error of its logarithm
    from the sub-windows' variation (a ratio estimator over all batches), and its degrees of freedom."""
    parts = [window_batches(s) for s in samples]
    if not parts:
        return math.nan, math.nan, 0
    amounts = np.concatenate([p[0] for p in parts])
    seconds = np.concatenate([p[1] for p in parts])
    if amounts.size < MIN_BATCHES or amounts.sum() <= 0:
        return math.nan, math.nan, 0
    rate = amounts.sum() / seconds.sum()
    residual = amounts - rate * seconds
    se = math.sqrt((residual**2).sum() / (amounts.size - 1) / amounts.size) / seconds.mean()
    return float(rate), se / rate, amounts.size - 1


def _as_samples(value: object) -> list[WindowSample] | None:
    if isinstance(value, WindowSample):
        return [value]
    if isinstance(value, list) and all(isinstance(v, WindowSample) for v in value):
        return value  # a point's runs; none: no interval
    return None


def throughput_ci(
    tokens: WindowSample | list[WindowSample] | np.ndarray,
    busy_s: np.ndarray | None = None,
    n_boot: int = N_BOOT,
    level: float = CI_LEVEL,
    seed: int = 0,
) -> tuple[float, float]:
    """Interval of a point's output rate, as factors of the measured rate.

    Given the windows (`WindowSample`, one per run of the point): batch means. Each window is cut into up
    to `MAX_BATCHES` equal consecutive sub-windows (`window_batches`) and a t interval (`scipy.stats.t`) is
    put on the rate from their spread, so the interval carries how the rate varies over time within the
    window (stalls, drift, bursts), which resampling requests with the concurrency held fixed cannot. A
    window shorter than two sub-windows of `SPANS_PER_BATCH` output spans gives no interval (NaN).

    Legacy form, `(tokens, busy_s)` per request: whole requests resampled and each resample's rate of
    service (tokens over summed request time) against the measured one; it holds the concurrency as
    measured and so misses the window's own variation (kept for callers not yet passing windows)."""
    samples = _as_samples(tokens)
    if samples is not None:
        _, se, df = _batch_rate(samples)
        if not (df >= 1 and np.isfinite(se)):
            return math.nan, math.nan
        t = float(stats.t.ppf(0.5 + level / 2, df))
        return math.exp(-t * se), math.exp(t * se)
    usable = _usable(np.asarray(tokens), np.asarray(busy_s))
    if usable is None:
        return np.nan, np.nan
    measured = _rate(*usable)
    lo, hi = _percentile_interval(usable, _rate, max(MIN_BOOT, n_boot), level, seed, paired=True)
    return float(lo / measured), float(hi / measured)


def throughput_ratio_ci(
    a: WindowSample | list[WindowSample] | tuple[np.ndarray, np.ndarray],
    b: WindowSample | list[WindowSample] | tuple[np.ndarray, np.ndarray],
    n_boot: int = N_BOOT,
    level: float = CI_LEVEL,
    seed: int = 0,
) -> tuple[float, float]:
    """Interval of the ratio of two points' output rates (as factors of the measured ratio).

    Given windows (`WindowSample`s): each rate's batch-means standard error (`throughput_ci`) on the log
    scale, combined as independent, with Welch-Satterthwaite degrees of freedom for the t quantile. Legacy
    `(tokens, busy_s)` pairs: each point's requests resampled on their own (concurrency held fixed)."""
    sa, sb = _as_samples(a), _as_samples(b)
    if sa is not None and sb is not None:
        _, se_a, df_a = _batch_rate(sa)
        _, se_b, df_b = _batch_rate(sb)
        if not (df_a >= 1 and df_b >= 1 and np.isfinite(se_a) and np.isfinite(se_b)):
            return math.nan, math.nan
        va, vb = se_a**2, se_b**2
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va**2 / df_a + vb**2 / df_b) if va + vb > 0 else float(df_a + df_b)
        t = float(stats.t.ppf(0.5 + level / 2, df))
        return math.exp(-t * se), math.exp(t * se)
    ua, ub = _usable(*a), _usable(*b)  # type: ignore[misc]
    if ua is None or ub is None:
        return np.nan, np.nan
    measured = _rate(*ua) / _rate(*ub)

    def ratio(ia: np.ndarray, ib: np.ndarray, axis: int = -1) -> np.ndarray:
        return _rate(ua[0][ia], ua[1][ia]) / _rate(ub[0][ib], ub[1][ib])

    ids = (np.arange(ua[0].size), np.arange(ub[0].size))
    lo, hi = _percentile_interval(ids, ratio, max(MIN_BOOT, n_boot), level, seed)
    return float(lo / measured), float(hi / measured)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (NaN stays NaN); scipy has Benjamini-Hochberg, not Holm."""
    idx = [i for i, p in enumerate(pvalues) if np.isfinite(p)]
    order = sorted(idx, key=lambda i: pvalues[i])
    m = len(order)
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
