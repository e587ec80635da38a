"""Receive times from the kernel: when each TCP segment reached the socket, not when the process got round to
reading it.

Linux stamps every received segment as the network stack queues it on the socket (on loopback that happens
inside the sender's own `send` call) and, for a socket that asks (SO_TIMESTAMPNS), returns the stamp with each
read. A reader that is busy with other streams, or whose virtual CPU was asleep when the bytes came, reads
later; the stamp stays where it was. Segments that wait unread are merged in the socket's queue and keep the
newest stamp, so a read that brings several events gives all of them the time of the last one: the stamp is
exact when the reader keeps up and never later than the read. The kernel switches stamping on a moment after
the first socket on the machine asks for it, so the very first reads of a run may come unstamped (they then
carry the time the read returned); warm-up requests absorb that.

The same socket can ask for the kernel's stamps of what it sends (SO_TIMESTAMPING, software, one per send
call, read back from the socket's error queue): the scripted server logs those as its write times, so the
truth is the kernel's on both ends and neither process's scheduling enters it.

`StampedSocket` overrides `recv`/`recv_into`, which asyncio's own (selector) event loop calls on the socket
object it was given; uvloop reads sockets in C and never calls them, so stamped reads need the standard loop
(`stamped_loop_factory`). Elsewhere than Linux, or if the option is refused, reads are stamped with the
process's clock when they return, as before.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from collections.abc import Callable
from time import perf_counter
from typing import Any

# Linux's values on every architecture Python runs on; the socket module does not export the names.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
# Software stamps of sent data, one per send call, keyed by the byte offset of its last byte, stamp only.
_TX_FLAGS = (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)  # TX_SOFTWARE | SOFTWARE | OPT_ID | OPT_TSONLY
_IP_RECVERR, _IPV6_RECVERR = 11, 25
_ERROR_QUEUE_MESSAGES = ((socket.IPPROTO_IP, _IP_RECVERR), (socket.IPPROTO_IPV6, _IPV6_RECVERR))
_CMSG_SPACE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 64
_TIMESPEC = struct.Struct("@qq")
_EXTENDED_ERR = struct.Struct("@IBBBBII")  # struct sock_extended_err: ee_data (the last field) is the offset


class WallToMonotonic:
    """The offset between the wall clock (the kernel's stamps) and perf_counter's monotonic clock, measured
    between two monotonic reads (the tightest of five brackets) and refreshed every second. Measuring it
    beside every read instead would put any pause between the two clock reads (a preempted thread) into
    the stamp; the two clocks run at the same rate (time synchronisation slews both) and part only when the
    wall clock is stepped, which the refresh catches."""

    def __init__(self, refresh_s: float = 1.0) -> None:
        self.refresh_ns = int(refresh_s * 1e9)
        self.offset_ns = 0
        self.measured_at_ns = -self.refresh_ns

    def to_monotonic(self, wall_ns: int) -> float:
        """perf_counter seconds of a wall-clock time in nanoseconds."""
        if time.perf_counter_ns() - self.measured_at_ns >= self.refresh_ns:
            self._measure()
        return (wall_ns - self.offset_ns) / 1e9

    def _measure(self) -> None:
        best_width = None
        for _ in range(5):
            before = time.perf_counter_ns()
            wall = time.time_ns()
            after = time.perf_counter_ns()
            if best_width is None or after - before < best_width:
                best_width, self.offset_ns = after - before, wall - (before + after) // 2
        self.measured_at_ns = time.perf_counter_ns()


_CLOCKS = WallToMonotonic()


def kernel_stamps_supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket.socket, "recvmsg")


class StampedSocket(socket.socket):
    """A socket whose every read notes, in `last_rx` (perf_counter seconds), the kernel's receive time of the
    newest segment it returned (or the time the read returned, where the kernel gave none), and whose every
    send notes when it was called (`last_tx`)."""

    last_rx: float = 0.0
    kernel_stamped_reads: int = 0
    last_tx: float = 0.0  # perf_counter seconds just before the latest send call
    bytes_sent = 0
    tx_stamps = False

    def enable_tx_stamps(self) -> bool:
        """Ask the kernel to stamp every send as its data leaves (on loopback: as the receiver's socket gets
        it, about a microsecond before the receiver's own stamp); `sent_at_kernel` reads the stamps back."""
        try:
            self.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _TX_FLAGS)
        except OSError:
            return False
        self.tx_stamps, self.bytes_sent = True, 0
        return True

    def sent_at_kernel(self) -> float | None:
        """The kernel's stamp of the latest send if it has sent all of it (perf_counter seconds), else None.
        Empties the socket's queue of send stamps."""
        latest = None
        for offset, stamp in self._drain_tx_stamps():
            if offset == (self.bytes_sent - 1) & 0xFFFFFFFF:
                latest = stamp
        return latest

    def _drain_tx_stamps(self) -> list[tuple[int, float]]:
        stamps: list[tuple[int, float]] = []
        while True:
            try:
                _, ancillary, _, _ = self.recvmsg(1, 256, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
            except OSError:  # BlockingIOError: the queue is empty
                return stamps
            wall_ns = offset = None
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= _TIMESPEC.size:
                    seconds, nanoseconds = _TIMESPEC.unpack_from(data)
                    wall_ns = seconds * 1_000_000_000 + nanoseconds
                elif (level, kind) in _ERROR_QUEUE_MESSAGES:
                    offset = _EXTENDED_ERR.unpack_from(data)[-1]
            if wall_ns is not None and offset is not None:
                stamps.append((offset, _CLOCKS.to_monotonic(wall_ns)))

    def enable_stamps(self) -> bool:
        try:
            self.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            return False
        return True

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if self.tx_stamps:  # send stamps nobody read raise EPOLLERR: drop them, or the loop spins on it
            self._drain_tx_stamps()
        data, ancillary, _, _ = self.recvmsg(bufsize, _CMSG_SPACE, flags)
        self._note(ancillary)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        if self.tx_stamps:
            self._drain_tx_stamps()
        view = memoryview(buffer)
        n, ancillary, _, _ = self.recvmsg_into([view[:nbytes] if nbytes else view], _CMSG_SPACE, flags)
        self._note(ancillary)
        return n

    def send(self, data: Any, flags: int = 0) -> int:
        self.last_tx = perf_counter()
        sent = super().send(data, flags)
        self.bytes_sent += sent
        return sent

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.last_tx = perf_counter()
        super().sendall(data, flags)
        self.bytes_sent += memoryview(data).nbytes

    def sendmsg(self, buffers: Any, *args: Any) -> int:  # asyncio's writelines on Python >= 3.12
        self.last_tx = perf_counter()
        sent = super().sendmsg(buffers, *args)
        self.bytes_sent += sent
        return sent

    def _note(self, ancillary: list[tuple[int, int, bytes]]) -> None:
        now = perf_counter()
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
                seconds, nanoseconds = _TIMESPEC.unpack_from(data)
                self.last_rx = min(_CLOCKS.to_monotonic(seconds * 1_000_000_000 + nanoseconds), now)
                self.kernel_stamped_reads += 1
                return
        self.last_rx = now

    @classmethod
    def from_accepted(cls, listener: socket.socket) -> tuple[StampedSocket, Any]:
        # socket.accept's own first step, which returns the bare descriptor; typeshed leaves it out
        fd, address = listener._accept()  # type: ignore[attr-defined]
        sock = cls(listener.family, listener.type, listener.proto, fileno=fd)
        sock.enable_stamps()
        if getattr(listener, "stamp_sends", False):
            sock.enable_tx_stamps()
        return sock, address


class StampedListener(socket.socket):
    """A listening socket whose accepted connections are `StampedSocket`s (asyncio's server loop calls
    `accept` on the socket object it was given), stamping their sends too where `stamp_sends`."""

    stamp_sends = False

    def accept(self) -> tuple[StampedSocket, Any]:
        return StampedSocket.from_accepted(self)


def stamped_listener(host: str, port: int, backlog: int = 4096, stamp_sends: bool = False) -> StampedListener:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = StampedListener(family, socket.SOCK_STREAM)
    sock.stamp_sends = stamp_sends
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # accepted sockets inherit it
    sock.bind((host, port))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def stamped_socket_factory(addr_info: tuple[Any, ...]) -> socket.socket:
    """For aiohttp's `TCPConnector(socket_factory=...)`: a client socket that stamps its reads."""
    family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = StampedSocket(family, type_, proto)
    sock.enable_stamps()
    return sock


def socket_of(transport: asyncio.BaseTransport | None) -> StampedSocket | None:
    """The StampedSocket under an asyncio transport, if it is one."""
    if transport is None:
        return None
    sock = transport.get_extra_info("socket")
    sock = getattr(sock, "_sock", sock)  # asyncio hands out a TransportSocket wrapper
    return sock if isinstance(sock, StampedSocket) else None


def stamped_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop that lets reads be stamped (asyncio's selector loop), or None where stamps are not
    available (then the caller may pick any loop, uvloop included)."""
    return asyncio.SelectorEventLoop if kernel_stamps_supported() else None
