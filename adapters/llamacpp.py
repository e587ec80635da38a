"""llama.cpp's HTTP server (`llama-server`): its OpenAI-compatible routes, read as OpenAI's, plus what only it
says.

Stream shape (tools/server: server-task.cpp, server-context.cpp): one `data:` chunk per generated token
(its text may be empty: a token inside a multi-byte character, or held back while it may start a stop
string), a closing chunk with `finish_reason` and `usage` (completions: always; chat: a usage-only chunk
when `stream_options.include_usage`), then `data: [DONE]`. The chat stream opens with a role-only delta, and
a token that changes nothing in the parsed message sends no chunk at all.

What it adds: with `timings_per_token` in the request every chunk carries `timings` (`prompt_n`,
`prompt_ms`, `predicted_n`, `predicted_ms`, ...: the slot's own account, `predicted_n` the tokens generated
so far), which makes the per-event token counts exact, as vLLM's continuous usage does; the last one is
kept as the request's `server_timings`. `ignore_eos` forces the output length (llama.cpp has no
`min_tokens`). Its `/metrics` (with `--metrics`) are `llamacpp:*` counters and gauges; `/props` says the
model's file type (its quantisation), the slots and the context per slot; `/slots` the state of each slot.

It serves a GGUF file, not a checkpoint directory: the launch takes the GGUF in the model directory, or the
one the built-in model ships (`reference_engine.builtin_models.builtin_gguf`). Its slots (`--parallel`)
are its most sequences in flight; its context is divided among them, so the launch gives each slot its own
(`--kv-unified-per-slot`), whatever `--parallel` a later flag sets.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from adapters.base import Adapter, HttpRequest, SettingFlags, StreamEvent, Usage, as_int, loads_event
from adapters.launch_spec import MODEL_MOUNT, LaunchSpec, LaunchSpecError, ModelSource, Variant
from adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from adapters.request_spec import RequestSpec
from adapters.startup_log import LogClock, config_line, pattern

#: llama-server's Prometheus metrics (server-task.cpp, `to_metrics`) -> common names. Its prompt counter
#: leaves out the tokens taken from the prompt cache, which it counts apart.
LLAMACPP_METRICS = {
    "llamacpp:prompt_tokens_total": "prompt_tokens_total",
    "llamacpp:prompt_tokens_cached_total": "prefix_cache_hits_total",
    "llamacpp:prompt_seconds_total": "prompt_seconds_total",
    "llamacpp:tokens_predicted_total": "generation_tokens_total",
    "llamacpp:tokens_predicted_seconds_total": "generation_seconds_total",
    "llamacpp:n_decode_total": "decode_steps_total",
    "llamacpp:n_busy_slots_per_decode": "busy_slots_per_step",
    "llamacpp:requests_processing": "requests_running",
    "llamacpp:requests_deferred": "requests_waiting",
    "llamacpp:n_tokens_max": "longest_sequence_tokens",
}


@dataclass(frozen=True)
class RelativeClock(LogClock):
    """llama.cpp's `--log-timestamps` prefix, `M.SS.mmm.uuu` since the process started logging: read as an
    epoch time by adding it to `near` (the spawn time), which is all that durations between lines need."""

    def epoch(self, line: str, near: float | None = None) -> float | None:
        match = self.regex.search(line)
        if not match or near is None:
            return None
        minutes, seconds, millis, micros = (int(g) for g in match.groups())
        return near + minutes * 60 + seconds + millis / 1e3 + micros / 1e6


LLAMACPP_CLOCK = RelativeClock(re.compile(r"^(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) "), "")

#: its start-up lines at `--log-verbosity 4` (the launch asks for it; the default level prints only the
#: first and the last three): the model file read and mapped, the context made (KV cache, compute buffers),
#: a warm-up run through the model, the slots made, the HTTP server listening
LLAMACPP_STARTUP = [
    pattern(
        "model_load_started",
        r"load_model: loading model '",
        begins="weights",
        detail="GGUF read and mapped: metadata, vocabulary, tensors",
    ),
    pattern(
        "weights_mapped",
        r"load_tensors:\s+(?P<device>[A-Z]+\d*)(?:_\w+)? model buffer size =\s*"
        r"(?P<mib>[\d.]+) MiB",
        memory="weights",
        repeat="sum",
    ),
    pattern(
        "context_started",
        r"llama_context: constructing llama_context",
        ends="weights",
        begins="kv_cache",
        detail="context: KV cache and compute buffers",
    ),
    pattern("context_tokens", r"llama_context: n_ctx\s*=\s*(?P<tokens>\d+)$"),
    pattern("kv_cache_size", r"llama_kv_cache: size =\s*(?P<mib>[\d.]+) MiB", memory="kv_cache"),
    pattern(
        "warmup_started",
        r"warming up the model with an empty run",
        ends="kv_cache",
        begins="warmup",
        detail="an empty run through the model",
    ),
    pattern(
        "slots_made",
        r"load_model: initializing, n_slots = (?P<slots>\d+), n_ctx_slot = (?P<ctx>\d+)",
        ends="warmup",
    ),
    pattern("server_ready", r"llama_server: listening on (?P<url>\S+)|server is listening on", ready=True),
]

#: GGUF file types (`llama_model_ftype_name`) that hold unquantised weights -> their dtype
_FLOAT_FILE_TYPES = {"all f32": "float32", "f32": "float32", "f16": "float16", "bf16": "bfloat16"}
#: KV-cache types as ggml names them -> as the audit writes dtypes
_KV_TYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def file_type_settings(file_type: str) -> dict[str, str]:
    """dtype and quantisation from a GGUF file type (`Q4_1`, `Q4_K - Medium`, `F16`, `all F32`): a float
    type is the dtype with no quantisation; a quantised one is both (the weights' storage format: llama.cpp
    computes on them as stored)."""
    name = file_type.strip().lower()
    if name in _FLOAT_FILE_TYPES:
        return {"dtype": _FLOAT_FILE_TYPES[name], "quantization": "none"}
    name = re.sub(r"\s*-\s*", "_", name).replace(" ", "_")  # q4_k - medium -> q4_k_medium
    return {"dtype": name, "quantization": name}


def _file_type_line(line: str) -> dict[str, str]:
    match = re.search(r"print_info: file type\s*=\s*(.+?)\s*$", line)
    return file_type_settings(match.group(1)) if match else {}


def _kv_line(line: str) -> dict[str, str]:
    match = re.search(r"\bK \((\w+)\):", line)
    return {"kv_cache_dtype": _KV_TYPES.get(match.group(1), match.group(1))} if match else {}


def _listening_line(line: str) -> dict[str, str]:
    # one process, one HTTP server (a thread pool) in front of the slots
    return {"api_servers": "1"}


def _buffers_line(line: str) -> dict[str, str]:
    # weights on the CPU only: a CPU build, which has no CUDA graphs
    return {"enforce_eager": "True"} if re.search(r"load_tensors:\s+CPU\w* model buffer", line) else {}


#: where its log states the settings the parity audit compares (at `--log-verbosity 4`)
LLAMACPP_CONFIG = [
    config_line(r"print_info: file type\s*=", read=_file_type_line),
    config_line(
        r"load_model: initializing, n_slots = \d+",
        max_num_seqs=r"n_slots = (\d+)",
        max_model_len=r"n_ctx_slot = (\d+)",
    ),
    config_line(r"llama_context: n_batch\s*=", max_batched_tokens=r"n_batch\s*=\s*(\d+)"),
    config_line(r"llama_kv_cache: size =", read=_kv_line),
    config_line(r"llama_server: listening on", read=_listening_line),
    config_line(r"load_tensors:\s+\w+ model buffer size", read=_buffers_line),
]
#: llama-server's defaults (tools/server/README.md): the prompt cache is on (`cache_prompt`); a prompt is
#: processed in pieces of the batch size, interleaved with other slots' decoding (continuous batching, on
#: by default); no draft model; no tensor or pipeline parallelism in one process on a CPU
LLAMACPP_DEFAULTS: dict[str, Any] = {
    "prefix_caching": True,
    "chunked_prefill": True,
    "speculative": "none",
    "tensor_parallel": 1,
    "pipeline_parallel": 1,
}
LLAMACPP_SETTING_FLAGS: SettingFlags = {
    "max_num_seqs": ("--parallel", "-np"),
    "max_batched_tokens": ("--batch-size", "-b"),
}

#: slots when the variant does not say: as many sequences as our engine batches on a CPU by default
#: (reference_engine/config.py, DEFAULT_MAX_NUM_SEQS), so that neither queues a load point the other serves
DEFAULT_SLOTS = 64
#: context per slot when the model source does not say (as vLLM's launch on a CPU: adapters/vllm.py)
DEFAULT_SLOT_CONTEXT = 1024
#: our image (docker/llamacpp-cpu.Dockerfile): llama-server built from the same pinned source as
#: .ci/install_llamacpp.sh; its entrypoint is llama-server
LLAMACPP_IMAGE = "llm-compare/llamacpp-cpu:latest"


def find_gguf(model: str) -> Path:
    """The GGUF file a model source names: the file itself, the one GGUF file in a directory, or the file
    the built-in model ships, for its converted checkpoint directory. LaunchSpecError if there is none."""
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(f.name for f in found)
            raise LaunchSpecError(f"llamacpp: {model} holds several GGUF files ({names}): name one")
        from reference_engine.builtin_models import builtin_gguf, builtin_of_checkpoint

        name = builtin_of_checkpoint(path)
        if name is not None:
            return builtin_gguf(name)
    raise LaunchSpecError(
        f"llamacpp: llama-server serves GGUF files and {model} is not one, nor a directory holding one "
        "(convert a checkpoint with llama.cpp's convert_hf_to_gguf.py, or use the built-in model)"
    )


def cpu_threads() -> int:
    """The CPUs this process may run on: llama-server's compute threads."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def llamacpp_flags(model: ModelSource, variant: Variant, gpu: bool) -> tuple[list[str], list[str]]:
    """llama-server's flags for a variant, and notes on what the machine changed."""
    notes = []
    if variant.graphs or variant.graph_sizes:
        raise LaunchSpecError(
            "llamacpp: llama-server has no flag for CUDA graphs (its CUDA build uses them by itself, this "
            "CPU build has none); leave graphs out of the variant"
        )
    if variant.graphs is False:
        notes.append("llama.cpp's CPU build has no CUDA graphs: eager is what it runs anyway")
    if variant.block_size:
        raise LaunchSpecError("llamacpp: llama.cpp's KV cache is one cell per token, no block size to set")
    if gpu:
        notes.append("llama-server runs as built: this build is CPU only, whatever GPU the machine has")
    slots = variant.max_num_seqs or DEFAULT_SLOTS
    per_slot = model.max_model_len or DEFAULT_SLOT_CONTEXT
    flags = [
        "--parallel",
        str(slots),
        # each slot its own context, the pool slots x this (a later --parallel resizes the pool, not a slot)
        "--kv-unified-per-slot",
        str(per_slot),
        "--threads",
        str(cpu_threads()),
        "--metrics",
        "--alias",
        model.served_name,
        "--log-timestamps",
        "--log-prefix",
        "--log-verbosity",
        "4",
        "--log-colors",
        "off",
    ]
    return flags, notes


