"""What a run will do: backends x variants x workloads x load points, from the command line or a YAML file.

    backends:  vllm,tgi:eager,reference:eager   (adapter name, optionally `:variant`)
    endpoints: vllm=http://127.0.0.1:8000      (a running server; key `name` or `name:variant`)
    launch:    process | docker                (how backends without an endpoint are started)
    load:      --concurrency 1,8,32 and/or --rate 2,8 --arrival poisson and/or --trace FILE
    workload:  --dataset random|fixed|sharegpt|jsonl|prefix, lengths, --dataset-path, --prefix-len/-groups
    slo:       ttft=200ms,tpot=50ms,e2e=2s      (a bare number is milliseconds)

A YAML run file (`-c run.yaml`) holds the same keys as the options, plus lists where a matrix needs them:

    model: smollm2-135m
    backends: [reference:eager, {name: vllm, endpoint: "http://127.0.0.1:8000"}]
    load: {concurrency: [1, 8], rate: [4], arrival: poisson}
    workloads: [{dataset: random, input_len: 128, output_len: 32}, {dataset: fixed}]
    slo: {ttft: 200ms, tpot: 50ms}

Options given on the command line win over the file; the file wins over the built-in defaults. Everything
that can be checked without a tokenizer or a server is checked here, before any work: a wrong option fails the
run at once.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from adapters import ADAPTERS
from adapters.launch_spec import LaunchSpecError, Variant
from compare import default_candidates
from workloads.datasets import LengthDist
from workloads.schedule import ClosedLoop, OpenLoop, Schedule, TraceReplay

#: backends the tool can start itself: those whose adapter knows how (`launch_spec`)
LAUNCHABLE = {name for name, cls in ADAPTERS.items() if cls.server_family}
LAUNCHERS = ("process", "docker")
SLO_KEYS = ("ttft", "tpot", "e2e")
ARRIVALS = ("poisson", "gamma", "constant")
PIN_MODES = ("auto", "off")
#: run-file keys whose command-line option has another name
OPTION_NAMES = {"mem_bandwidth_gbs": "mem_bandwidth", "endpoints": "endpoint", "images": "image"}

DEFAULTS: dict[str, Any] = {
    "backends": None,  # none given: compare.default_candidates picks two for this machine
    "model": "smollm2-135m",
    "tokenizer": None,
    "served_model": None,
    "dataset": "random",
    "dataset_path": None,
    "input_len": "128",
    "output_len": "16",
    "prefix_len": 256,  # dataset prefix: tokens every request of a group shares
    "prefix_groups": 4,  # dataset prefix: groups of requests, each with a prefix of its own
    "concurrency": [1, 4],
    "rate": [],
    "arrival": "poisson",
    "burstiness": 1.0,
    "max_concurrency": None,
    "trace": None,  # a file of send times, replayed as one more load point
    "trace_scale": 1.0,
    "num_requests": 16,
    "duration": 30.0,
    "warmup": None,
    "slo": {},
    "seed": 0,
    "gpu_price": None,
    "mem_bandwidth_gbs": None,
    "model_bytes": None,
    "request_timeout": 600.0,
    "startup_timeout": 600.0,
    "server_args": [],
    "pin": "auto",
    "repeats": 1,
    "launch": "process",
    "vllm_bin": None,
    "images": {},
    "dtype": "auto",
    "max_model_len": None,
    "busy_poll": False,
    # Ray (compare.ray_run): cluster address or `local`, load generators per point, or cells as tasks
    "ray": None,
    "ray_actors": None,
    "ray_actor_cpus": 1.0,
    "ray_cells": False,
    "ray_cell_resources": None,
}


class PlanError(ValueError):
    """The run as asked for cannot be planned (bad option, unknown backend, missing endpoint)."""


@dataclass(frozen=True)
class BackendSpec:
    """One backend in one variant, and where it comes from (an endpoint, or launched by us)."""

    name: str  # adapter name
    variant: str = ""
    endpoint: str | None = None
    server_args: tuple[str, ...] = ()
    options: tuple[tuple[str, Any], ...] = ()  # variant keys a run file gave (graph_sizes, block_size, ...)

    @property
    def key(self) -> str:
        return f"{self.name}:{self.variant}" if self.variant else self.name

    @property
    def launched(self) -> bool:
        return self.endpoint is None


@dataclass(frozen=True)
class WorkloadSpec:
    dataset: str = "random"
    input_len: str = "128"
    output_len: str = "16"
    path: str | None = None
    name: str = ""
    prefix_len: int | None = None  # dataset prefix only
    prefix_groups: int | None = None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.dataset == "random":
            return f"random-{self.input_len}x{self.output_len}"
        if self.dataset == "prefix":
            return f"prefix-{self.prefix_groups}x{self.prefix_len}+{self.input_len}x{self.output_len}"
        if self.dataset in ("sharegpt", "jsonl") and self.path:
            return f"{self.dataset}-{Path(self.path).stem}"
        return self.dataset


@dataclass
class RunPlan:
    backends: list[BackendSpec]
    workloads: list[WorkloadSpec]
    load_points: list[Schedule]
    model: str = "smollm2-135m"
    tokenizer: str | None = None
    served_model: str | None = None
    num_requests: int | None = 16
    duration: float | None = 30.0
    warmup: int | None = None  # None: one per concurrent stream (closed loop), 2 before an open loop
    slo: dict[str, float] = field(default_factory=dict)  # seconds
    seed: int = 0
    gpu_price: float | None = None  # per GPU-hour
    mem_bandwidth_gbs: float | None = None
    model_bytes: float | None = None
    request_timeout: float = 600.0
    startup_timeout: float = 600.0
    pin: str = "auto"
    repeats: int = 1  # launches of every backend, in alternating order (ABBA...), pooled per point
    launch: str = "process"  # how backends without an endpoint are started: process | docker
    vllm_bin: str | None = None
    images: dict[str, str] = field(default_factory=dict)  # server family or backend -> container image
    dtype: str = "auto"
    max_model_len: int | None = None
    busy_poll: bool = False  # the load generator's loop polls without sleeping (workloads.loadgen.keep_awake)
    ray: str | None = None  # None: no Ray; `local` or a cluster address
    ray_actors: int | None = None  # load generators per point (None: one per node)
    ray_actor_cpus: float = 1.0
    ray_cells: bool = False  # backend x variant x load point as Ray tasks
    ray_cell_resources: dict[str, float] = field(default_factory=dict)  # per cell; {} = the default
    candidates_reason: str = ""  # why these backends, when the tool chose them (no backend given)

    def warmup_count(self, schedule: Schedule) -> int:
        if self.warmup is not None:
            return self.warmup
        return schedule.concurrency if isinstance(schedule, ClosedLoop) else 2

    def describe(self) -> dict[str, Any]:
        """JSON-ready, for the manifest."""
        return {
            "backends": [asdict(b) | {"key": b.key, "launched": b.launched} for b in self.backends],
            "workloads": [asdict(w) | {"label": w.label} for w in self.workloads],
            "load_points": [s.describe() | {"label": s.label} for s in self.load_points],
            "model": self.model,
            "tokenizer": self.tokenizer,
            "served_model": self.served_model,
            "num_requests": self.num_requests,
            "duration_s": self.duration,
            "warmup": self.warmup,
            "slo_s": self.slo,
            "seed": self.seed,
            "gpu_price_per_hour": self.gpu_price,
            "mem_bandwidth_gbs": self.mem_bandwidth_gbs,
            "model_bytes": self.model_bytes,
            "request_timeout_s": self.request_timeout,
            "startup_timeout_s": self.startup_timeout,
            "pin": self.pin,
            "repeats": self.repeats,
            "launch": self.launch,
            "vllm_bin": self.vllm_bin,
            "images": self.images,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "busy_poll": self.busy_poll,
            "candidates_reason": self.candidates_reason or None,
        } | (
            {}
            if self.ray is None
            else {
                "ray": {
                    "address": self.ray,
                    "actors": self.ray_actors,
                    "actor_cpus": self.ray_actor_cpus,
                    "cells": self.ray_cells,
                    "cell_resources": self.ray_cell_resources,
                }
            }
        )


# -- small parsers ------------------------------------------------------------------------------------

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(us|µs|ms|s|m|min|h)?\s*$", re.IGNORECASE)
_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(value: str | float | int, default_unit: str = "s") -> float:
    """Seconds from `200ms`, `2s`, `1.5`, `5min` (a bare number is in `default_unit`)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) * _UNITS[default_unit]
    match = _DURATION.match(str(value))
    if not match:
        raise PlanError(f"cannot read duration {value!r}: use e.g. 200ms, 2s, 1.5s")
    number, unit = float(match.group(1)), (match.group(2) or default_unit).lower()
    return number * _UNITS[unit]


