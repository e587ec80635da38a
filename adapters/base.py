"""What every backend adapter provides to the load generator (protocol side only).

An adapter turns a `RequestSpec` into the backend's HTTP request (asking for exactly the wanted number of
output tokens where the backend allows it) and reads each server-sent event of the response into a
`StreamEvent`. Token counting follows docs/design.md (Metric definitions): count tokens, not text. An
event's token count is exact when the server says it (token ids in the chunk, or cumulative "continuous"
usage), otherwise it is the protocol's own rule (one token per TGI event, one per OpenAI content chunk); the
server's final usage, when given, is what the record uses as output length, and any disagreement is flagged
in the record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from adapters.request_spec import RequestSpec

if TYPE_CHECKING:
    from adapters.launch_spec import LaunchSpec, ModelSource, Variant
    from adapters.startup_log import ConfigLine, LogClock, StartupPattern

FinalEvent = Literal["done", "finish", "none"]
#: common setting name -> the launch flag that sets it and its aliases (`--tensor-parallel-size`, `-tp`)
SettingFlags = Mapping[str, tuple[str, ...]]
#: `/metrics` info gauge -> {its label: the common setting name the label's value gives}
InfoMetrics = Mapping[str, Mapping[str, str]]


class MalformedEvent(ValueError):
    """The data of one event could not be read (not JSON, or not the protocol's shape)."""


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(slots=True)
class StreamEvent:
    """One server-sent event, read.

    `n_tokens`: generated tokens carried (exact when `exact`, else the protocol's rule of thumb).
    `text`: the generated text it carried (may be empty for a token inside a multi-byte character).
    `usage`: usage the event reported; with continuous usage it is cumulative up to this event.
    `is_done`: the protocol's end marker (`[DONE]`, TGI's event with `details`).
    `is_output`: the event belongs to the generation (has a choice / a token), as opposed to a usage-only
    or end-marker event; only such events can carry cumulative usage.
    `error`: the server reported an error in the stream.
    `server_timings`: the server's own account of the request so far, where its events carry one
    (llama.cpp's `timings`), as numbers under its own names.
    """

    n_tokens: int = 0
    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    is_done: bool = False
    is_output: bool = False
    exact: bool = False
    error: str | None = None
    server_timings: dict[str, float] | None = None


@dataclass(frozen=True, slots=True)
class HttpRequest:
    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def loads_event(data: bytes | str) -> dict[str, Any]:
    """Parse one event's data as a JSON object, or raise `MalformedEvent` with the offending data."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MalformedEvent(f"event data is not JSON ({exc}): {_preview(data)}") from exc
    if not isinstance(obj, dict):
        raise MalformedEvent(f"event data is not a JSON object: {_preview(data)}")
    return obj


def _preview(data: bytes | str, limit: int = 200) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text if len(text) <= limit else text[:limit] + "..."


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Adapter:
    """The protocol side of one backend. Subclasses set the class attributes and the two main methods.

    - `build_request(spec, stream=True) -> HttpRequest(path, body, headers)`
    - `parse_event(data) -> StreamEvent` (raises `MalformedEvent`)
    - `parse_response(body) -> StreamEvent` for a non-streamed response
    - `count_tokens(events) -> list[int]`: per-event token counts for a whole stream (uses cumulative
      usage where the adapter asked for it)
    - `is_complete(events)`: whether the stream reached the protocol's final event
    - `health_path`, `info_path`, `metrics_path`, `metric_names` (backend metric -> common name)
    - `startup_patterns`, `log_clock`: its server's start-up log lines; `launch_spec(...)`: how to start it
    - `config_lines`, `declared_defaults`: where its log prints its settings, and its documented defaults
    - `setting_flags`, `info_metrics`: the flags and `/metrics` info gauges that carry the audited settings

    The launch and log side is written as mixins (`_VLLMLaunch`, ...) that subclass `Adapter` too, so that
    they see its attributes; in every concrete adapter they come before the protocol class.
    """

    name: ClassVar[str] = "base"
    health_path: ClassVar[str] = "/health"
    info_path: str | None = None  # an instance's own where the route names its model (Triton)
    metrics_path: ClassVar[str] = "/metrics"
    metric_names: ClassVar[Mapping[str, str]] = {}
    startup_patterns: ClassVar[list[StartupPattern]] = []  # its server's start-up lines' facts
    log_clock: ClassVar[LogClock | None] = None  # how those lines carry the time
    server_family: ClassVar[str | None] = None  # which server `launch_spec` starts (vllm, tgi, trtllm, ...)
    config_lines: ClassVar[list[ConfigLine]] = []  # where its log prints its settings
    #: settings its server has unless told otherwise (the parity audit's last resort: documented defaults)
    declared_defaults: ClassVar[Mapping[str, Any]] = {}
    setting_flags: ClassVar[SettingFlags] = {}  # the launch flags of the audited settings
    info_metrics: ClassVar[InfoMetrics] = {}  # the `/metrics` info gauges that carry settings
    final_event: ClassVar[FinalEvent] = "done"

    #: the request asks the server to produce exactly `wanted_output_tokens` (ignore_eos / min_tokens)
    forces_output_length: bool = False
    #: usage on output events is cumulative ("continuous usage"), so per-event counts are exact
    cumulative_usage: bool = False

    @classmethod
    def launch_spec(cls, model: ModelSource, variant: Variant, port: int, *, workdir: Path, gpu: bool,
                    executable: str | None = None) -> LaunchSpec:
        """How to start this backend's server."""
        from adapters.launch_spec import LaunchSpecError

        raise LaunchSpecError(f"{cls.name}: llm-compare does not start this server; give its --endpoint")

    def build_request(self, spec: RequestSpec, stream: bool = True) -> HttpRequest:
        raise NotImplementedError

    def parse_event(self, data: bytes | str) -> StreamEvent:
        raise NotImplementedError

    def parse_response(self, body: bytes | str) -> StreamEvent:
        raise NotImplementedError

    def count_tokens(self, events: Sequence[StreamEvent]) -> list[int]:
        """Per-event generated-token counts. With cumulative usage, an output event's count is the growth
        of `usage.completion_tokens` since the previous one; events without usage keep their own count."""
        counts: list[int] = []
        seen = 0
        for ev in events:
            n = ev.n_tokens
            done = ev.usage.completion_tokens if ev.usage is not None else None
            if self.cumulative_usage and ev.is_output and done is not None:
                n = max(done - seen, 0)
                seen = max(seen, done)
            elif ev.is_output:
                seen += n
            counts.append(n)
        return counts

    def is_complete(self, events: Sequence[StreamEvent]) -> bool:
        if self.final_event == "none":
            return True
        if self.final_event == "finish":
            return any(ev.is_done or ev.finish_reason for ev in events)
        return any(ev.is_done for ev in events)

    def with_body(self, body: dict[str, Any], spec: RequestSpec) -> dict[str, Any]:
        if spec.extra_body:
            body = {**body, **spec.extra_body}
        return body

    def describe(self) -> dict[str, Any]:
        """The adapter's settings, for run summaries and reports."""
        return {"adapter": self.name, "forces_output_length": self.forces_output_length,
                "cumulative_usage": self.cumulative_usage}
