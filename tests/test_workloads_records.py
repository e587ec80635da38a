"""Request records: JSON round trip, crash-safe appending, and the metric definitions on them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workloads import timing
from workloads.records import (
    ErrorKind,
    RecordWriter,
    RequestRecord,
    RunSummary,
    read_records,
    read_run_summaries,
)


def random_record(rng: np.random.Generator, request_id: str = "r0", **overrides) -> RequestRecord:
    send = float(rng.uniform(0, 5))
    n_events = int(rng.integers(3, 40))
    times = np.cumsum(rng.uniform(1e-4, 0.05, n_events)) + send + float(rng.uniform(0.01, 0.5))
    tokens = rng.integers(0, 4, n_events)
    tokens[0] = 0  # e.g. a role-only chunk
    tokens[1] = max(int(tokens[1]), 1)
    fields = dict(
        run_id="run1",
        request_id=request_id,
        backend="vllm",
        variant="graphs",
        load_point="c=8",
        t0_monotonic=float(rng.uniform(1e3, 1e5)),
        prompt_tokens=int(rng.integers(1, 4096)),
        wanted_output_tokens=int(tokens.sum()),
        output_length_forced=True,
        scheduled_s=send - 1e-3,
        start_s=send - 5e-4,
        send_s=send,
        headers_s=send + 1e-3,
        end_s=float(times[-1]) + 1e-4,
        events=[(float(t), int(n), int(rng.integers(0, 20))) for t, n in zip(times, tokens, strict=True)],
        http_status=200,
        finish_reason="length",
        usage_prompt_tokens=None,
        usage_completion_tokens=int(tokens.sum()),
        event_tokens=int(tokens.sum()),
        output_tokens=int(tokens.sum()),
        output_tokens_source="usage",
    )
    fields.update(overrides)
    return RequestRecord(**fields)


def test_json_round_trip_and_append(tmp_path):
    rng = np.random.default_rng(11)
    records = [random_record(rng, f"r{i}") for i in range(20)]
    records.append(
        random_record(
            rng,
            "failed",
            error_kind=ErrorKind.CONNECTION_RESET,
            error_message="reset",
            send_s=None,
            events=[],
        )
    )
    path = tmp_path / "run" / "requests.jsonl"
    for record in records:  # one writer per record: each append reopens the file and adds to it
        with RecordWriter(path) as writer:
            writer.append(record)
    assert read_records(path) == records
    line = json.loads(path.read_text().splitlines()[-1])
    assert line["error_kind"] == "connection_reset" and line["send_s"] is None
    assert RequestRecord.model_validate_json(records[3].model_dump_json()) == records[3]


def test_compressed_records_read_as_written(tmp_path):
    """A committed run directory keeps requests.jsonl as .xz: the run directory reads it in place."""
    import lzma

    from compare.measure.run_dir import RunDir

    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**32))
    records = [random_record(rng, f"r{i}") for i in range(int(rng.integers(5, 30)))]
    path = tmp_path / "requests.jsonl"
    with RecordWriter(path) as writer:
        for record in records:
            writer.append(record)
    packed = tmp_path / "requests.jsonl.xz"
    packed.write_bytes(lzma.compress(path.read_bytes()))
    assert read_records(packed) == records
    path.unlink()
    run = RunDir.create(tmp_path / "run", {}, ["compare", "run"])
    (run.path / "requests.jsonl.xz").write_bytes(packed.read_bytes())
    assert run.records() == records


def test_warmup_filter_and_partial_last_line(tmp_path):
    rng = np.random.default_rng(12)
    path = tmp_path / "requests.jsonl"
    with RecordWriter(path) as writer:
        writer.append(random_record(rng, "w", warmup=True))
        writer.append(random_record(rng, "m"))
    with path.open("a") as f:
        f.write('{"run_id": "run1", "request_id": "cut sh')  # a crash in the middle of a write
    assert [r.request_id for r in read_records(path)] == ["w", "m"]
    assert [r.request_id for r in read_records(path, include_warmup=False)] == ["m"]
    path.write_text(path.read_text() + "\n" + random_record(rng, "after").model_dump_json() + "\n")
    with pytest.raises(ValueError, match="not a JSON line"):
        read_records(path)


def test_unknown_fields_are_refused():
    rng = np.random.default_rng(13)
    data = json.loads(random_record(rng).model_dump_json())
    data["surprise"] = 1
    with pytest.raises(ValueError):
        RequestRecord.model_validate(data)


def test_run_summary_round_trip(tmp_path):
    summary = RunSummary(
        run_id="x",
        backend="vllm",
        t0_monotonic=12.5,
        schedule={"kind": "open", "rate": 2.0},
        measured_start_s=0.1,
        wall_s=10.0,
        n_warmup=2,
        n_measured=10,
        n_sent=10,
        n_ok=9,
        errors={"timeout": 1},
        offered_rate=2.0,
        achieved_rate=1.98,
        lag_p50_s=1e-4,
        lag_p99_s=3e-4,
        lag_max_s=4e-4,
    )
    with RecordWriter(tmp_path / "runs.jsonl") as writer:
        writer.append(summary)
    assert read_run_summaries(tmp_path / "runs.jsonl") == [summary]


def reference_metrics(record: RequestRecord) -> tuple:
    """The definitions written out longhand, to check `workloads.timing` against."""
    token_times = np.array([t for t, n, _ in record.events if n > 0])
    token_counts = np.array([n for _, n, _ in record.events if n > 0])
    ttft = token_times[0] - record.send_s
    e2e = token_times[-1] - record.send_s
    tpot = (e2e - ttft) / (record.output_tokens - 1)
    gaps = np.diff(token_times)
    per_token = np.repeat(gaps / token_counts[1:], token_counts[1:])
    return ttft, e2e, tpot, gaps, per_token


def test_metric_definitions_on_random_records():
    rng = np.random.default_rng(14)
    for i in range(200):
        record = random_record(rng, f"r{i}")
        ttft, e2e, tpot, gaps, per_token = reference_metrics(record)
        assert timing.ttft(record) == pytest.approx(ttft, abs=1e-12)
        assert timing.e2e(record) == pytest.approx(e2e, abs=1e-12)
        assert timing.tpot(record) == pytest.approx(tpot, rel=1e-12)
        assert timing.itl_per_event(record) == pytest.approx(gaps.tolist(), abs=1e-12)
        assert timing.itl(record) == pytest.approx(per_token.tolist(), abs=1e-12)
        # the per-token view covers the same span: it sums to last token event minus first
        assert sum(timing.itl(record)) == pytest.approx(e2e - ttft, abs=1e-9)
        assert timing.client_lag(record) == pytest.approx(record.send_s - record.scheduled_s)


def test_tokens_read_together_count_alike_however_they_were_framed():
    """Three tokens that reach the client at once give the same per-token gaps whether the server sent them
    as one SSE event or as three events in one write (same receive time); the per-event view keeps the
    framing: one gap and two zeros."""
    rng = np.random.default_rng(16)
    first, later = 2.0 + rng.uniform(0, 1), 0.003 + rng.uniform(0, 0.05)
    one_event = random_record(rng, events=[(first, 1, 1), (first + later, 3, 3)], output_tokens=4)
    three_events = random_record(
        rng,
        events=[(first, 1, 1), (first + later, 1, 1), (first + later, 1, 1), (first + later, 1, 1)],
        output_tokens=4,
    )
    assert timing.itl(one_event) == pytest.approx([later / 3] * 3)
    assert timing.itl(three_events) == pytest.approx(timing.itl(one_event))
    assert timing.itl_per_event(three_events) == pytest.approx([later, 0.0, 0.0])
    assert timing.itl_per_event(one_event) == pytest.approx([later])


def test_metrics_when_facts_are_missing():
    rng = np.random.default_rng(15)
    never_sent = random_record(rng, send_s=None)
    assert timing.ttft(never_sent) is None and timing.e2e(never_sent) is None
    assert timing.client_lag(never_sent) is None
    no_tokens = random_record(rng, events=[(1.0, 0, 0), (1.1, 0, 0)])
    assert timing.ttft(no_tokens) is None and timing.itl(no_tokens) == [] and timing.tpot(no_tokens) is None
    one_token = random_record(rng, events=[(5.0, 0, 0), (5.1, 1, 3)], output_tokens=1)
    assert timing.ttft(one_token) == pytest.approx(5.1 - one_token.send_s)
    assert timing.tpot(one_token) is None and timing.itl(one_token) == []
