"""The load generator's timings against the scripted server's own write times, at 64 concurrent streams: every
event is matched to the server's truth, the errors follow their definitions (`instruments/accuracy.py`), and
no event is stamped before the data its socket read brought had been sent (tests/causality.py says why that,
and not "no event before its own write", is what holds on a busy machine).

How small the errors are (the 1 ms goal at the 99th percentile) is measured by benchmarks/loadgen_accuracy.py,
on a quiet machine, with its results committed: on a machine busy with other work the client and the server
are not scheduled in time, and no bound on the size of the errors would say anything about the code.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from causality import stamped_before_sent

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from instruments.accuracy import compare
from instruments.scripted_server import read_event_log, scripted_server
from workloads.loadgen import PointJob, run_load_sync
from workloads.schedule import ClosedLoop

pytestmark = pytest.mark.timing  # run again beside CPU burners in CI (.ci/under_load.sh)

STREAMS = 64
# Only a wrong definition (another clock, a missing origin) puts the typical event seconds away from the
# truth; a loaded machine delays the server's writes and the client's reads by milliseconds, not by this much.
GROSS_S = 0.5


def specs(prefix: str, n: int, rng: random.Random, out: tuple[int, int]) -> list[RequestSpec]:
    return [
        RequestSpec(
            f"{prefix}-{i}",
            (1, 2, 3),
            "a b c",
            rng.randint(*out),
            extra_headers={
                "X-Scripted-Schedule": json.dumps({"ttft_s": rng.uniform(0.005, 0.05), "itl_s": 0.02})
            },
        )
        for i in range(n)
    ]


@pytest.mark.slow
def test_timings_match_the_servers_writes_at_64_streams(tmp_path):
    rng = random.Random(0)
    log = tmp_path / "events.jsonl"
    with scripted_server(event_log=log) as server:
        records = run_load_sync(
            PointJob(
                server.url,
                get_adapter("vllm"),
                specs("m", 3 * STREAMS, rng, (20, 120)),
                ClosedLoop(STREAMS),
                warmup_specs=specs("w", STREAMS, rng, (4, 8)),
            )
        )
    assert all(r.ok for r in records), [r.error_message for r in records if not r.ok][:3]
    measured = [r for r in records if not r.warmup]
    truth = read_event_log(log, expect=[r.request_id for r in records])
    errors = compare(measured, truth)

    # every request and every event matched to the server's log, one to one
    assert not errors.unmatched and errors.n_requests == len(measured) == 3 * STREAMS
    assert (
        len(errors.event)
        == sum(len(r.events) for r in measured)
        == sum(len(truth[r.request_id]["events"]) for r in measured)
    )
    token_events = [[e for e in r.events if e[1] > 0] for r in measured]
    assert len(errors.tpot) == len(measured) and len(errors.itl) == sum(len(t) - 1 for t in token_events)
    for name in ("event", "ttft", "itl", "tpot"):
        assert all(math.isfinite(e) for e in getattr(errors, name)), name

    # causality, read by read: no event stamped before the oldest data of its read was written
    early = {r.request_id: e for r in measured if (e := stamped_before_sent(r, truth[r.request_id]))}
    assert not early, dict(list(early.items())[:5])

    # the derived errors follow from the event errors, request by request (same order as `measured`)
    at = 0
    for k, record in enumerate(measured):
        event_errors = errors.event[at : at + len(record.events)]
        at += len(record.events)
        tokens = [e for e, (_, n, _) in zip(event_errors, record.events, strict=True) if n > 0]
        assert errors.ttft[k] == pytest.approx(tokens[0], abs=1e-9)  # TTFT error = first token's error
        assert errors.tpot[k] * (record.output_tokens - 1) == pytest.approx(tokens[-1] - tokens[0], abs=1e-9)
    assert sum(errors.itl) == pytest.approx(
        sum(errors.tpot[k] * (r.output_tokens - 1) for k, r in enumerate(measured)), abs=1e-6
    )

    # a gross bound: the typical event is seen about when it was written, not seconds away
    summary = errors.summary()
    assert summary["event_p50_ms"] < GROSS_S * 1e3, summary
