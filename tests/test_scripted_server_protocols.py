"""Live streams from the scripted server in every protocol, read by the load generator: the per-event
token counts, usage and finish reason of each record must match what the server logged it wrote."""

from __future__ import annotations

import json

import pytest
from causality import stamped_before_sent

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from instruments.scripted_server import ScriptedSchedule, read_event_log, scripted_server
from workloads.loadgen import PointJob, run_load_sync
from workloads.schedule import ClosedLoop

pytestmark = pytest.mark.timing  # run again beside CPU burners in CI (.ci/under_load.sh)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("scripted") / "events.jsonl"
    schedule = ScriptedSchedule(ttft_s=0.01, itl_s=0.002)
    with scripted_server(event_log=log, default_schedule=schedule) as handle:
        yield handle


def specs(prefix: str, n: int, out: int, schedule: dict) -> list[RequestSpec]:
    header = {"X-Scripted-Schedule": json.dumps(schedule)}
    return [
        RequestSpec(f"{prefix}-{i}", (1, 2, 3), "alpha beta gamma", out + i, extra_headers=header)
        for i in range(n)
    ]


# adapter, options, scripted flavor, kinds of zero-token events expected around the tokens
CASES = [
    ("vllm", {}, "vllm"),
    ("vllm-chat", {}, "vllm"),
    ("openai", {"continuous_usage": True, "force_output_length": True}, "vllm"),
    ("tgi", {}, "tgi"),
    ("tgi-openai", {}, "tgi"),
    ("tgi-openai-completions", {}, "tgi"),
    ("trtllm", {"model": "scripted-model"}, "trtllm"),
    ("trtllm-chat", {"model": "scripted-model"}, "trtllm"),
    ("trtllm-triton", {}, "trtllm"),
    ("reference", {}, "vllm"),
    ("reference-chat", {}, "vllm"),
    ("reference-tgi", {}, "tgi"),
]


@pytest.mark.parametrize("adapter_name,options,flavor", CASES, ids=[c[0] for c in CASES])
def test_live_stream_counts_match_the_server(server, tmp_path, adapter_name, options, flavor):
    adapter = get_adapter(adapter_name, **options)
    # Triton's stream says nothing about how many tokens a step carried: one token per step there
    steps = 1 if adapter_name == "trtllm-triton" else [1, 3, 2]
    schedule = {"flavor": flavor, "tokens_per_event": steps, "empty_text_every": 4, "comment_every": 5}
    sent = specs(adapter_name, 3, 9, schedule)
    records = run_load_sync(
        PointJob(server.url, adapter, sent, ClosedLoop(3), output_path=tmp_path / "requests.jsonl")
    )
    truth = read_event_log(server.event_log, expect=[r.request_id for r in records])
    for record, spec in zip(sorted(records, key=lambda r: r.request_id), sent, strict=True):
        assert record.ok, (record.error_kind, record.error_message)
        logged = truth[record.request_id]["events"]
        assert [n for _, n, _ in record.events] == [n for _, n, _ in logged], "per-event token counts"
        assert record.event_tokens == spec.wanted_output_tokens
        if adapter_name != "trtllm-triton":  # Triton reports no usage
            assert record.output_tokens_source == "usage"
            assert record.usage_completion_tokens == spec.wanted_output_tokens
            assert record.finish_reason == "length"
        assert not record.token_count_mismatch
        assert record.output_length_forced == adapter.forces_output_length
        kinds = [k for _, _, k in logged]
        if adapter_name in ("vllm-chat", "trtllm-chat", "reference-chat"):
            assert kinds[0] == "role" and record.events[0][1] == 0


