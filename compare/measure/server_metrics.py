"""A backend's own counters over one load point: its `/metrics` (its adapter's `metrics_path`) read just
before the load starts and again once it has ended, and the growth of each counter its adapter's
`metric_names` maps, under the common names (`preemptions_total`, `prefix_cache_hits_total`,
`requests_finished_total`, ...). The load generator writes them into the point's entry in runs.jsonl
(`RunSummary.server_metrics`). Best effort: a short timeout, and a server without `/metrics`, or one that
does not answer, records nothing; the point goes on either way. The warm-up requests fall inside."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

from adapters.base import Adapter

SCRAPE_TIMEOUT_S = 2.0
#: the common names whose values only grow: counters, and a histogram's or a summary's sum and count
CUMULATIVE = ("_total", "_sum", "_count")


def scrape(url: str, adapter: Adapter | None, timeout: float = SCRAPE_TIMEOUT_S) -> dict[str, float] | None:
    """The mapped cumulative metrics of the server at `url` under their common names; None where there is
    no adapter (a point driven without one) or it maps none, or the server does not answer, or not in
    Prometheus text."""
    from adapters.prometheus import common_metrics

    if adapter is None or not adapter.metric_names:
        return None
    try:
        with urllib.request.urlopen(url.rstrip("/") + adapter.metrics_path, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
        found = common_metrics(text, adapter.metric_names)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return {name: value for name, value in found.items() if name.endswith(CUMULATIVE)}


def counter_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each counter's growth between two reads; a counter that went back (the server restarted) or that one
    read lacks is left out."""
    out = {}
    for name, value in sorted(after.items()):
        first = before.get(name)
        if first is not None and value >= first:
            out[name] = round(value - first, 6)
    return out


@dataclass(frozen=True)
class ServerCounters:
    """The server's counters as read before a point; called once the point has ended, their growth since
    (None where the second read failed). A `PointJob`'s `server_metrics`."""

    url: str
    adapter: Adapter
    before: dict[str, float]
    timeout: float = SCRAPE_TIMEOUT_S

    @classmethod
    def read(cls, url: str, adapter: Adapter, timeout: float = SCRAPE_TIMEOUT_S) -> ServerCounters | None:
        """The counters now; None where there are none to read."""
        before = scrape(url, adapter, timeout)
        return cls(url, adapter, before, timeout) if before is not None else None

    def __call__(self) -> dict[str, float] | None:
        after = scrape(self.url, self.adapter, self.timeout)
        return counter_deltas(self.before, after) if after is not None else None
