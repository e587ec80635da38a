"""Multi-turn sessions: the datasets (turn lengths, each prompt carrying the conversation so far), the
records' session fields through requests.jsonl, and live against our engine, that later turns are served
from its prefix cache and the report shows TTFT by turn."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import requests
from checkpoints import make_tokenizer

from adapters import get_adapter
from adapters.prometheus import common_metrics
from workloads.datasets import LengthDist
from workloads.loadgen import PointJob, run_load_sync
from workloads.records import RecordWriter, RequestRecord, read_records
from workloads.schedule import ClosedLoop, OpenLoop
from workloads.sessions import ThinkTime, conversation_turn, sharegpt_sessions, synthetic_sessions

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("bpe"))


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_synthetic_sessions_lengths_and_think_times(bpe):
    sessions = synthetic_sessions(bpe, 4, 3, "uniform:5:40", "uniform:3:9", "uniform:0.5:1.5", seed=3)
    assert [s.session_id for s in sessions] == [f"session-{i}" for i in range(4)]
    rng = np.random.default_rng(3)
    ins = LengthDist.parse("uniform:5:40").sample(rng, 12)
    outs = LengthDist.parse("uniform:3:9").sample(rng, 12)
    assert [t.prompt_len for s in sessions for t in s.turns] == ins.tolist()
    assert [t.wanted_output_tokens for s in sessions for t in s.turns] == outs.tolist()
    for s in sessions:
        assert len(s.turns) == 3 and s.think_s[0] == 0.0
        assert all(0.5 <= t <= 1.5 for t in s.think_s[1:])
        for turn in s.turns:
            assert encode(bpe, turn.prompt_text) == list(turn.prompt_token_ids)
    again = synthetic_sessions(bpe, 4, 3, "uniform:5:40", "uniform:3:9", "uniform:0.5:1.5", seed=3)
    assert again == sessions
    other = synthetic_sessions(bpe, 4, 3, "uniform:5:40", "uniform:3:9", seed=4)
    assert other[0].turns[0].prompt_token_ids != sessions[0].turns[0].prompt_token_ids


def test_turn_carries_previous_prompt_and_answer(bpe):
    session = synthetic_sessions(bpe, 1, 3, 12, 5, seed=1)[0]
    first = conversation_turn(session, 0, None, "", bpe)
    assert first.prompt_token_ids == session.turns[0].prompt_token_ids and first.request_id == "session-0-t0"
    answers = ["The answer, one.", " and a second reply"]
    previous = first
    for k, answer in enumerate(answers, start=1):
        turn = conversation_turn(session, k, previous, answer, bpe)
        assert turn.prompt_text == previous.prompt_text + answer + session.turns[k].prompt_text
        assert list(turn.prompt_token_ids) == encode(bpe, turn.prompt_text)  # token-exact as sent
        assert turn.prompt_text.startswith(previous.prompt_text + answer)
        # the earlier prompt's tokens carry over but for a merge at the join (its last token at most)
        keep = len(previous.prompt_token_ids) - 1
        assert turn.prompt_token_ids[:keep] == previous.prompt_token_ids[:keep]
        assert turn.prompt_len >= previous.prompt_len + session.turns[k].prompt_len
        assert turn.wanted_output_tokens == session.turns[k].wanted_output_tokens
        assert turn.group == session.session_id
        previous = turn


def test_think_time_forms():
    assert ThinkTime.parse("2.5") == ThinkTime("fixed", 2.5)
    assert ThinkTime.parse(0) == ThinkTime("fixed", 0.0)
    drawn = ThinkTime.parse("exponential:2").sample(np.random.default_rng(0), 1000)
    assert drawn.mean() == pytest.approx(2, 0.1)
    for bad in ("-1", "uniform:3:1", "gamma:1", "soon", "uniform:1"):
        with pytest.raises(ValueError, match="think time"):
            ThinkTime.parse(bad)


def test_sharegpt_sessions(bpe, tmp_path):
    conversations = [
        {
            "id": "long",
            "conversations": [
                {"from": "human", "value": "First question?"},
                {"from": "gpt", "value": "First answer here."},
                {"from": "human", "value": "Second question?"},
                {"from": "gpt", "value": "Two."},
                {"from": "human", "value": "Third?"},
                {"from": "gpt", "value": "The third answer, longer still."},
            ],
        },
        {
            "id": "single",
            "conversations": [{"from": "human", "value": "Only one?"}, {"from": "gpt", "value": "Yes."}],
        },
        "not a conversation",
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    sessions = sharegpt_sessions(path, bpe, think_time=1.0)
    assert [s.session_id for s in sessions] == ["sharegpt-long"]  # one answered turn is no session
    turns = sessions[0].turns
    assert [t.prompt_text for t in turns] == ["First question?", "\n\nSecond question?", "\n\nThird?"]
    assert [t.wanted_output_tokens for t in turns] == [
        len(encode(bpe, a)) for a in ("First answer here.", "Two.", "The third answer, longer still.")
    ]
    assert sessions[0].think_s == (0.0, 1.0, 1.0)
    assert len(sharegpt_sessions(path, bpe, turns=2)[0].turns) == 2
    every = sharegpt_sessions(path, bpe, min_turns=1)
    assert {s.session_id for s in every} == {"sharegpt-long", "sharegpt-single"}
    with pytest.raises(ValueError, match="no conversation"):
        sharegpt_sessions(path, bpe, min_turns=4)


def test_session_fields_round_trip(tmp_path):
    base = dict(
        run_id="r",
        backend="b",
        t0_monotonic=1.0,
        prompt_tokens=3,
        wanted_output_tokens=2,
        output_length_forced=True,
        scheduled_s=0.0,
    )
    path = tmp_path / "requests.jsonl"
    with RecordWriter(path) as writer:
        writer.append(RequestRecord(**base, request_id="s-0-t1", session_id="s-0", turn=1))
    # a record of a run before sessions existed (schema 1, without the fields) still reads
    old = RequestRecord(**base, request_id="old").model_dump(exclude={"session_id", "turn"})
    with path.open("a") as f:
        f.write(json.dumps(old | {"schema_version": 1}) + "\n")
    new, legacy = read_records(path)
    assert (new.session_id, new.turn, new.schema_version) == ("s-0", 1, 2)
    assert (legacy.session_id, legacy.turn, legacy.schema_version) == (None, None, 1)


def test_sessions_need_a_closed_loop_and_a_tokenizer(bpe):
    sessions = synthetic_sessions(bpe, 2, 2, 4, 2, seed=0)
    adapter = get_adapter("reference")
    with pytest.raises(ValueError, match="closed loop"):
        run_load_sync(
            PointJob("http://127.0.0.1:9", adapter, [], OpenLoop(1.0), sessions=sessions, tokenizer=bpe)
        )
    with pytest.raises(ValueError, match="tokenizer"):
        run_load_sync(PointJob("http://127.0.0.1:9", adapter, [], ClosedLoop(1), sessions=sessions))


def _prefix_hits(url: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return common_metrics(text, get_adapter("reference").metric_names)["prefix_cache_hits_total"]


def test_live_later_turns_hit_the_prefix_cache(tiny_server, llama_dir, tmp_path):
    """3 sessions x 3 turns on our engine: every later turn finds at least the earlier prompt (to the
    16-token block) in the prefix cache, and the report shows TTFT by turn."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(llama_dir))
    sessions = synthetic_sessions(tokenizer, 3, 3, 24, 16, think_time=0.05, seed=11)
    before = _prefix_hits(tiny_server.url)
    out = tmp_path / "requests.jsonl"
    records = run_load_sync(
        PointJob(
            tiny_server.url,
            get_adapter("reference", model=str(llama_dir)),
            [],
            ClosedLoop(2),
            output_path=out,
            sessions=sessions,
            tokenizer=tokenizer,
        )
    )
    gained = _prefix_hits(tiny_server.url) - before
    assert len(records) == 9 and all(r.ok for r in records), [r.error_message for r in records]
    by_id = {(r.session_id, r.turn): r for r in read_records(out)}
    assert set(by_id) == {(s.session_id, k) for s in sessions for k in range(3)}
    earlier = 0
    for s in sessions:
        for k in (1, 2):
            turn, previous = by_id[(s.session_id, k)], by_id[(s.session_id, k - 1)]
            assert turn.prompt_tokens >= previous.prompt_tokens + 24 - 1  # the answer's tokens come on top
            assert turn.send_s >= previous.end_s + 0.05  # sent after the answer and the think time
            earlier += (previous.prompt_tokens - 1) // 16 * 16  # whole blocks; a join may merge its end
    print("prefix hits", gained, "earlier prompts", earlier)
    assert earlier > 0 and gained >= earlier, (gained, earlier)


