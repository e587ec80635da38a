"""The SSE decoder against the WHATWG rules, with events split across reads at every possible byte."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.sse_decoder import SSEDecoder, SSEEvent

# field values: no CR/LF (they end lines); may contain ':' and non-ASCII
values = st.text(
    alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=30
)
endings = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def streams(draw):
    """A list of expected events and one serialisation of them, with comments and mixed line endings."""
    expected, out = [], []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            out.append(":" + draw(values).lstrip(":") + draw(endings))  # comment / keep-alive
        name = draw(st.one_of(st.none(), st.sampled_from(["error", "message"])))
        if name:
            out.append(f"event: {name}{draw(endings)}")
        lines = draw(st.lists(values, min_size=1, max_size=3))
        for line in lines:
            spaced = draw(st.booleans()) or line.startswith(" ")
            out.append(("data: " if spaced else "data:") + line + draw(endings))
        if draw(st.booleans()):
            out.append("id: 7" + draw(endings))
        blank = draw(endings)
        if out[-1].endswith("\r") and blank.startswith("\n"):
            blank = "\r"  # "\r" then "\n" would read as one CRLF line end, not as a blank line
        out.append(blank)  # the blank line that ends the event
        expected.append(SSEEvent("\n".join(lines).encode(), name.encode() if name else None))
    return expected, "".join(out).encode()


def decode(body: bytes, cuts: list[int]) -> tuple[list[SSEEvent], bool]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    previous = 0
    for cut in [*sorted(cuts), len(body)]:
        events.extend(decoder.feed(body[previous:cut]))
        previous = cut
    tail, leftover = decoder.finish()
    return events + tail, leftover


@settings(max_examples=300, deadline=None)
@given(streams(), st.lists(st.integers(0, 10_000), max_size=12))
def test_any_split_gives_the_same_events(stream, raw_cuts):
    expected, body = stream
    cuts = [c % (len(body) + 1) for c in raw_cuts]
    events, leftover = decode(body, cuts)
    assert events == expected
    assert not leftover


def test_every_single_byte_split_of_a_vllm_like_stream():
    body = (
        b'data: {"choices":[{"text":" a"}]}\r\n\r\n: ping\n\ndata:{"choices":[{"text":"\xc3\xa9"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    whole, _ = decode(body, [])
    assert [e.data for e in whole] == [
        b'{"choices":[{"text":" a"}]}',
        '{"choices":[{"text":"é"}]}'.encode(),
        b"[DONE]",
    ]
    for cut in range(len(body) + 1):
        assert decode(body, [cut])[0] == whole
    assert decode(body, list(range(len(body))))[0] == whole  # one byte per read


def test_leftovers_and_edge_cases():
    assert decode(b"data: x\n", [])[1] is True  # an event without its blank line: bytes lost
    assert decode(b"data: x", [])[1] is True  # an unfinished line
    assert decode(b"data: x\n\n: trailing comment\n", []) == ([SSEEvent(b"x")], False)
    assert decode(b"data: x\r\r", [8]) == ([SSEEvent(b"x")], False)  # CR line endings, last CR held back
    assert decode(b"\xef\xbb\xbfdata: bom\n\n", [1, 2]) == ([SSEEvent(b"bom")], False)
    assert decode(b"event: error\n\n", []) == ([], False)  # no data: nothing dispatched
    assert decode(b"data\n\n", []) == ([SSEEvent(b"")], False)  # a field name alone is an empty data line
    assert decode(b"data:  two spaces\n\n", []) == ([SSEEvent(b" two spaces")], False)


def test_many_events_in_one_read():
    rng = random.Random(5)
    payloads = [str(rng.random()).encode() for _ in range(500)]
    body = b"".join(b"data: " + p + b"\n\n" for p in payloads)
    assert [e.data for e in decode(body, [])[0]] == payloads
