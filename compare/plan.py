"""What a run will do: backends x variants x workloads x load points, from the command line or a YAML file.

    backends:  vllm,tgi:eager,reference:eager   (adapter name, optionally `:variant`)
    endpoints: vllm=http://127.0.0.1:8000      (a running server; key `name` or `name:variant`)
    launch:    process | docker                (how backends without an endpoint are started)
    load:      --concurrency 1,8,32 and/or --rate 2,8 --arrival poisson
    slo:       ttft=200ms,tpot=50ms,e2e=2s      (a bare number is milliseconds)

A YAML run file (`-c run.yaml`) holds the same keys as the options, plus lists where a matrix needs them:

    model: smollm2-135m
    backends: [reference:eager, {name: vllm, endpoint: "http://127.0.0.1:8000"}]
    load: {concurrency: [1, 8], rate: [4], arrival: poisson}
    workloads: [{dataset: random, input_len: 128, output_len: 32}, {dataset: fixed}]
    slo: {ttft: 200ms, tpot: 50ms}

Options given on the command line win over the file; the file wins over the built-in defaults.
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
from workloads.schedule import ClosedLoop, OpenLoop, Schedule

#: backends the tool can start itself: those whose adapter knows how (`launch_spec`)
LAUNCHABLE = {name for name, cls in ADAPTERS.items() if cls.server_family}
LAUNCHERS = ("process", "docker")
SLO_KEYS = ("ttft", "tpot", "e2e")

DEFAULTS: dict[str, Any] = {
    "backends": None,  # none given: compare.default_candidates picks two for this machine
    "model": "smollm2-135m",
    "tokenizer": None,
    "served_model": None,
    "dataset": "random",
    "dataset_path": None,
    "input_len": "128",
    "output_len": "16",
    "concurrency": [1, 4],
    "rate": [],
    "arrival": "poisson",
    "burstiness": 1.0,
    "max_concurrency": None,
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

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.dataset == "random":
            return f"random-{self.input_len}x{self.output_len}"
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
        for key in ("concurrency", "rate", "arrival", "burstiness", "max_concurrency"):
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

    workloads = _workloads(merged, file_data, options)
    arrival = str(merged["arrival"])
    given = {k for k, v in options.items() if v is not None and v != []} | set(file_data)
    rates = parse_numbers(merged["rate"], float)
    # a rate alone asks for an open loop only; the default concurrencies apply when no load is given
    concurrencies = parse_numbers(merged["concurrency"], int) if "concurrency" in given or not rates else []
    schedules: list[Schedule] = []
    try:
        schedules += [ClosedLoop(c) for c in concurrencies]
        max_conc = merged.get("max_concurrency")
        schedules += [
            OpenLoop(
                r,
                arrival,
                float(merged["burstiness"]),
                int(merged["seed"]),  # type: ignore[arg-type]
                int(max_conc) if max_conc else None,
            )
            for r in rates
        ]
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    if not schedules:
        raise PlanError("no load points: give --concurrency and/or --rate")

    num_requests = merged.get("num_requests")
    duration = merged.get("duration")
    duration = parse_duration(duration) if duration not in (None, 0, "0", "none") else None
    num_requests = int(num_requests) if num_requests not in (None, 0) else None
    if num_requests is None and duration is None:
        raise PlanError("give --num-requests or --duration (or both) to bound each load point")
    repeats = int(merged["repeats"])
    if repeats < 1:
        raise PlanError(f"repeats must be >= 1, got {repeats}")
    launch = str(merged.get("launch") or "process")
    if launch not in LAUNCHERS:
        raise PlanError(f"unknown --launch {launch!r}; known: {', '.join(LAUNCHERS)}")
    images = parse_images(file_data.get("images")) | parse_images(options.get("images"))
    max_model_len = merged.get("max_model_len")
    ray_actors = None if merged.get("ray_actors") is None else int(merged["ray_actors"])
    if ray_actors is not None and ray_actors < 1:
        raise PlanError(f"ray_actors must be >= 1, got {ray_actors}")
    busy_poll = bool(merged.get("busy_poll"))
    if busy_poll and _ray_address(merged.get("ray")) is not None:
        raise PlanError("busy_poll is for one local load generator on a CPU of its own; it does not apply with ray")
    return RunPlan(
        backends=backends,
        workloads=workloads,
        load_points=schedules,
        model=str(merged["model"]),
        tokenizer=merged.get("tokenizer"),
        served_model=merged.get("served_model"),
        num_requests=num_requests,
        duration=duration,
        warmup=None if merged.get("warmup") is None else int(merged["warmup"]),
        slo=parse_slo(merged.get("slo")),
        seed=int(merged["seed"]),
        gpu_price=_opt_float(merged.get("gpu_price")),
        mem_bandwidth_gbs=_opt_float(merged.get("mem_bandwidth_gbs")),
        model_bytes=_opt_float(merged.get("model_bytes")),
        request_timeout=float(merged["request_timeout"]),
        startup_timeout=float(merged["startup_timeout"]),
        pin=str(merged.get("pin") or "auto"),
        repeats=repeats,
        launch=launch,
        vllm_bin=merged.get("vllm_bin"),
        images=images,
        dtype=str(merged.get("dtype") or "auto"),
        max_model_len=int(max_model_len) if max_model_len else None,
        busy_poll=busy_poll,
        ray=_ray_address(merged.get("ray")),
        ray_actors=ray_actors,
        ray_actor_cpus=float(merged["ray_actor_cpus"]),
        ray_cells=bool(merged.get("ray_cells")),
        ray_cell_resources=parse_resources(merged.get("ray_cell_resources")),
        candidates_reason=reason,
    )


def _ray_address(value: Any) -> str | None:
    if value in (None, False, ""):
        return None
    return "local" if value is True else str(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _workloads(
    merged: dict[str, Any], file_data: dict[str, Any], options: dict[str, Any]
) -> list[WorkloadSpec]:
    cli_workload = any(
        options.get(k) is not None for k in ("dataset", "input_len", "output_len", "dataset_path")
    )
    listed = file_data.get("workloads")
    if listed and not cli_workload:
        out = []
        for item in listed:
            if not isinstance(item, dict):
                raise PlanError(f"each workload in the run file is a mapping, got {item!r}")
            out.append(
                WorkloadSpec(
                    str(item.get("dataset", "random")),
                    str(item.get("input_len", DEFAULTS["input_len"])),
                    str(item.get("output_len", DEFAULTS["output_len"])),
                    item.get("path") or item.get("dataset_path"),
                    str(item.get("name", "")),
                )
            )
    else:
        out = [
            WorkloadSpec(
                str(merged["dataset"]),
                str(merged["input_len"]),
                str(merged["output_len"]),
                merged.get("dataset_path"),
            )
        ]
    for w in out:
        if w.dataset not in ("random", "fixed", "sharegpt", "jsonl"):
            raise PlanError(f"unknown dataset {w.dataset!r}; known: random, fixed, sharegpt, jsonl")
        if w.dataset in ("sharegpt", "jsonl") and not w.path:
            raise PlanError(f"dataset {w.dataset} needs --dataset-path")
    labels = [w.label for w in out]
    if len(set(labels)) != len(labels):
        raise PlanError(f"two workloads share a name: {labels}; give them `name:`")
    return out
