"""What each backend costs, in numbers comparable across workloads and prices: per input and output token,
against the hardware's bound, per million tokens, set-up time against latency, memory given up.

- prefill cost: p50 TTFT per 1k input tokens, only at single-stream points (concurrency 1), where no
  request waits behind another; elsewhere the TTFT is mostly queueing and the records hold no server-side
  prefill time to use instead, so it is left out. It still includes a fixed per-request overhead. Decode
  cost: TPOT.
- roofline: a decode step must read the weights once and each running sequence's KV cache, so at
  concurrency c the fastest possible TPOT is (weights + c * context * KV bytes per token) / bandwidth;
  efficiency = that bound / measured p50 TPOT. Only when the model's bytes and the bandwidth are known.
- cost per million output tokens = price per hour / (3600 * output tokens/s) * 1e6.
- break-even: option A starts `dS` seconds later than B but serves a request `dT` seconds sooner; after
  N = ceil(dS / dT) requests A has paid its set-up back (rounded up: after 2 requests it has not yet for
  2.07), which at A's measured rate is N / rate seconds.
- memory given up: a CUDA-graph pool of P bytes is P / (KV bytes per token) tokens of KV cache that the
  backend could otherwise hold, i.e. that many / (tokens per sequence) concurrent sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from compare.common.datatypes import SetupReport
from compare.common.text import plural


def prefill_ms_per_1k(ttft_p50_ms: float, input_tokens_mean: float) -> float:
    if not input_tokens_mean or not np.isfinite(ttft_p50_ms):
        return math.nan
    return ttft_p50_ms / input_tokens_mean * 1000.0


def single_stream(row: pd.Series) -> bool:
    """A point with one request in flight at a time (closed loop or imported at concurrency 1): its TTFT has
    no queueing behind other requests in it."""
    conc = row.get("concurrency")
    return row.get("mode") in ("closed", "imported") and conc is not None and pd.notna(conc) and conc == 1


def roofline_tpot_ms(
    weight_bytes: float,
    bandwidth_gbs: float,
    concurrency: float = 1.0,
    context_tokens: float = 0.0,
    kv_bytes_per_token: float = 0.0,
) -> float:
    """The memory-bandwidth bound on TPOT: bytes a decode step must read / bandwidth (GB/s = 1e9 B/s)."""
    if not weight_bytes or not bandwidth_gbs:
        return math.nan
    step_bytes = weight_bytes + concurrency * context_tokens * kv_bytes_per_token
    return step_bytes / (bandwidth_gbs * 1e9) * 1e3


def cost_per_million_tokens(price_per_hour: float | None, tokens_per_s: float) -> float:
    if price_per_hour is None or not tokens_per_s or not np.isfinite(tokens_per_s):
        return math.nan
    return price_per_hour / 3600.0 / tokens_per_s * 1e6


@dataclass(frozen=True)
class BreakEven:
    """A (slower to start, faster per request) against B. `requests` None: never pays back; 0: A is also
    the quicker to start (nothing to pay back)."""

    setup_delta_s: float  # A's set-up minus B's
    per_request_delta_s: float  # B's time per request minus A's (> 0: A is faster)
    requests: float | None
    hours: float | None  # serving that many requests at A's measured rate

    @property
    def verdict(self) -> str:
        if self.requests is None:
            return "never"
        if self.requests == 0:
            return "immediately"
        return f"after {plural(self.requests, 'request')} ({format_hours(self.hours)})"


def break_even(
    setup_a_s: float, setup_b_s: float, per_request_a_s: float, per_request_b_s: float
) -> BreakEven:
    """When does A, set up in `setup_a_s` and serving one request per `per_request_a_s` at its measured
    rate, catch up with B on the total time to serve N requests (set-up + N * per request)?"""
    ds = setup_a_s - setup_b_s
    dt = per_request_b_s - per_request_a_s
    if dt <= 0:  # A is not faster per request: whatever its start, it never pays anything back
        return BreakEven(ds, dt, None, None)
    if ds <= 0:  # A is faster and also quicker to start
        return BreakEven(ds, dt, 0.0, 0.0)
    n = math.ceil(ds / dt)  # the first whole request by which A has caught up: 2.07 is 3, never 2
    return BreakEven(ds, dt, n, n * per_request_a_s / 3600.0)


def format_hours(hours: float | None) -> str:
    if hours is None:
        return "never"
    seconds = hours * 3600
    if seconds < 120:
        return f"{seconds:.0f} s of serving"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min of serving"
    return f"{hours:.1f} h of serving"


def kv_bytes_per_token(setup: SetupReport | None) -> float:
    if setup is None:
        return math.nan
    kv, tokens = setup.memory.get("kv_cache"), setup.memory.get("kv_tokens")
    return kv / tokens if kv and tokens else math.nan


@dataclass(frozen=True)
class MemoryTrade:
    pool_bytes: float
    kv_tokens: float  # KV-cache tokens the pool could have held
    sequences: float  # concurrent sequences of `seq_tokens` that is


def graph_pool_trade(setup: SetupReport | None, seq_tokens: float) -> MemoryTrade | None:
    """What a CUDA-graph pool costs in KV capacity; None where there is no pool or no KV figure."""
    if setup is None:
        return None
    pool = setup.memory.get("graph_pool") or 0.0
    per_token = kv_bytes_per_token(setup)
    if pool <= 0 or not np.isfinite(per_token):
        return None
    tokens = pool / per_token
    return MemoryTrade(pool, tokens, tokens / seq_tokens if seq_tokens else math.nan)


def add_normalized(
    summary: pd.DataFrame,
    setups: dict[str, SetupReport],
    price_per_hour: float | None,
    bandwidth_gbs: float | None,
    model_bytes: float | None,
) -> pd.DataFrame:
    """Columns `prefill_ms_per_1k_in`, `roofline_tpot_ms`, `roofline_efficiency`, `usd_per_1m_out`."""
    out = summary.copy()
    if out.empty:
        return out
    prefill, bound, efficiency, cost = [], [], [], []
    for _, row in out.iterrows():
        key = f"{row['backend']}:{row['variant']}" if row["variant"] else row["backend"]
        setup = setups.get(key)
        prefill.append(
            prefill_ms_per_1k(row["ttft_p50_ms"], row["input_tokens_mean"])
            if single_stream(row)
            else math.nan
        )
        weights = model_bytes or (setup.memory.get("weights") if setup else None)
        per_token = kv_bytes_per_token(setup)
        conc = row["concurrency"] if pd.notna(row["concurrency"]) and row["concurrency"] else 1.0
        context = (row["input_tokens_mean"] or 0) + (row["output_tokens_mean"] or 0) / 2
        b = roofline_tpot_ms(
            weights or 0.0,
            bandwidth_gbs or 0.0,
            conc,
            context if np.isfinite(context) else 0.0,
            per_token if np.isfinite(per_token) else 0.0,
        )
        bound.append(b)
        efficiency.append(b / row["tpot_p50_ms"] if np.isfinite(b) and row["tpot_p50_ms"] > 0 else math.nan)
        cost.append(cost_per_million_tokens(price_per_hour, row["output_tok_s"]))
    out["prefill_ms_per_1k_in"] = prefill
    out["roofline_tpot_ms"] = bound
    out["roofline_efficiency"] = efficiency
    out["usd_per_1m_out"] = cost
    return out
