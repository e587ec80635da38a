"""Capturing a response body as raw bytes, each piece with the time it reached the socket; parsing is
`workloads/response_parsing.py`.

`StampingConnector` gives each aiohttp connection a `StampingHandler`, which notes the time of every
socket read and how far it advanced the watched body. Its sockets are `StampedSocket`s
(`workloads/kernel_stamps.py`), so on Linux under asyncio's own loop a read's time is the kernel's receive
stamp: neither the client's queue of ready streams nor a sleeping CPU delays it (elsewhere, the moment the
read returned). `read_stamped` wakes once per response instead of once per token and cuts the body at those
marks, so the client's own queueing stays out of the timestamps; since a body is read whole once it has
ended, the handler never pauses the socket for aiohttp's buffer limits.

Two aiohttp internals are used, each with a fallback: the connector's `_factory` (without it, pieces are
stamped when each read call returns) and the stream reader's `_buffer`, to keep the part of a body that
arrived before an error (without it, that part is lost from the record; the error is not).
"""

from __future__ import annotations

import functools
import logging
from time import perf_counter
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

from workloads.kernel_stamps import StampedSocket, socket_of, stamped_socket_factory

log = logging.getLogger(__name__)

Chunks = list[tuple[float, bytes]]


class StampingHandler(ResponseHandler):
    """aiohttp's client protocol, noting when each socket read reached the process."""

    last_rx = 0.0
    _watched: tuple[aiohttp.StreamReader, list[tuple[float, int]]] | None = None
    _socket: StampedSocket | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._socket = socket_of(transport)

    def data_received(self, data: bytes) -> None:
        if not data:  # aiohttp calls this with b"" itself when the reader resumes reading: not a socket read
            super().data_received(data)
            return
        # the transport calls data_received right after the read that returned `data`: its stamp is this one's
        t = self.last_rx = self._socket.last_rx if self._socket is not None else perf_counter()
        watched = self._watched
        if watched is None:
            super().data_received(data)
            return
        reader, marks = watched
        before = reader.total_bytes
        super().data_received(data)
        after = reader.total_bytes
        if after != before:
            marks.append((t, after))

    def pause_reading(self) -> None:
        """Never pause: a body is read only once it has ended (`read_stamped`), so its buffer passing
        aiohttp's high-water mark (even before the read starts) would stall the stream for good. The load
        generator keeps every body whole anyway."""

    def watch(self, reader: aiohttp.StreamReader, marks: list[tuple[float, int]]) -> None:
        self._watched = (reader, marks)

    def unwatch(self) -> None:
        self._watched = None


class StampingConnector(aiohttp.TCPConnector):
    """A TCPConnector whose connections use `StampingHandler`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(socket_factory=stamped_socket_factory, **kwargs)
        factory = getattr(self, "_factory", None)
        if isinstance(factory, functools.partial) and factory.func is ResponseHandler:
            handler: type[ResponseHandler] = StampingHandler  # the attribute's type: partial[ResponseHandler]
            self._factory = functools.partial(handler, *factory.args, **factory.keywords)
        else:
            log.warning(
                "aiohttp %s: socket-read stamping unavailable; pieces are stamped when reads return",
                aiohttp.__version__,
            )


def _unread(reader: aiohttp.StreamReader) -> bytes | None:
    """The bytes still buffered in a reader that failed (its public reads raise the error)."""
    buffer = getattr(reader, "_buffer", None)
    if buffer is None:
        return None
    offset = getattr(reader, "_buffer_offset", 0)
    data = b"".join(buffer)
    return data[offset:] if offset else data


def _cut(body: bytes, marks: list[tuple[float, int]]) -> Chunks:
    """Split `body` (the payload from its first byte) at the cumulative offsets of the socket-read marks."""
    pieces: Chunks = []
    start = 0
    for t, total in marks:
        end = min(total, len(body))
        if end > start:
            pieces.append((t, body[start:end]))
            start = end
    if start < len(body):  # bytes without a mark (should not happen): the latest time known
        pieces.append((marks[-1][0] if marks else perf_counter(), body[start:]))
    return pieces


async def read_stamped(response: aiohttp.ClientResponse, chunks: Chunks) -> None:
    """Read the whole body into `chunks` as `(time its socket read reached the process, bytes)`. If reading
    fails or is cancelled, what arrived before is in `chunks` when the exception propagates."""
    content = response.content
    protocol = response.connection.protocol if response.connection is not None else None
    if not isinstance(protocol, StampingHandler):
        while data := await content.readany():
            chunks.append((perf_counter(), data))
        return
    marks: list[tuple[float, int]] = []
    if content.total_bytes:  # body bytes that came in the same socket read as the headers
        marks.append((protocol.last_rx, content.total_bytes))
    protocol.watch(content, marks)
    try:
        await content.wait_eof()
        body = await content.read()
    except BaseException:
        body = _unread(content) or b""  # None: no access to the buffer, nothing to recover
        raise
    finally:
        protocol.unwatch()
        chunks.extend(_cut(body, marks))
