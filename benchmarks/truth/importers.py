"""Read each benchmark client's per-request output into `Measured` records (seconds, the client's own
definitions), keyed by the request id the scripted server logged.

How requests are matched to the server's log:
- ours: the `X-Request-Id` header we send (the server logs it).
- `vllm bench serve`: it sends `x-request-id: <--request-id-prefix><i>` and saves its per-request lists
  (`--save-detailed`) in the order of its input requests, so entry i is request `<prefix><i>`.
- AIPerf: it sends `X-Request-ID: <uuid>` and writes it with each record of `profile_export.jsonl`.
- GuideLLM: it sends no id, but keeps the `id` of the server's chunks as `response_id`; the scripted server
  names a response `cmpl-<request id>` / `chatcmpl-<request id>`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.truth.definitions import Measured


def ours(records_path: Path) -> Iterator[Measured]:
    """Our `requests.jsonl`: measured (non-warm-up) successful records, metrics from `workloads.timing`."""
    from workloads import timing
    from workloads.records import RequestRecord

    for line in records_path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = RequestRecord.model_validate_json(line)
        if record.warmup or not record.ok:
            continue
        yield Measured(record.request_id, timing.ttft(record), timing.tpot(record), timing.itl(record))


def vllm_bench(result_path: Path, request_id_prefix: str) -> Iterator[Measured]:
    """`vllm bench serve --save-result --save-detailed` JSON. TPOT as `serve.py` computes it:
    (latency - ttft) / (output_len - 1), output_len from the server's usage."""
    result = json.loads(result_path.read_text(encoding="utf-8"))
    for i, (ttft, itl, latency, n, error) in enumerate(
        zip(
            result["ttfts"],
            result["itls"],
            result["latencies"],
            result["output_lens"],
            result["errors"],
            strict=True,
        )
    ):
        if error:
            continue
        tpot = (latency - ttft) / (n - 1) if n > 1 else None
        yield Measured(f"{request_id_prefix}{i}", ttft, tpot, list(itl))


def aiperf(jsonl_path: Path) -> Iterator[Measured]:
    """AIPerf's `profile_export.jsonl`: one record per request (profiling phase only), values in ms."""
    for line in jsonl_path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        meta, metrics = record.get("metadata", {}), record.get("metrics", {})
        if meta.get("benchmark_phase") not in (None, "profiling") or record.get("error"):
            continue
        yield Measured(
            meta["x_request_id"],
            _ms(metrics.get("time_to_first_token")),
            _ms(metrics.get("inter_token_latency")),
            [v / 1e3 for v in (metrics.get("inter_chunk_latency") or {}).get("value", [])],
        )


def _ms(metric: dict[str, Any] | None) -> float | None:
    if not metric:
        return None
    if metric.get("unit") != "ms":
        raise ValueError(f"unexpected unit in AIPerf record: {metric}")
    return metric["value"] / 1e3


def guidellm(report_path: Path) -> Iterator[Measured]:
    """GuideLLM's JSON report: the successful requests of each benchmark that fall in its measured window
    (warm-up requests are listed too; GuideLLM's statistics keep requests that end after the window's start
    and start before its end, and so does this). Its per-request computed fields, in ms."""
    report = json.loads(report_path.read_text(encoding="utf-8"))
    for bench in report["benchmarks"]:
        start, end = bench["start_time"], bench["end_time"]
        for req in bench["requests"]["successful"]:
            if req["request_end_time"] < start or req["request_start_time"] > end:
                continue
            rid = req["response_id"] or ""
            rid = rid.removeprefix("chatcmpl-").removeprefix("cmpl-")
            itl = req.get("inter_token_latency_ms")
            yield Measured(
                rid,
                _opt_ms(req.get("time_to_first_token_ms")),
                _opt_ms(req.get("time_per_output_token_ms")),
                [] if itl is None else [itl / 1e3],
            )


def _opt_ms(value: float | None) -> float | None:
    return None if value is None else value / 1e3
