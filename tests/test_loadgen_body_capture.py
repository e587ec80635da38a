"""Socket-read stamping: the body comes back whole, each piece with the time of the read that brought it, and
with the kernel's receive stamps that time does not move when the reader is late."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from itertools import pairwise
from pathlib import Path

import aiohttp
import pytest
from causality import stamped_before_sent
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from instruments.scripted_server import ScriptedSchedule, read_event_log, scripted_server
from workloads.body_capture import StampingConnector, StampingHandler, _cut, read_stamped
from workloads.kernel_stamps import StampedSocket, kernel_stamps_supported, stamped_listener
from workloads.loadgen import PointJob, run_load_sync
from workloads.schedule import ClosedLoop

pytestmark = pytest.mark.timing  # run again beside CPU burners in CI (.ci/under_load.sh)


# a pure function: a busy machine, not the code, would pass Hypothesis' 200 ms deadline
@settings(deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=12))
def test_cutting_at_marks_keeps_every_byte_in_order(body, offsets):
    # marks as the protocol makes them: rising cumulative offsets, the last at the end of the body
    totals = sorted({min(o, len(body)) for o in offsets} | {len(body)})
    marks = [(float(i), total) for i, total in enumerate(totals)]
    pieces = _cut(body, marks)
    assert b"".join(piece for _, piece in pieces) == body
    for t, total in marks:  # everything up to a mark's offset carries that mark's time or an earlier one
        assert sum(len(piece) for tt, piece in pieces if tt <= t) == total


async def post(
    url: str, connector_class: type[aiohttp.TCPConnector], schedule: dict, tokens: int
) -> tuple[list[tuple[float, bytes]], BaseException | None]:
    chunks: list[tuple[float, bytes]] = []
    connector = connector_class()
    request = {"prompt": "x", "max_tokens": tokens, "stream": True}
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(
            url + "/v1/completions", json=request, headers={"X-Scripted-Schedule": json.dumps(schedule)}
        ) as response,
    ):
        stamping = isinstance(connector, StampingConnector)
        assert isinstance(response.connection.protocol, StampingHandler) == stamping
        try:
            await read_stamped(response, chunks)
        except aiohttp.ClientPayloadError as exc:
            return chunks, exc
    return chunks, None


def test_pieces_carry_the_time_of_their_read_with_and_without_stamping():
    with scripted_server(default_schedule=ScriptedSchedule(ttft_s=0.01, itl_s=0.03)) as server:
        for connector_class in (StampingConnector, aiohttp.TCPConnector):
            chunks, error = asyncio.run(post(server.url, connector_class, {}, 6))
            assert error is None
            body = b"".join(piece for _, piece in chunks)
            assert body.count(b"data: ") == 7 and body.endswith(b"data: [DONE]\n\n")  # 6 tokens and [DONE]
            times = [t for t, _ in chunks]
            assert times == sorted(times)
            assert sum(b'"text"' in piece for _, piece in chunks) >= 5  # tokens 30 ms apart: separate reads
            assert max(b - a for a, b in pairwise(times)) > 0.02


def test_a_body_cut_short_keeps_what_arrived():
    with scripted_server(default_schedule=ScriptedSchedule(ttft_s=0.01, itl_s=0.01)) as server:
        chunks, error = asyncio.run(
            post(server.url, StampingConnector, {"fault": "reset", "fault_after_events": 3}, 9)
        )
    assert error is not None and "ConnectionResetError" in str(error)
    assert b"".join(piece for _, piece in chunks).count(b'"text"') == 3


def test_a_body_larger_than_the_read_buffer_does_not_stall(monkeypatch):
    """The reader's buffer fills past aiohttp's high-water mark while the body is watched: no pause."""
    from adapters import get_adapter
    from adapters.request_spec import RequestSpec
    from workloads import loadgen
    from workloads.loadgen import Timeouts, run_load_sync
    from workloads.schedule import ClosedLoop

    monkeypatch.setattr(loadgen, "READ_BUFFER", 2**12)  # high water: 8 KiB, ~30 events
    with scripted_server(default_schedule=ScriptedSchedule()) as server:
        records = run_load_sync(
            PointJob(
                server.url,
                get_adapter("vllm"),
                [RequestSpec("big", (1,), "x", 3000)],
                ClosedLoop(1),
                timeouts=Timeouts(request_s=20, read_s=5),
            )
        )
    assert records[0].ok and records[0].output_tokens == 3000


async def post_while_busy(url: str, tokens: int, busy_s: float, every_s: float) -> list[tuple[float, bytes]]:
    """`post`, on a loop that a callback blocks for `busy_s` out of every `every_s`: a client busy
    elsewhere."""
    loop = asyncio.get_running_loop()

    def hog() -> None:
        time.sleep(busy_s)
        handle[0] = loop.call_later(every_s - busy_s, hog)

    handle = [loop.call_later(0.003, hog)]
    try:
        chunks, error = await post(url, StampingConnector, {}, tokens)
    finally:
        handle[0].cancel()
    assert error is None
    return chunks


def token_write_times(event_log: Path) -> list[float]:
    """The token write times of the one request in the log (the server logs it a moment after the response
    ends, so wait for it)."""
    entry = read_event_log(event_log, expect=["scripted-0"])["scripted-0"]
    return [t for t, n, kind in entry["events"] if kind == "token"]


@pytest.mark.skipif(not kernel_stamps_supported(), reason="the kernel's receive stamps are a Linux feature")
@pytest.mark.parametrize("kernel", [True, False])
def test_kernel_stamps_keep_the_arrival_time_when_the_reader_is_late(tmp_path, monkeypatch, kernel):
    """Tokens 30 ms apart reach a client that is blocked 20 ms of every 25: most arrive while it is blocked
    and are read up to 20 ms late. With the kernel's stamps each read keeps the arrival time of what it
    brought (within 2 ms of the server's write); with the process's clock (the option refused) the lateness
    shows. The pair shows the test can tell them apart. A busy machine may write two tokens into one blocked
    spell: their read then carries one stamp, no earlier than the first one's write and no later than the
    last's."""
    if not kernel:
        monkeypatch.setattr(StampedSocket, "enable_stamps", lambda self: False)
    log = tmp_path / "events.jsonl"
    with scripted_server(default_schedule=ScriptedSchedule(ttft_s=0.03, itl_s=0.03), event_log=log) as server:
        with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
            chunks = runner.run(post_while_busy(server.url, 12, busy_s=0.02, every_s=0.025))
        written = token_write_times(log)
    reads = [(t, piece.count(b'"text"')) for t, piece in chunks if b'"text"' in piece]
    assert sum(n for _, n in reads) == len(written) == 12
    lateness_ms, first = [], 0  # per read: its stamp minus the writes of the first and last token it brought
    for t, n in reads:
        lateness_ms.append(((t - written[first]) * 1e3, (t - written[first + n - 1]) * 1e3))
        first += n
    assert min(early for early, _ in lateness_ms) > -0.5, lateness_ms  # never before the server wrote it
    if kernel:
        assert max(late for _, late in lateness_ms) < 2.0, lateness_ms
    else:
        assert max(late for _, late in lateness_ms) > 5.0, lateness_ms


def wait_for_receive_stamps(server: StampedSocket, client: StampedSocket, tries: int = 200) -> None:
    """Linux turns receive stamping on a moment after the first socket asks for it (the switch is deferred
    to a work queue), so a fresh pair of sockets may see its first reads unstamped: exchange bytes until one
    is."""
    for _ in range(tries):
        server.send(b"w")
        client.recv(16)
        server.sent_at_kernel()  # drop the send stamp: each test send reads its own
        if client.kernel_stamped_reads:
            return
        time.sleep(0.005)
    pytest.fail("the kernel never stamped a read")


@pytest.mark.skipif(
    not kernel_stamps_supported(), reason="the kernel's send and receive stamps are a Linux feature"
)
def test_kernel_send_stamps_bracket_the_send_and_precede_the_receive_stamp():
    """The scripted server's truth: the kernel's stamp of each send lies within the send call, and the
    receiver's kernel stamp of the same bytes comes after it (on loopback, microseconds after)."""
    listener = stamped_listener("127.0.0.1", 0, stamp_sends=True)
    listener.setblocking(True)
    client = StampedSocket(socket.AF_INET, socket.SOCK_STREAM)
    client.enable_stamps()
    with listener, client:
        client.connect(listener.getsockname())
        server, _ = listener.accept()
        with server:
            assert server.tx_stamps
            wait_for_receive_stamps(server, client)
            for size in (1, 100, 3000, 70_000):  # one byte up to more than one loopback segment
                stamped_reads = client.kernel_stamped_reads
                before = time.perf_counter()
                server.sendall(os.urandom(size))
                after = time.perf_counter()
                sent = server.sent_at_kernel()
                assert sent is not None and before <= sent <= after
                received = 0
                while received < size:
                    received += len(client.recv(1 << 20))
                assert client.kernel_stamped_reads > stamped_reads
                assert sent <= client.last_rx <= time.perf_counter()
            server.send(b"x")
            assert server.sent_at_kernel() is not None
            assert server.sent_at_kernel() is None  # each stamp is read once


def test_busy_poll_measures_the_same_and_stops_with_the_run(tmp_path):
    """With the loop kept polling every request is recorded in full, and the poller ends with the run (no
    task left spinning on the loop)."""
    log = tmp_path / "events.jsonl"
    specs = [RequestSpec(f"poll-{i}", (1, 2, 3), "a b c", 6) for i in range(4)]
    schedule = ScriptedSchedule(ttft_s=0.005, itl_s=0.004)
    with scripted_server(default_schedule=schedule, event_log=log) as server:
        records = run_load_sync(
            PointJob(server.url, get_adapter("vllm"), specs, ClosedLoop(2), busy_poll=True)
        )
    assert [r.ok for r in records] == [True] * 4
    assert all(sum(n for _, n, _ in r.events) == 6 for r in records)
    written = read_event_log(log, expect=[r.request_id for r in records])
    for r in records:  # every event matched, and no read stamped before the server wrote what it brought
        assert [n for _, n, _ in r.events] == [n for _, n, _ in written[r.request_id]["events"]]
        assert not stamped_before_sent(r, written[r.request_id])
