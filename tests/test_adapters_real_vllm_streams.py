"""Token counting on streams recorded from the real vLLM (its CPU build serving SmolLM2-135M): tokens that end
inside a multi-byte character arrive as empty-text chunks and still count; the chat stream's role chunk
counts none; the totals equal vLLM's own usage."""

from __future__ import annotations

from pathlib import Path

from adapters import get_adapter
from workloads.response_parsing import read_stream

DATA = Path(__file__).parent / "data"


def read(name: str, adapter: str):
    body = (DATA / name).read_bytes()
    return read_stream(get_adapter(adapter), [(0.0, body)])


def test_completion_stream_with_empty_text_chunks():
    reading = read("vllm_cpu_completion_stream.txt", "vllm")
    assert reading.problem is None
    token_events = [(e, n) for e, n in zip(reading.events, reading.counts, strict=True) if e.is_output]
    assert sum(n for _, n in token_events) == reading.usage_completion_tokens == 16
    assert sum(1 for e, n in token_events if n == 1 and e.text == "") == 11  # multi-byte emoji pieces
    assert reading.text == " 🍔🍢🍢🍢🍢"
    assert reading.finish_reason == "length"


def test_chat_stream_role_chunk_and_hiragana():
    reading = read("vllm_cpu_chat_stream.txt", "vllm-chat")
    assert reading.problem is None
    assert reading.counts[0] == 0  # the role-only first chunk carries no token
    assert sum(reading.counts) == reading.usage_completion_tokens == 62
    assert reading.finish_reason == "stop"
    assert any(e.text == "" for e, n in zip(reading.events, reading.counts, strict=True) if n == 1)