def test_live_compare_run_multi_turn_report(tiny_server, llama_dir, tmp_path):
    """The acceptance run: `compare run --dataset multi-turn` against our engine (3 sessions x 3 turns):
    its prefix-cache hit counter rises by at least the earlier turns' prompts, and the report and turns.csv
    show TTFT by turn."""
    import pandas as pd
    from compare_cli import run_compare

    before = _prefix_hits(tiny_server.url)
    out = tmp_path / "run"
    run_compare(
        "run",
        "--backends",
        "reference",
        "--endpoint",
        f"reference={tiny_server.url}",
        "--model",
        str(llama_dir),
        "--dataset",
        "multi-turn",
        "--turns",
        "3",
        "--input-len",
        "24",
        "--output-len",
        "16",
        "--think-time",
        "0.02",
        "--concurrency",
        "3",
        "--num-requests",
        "3",
        "--warmup",
        "0",
        "--n-boot",
        "100",
        "--out",
        str(out),
    )
    gained = _prefix_hits(tiny_server.url) - before
    records = read_records(out / "requests.jsonl")
    assert len(records) == 9 and all(r.ok for r in records)
    assert sorted(r.turn for r in records) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    prompts = {(r.session_id, r.turn): r.prompt_tokens for r in records}
    earlier = sum((prompts[(s, k - 1)] - 1) // 16 * 16 for s, k in prompts if k > 0)
    assert earlier > 0 and gained >= earlier, (gained, earlier)
    turns = pd.read_csv(out / "turns.csv")
    # numbered from 1, as the report numbers them (the records' own `turn` counts from 0)
    assert turns["turn_number"].tolist() == [1, 2, 3] and turns["n"].tolist() == [3, 3, 3]
    assert turns["prompt_tokens_mean"].is_monotonic_increasing and turns["ttft_p50_ms"].gt(0).all()
    report = (out / "report.md").read_text()
    section = report.split("## TTFT by turn", 1)[1].split("\n## ", 1)[0]
    assert section.count("| reference |") == 3, section
    # `compare report` rebuilds turns.csv from the records
    (out / "turns.csv").unlink()
    run_compare("report", str(out), "--n-boot", "100")
    pd.testing.assert_frame_equal(pd.read_csv(out / "turns.csv"), turns)