def parse_slo(value: str | dict[str, Any] | None) -> dict[str, float]:
    """`ttft=200ms,tpot=50ms,e2e=2s` (or a mapping) -> {metric: seconds}; a bare number is milliseconds."""
    if not value:
        return {}
    items: list[tuple[str, Any]]
    if isinstance(value, dict):
        items = list(value.items())
    else:
        items = []
        for part in str(value).split(","):
            if not part.strip():
                continue
            key, sep, amount = part.partition("=")
            if not sep:
                key, sep, amount = part.partition(":")
            if not sep:
                raise PlanError(f"cannot read SLO {part!r}: use metric=value, e.g. ttft=200ms")
            items.append((key, amount))
    out: dict[str, float] = {}
    for key, amount in items:
        key = str(key).strip().lower()
        if key not in SLO_KEYS:
            raise PlanError(f"unknown SLO metric {key!r}; known: {', '.join(SLO_KEYS)}")
        seconds = parse_duration(amount, default_unit="ms")
        if not seconds > 0:
            raise PlanError(f"SLO {key} must be > 0, got {amount!r}")
        out[key] = seconds
    return out


def split_list(value: str | list | tuple | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def parse_numbers(value: str | list | tuple | None, kind: type = float) -> list:
    out = []
    for item in split_list(value):
        try:
            number = kind(item)
        except ValueError:
            raise PlanError(f"expected a comma-separated list of numbers, got {item!r}") from None
        out.append(number)
    return out


def parse_resources(value: str | dict[str, Any] | None) -> dict[str, float]:
    """`GPU=1,CPU=4,accelerator_type:H100=0.01` (or a mapping) -> Ray resource amounts per cell."""
    if not value:
        return {}
    items = value.items() if isinstance(value, dict) else [p.rpartition("=")[::2] for p in split_list(value)]
    out = {}
    for name, amount in items:
        try:
            out[str(name).strip()] = float(amount)
        except ValueError:
            raise PlanError(f"cannot read resource {name}={amount!r}: use NAME=AMOUNT, e.g. GPU=1") from None
        if not str(name).strip() or out[str(name).strip()] < 0:
            raise PlanError(f"bad resource request {name}={amount!r}")
    return out


def _parse_pairs(values: list[str] | dict[str, str] | None, what: str, example: str) -> dict[str, str]:
    """`NAME=VALUE` items (or a mapping from a run file) -> {NAME: VALUE}, stripped."""
    if not values:
        return {}
    if isinstance(values, dict):
        return {str(k): str(v) for k, v in values.items()}
    out = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise PlanError(f"cannot read {what} {item!r}: use NAME={what.upper()}, e.g. {example}")
        out[name.strip()] = value.strip()
    return out


def parse_endpoints(values: list[str] | dict[str, str] | None) -> dict[str, str]:
    """`NAME=URL` items (NAME: `backend` or `backend:variant`) -> {NAME: URL}."""
    out = _parse_pairs(values, "url", "vllm=http://127.0.0.1:8000")
    for name, url in out.items():
        if not url.startswith(("http://", "https://")):
            raise PlanError(f"endpoint {name}={url!r}: the URL must start with http:// or https://")
    return {name: url.rstrip("/") for name, url in out.items()}


def parse_images(values: list[str] | dict[str, str] | None) -> dict[str, str]:
    """`NAME=IMAGE` items (NAME: a server family such as vllm, or a backend name) -> {NAME: IMAGE}."""
    return _parse_pairs(values, "image", "vllm=vllm/vllm-openai:v0.11.0")


def parse_backend(
    item: str | dict[str, Any], endpoints: dict[str, str], server_args: list[str]
) -> BackendSpec:
    options: dict[str, Any] = {}
    if isinstance(item, dict):
        extra = item.get("args") or item.get("server_args") or []
        name, variant = str(item.get("name", "")), str(item.get("variant") or "")
        endpoint = item.get("endpoint")
        extra = extra.split() if isinstance(extra, str) else [str(a) for a in extra]
        options = {k: item[k] for k in VARIANT_KEYS if item.get(k) is not None}
    else:
        name, _, variant = str(item).partition(":")
        endpoint, extra = None, []
    name, variant = name.strip(), variant.strip()
    if name not in ADAPTERS:
        raise PlanError(f"unknown backend {name!r}; known: {', '.join(sorted(ADAPTERS))}")
    key = f"{name}:{variant}" if variant else name
    endpoint = endpoint or endpoints.get(key) or endpoints.get(name)
    if endpoint is None and name not in LAUNCHABLE:
        raise PlanError(
            f"backend {key}: llm-compare cannot start it; give its endpoint (--endpoint {name}=http://HOST:PORT). "
            f"It launches {', '.join(sorted(LAUNCHABLE))}"
        )
    if endpoint is None:
        if not variant and ADAPTERS[name].server_family == "reference":
            variant = default_reference_variant()
        try:
            Variant.parse(variant, **options)
        except LaunchSpecError as exc:
            raise PlanError(f"backend {name}: {exc}") from None
    return BackendSpec(name, variant, endpoint, tuple(server_args + extra), tuple(sorted(options.items())))


VARIANT_KEYS = ("graphs", "graph_sizes", "block_size", "max_batch_size")


def default_reference_variant() -> str:
    """CUDA graphs where there is a GPU; on a CPU every variant runs eager, so the default says so."""
    try:
        import torch

        return "graphs" if torch.cuda.is_available() else "eager"
    except Exception:  # torch missing or broken: the server will say more
        return "eager"


def load_run_file(path: str | Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"run file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise PlanError(f"{path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PlanError(f"{path}: a run file is a YAML mapping of option names to values")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    load = data.pop("load", None)
    if isinstance(load, dict):
        for key in (
            "concurrency",
            "rate",
            "arrival",
            "burstiness",
            "max_concurrency",
            "trace",
            "trace_scale",
        ):
            if key in load:
                data[key] = load[key]
    known = set(DEFAULTS) | {"endpoints", "workloads", "out"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PlanError(
            f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known | {'load'}))}"
        )
    return data


def build_plan(options: dict[str, Any], run_file: str | Path | None = None) -> RunPlan:
    """Merge command-line `options` (None: not given) over the run file over the defaults."""
    merged = dict(DEFAULTS)
    file_data = load_run_file(run_file) if run_file else {}
    merged.update(file_data)
    merged.update({k: v for k, v in options.items() if v is not None and v != []})
    # the checks that need no heavy import first: a wrong option fails at once
    workloads = _workloads(merged, file_data, options)
    seed = _number(merged["seed"], "seed", int, minimum=0)
    schedules = _load_points(merged, options, file_data, seed)
    endpoints = parse_endpoints(file_data.get("endpoints")) | parse_endpoints(options.get("endpoints"))
    server_args = merged.get("server_args") or []
    server_args = server_args.split() if isinstance(server_args, str) else [str(a) for a in server_args]
    raw_backends, reason = merged["backends"], ""
    if raw_backends is None:
        chosen = default_candidates.choose(
            merged.get("vllm_bin"),
            str(merged.get("launch") or "process"),
            gpu=default_reference_variant() == "graphs",
        )
        raw_backends, reason = chosen.backends, chosen.reason
    if isinstance(raw_backends, str):
        raw_backends = split_list(raw_backends)
    backends = [parse_backend(b, endpoints, server_args) for b in raw_backends]
    if not backends:
        raise PlanError("no backends given")
    keys = [b.key for b in backends]
    if len(set(keys)) != len(keys):
        raise PlanError(f"a backend appears twice: {', '.join(keys)} (give variants different names)")
    unused = set(endpoints) - set(keys) - {b.name for b in backends}
    if unused:
        raise PlanError(f"--endpoint for {', '.join(sorted(unused))}, which is not in --backends")
    num_requests = merged.get("num_requests")
    duration = merged.get("duration")
    duration = parse_duration(duration) if duration not in (None, 0, "0", "none") else None
    if duration is not None and not duration > 0:
        raise PlanError(f"--duration must be > 0, got {merged.get('duration')!r}")
    num_requests = (
        _number(num_requests, "num_requests", int, minimum=1) if num_requests not in (None, 0) else None
    )
    if num_requests is None and duration is None:
        raise PlanError("give --num-requests or --duration (or both) to bound each load point")
    repeats = _number(merged["repeats"], "repeats", int)
    if repeats < 1:
        raise PlanError(f"repeats must be >= 1, got {repeats}")
    launch = str(merged.get("launch") or "process")
    if launch not in LAUNCHERS:
        raise PlanError(f"unknown --launch {launch!r}; known: {', '.join(LAUNCHERS)}")
    pin = str(merged.get("pin") or "auto")
    if pin not in PIN_MODES:
        raise PlanError(f"unknown --pin {pin!r}; known: {', '.join(PIN_MODES)}")
    images = parse_images(file_data.get("images")) | parse_images(options.get("images"))
    ray = _ray_address(merged.get("ray"))
    _check_ray_options(merged, ray)
    ray_actors = (
        None if merged.get("ray_actors") is None else _number(merged["ray_actors"], "ray_actors", int)
    )
    if ray_actors is not None and ray_actors < 1:
        raise PlanError(f"ray_actors must be >= 1, got {ray_actors}")
    busy_poll = bool(merged.get("busy_poll"))
    if busy_poll and ray is not None:
        raise PlanError(
            "busy_poll is for one local load generator on a CPU of its own; it does not apply with ray"
        )
    model = str(merged["model"])
    if any(b.launched for b in backends) or merged.get("tokenizer") is None:  # the model is read here
        _check_local_path(model, "model")
    _check_local_path(merged.get("tokenizer"), "tokenizer")
    return RunPlan(
        backends=backends,
        workloads=workloads,
        load_points=schedules,
        model=model,
        tokenizer=merged.get("tokenizer"),
        served_model=merged.get("served_model"),
        num_requests=num_requests,
        duration=duration,
        warmup=None if merged.get("warmup") is None else _number(merged["warmup"], "warmup", int, minimum=0),
        slo=parse_slo(merged.get("slo")),
        seed=seed,
        gpu_price=_positive(merged.get("gpu_price"), "gpu_price"),
        mem_bandwidth_gbs=_positive(merged.get("mem_bandwidth_gbs"), "mem_bandwidth_gbs"),
        model_bytes=_positive(merged.get("model_bytes"), "model_bytes"),
        request_timeout=_number(merged["request_timeout"], "request_timeout", above=0),
        startup_timeout=_number(merged["startup_timeout"], "startup_timeout", above=0),
        pin=pin,
        repeats=repeats,
        launch=launch,
        vllm_bin=merged.get("vllm_bin"),
        images=images,
        dtype=str(merged.get("dtype") or "auto"),
        max_model_len=_positive(merged.get("max_model_len"), "max_model_len", int),
        busy_poll=busy_poll,
        ray=ray,
        ray_actors=ray_actors,
        ray_actor_cpus=_number(merged["ray_actor_cpus"], "ray_actor_cpus", above=0),
        ray_cells=bool(merged.get("ray_cells")),
        ray_cell_resources=parse_resources(merged.get("ray_cell_resources")),
        candidates_reason=reason,
    )


def _load_points(
    merged: dict[str, Any], options: dict[str, Any], file_data: dict[str, Any], seed: int
) -> list[Schedule]:
    """Closed-loop concurrencies, then open-loop rates; a rate alone asks for an open loop only."""
    arrival = str(merged["arrival"])
    if arrival not in ARRIVALS:
        raise PlanError(f"unknown --arrival {arrival!r}; known: {', '.join(ARRIVALS)}")
    burstiness = _number(merged["burstiness"], "burstiness", above=0)
    max_conc = merged.get("max_concurrency")
    max_conc = None if max_conc is None else _number(max_conc, "max_concurrency", int, minimum=1)
    given = {k for k, v in options.items() if v is not None and v != []} | set(file_data)
    rates = parse_numbers(merged["rate"], float)
    trace = _trace(merged, max_conc)
    open_given = rates or trace is not None
    concurrencies = (
        parse_numbers(merged["concurrency"], int) if "concurrency" in given or not open_given else []
    )
    try:
        schedules: list[Schedule] = [ClosedLoop(c) for c in concurrencies]
        schedules += [OpenLoop(r, arrival, burstiness, seed, max_conc) for r in rates]  # type: ignore[arg-type]
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    schedules += [trace] if trace is not None else []
    if not schedules:
        raise PlanError("no load points: give --concurrency, --rate and/or --trace")
    return schedules


def _trace(merged: dict[str, Any], max_concurrency: int | None) -> TraceReplay | None:
    """The trace file read whole now, so that a missing file or a bad line fails before any work."""
    scale = _number(merged["trace_scale"], "trace_scale", above=0)
    path = merged.get("trace")
    if not path:
        if merged["trace_scale"] != DEFAULTS["trace_scale"]:
            raise PlanError("--trace-scale needs --trace")
        return None
    try:
        return TraceReplay.from_file(Path(path).expanduser(), scale, max_concurrency)
    except FileNotFoundError:
        raise PlanError(f"--trace {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise PlanError(f"--trace {path}: {exc}") from None


def _flag(key: str) -> str:
    return "--" + OPTION_NAMES.get(key, key).replace("_", "-")


def _number(
    value: Any, key: str, kind: type = float, minimum: float | None = None, above: float | None = None
):
    """`value` (an option or a run-file entry) as `kind`, in range, or a PlanError naming the option."""
    try:
        if isinstance(value, bool):
            raise ValueError
        number = kind(value)
        if kind is int and isinstance(value, float) and value != number:
            raise ValueError
    except (TypeError, ValueError):
        what = "a whole number" if kind is int else "a number"
        raise PlanError(f"{_flag(key)} must be {what}, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise PlanError(f"{_flag(key)} must be >= {minimum}, got {value!r}")
    if above is not None and not number > above:
        raise PlanError(f"{_flag(key)} must be > {above}, got {value!r}")
    return number


def _positive(value: Any, key: str, kind: type = float) -> Any:
    """An optional quantity: None when not given, else a number > 0."""
    return None if value is None else _number(value, key, kind, above=0)


def _check_ray_options(merged: dict[str, Any], ray: str | None) -> None:
    """Options that only mean something on Ray must not be silently dropped without it."""
    if ray is not None:
        return
    for key in ("ray_actors", "ray_cells", "ray_cell_resources"):
        if merged.get(key) not in (None, False, DEFAULTS[key]):
            raise PlanError(f"{_flag(key)} needs --ray (alone: a local instance; or --ray ADDRESS)")


def _check_local_path(value: str | None, key: str) -> None:
    """A model or tokenizer written as a path (not a hub id or built-in name) must exist before any work."""
    if value and str(value).startswith(("/", "./", "../", "~")) and not Path(value).expanduser().exists():
        raise PlanError(f"{_flag(key)} {value}: no such file or directory")


def _ray_address(value: Any) -> str | None:
    if value in (None, False, ""):
        return None
    return "local" if value is True else str(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _workloads(
    merged: dict[str, Any], file_data: dict[str, Any], options: dict[str, Any]
) -> list[WorkloadSpec]:
    cli_given = {k for k in WORKLOAD_OPTIONS if options.get(k) is not None}
    listed = file_data.get("workloads")
    if listed and not cli_given:
        if not isinstance(listed, list):
            raise PlanError(f"workloads in the run file is a list of mappings, got {listed!r}")
        out = [_listed_workload(item) for item in listed]
    else:
        out = [_workload_of(merged)]
    for w in out:
        _check_workload(w, cli_given)
    labels = [w.label for w in out]
    if len(set(labels)) != len(labels):
        raise PlanError(f"two workloads share a name: {labels}; give them `name:`")
    return out


WORKLOAD_OPTIONS = ("dataset", "input_len", "output_len", "dataset_path", "prefix_len", "prefix_groups")
WORKLOAD_KEYS = {"path", "name", *WORKLOAD_OPTIONS}
DATASET_NAMES = ("random", "fixed", "sharegpt", "jsonl", "prefix")
FILE_DATASETS = ("sharegpt", "jsonl")
#: the shape options each dataset reads (any other would be silently ignored)
SHAPE_OPTIONS = ("input_len", "output_len", "prefix_len", "prefix_groups")
OPTIONS_USED = {
    "random": {"input_len", "output_len"},
    "jsonl": {"output_len"},
    "prefix": set(SHAPE_OPTIONS),
}


def _workload_of(values: dict[str, Any], name: str = "") -> WorkloadSpec:
    """One workload from the merged options or a run file's `workloads` entry (defaults for what is absent)."""
    dataset = str(values.get("dataset", "random"))
    prefix = dataset == "prefix"
    return WorkloadSpec(
        dataset,
        str(values.get("input_len", DEFAULTS["input_len"])),
        str(values.get("output_len", DEFAULTS["output_len"])),
        values.get("path") or values.get("dataset_path"),
        name,
        _number(values.get("prefix_len", DEFAULTS["prefix_len"]), "prefix_len", int, minimum=1)
        if prefix
        else None,
        _number(values.get("prefix_groups", DEFAULTS["prefix_groups"]), "prefix_groups", int, minimum=1)
        if prefix
        else None,
    )


def _listed_workload(item: Any) -> WorkloadSpec:
    if not isinstance(item, dict):
        raise PlanError(f"each workload in the run file is a mapping, got {item!r}")
    unknown = sorted(set(map(str, item)) - WORKLOAD_KEYS)
    if unknown:
        raise PlanError(
            f"workload {item!r}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(WORKLOAD_KEYS))}"
        )
    return _workload_of(item, str(item.get("name", "")))


def _check_workload(w: WorkloadSpec, cli_given: set[str]) -> None:
    """Everything about a workload that can be known without a tokenizer: the dataset, its file, its lengths."""
    if w.dataset not in DATASET_NAMES:
        raise PlanError(f"unknown dataset {w.dataset!r}; known: {', '.join(DATASET_NAMES)}")
    if w.dataset in FILE_DATASETS:
        if not w.path:
            raise PlanError(f"dataset {w.dataset} needs --dataset-path")
        if not Path(w.path).expanduser().is_file():
            raise PlanError(f"--dataset-path {w.path}: no such file")
    elif w.path:
        raise PlanError(
            f"--dataset-path is for the file datasets ({', '.join(FILE_DATASETS)}); "
            f"dataset {w.dataset} makes its own prompts (give --dataset {' or '.join(FILE_DATASETS)})"
        )
    used = OPTIONS_USED.get(w.dataset, set())
    for key in sorted(cli_given & set(SHAPE_OPTIONS) - used):
        reads = ", ".join(_flag(k) for k in SHAPE_OPTIONS if k in used) or "none of the length options"
        raise PlanError(f"{_flag(key)} does not apply to dataset {w.dataset} (it reads {reads})")
    for key in sorted(used & {"input_len", "output_len"}):
        value = getattr(w, key)
        try:
            if w.dataset == "jsonl" and not str(value).strip().isdigit():
                raise ValueError(
                    f"the default output length of jsonl lines is a whole number N, got {value!r}"
                )
            LengthDist.parse(value)
        except ValueError as exc:
            raise PlanError(f"{_flag(key)}: {exc}") from None
