"""Incremental decoding of a `text/event-stream` body (WHATWG server-sent events), bytes in, events out.

Rules followed: lines end in CRLF, LF or CR (a CR at the very end of a read is held back until the next
read shows whether an LF follows); a blank line ends an event; lines starting with ':' are comments
(keep-alives); `field:value` with one optional space after the colon (`data:x` and `data: x` are the
same); several `data` lines join with newlines; an event with no data is not dispatched; a leading BOM is
dropped. Events may be split across reads at any byte, and one read may hold many events.
"""

from __future__ import annotations

from dataclasses import dataclass

_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: bytes
    event: bytes | None = None  # the `event:` field, when the server named the event type


class SSEDecoder:
    """Feed it the body's reads in order; each `feed` returns the events that read completed."""

    __slots__ = ("_data", "_event", "_pending", "_started")

    def __init__(self) -> None:
        self._pending = b""  # bytes of an unfinished line
        self._data: list[bytes] = []
        self._event: bytes | None = None
        self._started = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not self._started:
            if not chunk:
                return []
            buf = self._pending + chunk
            if len(buf) < len(_BOM) and _BOM.startswith(buf):
                self._pending = buf
                return []
            self._started = True
            self._pending = b""
            chunk = buf[3:] if buf.startswith(_BOM) else buf
        buf = self._pending + chunk if self._pending else chunk
        if b"\r" in buf:
            if buf.endswith(b"\r"):
                self._pending = b"\r"  # might be the first half of CRLF
                buf = buf[:-1]
            else:
                self._pending = b""
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            lines = buf.split(b"\n")
            if self._pending:
                self._pending = lines.pop() + self._pending
            else:
                self._pending = lines.pop()
        else:
            lines = buf.split(b"\n")
            self._pending = lines.pop()
        return self._take_lines(lines)

    def _take_lines(self, lines: list[bytes]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(SSEEvent(b"\n".join(self._data), self._event))
                self._data = []
                self._event = None
            elif line[0] == 0x3A:  # ':' comment / keep-alive
                continue
            else:
                name, sep, value = line.partition(b":")
                if sep and value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    self._data.append(value)
                elif name == b"event":
                    self._event = value
                # id, retry and unknown fields do not matter here
        return events

    def finish(self) -> tuple[list[SSEEvent], bool]:
        """End of body: the events completed by a CR held back at the very end, and whether bytes were
        left over (an unfinished line, or an event that never got its blank line)."""
        events: list[SSEEvent] = []
        if self._pending.endswith(b"\r"):
            events = self._take_lines([self._pending[:-1]])
            self._pending = b""
        leftover = bool(self._data) or bool(self._pending)
        self._pending = b""
        self._data = []
        self._event = None
        return events, leftover
