"""Planning a run: options, the YAML run file, SLOs, endpoints and variants."""

from __future__ import annotations

import numpy as np
import pytest

from compare.plan.build import build_plan
from compare.plan.run_options import PlanError, parse_duration, parse_endpoints, parse_slo
from workloads.schedule import ClosedLoop, OpenLoop


def test_defaults_are_the_embedded_run():
    plan = build_plan({})
    assert len(plan.backends) == 2 and all(b.launched for b in plan.backends)
    assert plan.candidates_reason.startswith("No backend was given")
    assert plan.describe()["candidates_reason"] == plan.candidates_reason
    assert plan.model == "smollm2-135m"
    assert [s.label for s in plan.load_points] == ["c=1", "c=4"]
    assert plan.workloads[0].label == "random-128x16"
    assert plan.slo == {}
    given = build_plan({"backends": "reference"})
    assert [b.name for b in given.backends] == ["reference"]
    assert given.backends[0].variant in ("eager", "graphs")
    assert given.candidates_reason == "" and given.describe()["candidates_reason"] is None


def test_slo_and_durations():
    assert parse_slo("ttft=200ms,tpot=50ms,e2e=2s") == pytest.approx({"ttft": 0.2, "tpot": 0.05, "e2e": 2.0})
    assert parse_slo("ttft:150") == pytest.approx({"ttft": 0.15})  # a bare number is milliseconds
    assert parse_slo({"tpot": "40ms"}) == pytest.approx({"tpot": 0.04})
    assert parse_duration("1.5min") == pytest.approx(90)
    assert parse_duration(30) == 30
    for bad in ("ttft=fast", "latency=2s", "ttft=0ms", "ttft"):
        with pytest.raises(PlanError):
            parse_slo(bad)


def test_backends_variants_and_endpoints():
    plan = build_plan(
        {
            "backends": "vllm,tgi,reference:eager",
            "endpoints": ["vllm=http://127.0.0.1:8000/", "tgi=http://127.0.0.1:8080"],
        }
    )
    by_key = {b.key: b for b in plan.backends}
    assert by_key["vllm"].endpoint == "http://127.0.0.1:8000" and not by_key["vllm"].launched
    assert by_key["tgi"].endpoint == "http://127.0.0.1:8080"
    assert by_key["reference:eager"].launched
    plan = build_plan({"backends": "vllm:a,vllm:b", "endpoints": ["vllm:a=http://h:1", "vllm:b=http://h:2"]})
    assert [b.endpoint for b in plan.backends] == ["http://h:1", "http://h:2"]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"backends": "openai"}, "cannot start it"),
        ({"backends": "trtllm-triton"}, "cannot start it"),
        ({"backends": "vllm:graphs=0"}, "positive"),
        ({"backends": "tgi:eager+graphs=1/2"}, "off and on"),
        ({"launch": "kubernetes"}, "unknown --launch"),
        ({"images": ["vllm"]}, "NAME=IMAGE"),
        ({"backends": "nosuch"}, "unknown backend"),
        ({"backends": "reference:turbo"}, "unknown variant"),
        ({"backends": "reference,reference"}, "appears twice"),
        ({"backends": "reference", "endpoints": ["tgi=http://x:1"]}, "not in --backends"),
        ({"endpoints": ["vllm"]}, "NAME=URL"),
        ({"concurrency": "0"}, "concurrency"),
        ({"concurrency": "a,b"}, "numbers"),
        ({"dataset": "sharegpt"}, "--dataset-path"),
        ({"repeats": 0}, "repeats"),
        ({"busy_poll": True, "ray": "local"}, "busy_poll"),
        ({"dataset": "multi-turn", "turns": 0}, "--turns must be >= 1"),
        ({"dataset": "multi-turn", "think_time": "uniform:3:1"}, "LOW <= HIGH"),
        ({"dataset": "multi-turn", "rate": "2"}, "closed loop"),
        ({"dataset": "multi-turn", "ray": "local"}, "without --ray"),
        ({"turns": 3}, "does not apply"),
    ],
)
def test_plan_errors_are_clear(options, message):
    with pytest.raises(PlanError, match=message):
        build_plan(options)


def test_multi_turn_workloads():
    plan = build_plan({"dataset": "multi-turn", "input_len": "32", "output_len": "8", "think_time": "0.5"})
    w = plan.workloads[0]
    assert (w.sessions, w.turns, w.think_time, w.label) == (True, 3, "0.5", "multi-turn-3x32x8")
    assert build_plan({"dataset": "multi-turn", "turns": 5}).workloads[0].turns == 5
    assert not build_plan({}).workloads[0].sessions and build_plan({}).workloads[0].turns is None


def test_rate_alone_is_open_loop_only():
    plan = build_plan({"rate": "2,8", "arrival": "gamma", "burstiness": 0.5})
    assert all(isinstance(s, OpenLoop) for s in plan.load_points)
    assert [s.rate for s in plan.load_points] == [2, 8]
    assert plan.load_points[0].arrival == "gamma" and plan.load_points[0].burstiness == 0.5
    both = build_plan({"rate": "2", "concurrency": "3"})
    assert [s.label for s in both.load_points] == ["c=3", "r=2"]


