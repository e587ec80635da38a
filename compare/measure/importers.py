"""Other tools' per-request results as our `RequestRecord`s, so the same metric code reads them.

- `vllm bench serve --save-result --save-detailed` JSON: per request `ttfts` (s), `itls` (list of s, one per
  stream chunk after the first), `input_lens`, `output_lens`, `errors` ("" when ok), and in newer versions
  `start_times` and `latencies`; the file's own `duration` is kept as the point's window.
- AIPerf `profile_export.jsonl`: one JSON object per request with `metadata.request_start_ns`,
  `benchmark_phase`, `was_cancelled`, and `metrics.time_to_first_token`, `inter_chunk_latency` (ms),
  `output_sequence_length` (tokens), `request_latency` (ms); `error` when it failed.

What these files do not hold is not invented, and the report says so: events are rebuilt from TTFT and
the chunk gaps (each chunk's token count inferred by spreading the output length evenly over the chunks),
and client lag is unknown (no scheduled times).

An imported point sits beside ours only as far as it measured the same thing: `compare.analysis.import_parity`
sets each one's model (as its file names it), mean prompt and output lengths and load against ours in the same
workload, and names those that must not be ranked against ours (another model, or lengths off by more than
`LENGTH_TOLERANCE`): the report shows the rows, and the selection never sees the excluded points.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

from workloads.datasets import read_json_lines
from workloads.records import ErrorKind, RequestRecord


class ImportFormatError(ValueError):
    """The file is not in the format asked for, or lacks the per-request data."""


@dataclass
class Imported:
    records: list[RequestRecord]
    run_id: str
    backend: str
    variant: str
    workload: str
    load_point: str
    concurrency: int | None
    rate: float | None
    duration_s: float | None
    source: str
    model: str | None = None  # the model the file says it measured (as the server was asked for it)
    tokenizer: str | None = None  # the tokenizer the file says it counted with

    def manifest_entry(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "tokenizer": self.tokenizer,
            "run_id": self.run_id,
            "backend": self.backend,
            "variant": self.variant,
            "workload": self.workload,
            "load_point": self.load_point,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "duration_s": self.duration_s,
            "source": self.source,
        }


def spread(total: int, chunks: int) -> list[int]:
    """`total` tokens over `chunks` chunks, as evenly as possible, the larger shares first."""
    if chunks <= 0:
        return []
    base, extra = divmod(max(total, 0), chunks)
    return [base + (1 if j < extra else 0) for j in range(chunks)]


def events_from(
    send: float, ttft: float, gaps: list[float], output_tokens: int
) -> list[tuple[float, int, int]]:
    """Token events at send + ttft and each chunk gap after it, carrying `output_tokens` between them."""
    times = [send + ttft]
    for g in gaps:
        times.append(times[-1] + g)
    counts = spread(output_tokens, len(times))
    return [(t, n, 0) for t, n in zip(times, counts, strict=True) if n > 0]


def detect_format(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").lstrip()
    first = text.split("\n", 1)[0]
    try:
        obj = json.loads(first)
        if isinstance(obj, dict) and "metadata" in obj and "metrics" in obj:
            return "aiperf"
    except json.JSONDecodeError:
        pass
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        raise ImportFormatError(f"{path}: neither a vllm bench serve result JSON nor AIPerf JSONL") from None
    if isinstance(obj, dict) and "ttfts" in obj:
        return "vllm-bench"
    raise ImportFormatError(
        f"{path}: JSON without per-request `ttfts` (run `vllm bench serve` with --save-result "
        "--save-detailed) and not AIPerf's profile_export.jsonl"
    )


class Labels(TypedDict, total=False):
    """What imported records are filed under (each importer's defaults where not given)."""

    backend: str | None
    variant: str | None
    workload: str
    load_point: str | None


def import_file(path: str | Path, fmt: str = "auto", **labels: Unpack[Labels]) -> Imported:
    path = Path(path)
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "vllm-bench":
        return import_vllm_bench(path, **labels)
    if fmt == "aiperf":
        return import_aiperf(path, **labels)
    raise ImportFormatError(f"unknown format {fmt!r}; known: auto, vllm-bench, aiperf")


@dataclass(frozen=True)
class _Point:
    """Where imported requests are filed: the run and load point they become."""

    run_id: str
    backend: str
    variant: str
    load_point: str


@dataclass(frozen=True)
class _Request:
    """One request as another tool reported it, times in seconds from the first send."""

    index: int
    send: float
    prompt: int
    out: int
    events: list[tuple[float, int, int]]
    end: float
    error: str | None
    cancelled: bool = False
    warmup: bool = False
    request_id: str | None = None


def _record(point: _Point, request: _Request) -> RequestRecord:
    send, out, events, error = request.send, request.out, request.events, request.error
    cancelled = request.cancelled
    kind = ErrorKind.CANCELLED if cancelled else (ErrorKind.STREAM_ERROR if error else None)
    return RequestRecord(
        run_id=point.run_id,
        request_id=request.request_id or f"{point.run_id}-{request.index}",
        backend=point.backend,
        variant=point.variant,
        load_point=point.load_point,
        warmup=request.warmup,
        t0_monotonic=0.0,
        prompt_tokens=request.prompt,
        wanted_output_tokens=max(out, 1),
        output_length_forced=False,
        scheduled_s=send,
        start_s=send,
        send_s=send,
        end_s=request.end,
        events=events,
        http_status=200 if not error else None,
        finish_reason=None,
        usage_completion_tokens=out if kind is None else None,
        event_tokens=sum(n for _, n, _ in events),
        output_tokens=out if kind is None else sum(n for _, n, _ in events),
        output_tokens_source="usage" if kind is None else "events",
        error_kind=kind,
        error_message=f"imported: {error}" if error else ("imported: cancelled" if cancelled else None),
    )


def import_vllm_bench(
    path: Path,
    backend: str | None = None,
    variant: str | None = None,
    workload: str = "",
    load_point: str | None = None,
) -> Imported:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("ttfts"), list):
        raise ImportFormatError(
            f"{path}: no per-request `ttfts`; run `vllm bench serve` with --save-result --save-detailed"
        )
    ttfts, n = data["ttfts"], len(data["ttfts"])
    itls = data.get("itls") or [[] for _ in range(n)]
    ins = data.get("input_lens") or [0] * n
    outs = data.get("output_lens") or [0] * n
    errors = data.get("errors") or [""] * n
    if not all(len(x) == n for x in (itls, ins, outs, errors)):
        raise ImportFormatError(f"{path}: per-request lists of different lengths")
    conc = data.get("max_concurrency")
    rate = data.get("request_rate")
    rate = float(rate) if isinstance(rate, int | float) and math.isfinite(rate) else None
    if load_point is None:
        load_point = f"c={conc}" if conc else (f"r={rate:g}" if rate else "imported")
    backend = backend or "vllm-bench"
    variant = variant if variant is not None else str(data.get("label") or data.get("backend") or "")
    run_id = f"import-{path.stem}"
    point = _Point(run_id, backend, variant, load_point)
    # newer versions also save each request's start time (monotonic) and latency
    starts = (
        data["start_times"]
        if isinstance(data.get("start_times"), list) and len(data["start_times"]) == n
        else [0.0] * n
    )
    first = min(starts) if starts else 0.0
    latencies = (
        data["latencies"] if isinstance(data.get("latencies"), list) and len(data["latencies"]) == n else None
    )
    records = []
    for i in range(n):
        err = errors[i] or None
        out = int(outs[i] or 0)
        send = float(starts[i]) - first
        ev = [] if err else events_from(send, float(ttfts[i] or 0.0), [float(g) for g in itls[i] or []], out)
        end = send + float(latencies[i]) if latencies and latencies[i] else (ev[-1][0] if ev else send)
        records.append(_record(point, _Request(i, send, int(ins[i] or 0), out, ev, end, err)))
    return Imported(
        records,
        run_id,
        backend,
        variant,
        workload,
        load_point,
        int(conc) if conc else None,
        rate,
        float(data["duration"]) if data.get("duration") else None,
        "vllm bench serve",
        str(data.get("model_id") or data.get("model") or "") or None,
        str(data.get("tokenizer_id") or "") or None,
    )


