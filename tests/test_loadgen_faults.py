"""Every failure ends as a record with the right error kind; nothing escapes, nothing is lost."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from instruments.scripted_server import ScriptedSchedule, scripted_server
from workloads.loadgen import PointJob, Timeouts, new_runner, run_load, run_load_sync
from workloads.records import ErrorKind, read_records
from workloads.schedule import ClosedLoop

pytestmark = pytest.mark.timing  # run again beside CPU burners in CI (.ci/under_load.sh)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("faults") / "events.jsonl"
    schedule = ScriptedSchedule(ttft_s=0.01, itl_s=0.005)
    with scripted_server(event_log=log, default_schedule=schedule) as handle:
        yield handle


def spec(request_id: str, schedule: dict, out: int = 12) -> RequestSpec:
    return RequestSpec(
        request_id, (1, 2), "fault test", out, extra_headers={"X-Scripted-Schedule": json.dumps(schedule)}
    )


FAULTS = [
    # request id, schedule, expected error kind, text expected in the message
    ("ok", {}, None, None),
    ("reset", {"fault": "reset", "fault_after_events": 4}, ErrorKind.CONNECTION_RESET, "reset"),
    ("closed", {"fault": "close", "fault_after_events": 4}, ErrorKind.SERVER_DISCONNECTED, "not completed"),
    ("http429", {"status": 429, "error_message": "queue full"}, ErrorKind.HTTP_STATUS, "HTTP 429"),
    ("http500", {"status": 500, "error_message": "engine died"}, ErrorKind.HTTP_STATUS, "engine died"),
    ("http503", {"status": 503, "error_message": "warming up"}, ErrorKind.HTTP_STATUS, "warming up"),
    ("malformed", {"fault": "malformed", "fault_after_events": 3}, ErrorKind.MALFORMED_EVENT, "not JSON"),
    (
        "in-stream-error",
        {"fault": "error_event", "fault_after_events": 2},
        ErrorKind.STREAM_ERROR,
        "scripted failure",
    ),
    ("no-final", {"fault": "no_final"}, ErrorKind.INCOMPLETE_STREAM, "without its final event"),
    ("cut-early", {"fault": "no_final", "fault_after_events": 5}, ErrorKind.INCOMPLETE_STREAM, "final event"),
    # pauses each shorter than the read timeout, together longer than the whole-request timeout (margins in
    # test_every_fault_is_recorded_with_its_kind)
    (
        "stall-total",
        {"stalls": [{"after_event": 2, "seconds": 1.05}, {"after_event": 3, "seconds": 1.05}]},
        ErrorKind.TIMEOUT,
        "longer than 2.0 s",
    ),
    ("slow-headers-ok", {"headers_delay_s": 0.4}, None, None),
    ("slow-headers", {"headers_delay_s": 2.5}, ErrorKind.HEADERS_TIMEOUT, "no response headers"),
]


def test_every_fault_is_recorded_with_its_kind(server, tmp_path):
    out = tmp_path / "requests.jsonl"
    sent = [spec(rid, schedule) for rid, schedule, _, _ in FAULTS]
    # Margins for a busy machine, where the server writes late and the client reads late: each stall of
    # stall-total is 0.45 s shorter than read_s; together they end >= 0.1 s after request_s (the server is
    # never early), so the whole-request timeout ends it; slow-headers' header timeout (read_s after sending)
    # comes 0.5 s before the whole-request timeout; slow-headers-ok's headers come 1.1 s before read_s.
    timeouts = Timeouts(request_s=2.0, read_s=1.5, connect_s=2.0)
    records = run_load_sync(
        PointJob(
            server.url, get_adapter("vllm"), sent, ClosedLoop(len(sent)), output_path=out, timeouts=timeouts
        )
    )
    by_id = {r.request_id: r for r in records}
    assert len(records) == len(FAULTS) and set(by_id) == {rid for rid, *_ in FAULTS}
    for rid, _, kind, text in FAULTS:
        record = by_id[rid]
        assert record.error_kind == kind, (rid, record.error_kind, record.error_message)
        if text is not None:
            assert text in record.error_message, (rid, record.error_message)
    assert read_records(out) == records  # all of them in requests.jsonl too
    assert by_id["http503"].http_status == 503 and by_id["http503"].events == []
    assert by_id["reset"].event_tokens == 4 and by_id["closed"].event_tokens == 4  # what came before is kept
    assert by_id["stall-total"].event_tokens == 3  # two before the first pause, one between the two
    slow = by_id["slow-headers-ok"]
    assert slow.headers_s - slow.send_s >= 0.4 and slow.output_tokens == 12


def test_stall_between_reads(server):
    sent = [spec("stall-read", {"stalls": [{"after_event": 3, "seconds": 1.5}]})]
    [record] = run_load_sync(
        PointJob(
            server.url, get_adapter("vllm"), sent, ClosedLoop(1), timeouts=Timeouts(request_s=30, read_s=0.5)
        )
    )
    assert record.error_kind == ErrorKind.STALL and record.event_tokens == 3


def test_connection_refused():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    records = run_load_sync(
        PointJob(
            f"http://127.0.0.1:{port}",
            get_adapter("tgi"),
            [spec(f"r{i}", {}) for i in range(3)],
            ClosedLoop(2),
        )
    )
    assert [r.error_kind for r in records] == [ErrorKind.CONNECTION_REFUSED] * 3
    assert all(r.send_s is None and r.events == [] for r in records)


def test_server_killed_mid_run(tmp_path):
    """Streams in flight when the server dies end as disconnected/reset; later requests find it refused."""
    out = tmp_path / "requests.jsonl"
    slow = ScriptedSchedule(ttft_s=0.01, itl_s=0.05)  # 200 tokens: 10 s a stream, far longer than the wait
    with scripted_server(default_schedule=slow) as doomed:
        sent = [RequestSpec(f"k{i}", (1,), "x", 200) for i in range(10)]

        async def scenario():
            run = asyncio.create_task(
                run_load(PointJob(doomed.url, get_adapter("vllm"), sent, ClosedLoop(4), output_path=out))
            )
            # all four streams have tokens: none is connecting
            await asyncio.to_thread(doomed.wait_streaming, 4)
            doomed.kill()
            return await run

        with new_runner() as runner:
            records = runner.run(scenario())
    kinds = [r.error_kind for r in sorted(records, key=lambda r: int(r.request_id[1:]))]
    assert len(records) == 10 and read_records(out) == records
    assert set(kinds[:4]) <= {ErrorKind.SERVER_DISCONNECTED, ErrorKind.CONNECTION_RESET}
    assert kinds[4:] == [ErrorKind.CONNECTION_REFUSED] * 6
    assert all(0 < r.event_tokens < 200 for r in records if r.request_id in {"k0", "k1", "k2", "k3"})
