"""What a client's socket-read stamps can be checked against on any machine, busy or not.

A socket read carries the kernel's receive stamp of the oldest segment it returns that no earlier read had
returned: Linux merges segments that arrive while the reader holds the socket (for instance, preempted inside
a read), and the merged one keeps the first one's stamp. So an event that came in the same read as earlier
data carries that data's time, which may precede the event's own write by as long as the reader was held up
(several ms on a loaded machine). What always holds: no read is stamped before the oldest data it brought
was written. Checked read by read, that catches a misread clock without failing on a busy machine.
"""

from __future__ import annotations

from typing import Any

from workloads.records import RequestRecord

# Both ends stamp with the kernel's wall clock, each process taking it back to the shared monotonic clock
# through an offset measured to within a microsecond; a send's stamp precedes the receive stamp of the same
# bytes by about a microsecond. 0.2 ms is far above both, and far below what a misread clock would give.
CLOCK_TOLERANCE_S = 2e-4


def stamped_before_sent(
    record: RequestRecord, entry: dict[str, Any], tolerance_s: float = CLOCK_TOLERANCE_S
) -> list[tuple[int, float]]:
    """(event index, seconds early) of each event whose client time precedes the scripted server's write of
    the oldest data that can have come in the same socket read. Events sharing one client time came in one
    read; the first event's read may also have carried the response head (written after `headers_s`). The
    record's events and the server's logged events must line up one to one."""
    t0 = record.t0_monotonic - (record.clock_offset_s or 0.0)
    early, read_time, oldest_sent = [], None, 0.0
    for i, ((t, _, _), (sent, _, _)) in enumerate(zip(record.events, entry["events"], strict=True)):
        client = t0 + t
        if client != read_time:  # a new read: its oldest data is this event (or, for the first, the head)
            read_time, oldest_sent = client, entry["headers_s"] if i == 0 else sent
        if client < oldest_sent - tolerance_s:
            early.append((i, oldest_sent - client))
    return early
