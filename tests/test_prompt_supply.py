"""A prompt of its own for every request (`workloads.datasets.PromptStream`, made as a point needs them),
repetition only with `--prompt-pool`, and running endpoints measured in alternating blocks (`--blocks`).

The end-to-end cases drive two scripted servers as running endpoints for about a second each (a few dozen
requests a block); nothing in them depends on timing beyond "some requests were sent"."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
from checkpoints import make_tokenizer

from compare.analysis.caveats import repeated_prompt_warnings
from compare.measure import prompts
from compare.measure.loop import measure
from compare.measure.order import block_budget, block_order
from compare.measure.run_dir import RunDir
from compare.measure.watcher import Watcher
from compare.plan.build import build_plan
from compare.plan.run_options import PlanError, WorkloadSpec
from instruments.scripted_server import ScriptedSchedule, scripted_server
from workloads import catalog, datasets
from workloads.datasets import PromptStream
from workloads.loadgen import run_load_sync
from workloads.records import read_records


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    make_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tok_dir))


def _numbers(seed: int, size: int):
    def make(c: int) -> list[int]:
        return np.random.default_rng([seed, c]).integers(0, 1 << 40, size).tolist()

    return make


@pytest.mark.parametrize("seed", [0, 7, 1234])
def test_a_stream_is_the_same_however_it_is_read(seed):
    """`first(n)`, a supply read to the end, and chunks read out of order give the same items."""
    size = 5
    stream = PromptStream(_numbers(seed, size), size)
    head = stream.first(23)
    assert len(head) == 23
    supply = stream.supply(ahead=2)
    read = [next(supply) for _ in range(23)]
    supply.close()
    assert read == head
    assert stream.chunk(3) + stream.chunk(1) == head[15:20] + head[5:10]
    assert stream.supplied and stream.supplied[-1]["handed"] == 23


def test_a_bounded_stream_stops_at_its_limit_and_makes_no_chunk_beyond_it():
    made: list[int] = []

    def make(c: int) -> list[int]:
        made.append(c)
        return list(range(c * 4, c * 4 + 4))

    stream = PromptStream(make, 4, limit=10)
    assert list(stream.supply(ahead=5)) == list(range(10))
    assert sorted(set(made)) == [0, 1, 2]  # 3 chunks of 4 hold 10; none beyond
    assert stream.supplied[-1]["handed"] == 10 and stream.first(99) == list(range(10))


def test_a_chunk_not_ready_when_needed_is_waited_for_and_counted():
    """Chunk 1 is held back until the consumer is already waiting for it: the wait is counted (the stats
    say generation held a send back). No timing decides it: the gate is opened only after the consumer
    was seen still blocked."""
    gate = threading.Event()

    def make(c: int) -> list[int]:
        if c >= 1:
            assert gate.wait(60)
        return [c * 10, c * 10 + 1]

    supply = PromptStream(make, 2).supply(ahead=1)
    assert [next(supply), next(supply)] == [0, 1]
    got: list[int] = []
    consumer = threading.Thread(target=lambda: got.append(next(supply)))
    consumer.start()
    consumer.join(0.2)
    assert consumer.is_alive()  # blocked on the chunk that is not made yet
    gate.set()
    consumer.join(60)
    assert got == [10]
    assert supply.stats()["waits"] == 1 and supply.stats()["wait_s"] > 0
    supply.close()


@pytest.mark.parametrize("seed", [0, 3])
def test_generated_workloads_give_every_request_a_prompt_of_its_own(tokenizer, monkeypatch, seed):
    """Random, prefix and multi-turn streams over several chunks: ids and prompts distinct, the same
    sequence made twice, another slice different; a prefix workload keeps its groups' prefixes from one
    chunk to the next."""
    monkeypatch.setattr(datasets, "STREAM_CHUNK", 6)
    monkeypatch.setattr(catalog, "SESSION_CHUNK", 3)
    allowed = prompts._Allowed(tokenizer)

    def stream(w: WorkloadSpec, k: int) -> PromptStream:
        return catalog.dataset_named(w.dataset).stream(w, tokenizer, seed, k, None, allowed)

    random = WorkloadSpec("random", "uniform:4:12", "3")
    specs = stream(random, 0).first(20)
    assert [s.request_id for s in specs] == [f"random0-{i}" for i in range(20)]
    assert len({s.prompt_token_ids for s in specs}) == 20
    assert stream(random, 0).first(20) == specs
    other = stream(random, 1).first(20)
    assert not {s.prompt_token_ids for s in other} & {s.prompt_token_ids for s in specs}

    prefix = WorkloadSpec("prefix", "4", "2", prefix_len=8, prefix_groups=2)
    grouped = stream(prefix, 2).first(18)  # 3 chunks of 6
    assert len({s.request_id for s in grouped}) == len({s.prompt_token_ids for s in grouped}) == 18
    heads = {g: {s.prompt_token_ids[:8] for s in grouped if s.group == g} for g in ("g0", "g1")}
    assert all(len(h) == 1 for h in heads.values()) and heads["g0"] != heads["g1"]
    assert all(s.request_id.startswith("prefix2-g") for s in grouped)

    turns = WorkloadSpec("multi-turn", "5", "2", turns=2)
    sessions = stream(turns, 0).first(7)
    assert [s.session_id for s in sessions] == [f"session0-{i}" for i in range(7)]
    assert len({t.prompt_token_ids for s in sessions for t in s.turns}) == 14


def test_block_order_alternates_and_carries_on_across_repeats():
    assert block_order(["A", "B"], 2) == [(0, "A"), (0, "B"), (1, "B"), (1, "A")]
    after_one = [(0, "B"), (0, "A"), (1, "A"), (1, "B"), (2, "B"), (2, "A")]
    assert block_order(["A", "B"], 3, repeat=1) == after_one
    assert block_order(["A", "B", "C"], 1) == [(0, "A"), (0, "B"), (0, "C")]


def test_blocks_share_the_point_budget():
    plan = SimpleNamespace(blocks=3, num_requests=10, duration=9.0)
    assert [block_budget(plan, b) for b in range(3)] == [(4, 3.0), (3, 3.0), (3, 3.0)]
    plan = SimpleNamespace(blocks=2, num_requests=None, duration=30.0)
    assert block_budget(plan, 1) == (None, 15.0)


def test_blocks_default_to_two_for_running_endpoints_only(tok_dir):
    two = {
        "backends": "vllm:a,vllm:b",
        "endpoints": ["vllm:a=http://127.0.0.1:9", "vllm:b=http://127.0.0.1:8"],
        "model": "m",
        "tokenizer": str(tok_dir),
    }
    assert build_plan(two).blocks == 2
    assert build_plan(two | {"blocks": 3}).blocks == 3
    assert build_plan(two | {"blocks": 1}).blocks == 1
    one = {
        "backends": "vllm",
        "endpoints": ["vllm=http://127.0.0.1:9"],
        "model": "m",
        "tokenizer": str(tok_dir),
    }
    assert build_plan(one).blocks == 1
    launched = {
        "backends": "reference:eager,vllm",
        "endpoints": ["vllm=http://127.0.0.1:9"],
        "model": str(tok_dir),
        "tokenizer": str(tok_dir),
    }
    assert build_plan(launched).blocks == 1
    with pytest.raises(PlanError, match="--repeats"):
        build_plan(launched | {"blocks": 2})
    assert build_plan(one | {"prompt_pool": 5}).describe()["prompt_pool"] == 5


def _measure_two_endpoints(tmp_path, tok_dir, monkeypatch, **options):
    """Two scripted servers as running endpoints `vllm:a` and `vllm:b`; every prompt stream's chunks
    recorded as made: (run directory, {(backend key, run id): prompts made for it in order})."""
    monkeypatch.setattr(datasets, "STREAM_CHUNK", 16)  # several chunks a block
    made: dict[tuple[str, str], list] = {}

    def load(job):
        if job.spec_stream is not None:
            inner, key = job.spec_stream.make_chunk, (job.variant, job.run_id)
            made[key] = []

            def recording(c: int) -> list:
                chunk = inner(c)
                made[key].append((c, chunk))
                return chunk

            job.spec_stream.make_chunk = recording
            try:
                return run_load_sync(job)
            finally:
                job.spec_stream.make_chunk = inner
        return run_load_sync(job)

    schedule = ScriptedSchedule(ttft_s=0.005, itl_s=0.002)
    with scripted_server(default_schedule=schedule) as a, scripted_server(default_schedule=schedule) as b:
        plan = build_plan({
            "backends": "vllm:a,vllm:b", "endpoints": [f"vllm:a={a.url}", f"vllm:b={b.url}"],
            "model": "scripted-model", "tokenizer": str(tok_dir), "input_len": "8", "output_len": "3",
            "warmup": 0, "concurrency": "2", "seed": 11, **options,
        })  # fmt: skip
        run_dir = RunDir.create(tmp_path / "run", plan.describe(), ["compare", "run"])
        assert measure(plan, run_dir, Watcher(), load=load) == 0
    ordered = {k: [s for _, chunk in sorted(v, key=lambda x: x[0]) for s in chunk] for k, v in made.items()}
    return run_dir, ordered


@pytest.mark.live
def test_a_duration_bound_point_gives_every_request_its_own_prompt_in_alternating_blocks(
    tmp_path, tok_dir, monkeypatch
):
    """No --num-requests, two running endpoints: blocks A B B A of half the duration each, labelled
    repeat 0 and 1; every request id distinct and without `~k`, every prompt distinct within a point, and
    in each block both backends sent the same sequence (one is a prefix of the other)."""
    run_dir, made = _measure_two_endpoints(tmp_path, tok_dir, monkeypatch, num_requests=0, duration="1s")
    points = run_dir.manifest["points"]
    assert [(p["variant"], p["block"], p["blocks"], p["repeat"]) for p in points] == [
        ("a", 0, 2, 0),
        ("b", 0, 2, 0),
        ("b", 1, 2, 1),
        ("a", 1, 2, 1),
    ]
    assert run_dir.manifest["config"]["blocks"] == 2 and run_dir.manifest["config"]["prompt_pool"] is None
    records = [r for r in read_records(run_dir.requests_path) if not r.warmup]
    by_run = {p["run_id"]: [r for r in records if r.run_id == p["run_id"]] for p in points}
    assert all(by_run.values()) and all(r.ok for r in records)
    assert not any("~" in r.request_id for r in records)
    assert not repeated_prompt_warnings(records)
    sent: dict[tuple[str, int], list] = {}
    for p in points:
        ids = [r.request_id for r in by_run[p["run_id"]]]
        head = ids[0].split("-")[0]  # "random<k>": the point's (and block's) own, so ids differ across points
        assert len(set(ids)) == len(ids) and set(ids) == {f"{head}-{i}" for i in range(len(ids))}
        # each closed-loop worker takes one more that it does not send once the duration is over
        assert p["prompts"]["kind"] == "per_request" and len(ids) <= p["prompts"]["handed"] <= len(ids) + 2
        prompts = [s.prompt_token_ids for s in made[(p["variant"], p["run_id"])][: len(ids)]]
        assert len(set(prompts)) == len(prompts)
        sent[(p["variant"], p["block"])] = prompts
    for block in (0, 1):
        a, b = sent[("a", block)], sent[("b", block)]
        shorter = min(len(a), len(b))
        assert a[:shorter] == b[:shorter]  # the same sequence for both backends
    assert not set(sent[("a", 0)]) & set(sent[("a", 1)])  # each block has prompts of its own


@pytest.mark.live
def test_a_prompt_pool_cycles_its_prompts_and_says_so(tmp_path, tok_dir, monkeypatch):
    """--prompt-pool 3 --num-requests 8 --blocks 1: each point sends 3 prompts, the repeats suffixed `~k`,
    which the repeated-prompt warning counts; the manifest records the pool."""
    run_dir, made = _measure_two_endpoints(
        tmp_path, tok_dir, monkeypatch, num_requests=8, prompt_pool=3, blocks=1
    )
    assert not made  # nothing made as it went: the pool was made first
    points = run_dir.manifest["points"]
    assert [(p["variant"], p["repeat"]) for p in points] == [("a", 0), ("b", 0)]
    assert all(p["prompts"] == {"kind": "pool", "prompts": 3} and "block" not in p for p in points)
    assert run_dir.manifest["config"]["prompt_pool"] == 3 and run_dir.manifest["config"]["blocks"] == 1
    records = [r for r in read_records(run_dir.requests_path) if not r.warmup]
    for p in points:
        ids = sorted(r.request_id for r in records if r.run_id == p["run_id"])
        assert ids == sorted(
            [
                "random0-0",
                "random0-1",
                "random0-2",
                "random0-0~1",
                "random0-1~1",
                "random0-2~1",
                "random0-0~2",
                "random0-1~2",
            ]
        )
    warnings = repeated_prompt_warnings(records)
    assert len(warnings) == 2 and all("5 of 8 requests" in w for w in warnings)


@pytest.mark.live
def test_duration_bound_multi_turn_sessions_each_get_their_own(tmp_path, tok_dir, monkeypatch):
    """A multi-turn workload bound by its duration takes new sessions from the stream as it goes (chunks
    of 3 sessions here): every session and turn id distinct, turns in order."""
    monkeypatch.setattr(catalog, "SESSION_CHUNK", 3)
    schedule = ScriptedSchedule(ttft_s=0.005, itl_s=0.002)
    with scripted_server(default_schedule=schedule) as server:
        plan = build_plan({
            "backends": "vllm", "endpoints": [f"vllm={server.url}"], "model": "scripted-model",
            "tokenizer": str(tok_dir), "dataset": "multi-turn", "turns": 2, "input_len": "6",
            "output_len": "3", "warmup": 0, "concurrency": "2", "num_requests": 0, "duration": "1s",
        })  # fmt: skip
        run_dir = RunDir.create(tmp_path / "run", plan.describe(), ["compare", "run"])
        assert measure(plan, run_dir) == 0
    records = [r for r in read_records(run_dir.requests_path) if not r.warmup]
    sessions = {r.session_id for r in records}
    assert len(sessions) > 3  # beyond the first chunk
    assert len({r.request_id for r in records}) == len(records)
    assert not any("~" in r.request_id for r in records)
    assert all(r.ok for r in records)
    (point,) = run_dir.manifest["points"]
    assert point["prompts"]["kind"] == "per_request" and point["prompts"]["handed"] >= len(sessions)


@pytest.mark.live
def test_an_open_loop_point_makes_its_prompts_before_it_starts(tmp_path, tok_dir, monkeypatch):
    """A duration-bound open loop knows its sends: they are made before the point starts (with a margin),
    and nothing is made while it runs."""
    monkeypatch.setattr(datasets, "STREAM_CHUNK", 16)
    with scripted_server(default_schedule=ScriptedSchedule(ttft_s=0.005, itl_s=0.002)) as server:
        plan = build_plan({
            "backends": "vllm", "endpoints": [f"vllm={server.url}"], "model": "scripted-model",
            "tokenizer": str(tok_dir), "input_len": "6", "output_len": "3", "warmup": 0, "rate": "30",
            "arrival": "constant", "num_requests": 0, "duration": "1s",
        })  # fmt: skip
        run_dir = RunDir.create(tmp_path / "run", plan.describe(), ["compare", "run"])
        assert measure(plan, run_dir) == 0
    records = [r for r in read_records(run_dir.requests_path) if not r.warmup]
    (point,) = run_dir.manifest["points"]
    made = point["prompts"]
    assert 25 <= len(records) <= 31 and len({r.request_id for r in records}) == len(records)
    assert made["reserve"] >= len(records) and made["waits"] == 0
    assert made["chunks_made"] == -(-made["reserve"] // 16)  # the reserve's chunks, none while it ran


@pytest.mark.parametrize("seed", [0, 1, 2, 5])
def test_an_open_loop_reserve_covers_its_sends(seed):
    """The reserve is at least the sends within the duration of the schedule's own arrivals; a closed loop
    and a burst get none (their counts are not known ahead)."""
    from workloads.schedule import ClosedLoop, OpenLoop

    for rate, duration in ((5.0, 3.0), (40.0, 10.0)):
        schedule = OpenLoop(rate, "poisson", seed=seed)
        sends = int(np.sum(schedule.offsets(int(rate * duration * 3) + 50) < duration))
        assert sends <= prompts.expected_sends(schedule, duration) <= sends + 3 * np.sqrt(sends) + 8
    assert prompts.expected_sends(ClosedLoop(4), 10.0) == 0
    assert prompts.expected_sends(OpenLoop(float("inf")), 10.0) == 0
