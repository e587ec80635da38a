"""The scripted server itself: it keeps to its schedule, logs the truth, and answers like each backend."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from instruments.scripted_server import ScriptedSchedule, read_event_log, scripted_server, token_texts
from workloads.loadgen import PointJob, run_load_sync
from workloads.schedule import ClosedLoop

pytestmark = pytest.mark.timing  # run again beside CPU burners in CI (.ci/under_load.sh)

REPO = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "events.jsonl"
    with scripted_server(event_log=log, flavor="vllm", model="tiny-model") as handle:
        yield handle


def call(url: str, body: dict | bytes | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_schedule_is_kept(server):
    schedule = {"ttft_s": 0.03, "itl_s": [0.01, 0.02], "stalls": [{"after_event": 3, "seconds": 0.05}]}
    specs = [
        RequestSpec(f"kept-{i}", (1,), "x", 8, extra_headers={"X-Scripted-Schedule": json.dumps(schedule)})
        for i in range(3)
    ]
    run_load_sync(PointJob(server.url, get_adapter("vllm"), specs, ClosedLoop(3)))
    log = read_event_log(server.event_log, expect=[s.request_id for s in specs])
    late = []
    for spec in specs:
        entry = log[spec.request_id]
        tokens = [t for t, n, kind in entry["events"] if kind == "token"]
        assert tokens[0] - entry["received_s"] >= 0.03 - 2e-3  # the loop's timers may fire a little early
        due_gaps = np.array([0.01, 0.02, 0.01 + 0.05, 0.02, 0.01, 0.02, 0.01])
        # each write is due on the absolute schedule, so lateness never accumulates from gap to gap
        due = entry["received_s"] + 0.03 + np.concatenate([[0], np.cumsum(due_gaps)])
        late.append(np.array(tokens) - due)
    late = np.array(late)  # (request, token)
    assert np.all(late >= -2e-3), late  # no gap or stall shortened, however busy the machine
    # No gap or stall lengthened either: a busy machine makes some writes late, but a schedule read wrong (a
    # stall applied twice, a gap in the wrong unit) would make every write after it late. So the least late
    # write before the stall and the least late after it (of the three streams) are each near their due time.
    assert late[:, :4].min() < 0.02 and late[:, 4:].min() < 0.02, late


def test_steps_align_concurrent_streams(server):
    schedule = {"ttft_s": 0.0, "itl_s": 0.02, "step_s": 0.04}
    specs = [
        RequestSpec(f"step-{i}", (1,), "x", 5, extra_headers={"X-Scripted-Schedule": json.dumps(schedule)})
        for i in range(4)
    ]
    run_load_sync(PointJob(server.url, get_adapter("vllm"), specs, ClosedLoop(4)))
    log = read_event_log(server.event_log, expect=[s.request_id for s in specs])
    late = []
    for spec in specs:
        entry = log[spec.request_id]
        tokens = np.array([t for t, n, kind in entry["events"] if kind == "token"])
        # due every 20 ms from arrival, each rounded up to the next 40 ms step boundary of the monotonic clock
        boundary = np.ceil((entry["received_s"] + 0.02 * np.arange(len(tokens))) / 0.04) * 0.04
        late.extend(tokens - boundary)
    # Never written before the boundary (the loop's timers may fire a little early): unaligned writes, due
    # 20 ms apart, would come before it. However busy the machine, that holds.
    assert min(late) >= -2e-3, late
    # Not rounded past it: a busy machine makes some writes late, a wrong rounding (a step too far) every one.
    assert min(late) < 0.02, late


def test_token_texts():
    assert token_texts(4, 0) == [" t0", " t1", " t2", " t3"]
    assert token_texts(5, 2) == [" t0", "", "\u00e9 t2", "", "\u00e9 t4"]


def test_informational_routes(server):
    assert call(server.url + "/health")[0] == 200
    assert json.loads(call(server.url + "/v1/models")[1])["data"][0]["id"] == "tiny-model"
    assert json.loads(call(server.url + "/info")[1])["model_id"] == "tiny-model"
    assert call(server.url + "/v2/health/ready")[0] == 200
    status, metrics = call(server.url + "/metrics")
    assert status == 200 and b"vllm:num_requests_running" in metrics


def test_bad_schedules_and_bodies_get_clear_400s(server):
    status, body = call(server.url + "/v1/completions", {"prompt": "x"}, {"X-Scripted-Schedule": "{not json"})
    assert status == 400 and b"bad X-Scripted-Schedule" in body
    status, body = call(
        server.url + "/v1/completions", {"prompt": "x"}, {"X-Scripted-Schedule": '{"ttft": 1}'}
    )
    assert status == 400 and b"ttft" in body  # unknown schedule field
    status, body = call(server.url + "/v1/completions", b"[1, 2")
    assert status == 400 and b"bad request body" in body
    status, body = call(server.url + "/generate_stream", b"[1, 2]")
    assert status == 400 and b"not a JSON object" in body


def test_trtllm_flavor_rejects_what_trtllm_serve_rejects(server):
    trt = {"X-Scripted-Schedule": json.dumps({"flavor": "trtllm"})}
    status, body = call(server.url + "/v1/completions", {"prompt": "x", "max_tokens": 2}, trt)
    assert status == 400 and b"model" in body
    status, body = call(server.url + "/v1/completions", {"model": "m", "prompt": "x", "vllm_only": 1}, trt)
    assert status == 400 and b"vllm_only" in body
    status, _ = call(server.url + "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2}, trt)
    assert status == 200


@pytest.mark.parametrize("adapter_name,flavor", [("vllm", "vllm"), ("vllm-chat", "vllm"), ("tgi", "tgi")])
def test_whole_responses(server, adapter_name, flavor):
    adapter = get_adapter(adapter_name)
    request = adapter.build_request(RequestSpec("w", (1,), "x y", 6), stream=False)
    status, body = call(
        server.url + request.path, request.body, {"X-Scripted-Schedule": json.dumps({"flavor": flavor})}
    )
    event = adapter.parse_response(body)
    assert status == 200 and event.n_tokens == 6 and event.text == "".join(token_texts(6, 0))


def test_command_line_refuses_a_bad_default_schedule():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "instruments.scripted_server",
            "--port",
            "0",
            "--default-schedule",
            '{"itl_s": "slow"}',
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 2 and "--default-schedule" in result.stderr


def test_default_schedule_from_a_file(tmp_path):
    (tmp_path / "s.json").write_text(ScriptedSchedule(output_tokens=3, flavor="tgi").model_dump_json())
    log = tmp_path / "events.jsonl"
    schedule = ScriptedSchedule.model_validate_json((tmp_path / "s.json").read_text())
    with scripted_server(default_schedule=schedule, event_log=log) as srv:
        [record] = run_load_sync(
            PointJob(srv.url, get_adapter("tgi"), [RequestSpec("f", (1,), "x", 10)], ClosedLoop(1))
        )
    assert record.ok and record.output_tokens == 3  # the schedule's length wins over the request's