def test_yaml_run_file_matrix_and_override(tmp_path):
    path = tmp_path / "run.yaml"
    (tmp_path / "x").mkdir()
    path.write_text(f"""
model: {tmp_path / "x"}
backends:
  - reference:eager
  - {{name: vllm, variant: graphs, endpoint: "http://127.0.0.1:9000"}}
load: {{concurrency: [1, 8], rate: [4], arrival: constant}}
workloads:
  - {{dataset: random, input_len: 256, output_len: 64}}
  - {{name: long, dataset: random, input_len: "uniform:1000:2000", output_len: 16}}
num_requests: 50
slo: {{ttft: 300ms, tpot: 40ms}}
gpu_price: 3.5
pin: off
""")
    plan = build_plan({}, path)
    assert [b.key for b in plan.backends] == ["reference:eager", "vllm:graphs"]
    assert plan.backends[1].endpoint == "http://127.0.0.1:9000"
    assert [s.label for s in plan.load_points] == ["c=1", "c=8", "r=4"]
    assert isinstance(plan.load_points[0], ClosedLoop) and plan.load_points[2].arrival == "constant"
    assert [w.label for w in plan.workloads] == ["random-256x64", "long"]
    assert plan.num_requests == 50 and plan.gpu_price == 3.5
    assert plan.pin == "off"  # YAML reads a bare off as false: it still means off
    assert plan.slo == pytest.approx({"ttft": 0.3, "tpot": 0.04})
    # the command line wins over the file
    plan = build_plan({"num_requests": 5, "concurrency": "2"}, path)
    assert plan.num_requests == 5 and [s.label for s in plan.load_points] == ["c=2", "r=4"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("backendz: [reference]\n")
    with pytest.raises(PlanError, match="unknown keys"):
        build_plan({}, bad)


def test_parse_endpoints_rejects_non_http():
    with pytest.raises(PlanError, match="http"):
        parse_endpoints(["vllm=127.0.0.1:8000"])


def test_every_planned_option_is_a_plan_field():
    """An option with a manifest key is kept by the plan as read: RunPlan has a field of its name."""
    from dataclasses import fields

    from compare.plan.run_options import PLANNED, RunPlan

    made = {"backends", "workloads", "load_points", "candidates_reason", "sweep_open"}
    assert {f.name for f in fields(RunPlan)} - made == {o.name for o in PLANNED}


def test_sweep_and_capacity_plan():
    """--sweep plans its two first points (the rest are chosen while it runs) and the open loop of the others;
    --capacity implies the sweep; both are in the manifest's config."""
    endpoint = {"backends": "vllm", "endpoints": ["vllm=http://h:1"], "tokenizer": "gpt2"}
    plan = build_plan({**endpoint, "sweep": True, "arrival": "constant", "sweep_concurrency": 16})
    assert plan.load_points == [ClosedLoop(1), ClosedLoop(16)]
    assert plan.sweep_open == OpenLoop(1.0, "constant", 1.0, 0, None)
    assert plan.sweep and not plan.capacity and plan.sweep_points == 5 and plan.sweep_spacing == "geometric"
    plan = build_plan({**endpoint, "capacity": True, "slo": "ttft=100ms", "capacity_percentile": 95})
    config = plan.describe()
    assert config["sweep"] and config["capacity"] and config["capacity_percentile"] == 95
    assert config["capacity_precision"] == 0.1 and config["slo_s"] == pytest.approx({"ttft": 0.1})
    assert build_plan(endpoint).sweep_open is None and not build_plan(endpoint).sweep
    for bad, message in (
        ({"sweep": True, "rate": "2"}, "drop --rate"),
        ({"sweep": True, "ray": True}, "does not apply with ray"),
        ({"sweep_spacing": "linear"}, "needs --sweep"),
        ({"capacity": True}, "give --slo"),
        ({"capacity_percentile": 90, "slo": "ttft=1s"}, "needs --capacity"),
    ):
        with pytest.raises(PlanError, match=message):
            build_plan({**endpoint, **bad})


def test_each_open_loop_point_draws_its_own_arrivals():
    """Every rate gets a seed of its own, derived from --seed and its place among the rates, so no two points
    scale one draw; the seed is in the schedule's description, which the manifest and runs.jsonl record."""
    from workloads.schedule import point_seed

    for seed in (0, 1, 5):
        plan = build_plan({"rate": "2,8,2", "seed": seed})
        seeds = [s.seed for s in plan.load_points]
        assert seeds == [point_seed(seed, k) for k in range(3)] and len(set(seeds)) == 3
        assert [s.describe()["seed"] for s in plan.load_points] == seeds
        first, _, again = plan.load_points
        assert not np.allclose(first.offsets(20), again.offsets(20))  # the same rate, another draw
    one, other = build_plan({"rate": "2"}), build_plan({"rate": "2", "seed": 1})
    assert one.load_points[0].seed != other.load_points[0].seed