def _metric(metrics: dict[str, Any], name: str) -> Any:
    entry = metrics.get(name)
    return entry.get("value") if isinstance(entry, dict) else entry


def import_aiperf(
    path: Path,
    backend: str | None = None,
    variant: str | None = None,
    workload: str = "",
    load_point: str | None = None,
) -> Imported:
    rows = []
    for number, obj in read_json_lines(path, ImportFormatError):
        if not isinstance(obj, dict) or "metadata" not in obj:
            raise ImportFormatError(f"{path}:{number}: not an AIPerf record (no `metadata`)")
        rows.append(obj)
    if not rows:
        raise ImportFormatError(f"{path}: no records")
    t0 = min(r["metadata"].get("request_start_ns", 0) for r in rows)
    backend, variant = backend or "aiperf", variant or ""
    load_point = load_point or "imported"
    run_id = f"import-{path.stem}"
    point = _Point(run_id, backend, variant, load_point)
    records = []
    for i, r in enumerate(rows):
        md, metrics = r["metadata"], r.get("metrics") or {}
        send = (md.get("request_start_ns", t0) - t0) / 1e9
        end_ns = md.get("request_end_ns")
        error = r.get("error")
        err = (
            (error.get("error_message") or error.get("message") or str(error))
            if isinstance(error, dict)
            else (str(error) if error else None)
        )
        cancelled = bool(md.get("was_cancelled"))
        out = int(_metric(metrics, "output_sequence_length") or _metric(metrics, "output_token_count") or 0)
        ttft = _metric(metrics, "time_to_first_token")
        gaps = _metric(metrics, "inter_chunk_latency")
        latency = _metric(metrics, "request_latency")
        events: list[tuple[float, int, int]] = []
        if ttft is not None and not err and not cancelled:
            if isinstance(gaps, list) and gaps:
                events = events_from(send, ttft / 1e3, [g / 1e3 for g in gaps], out)
            elif latency is not None and out > 1:  # no chunk gaps: first token, then the rest at the end
                events = [(send + ttft / 1e3, 1, 0), (send + latency / 1e3, out - 1, 0)]
            else:
                events = [(send + ttft / 1e3, max(out, 1), 0)]
        end = (end_ns - t0) / 1e9 if end_ns else (events[-1][0] if events else send)
        records.append(
            _record(
                point,
                _Request(
                    i,
                    send,
                    int(_metric(metrics, "input_sequence_length") or 0),
                    out,
                    events,
                    end,
                    err,
                    cancelled,
                    warmup=md.get("benchmark_phase") == "warmup",
                    request_id=str(md.get("x_request_id") or f"{run_id}-{i}"),
                ),
            )
        )
    conc = int(load_point[2:]) if load_point.startswith("c=") and load_point[2:].isdigit() else None
    model = next((str(r["metadata"]["model_name"]) for r in rows if r["metadata"].get("model_name")), None)
    return Imported(
        records, run_id, backend, variant, workload, load_point, conc, None, None, "AIPerf", model
    )