class _LlamaCppLaunch(Adapter):
    """How to start llama-server on a GGUF file, and what its launch and `/props` declare."""

    server_family = "llamacpp"
    declared_defaults = LLAMACPP_DEFAULTS
    setting_flags = LLAMACPP_SETTING_FLAGS
    config_lines: ClassVar[list] = LLAMACPP_CONFIG
    props_path: ClassVar[str | None] = "/props"
    executable_option = "llamacpp_bin"
    executable_hint = " (--llamacpp-bin PATH or LLM_COMPARE_LLAMACPP; .ci/install_llamacpp.sh DIR)"

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
        gguf = find_gguf(model.model)
        flags, notes = llamacpp_flags(model, variant, gpu)
        exe = executable or os.environ.get("LLM_COMPARE_LLAMACPP") or "llama-server"
        return LaunchSpec(
            cls.name,
            [exe, "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port), *flags],
            LLAMACPP_IMAGE,
            ["--model", f"{MODEL_MOUNT}/{gguf.name}", "--host", "0.0.0.0", "--port", "8000", *flags],
            port,
            health_path=cls.health_path,
            volumes={str(gguf.resolve().parent): {"bind": MODEL_MOUNT, "mode": "ro"}},
            notes=notes,
        )

    @staticmethod
    def read_props(props: dict[str, Any]) -> dict[str, str]:
        """The audited settings in a `/props` answer, as common setting names and strings."""
        out: dict[str, str] = {}
        if isinstance(props.get("model_ftype"), str):
            out.update(file_type_settings(props["model_ftype"]))
        if as_int(props.get("total_slots")) is not None:
            out["max_num_seqs"] = str(props["total_slots"])
        settings = props.get("default_generation_settings")
        if isinstance(settings, dict) and as_int(settings.get("n_ctx")) is not None:
            out["max_model_len"] = str(settings["n_ctx"])
        return out


class _LlamaCppMixin(OpenAICompletionsAdapter):
    """llama-server's routes, metric names and start-up log; its per-token timings for exact counts."""

    health_path = "/health"
    info_path = "/props"
    metric_names = LLAMACPP_METRICS
    startup_patterns = LLAMACPP_STARTUP
    config_lines = LLAMACPP_CONFIG
    log_clock = LLAMACPP_CLOCK

    def __init__(
        self,
        model: str | None = None,
        *,
        force_output_length: bool = True,
        timings_per_token: bool = True,
        **options: Any,
    ) -> None:
        """`timings_per_token`: ask for the slot's timings on every chunk (exact per-event token counts, the
        server's own prompt and decode times); `force_output_length`: `ignore_eos`."""
        super().__init__(model, force_output_length=force_output_length, **options)
        self.timings_per_token = timings_per_token
        self.cumulative_usage = timings_per_token

    def build_request(self, spec: RequestSpec, stream: bool = True) -> HttpRequest:
        request = super().build_request(spec, stream)
        body = dict(request.body)
        body.pop("min_tokens", None)  # not llama.cpp's: ignore_eos alone gives the exact length
        if self.timings_per_token and stream:
            body["timings_per_token"] = True
        return HttpRequest(request.path, body, request.headers)

    def stream_options(self) -> dict[str, bool]:
        # usage at the end only: the per-chunk counts come from the timings, not from continuous usage
        return {"include_usage": True} if self.include_usage else {}

    def parse_event(self, data: bytes | str) -> StreamEvent:
        event = super().parse_event(data)
        if event.is_done or event.error is not None:
            return event
        raw = loads_event(data).get("timings")
        timings = read_timings(raw)
        if timings is not None:
            event.server_timings = timings
            generated = as_int(raw.get("predicted_n")) if isinstance(raw, dict) else None
            if generated is not None and event.is_output:
                prompt = event.usage.prompt_tokens if event.usage is not None else None
                done = event.usage.completion_tokens if event.usage is not None else None
                event.usage = Usage(prompt, done if done is not None else generated)
                event.exact = True
        return event

    def estimate_tokens(self, text: str | None, role_only: bool, finish: str | None) -> int:
        if role_only or text is None:
            return 0
        return 0 if text == "" and finish is not None else 1

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "timings_per_token": self.timings_per_token}


def read_timings(value: Any) -> dict[str, float] | None:
    """A chunk's `timings` object as numbers (None where there is none)."""
    if not isinstance(value, dict):
        return None
    out = {k: float(v) for k, v in value.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return out or None


class LlamaCppCompletionsAdapter(_LlamaCppLaunch, _LlamaCppMixin, OpenAICompletionsAdapter):
    """llama-server's `/v1/completions` (options as `OpenAICompletionsAdapter`, and `timings_per_token`)."""

    name = "llamacpp"


class LlamaCppChatAdapter(_LlamaCppLaunch, _LlamaCppMixin, OpenAIChatAdapter):
    """llama-server's `/v1/chat/completions` (its chat template, from the GGUF)."""

    name = "llamacpp-chat"
