"""Each backend's stream read from recorded bytes: token counts per event, usage, finish, completeness.

TGI and TensorRT-LLM cannot run on this machine, so their streams are the byte-exact recordings under
tests/data/streams (see the README there for the source each follows); the same formats are served live
by the scripted server in test_scripted_server_protocols.py.
"""

from __future__ import annotations

import random
from itertools import pairwise
from pathlib import Path

import pytest

from adapters import get_adapter
from workloads.records import ErrorKind
from workloads.response_parsing import read_stream

STREAMS = Path(__file__).parent / "data" / "streams"

# file, adapter (name, options), per-event token counts, usage (prompt, completion), finish reason, text
CASES = [
    (
        "vllm_completions_continuous_usage.sse",
        ("vllm", {}),
        [1, 1, 1, 1, 1, 2, 1, 0, 0],
        (6, 8),
        "length",
        " Tokyo is東京 and",
    ),
    (
        "vllm_completions_final_usage.sse",
        ("vllm", {}),
        [1, 1, 1, 1, 1, 1, 1, 0, 0],
        (9, 7),
        "length",
        " The café opens at nine",
    ),
    (
        "vllm_chat_continuous_usage.sse",
        ("vllm-chat", {}),
        [0, 1, 2, 1, 1, 1, 1, 0, 0],
        (12, 7),
        "stop",
        "Bonjour le monde🙂",
    ),
    (
        "tgi_generate_stream.sse",
        ("tgi", {}),
        [1, 1, 1, 1, 1, 1],
        (5, 6),
        "eos_token",
        " Deep learning isé</s>",
    ),
    ("tgi_openai_chat.sse", ("tgi-openai", {}), [1, 1, 1, 1, 0, 0], (17, 4), "length", "Deep learning is"),
    (
        "tgi_openai_completions.sse",
        ("tgi-openai-completions", {}),
        [1, 1, 1],
        (5, 3),
        "length",
        " Deep learning is",
    ),
    (
        "trtllm_completions.sse",
        ("trtllm", {"model": "m"}),
        [1, 1, 2, 1, 1, 0, 0],
        (7, 6),
        "length",
        " Paris is the capitalé",
    ),
    (
        "trtllm_chat.sse",
        ("trtllm-chat", {"model": "m"}),
        [0, 1, 1, 2, 1, 0, 0],
        (20, 5),
        "stop",
        "Hello! How can",
    ),
    (
        "triton_generate_stream.sse",
        ("trtllm-triton", {}),
        [1, 1, 1, 1],
        (None, None),
        None,
        "\nMachine learning is",
    ),
]


def chunks_of(body: bytes, cuts: list[int]) -> list[tuple[float, bytes]]:
    bounds = [0, *sorted(set(cuts)), len(body)]
    return [(float(i), body[a:b]) for i, (a, b) in enumerate(pairwise(bounds)) if b > a]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_recorded_stream(case):
    name, (adapter_name, options), counts, (prompt, completion), finish, text = case
    adapter = get_adapter(adapter_name, **options)
    body = (STREAMS / name).read_bytes()
    rng = random.Random(name)
    for cuts in ([], [rng.randrange(len(body)) for _ in range(5)], list(range(1, len(body), 7))):
        reading = read_stream(adapter, chunks_of(body, cuts))
        assert reading.problem is None
        assert reading.counts == counts
        assert (reading.usage_prompt_tokens, reading.usage_completion_tokens) == (prompt, completion)
        assert reading.finish_reason == finish
        assert reading.text == text
        if completion is not None:
            assert reading.event_tokens == completion  # per-event counts add up to the server's usage


def test_without_continuous_usage_counts_are_estimates_and_disagree():
    """A plain OpenAI client cannot know that empty-text chunks carry tokens or that one chunk carried two:
    its per-event counts are estimates, and here they fall short of the server's usage (the record flags
    that); vLLM's adapter asks for continuous usage and counts exactly (previous test)."""
    body = (STREAMS / "vllm_completions_continuous_usage.sse").read_bytes()
    reading = read_stream(get_adapter("openai"), [(0.0, body)])
    assert reading.counts == [1, 1, 1, 1, 1, 1, 0, 0, 0]
    assert reading.event_tokens == 6 and reading.usage_completion_tokens == 8


def test_events_keep_the_time_of_the_read_that_completed_them():
    body = (STREAMS / "vllm_chat_continuous_usage.sse").read_bytes()
    second = body.index(b"data:", 10)
    chunks = [(1.0, body[: second - 5]), (2.0, body[second - 5 : second + 3]), (3.0, body[second + 3 :])]
    reading = read_stream(get_adapter("vllm-chat"), chunks)
    assert reading.times[:2] == [2.0, 3.0]  # the role chunk's blank line came in the second read


@pytest.mark.parametrize(
    "name,adapter_name,message",
    [
        ("vllm_stream_error.sse", "vllm", "The engine encountered an internal error."),
        (
            "tgi_stream_error.sse",
            "tgi",
            "Request failed during generation: Server error: CUDA out of memory (generation)",
        ),
        (
            "triton_stream_error.sse",
            "trtllm-triton",
            "in ensemble 'ensemble', Encountered error for requestId 7",
        ),
    ],
)
def test_errors_inside_a_stream(name, adapter_name, message):
    reading = read_stream(get_adapter(adapter_name), [(0.0, (STREAMS / name).read_bytes())])
    assert reading.problem == (ErrorKind.STREAM_ERROR, message)
    assert reading.counts[0] == 1  # what came before the error is still counted


@pytest.mark.parametrize(
    "name,adapter_name,cut_before",
    [
        ("vllm_completions_continuous_usage.sse", "vllm", b"data: [DONE]"),
        (
            "vllm_chat_continuous_usage.sse",
            "vllm-chat",
            b'data: {"id":"chatcmpl-0c6f2d8e91b34a7f","object":"chat.completion.chunk","created":1732000100,'
            b'"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[]',
        ),
        ("tgi_generate_stream.sse", "tgi", b'data:{"index":6'),
        ("trtllm_chat.sse", "trtllm-chat", b"data: [DONE]"),
    ],
)
def test_stream_closed_without_its_final_event(name, adapter_name, cut_before):
    body = (STREAMS / name).read_bytes()
    options = {"model": "m"} if adapter_name.startswith("trtllm") else {}
    reading = read_stream(get_adapter(adapter_name, **options), [(0.0, body[: body.index(cut_before)])])
    if adapter_name == "vllm-chat":  # the finish chunk came, but not the usage chunk and [DONE]
        assert reading.finish_reason == "stop"
    assert reading.problem is not None and reading.problem[0] == ErrorKind.INCOMPLETE_STREAM


def test_body_cut_in_the_middle_of_an_event():
    body = (STREAMS / "tgi_generate_stream.sse").read_bytes()
    reading = read_stream(get_adapter("tgi"), [(0.0, body[:-20])])
    assert reading.problem == (ErrorKind.INCOMPLETE_STREAM, "the body ended in the middle of an event")


def test_malformed_event_is_reported_and_the_rest_still_counted():
    body = (STREAMS / "vllm_completions_continuous_usage.sse").read_bytes()
    second = body.index(b"data:", 10)
    broken = body[:second] + b'data: {"id": "cmpl-x", "choices": [{"text": "unterminated\n\n' + body[second:]
    reading = read_stream(get_adapter("vllm"), [(0.0, broken)])
    assert reading.problem is not None and reading.problem[0] == ErrorKind.MALFORMED_EVENT
    assert "not JSON" in reading.problem[1]
    assert reading.counts == [1, 0, 1, 1, 1, 1, 2, 1, 0, 0]
