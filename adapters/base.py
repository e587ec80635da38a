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
#: how a server's HTTP front-end count is known when it was not told one (`Adapter.api_servers_default`)
ApiServersDefault = Literal["per_data_parallel_rank", "one_unless_logged"]
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
    - `setting_flags`, `info_metrics`: the flags and `/metrics` info gauges that carry the audited settings;
      `props_path`, `read_props`: a settings route and how its answer reads
    - the capabilities from `own_model_name` on, and `serving_defaults(gpu)`: what the comparator does
      differently for this backend, so that `compare/` names none

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
    #: where its server states its settings as JSON (llama.cpp's `/props`; `read_props` reads the answer):
    #: the parity audit's source for a running endpoint, whose log we do not have
    props_path: ClassVar[str | None] = None

    # -- what the comparator does differently for it (so that compare/ names no backend) -------------------
    #: its `model` option names a model of the server's own (Triton's `ensemble`), not the checkpoint: only
    #: `--served-model` replaces its default
    own_model_name: ClassVar[bool] = False
    #: the run option that names its server's executable (a `RunPlan` field: `vllm_bin`), and where the
    #: executable is looked for, said when it is not found (" (--vllm-bin PATH or LLM_COMPARE_VLLM)")
    executable_option: ClassVar[str | None] = None
    executable_hint: ClassVar[str] = ""
    #: its server is this checkout's own code: a process launch puts the checkout first on PYTHONPATH
    runs_from_checkout: ClassVar[bool] = False
    #: without a GPU, its container image is built here from this checkout (docker/), not pulled
    cpu_image_built_here: ClassVar[bool] = False
    #: a launch that names no variant gets the one the device calls for (CUDA graphs on a GPU, eager on a CPU)
    variant_by_device: ClassVar[bool] = False
    #: on a CPU it runs eager whatever its variant asks (there are no CUDA graphs there)
    eager_on_cpu: ClassVar[bool] = False
    #: its command line takes vLLM's flags for the model's settings (`--max-model-len`, `--dtype`,
    #: `--quantization`, `--enable-prefix-caching`, `--enforce-eager`, ...), which the parity audit reads back
    vllm_style_flags: ClassVar[bool] = False
    #: how many HTTP front ends its server runs when not told, for the audit: one per data-parallel rank
    #: (vLLM), or one on a CPU and, on a GPU, one where its log's configuration line names none (ours: it
    #: logs the count only for several); None: not known
    api_servers_default: ClassVar[ApiServersDefault | None] = None
    #: the fraction of GPU memory it takes unless told, declared for a launch on a GPU (None: not declared)
    gpu_memory_default: ClassVar[float | None] = None
    #: its `setting_flags` for the front ends and batch limits mean what ours' and vLLM's do, so that
    #: `--match-serving` may give them alike (`compare.launch.serving_match`)
    serving_matchable: ClassVar[bool] = False

    #: the request asks the server to produce exactly `wanted_output_tokens` (ignore_eos / min_tokens)
    forces_output_length: bool = False
    #: usage on output events is cumulative ("continuous usage"), so per-event counts are exact
    cumulative_usage: bool = False

    @classmethod
    def launch_spec(
        cls,
        model: ModelSource,
        variant: Variant,
        port: int,
        *,
        workdir: Path,
        gpu: bool,
        executable: str | None = None,
    ) -> LaunchSpec:
        """How to start this backend's server."""
        from adapters.launch_spec import LaunchSpecError

        raise LaunchSpecError(f"{cls.name}: llm-compare does not start this server; give its --endpoint")

    @classmethod
    def serving_defaults(cls, gpu: bool) -> dict[str, int]:
        """The matched serving settings (`api_servers`, `max_num_seqs`, `max_batched_tokens`) its server
        runs with unasked on this machine, where they are fixed ({}: none is)."""
        return {}

    @staticmethod
    def read_props(props: dict[str, Any]) -> dict[str, str]:
        """The audited settings in an answer of its `props_path`, as common setting names and strings."""
        return {}

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
        return {
            "adapter": self.name,
            "forces_output_length": self.forces_output_length,
            "cumulative_usage": self.cumulative_usage,
        }
