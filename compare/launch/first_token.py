"""The cold first token: from the moment a launched server first answers its health check to the first
generated token of the first request it serves.

A server that is "healthy" may still have work left before it can generate (lazy kernel compilation, a first
allocation, a graph captured on first use); that cost belongs to its set-up, and a user's first request pays
it. One short streamed request is sent right after ready, read with the backend's own adapter, and timed to
its first token-carrying event. It also proves the server can generate at all: vLLM's CPU build, for one,
reports healthy with a model shape its attention kernels refuse, and fails only at the first request.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse

from adapters.base import Adapter
from adapters.request_spec import RequestSpec
from workloads.sse_decoder import SSEDecoder


class FirstTokenError(RuntimeError):
    """The first request failed: the server is up but cannot generate."""


def first_token_s(
    url: str, adapter: Adapter, spec: RequestSpec, since: float, timeout: float = 300.0
) -> float:
    """Send `spec` streamed through `adapter` to `url`; seconds from `since` (a `time.perf_counter()` value)
    to the first event carrying a generated token. The rest of the stream is read, so the server does not
    see an aborted request."""
    request = adapter.build_request(spec, stream=True)
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None:
        raise FirstTokenError(f"no host in {url!r}")
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        body = json.dumps(request.body).encode()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **request.headers}
        conn.request("POST", parts.path.rstrip("/") + request.path, body=body, headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise FirstTokenError(f"HTTP {resp.status}: {resp.read(2000).decode('utf-8', 'replace')}")
        decoder, first = SSEDecoder(), None
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            for event in decoder.feed(chunk):
                if event.data.strip() in (b"[DONE]",):
                    continue
                parsed = adapter.parse_event(event.data)
                if parsed.error:
                    raise FirstTokenError(f"the stream reported an error: {parsed.error}")
                carries = parsed.n_tokens > 0 or bool(parsed.usage and parsed.usage.completion_tokens)
                if first is None and parsed.is_output and carries:
                    first = time.perf_counter()
        if first is None:
            raise FirstTokenError("the stream ended without a generated token")
        return first - since
    except (OSError, http.client.HTTPException) as exc:
        raise FirstTokenError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()