def test_every_token_event_is_timed_after_its_write(server):
    schedule = {"ttft_s": 0.02, "itl_s": [0.004, 0.001, 0.003], "tokens_per_event": 2}
    records = run_load_sync(
        PointJob(server.url, get_adapter("vllm"), specs("timed", 4, 12, schedule), ClosedLoop(4))
    )
    truth = read_event_log(server.event_log, expect=[r.request_id for r in records])
    for record in records:
        logged = truth[record.request_id]
        # nothing is seen before it is sent: no socket read stamped before the oldest data it brought was
        # written (an event read together with earlier data may carry that data's time: tests/causality.py)
        assert [n for _, n, _ in record.events] == [n for _, n, _ in logged["events"]]
        assert not stamped_before_sent(record, logged)
        assert record.t0_monotonic + record.send_s <= logged["received_s"]
        assert record.t0_monotonic + record.headers_s >= logged["headers_s"]


def test_retokenisation_is_a_cross_check(server):
    adapter = get_adapter("vllm")

    def count_words(text: str) -> int:  # the scripted server's tokens are " t<k>" words
        return len(text.split())

    clean = run_load_sync(
        PointJob(server.url, adapter, specs("words-clean", 2, 8, {}), ClosedLoop(2), tokenizer=count_words)
    )
    assert all(r.retokenized_tokens == r.output_tokens and not r.token_count_mismatch for r in clean)
    # every 3rd token has empty text and its character joins the next word: fewer words than tokens
    split = run_load_sync(
        PointJob(
            server.url,
            adapter,
            specs("words-split", 2, 8, {"empty_text_every": 3}),
            ClosedLoop(2),
            tokenizer=count_words,
        )
    )
    for r in split:
        assert r.retokenized_tokens < r.output_tokens and r.token_count_mismatch
        assert r.output_tokens_source == "usage"  # the mismatch is flagged, the server's count is kept


def test_triton_multi_token_steps_show_only_in_the_cross_check(server):
    """With speculative decoding a Triton step can carry several tokens; the protocol does not say so, so
    the per-event count is one per step and only re-tokenising the text reveals the difference."""
    sent = specs("triton-spec", 1, 9, {"flavor": "trtllm", "tokens_per_event": 3})
    [record] = run_load_sync(
        PointJob(
            server.url,
            get_adapter("trtllm-triton"),
            sent,
            ClosedLoop(1),
            tokenizer=lambda text: len(text.split()),
        )
    )
    assert record.ok and record.event_tokens == 3 and record.retokenized_tokens == 9
    assert record.token_count_mismatch


@pytest.mark.parametrize(
    "adapter_name,flavor", [("vllm-chat", "vllm"), ("tgi", "tgi"), ("trtllm-chat", "trtllm")]
)
def test_events_split_across_reads(server, adapter_name, flavor):
    """Every event written in two pieces 2 ms apart: each arrives in two reads and is still read whole."""
    options = {"model": "scripted-model"} if flavor == "trtllm" else {}
    sent = specs(f"split-{adapter_name}", 2, 5, {"flavor": flavor, "split_events": True})
    records = run_load_sync(PointJob(server.url, get_adapter(adapter_name, **options), sent, ClosedLoop(2)))
    truth = read_event_log(server.event_log, expect=[r.request_id for r in records])
    for record in records:
        assert record.ok and record.output_tokens == record.wanted_output_tokens
        assert [n for _, n, _ in record.events] == [n for _, n, _ in truth[record.request_id]["events"]]


def test_the_trtllm_adapter_checks_the_fields_trtllm_serve_documents():
    """The scripted server keeps its own copy of trtllm-serve's accepted request fields (written from its
    request models): an adapter list that drifts from it, by a typo or a field the server never had, would
    let requests through that the real server refuses, or refuse ones it accepts."""
    from adapters.trtllm import TrtllmChatAdapter, TrtllmCompletionsAdapter
    from instruments.scripted_formats import TRTLLM_ACCEPTED_FIELDS

    assert TrtllmCompletionsAdapter.known_fields == TRTLLM_ACCEPTED_FIELDS["completions"]
    assert TrtllmChatAdapter.known_fields == TRTLLM_ACCEPTED_FIELDS["chat"]
