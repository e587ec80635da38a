"""What a run will do: backends x variants x workloads x load points, from the command line or a YAML file.

    backends:  vllm,tgi:eager,reference:eager   (adapter name, optionally `:variant`)
    endpoints: vllm=http://127.0.0.1:8000      (a running server; key `name` or `name:variant`)
    launch:    process | docker                (how backends without an endpoint are started)
    load:      --concurrency 1,8,32 and/or --rate 2,8 --arrival poisson and/or --trace FILE
    workload:  --dataset NAME (declared in workloads/catalog.py) and the options it reads: lengths,
               --dataset-path, --prefix-len/-groups, --turns, --think-time
    slo:       ttft=200ms,tpot=50ms,e2e=2s      (a bare number is milliseconds)

A YAML run file (`-c run.yaml`) holds the same keys as the options, plus lists where a matrix needs them:

    model: smollm2-135m
    backends: [reference:eager, {name: vllm, endpoint: "http://127.0.0.1:8000"}]
    load: {concurrency: [1, 8], rate: [4], arrival: poisson}
    workloads: [{dataset: random, input_len: 128, output_len: 32}, {dataset: fixed}]
    slo: {ttft: 200ms, tpot: 50ms}

Options given on the command line win over the file; the file wins over the built-in defaults. Each option
is declared once, in `compare.plan.run_options`. Everything that can be checked without a tokenizer or a
server is checked here, before any work: a wrong option fails the run at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from adapters import ADAPTERS
from adapters.launch_spec import LaunchSpecError, Variant
from compare.plan import default_candidates
from compare.plan.run_options import (
    DEFAULTS,
    OPTIONS,
    PLANNED,
    BackendSpec,
    PlanError,
    RunPlan,
    WorkloadSpec,
    checked_number,
    flag,
    parse_endpoints,
    parse_images,
    parse_numbers,
    split_list,
)
from workloads.catalog import DATASETS, DEFAULT_DATASET, Dataset, dataset_named
from workloads.schedule import ClosedLoop, OpenLoop, Schedule, TraceReplay, point_seed

#: backends the tool can start itself: those whose adapter knows how (`launch_spec`)
LAUNCHABLE = {name for name, cls in ADAPTERS.items() if cls.server_family}
ARRIVALS = ("poisson", "gamma", "constant")


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
            f"backend {key}: llm-compare cannot start it; give its endpoint "
            f"(--endpoint {name}=http://HOST:PORT). It launches {', '.join(sorted(LAUNCHABLE))}"
        )
    if endpoint is None:
        if not variant and ADAPTERS[name].variant_by_device:
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
    known = set(DEFAULTS) | {"workloads", "out"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PlanError(
            f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known | {'load'}))}"
        )
    return data


def run_file_out(run_file: str | Path | None) -> Path | None:
    """The run directory a run file names (`out:`), or None; `--out` on the command line wins over it."""
    out = load_run_file(run_file).get("out") if run_file else None
    if out is None:
        return None
    if not isinstance(out, str) or not out.strip():
        raise PlanError(f"{run_file}: out is a directory path, got {out!r}")
    return Path(out).expanduser()


def build_plan(options: dict[str, Any], run_file: str | Path | None = None) -> RunPlan:
    """Merge command-line `options` (None: not given) over the run file over the defaults."""
    merged = dict(DEFAULTS)
    file_data = load_run_file(run_file) if run_file else {}
    merged.update(file_data)
    merged.update({k: v for k, v in options.items() if v is not None and v != []})
    # NAME=VALUE options add to the run file's rather than replace them
    merged["images"] = parse_images(file_data.get("images")) | parse_images(options.get("images"))
    # the checks that need no heavy import first: a wrong option fails at once
    workloads = _workloads(merged, file_data, options)
    values = {o.name: o.read(merged[o.name], o) for o in PLANNED}
    sweep = _sweep(merged, options, file_data, values)
    schedules = sweep[0] if sweep else _load_points(merged, options, file_data, values["seed"])
    _check_sessions(workloads, schedules, values["ray"] is not None)
    if sweep and any(w.sessions for w in workloads):
        raise PlanError(
            "--sweep and --capacity send open-loop points; the multi-turn workloads run in a "
            "closed loop (--concurrency counts sessions): run them apart"
        )
    backends, reason = _backends(merged, file_data, options)
    if values["num_requests"] is None and values["duration"] is None:
        raise PlanError("give --num-requests or --duration (or both) to bound each load point")
    _check_ray_options(merged, values["ray"])
    if values["busy_poll"] and values["ray"] is not None:
        raise PlanError(
            "busy_poll is for one local load generator on a CPU of its own; it does not apply with ray"
        )
    if any(b.launched for b in backends) or values["tokenizer"] is None:  # the model is read here
        _check_local_path(values["model"], "model")
    _check_local_path(values["tokenizer"], "tokenizer")
    values["blocks"] = _blocks(values, backends)
    sweep_open = sweep[1] if sweep else None
    return RunPlan(backends, workloads, schedules, **values, sweep_open=sweep_open, candidates_reason=reason)


def _blocks(values: dict[str, Any], backends: list[BackendSpec]) -> int:
    """Blocks per point: 2 by default where two or more running endpoints take turns (launched backends are
    alternated by --repeats instead, each launch measuring its points in one go)."""
    asked, endpoints = values["blocks"], [b for b in backends if not b.launched]
    alone = values["sweep"] or values["ray_cells"]
    if asked is None:
        return 2 if len(endpoints) == len(backends) >= 2 and not alone else 1
    if asked > 1 and len(endpoints) < len(backends):
        raise PlanError(
            "--blocks alternates running endpoints within a point; launched backends alternate by --repeats"
        )
    if asked > 1 and alone:
        raise PlanError(
            "--blocks does not apply with --sweep or --ray-cells (each point is chosen or run on its own)"
        )
    return asked


def _check_sessions(workloads: list[WorkloadSpec], schedules: list[Schedule], ray: bool) -> None:
    """Sessions are sent in a closed loop only: the concurrency counts sessions, each turn waits for the
    previous answer, so a rate or a trace has nothing to say when a turn goes out. The Ray load splits
    single requests over its actors, not sessions."""
    sessions = [w.label for w in workloads if w.sessions]
    if sessions and ray:
        raise PlanError(f"the multi-turn workloads ({', '.join(sessions)}) run without --ray")
    timed = [s.label for s in schedules if not isinstance(s, ClosedLoop)]
    if sessions and timed:
        raise PlanError(
            f"the multi-turn workloads ({', '.join(sessions)}) run in a closed loop (--concurrency counts "
            f"sessions); drop the open-loop or trace points ({', '.join(timed)}) or run them apart"
        )


def _backends(
    merged: dict[str, Any], file_data: dict[str, Any], options: dict[str, Any]
) -> tuple[list[BackendSpec], str]:
    """The backends asked for (or, none given, chosen for this machine), and why they were chosen."""
    endpoints = parse_endpoints(file_data.get("endpoints")) | parse_endpoints(options.get("endpoints"))
    server_args = merged.get("server_args") or []
    server_args = server_args.split() if isinstance(server_args, str) else [str(a) for a in server_args]
    raw_backends, reason = merged["backends"], ""
    if raw_backends is None:
        launch = str(merged.get("launch") or "process")
        chosen = default_candidates.with_llamacpp(
            merged.get("llamacpp_bin"), launch, merged.get("model")
        ) or default_candidates.choose(
            merged.get("vllm_bin"),
            launch,
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
    return backends, reason


def _arrival_options(merged: dict[str, Any]) -> tuple[str, float, int | None]:
    """How open-loop requests arrive: the process, its burstiness, and the cap on requests in flight."""
    arrival = str(merged["arrival"])
    if arrival not in ARRIVALS:
        raise PlanError(f"unknown --arrival {arrival!r}; known: {', '.join(ARRIVALS)}")
    burstiness = checked_number(merged["burstiness"], "burstiness", above=0)
    max_conc = merged.get("max_concurrency")
    max_conc = None if max_conc is None else checked_number(max_conc, "max_concurrency", int, minimum=1)
    return arrival, burstiness, max_conc


def _load_points(
    merged: dict[str, Any], options: dict[str, Any], file_data: dict[str, Any], seed: int
) -> list[Schedule]:
    """Closed-loop concurrencies, then open-loop rates; a rate alone asks for an open loop only."""
    arrival, burstiness, max_conc = _arrival_options(merged)
    given = {k for k, v in options.items() if v is not None and v != []} | set(file_data)
    rates = parse_numbers(merged["rate"], float)
    trace = _trace(merged, max_conc)
    open_given = rates or trace is not None
    concurrencies = (
        parse_numbers(merged["concurrency"], int) if "concurrency" in given or not open_given else []
    )
    try:
        schedules: list[Schedule] = [ClosedLoop(c) for c in concurrencies]
        # each rate its own draw of arrivals, seeded from --seed and its place among the rates
        schedules += [
            OpenLoop(r, arrival, burstiness, point_seed(seed, i), max_conc)  # type: ignore[arg-type]
            for i, r in enumerate(rates)
        ]
    except ValueError as exc:
        raise PlanError(str(exc)) from exc
    schedules += [trace] if trace is not None else []
    if not schedules:
        raise PlanError("no load points: give --concurrency, --rate and/or --trace")
    return schedules


SWEEP_ONLY = ("sweep_points", "sweep_spacing", "sweep_concurrency")
CAPACITY_ONLY = ("capacity_percentile", "capacity_precision")


def _sweep(
    merged: dict[str, Any], options: dict[str, Any], file_data: dict[str, Any], values: dict[str, Any]
) -> tuple[list[Schedule], OpenLoop] | None:
    """With --sweep (or --capacity, which searches from the sweep's points): the two points every sweep
    starts with, concurrency 1 and the saturating closed loop, and the open loop whose rate it will set.
    None without a sweep, after checking that no sweep or capacity option is given alone."""
    given = {k for k, v in options.items() if v is not None and v != []} | set(file_data)
    if values["capacity"] and not values["slo"]:
        raise PlanError("--capacity searches the highest rate meeting the SLO: give --slo too")
    for key in CAPACITY_ONLY:
        if key in given and not values["capacity"]:
            raise PlanError(f"{flag(key)} needs --capacity")
    values["sweep"] = values["sweep"] or values["capacity"]
    if not values["sweep"]:
        for key in SWEEP_ONLY:
            if key in given:
                raise PlanError(f"{flag(key)} needs --sweep")
        return None
    fixed = [key for key in ("concurrency", "rate", "trace") if key in given]
    if fixed:
        raise PlanError(f"--sweep chooses the load points itself; drop {', '.join(flag(k) for k in fixed)}")
    if values["ray"] is not None:
        raise PlanError("--sweep decides each point from those before it, here; it does not apply with ray")
    if values["repeats"] != 1:
        raise PlanError("--sweep chooses each launch's points from its own measurements; give --repeats 1")
    arrival, burstiness, max_conc = _arrival_options(merged)
    anchors: list[Schedule] = [ClosedLoop(1), ClosedLoop(values["sweep_concurrency"])]
    return anchors, OpenLoop(1.0, arrival, burstiness, values["seed"], max_conc)  # type: ignore[arg-type]


def _trace(merged: dict[str, Any], max_concurrency: int | None) -> TraceReplay | None:
    """The trace file read whole now, so that a missing file or a bad line fails before any work."""
    scale = checked_number(merged["trace_scale"], "trace_scale", above=0)
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


def _check_ray_options(merged: dict[str, Any], ray: str | None) -> None:
    """Options that only mean something on Ray must not be silently dropped without it."""
    if ray is not None:
        return
    for key in ("ray_actors", "ray_cells", "ray_cell_resources"):
        if merged.get(key) not in (None, False, DEFAULTS[key]):
            raise PlanError(f"{flag(key)} needs --ray (alone: a local instance; or --ray ADDRESS)")


def _check_local_path(value: str | None, key: str) -> None:
    """A model or tokenizer written as a path (not a hub id or built-in name) must exist before any work."""
    if value and str(value).startswith(("/", "./", "../", "~")) and not Path(value).expanduser().exists():
        raise PlanError(f"{flag(key)} {value}: no such file or directory")


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


WORKLOAD_OPTIONS = (
    "dataset",
    "input_len",
    "output_len",
    "dataset_path",
    "prefix_len",
    "prefix_groups",
    "turns",
    "think_time",
)
WORKLOAD_KEYS = {"path", "name", *WORKLOAD_OPTIONS}
#: the shape options a dataset may read (its declaration's `options`; any other given is refused)
SHAPE_OPTIONS = ("input_len", "output_len", "prefix_len", "prefix_groups", "turns", "think_time")
#: those a workload keeps only where its dataset reads them (the lengths it always keeps)
KEPT_WHERE_READ = ("prefix_len", "prefix_groups", "turns", "think_time")


def _workload_of(values: dict[str, Any], name: str = "") -> WorkloadSpec:
    """One workload from the merged options or a run file's `workloads` entry (defaults for what is
    absent)."""
    try:
        dataset = dataset_named(str(values.get("dataset", DEFAULT_DATASET)))
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    return WorkloadSpec(
        dataset.name,
        str(values.get("input_len", DEFAULTS["input_len"])),
        str(values.get("output_len", DEFAULTS["output_len"])),
        values.get("path") or values.get("dataset_path"),
        name,
        **{k: _shape_value(dataset, k, values) if k in dataset.options else None for k in KEPT_WHERE_READ},
    )


def _shape_value(dataset: Dataset, key: str, values: dict[str, Any]) -> Any:
    """The value of option `key` for a dataset that reads it: the one given, else the dataset's default,
    else the option's; a whole-number option checked (>= 1, or None where neither has a default)."""
    value = values.get(key)
    if value is None:
        value = dataset.options[key].default
    if value is None:
        value = DEFAULTS[key]
    if OPTIONS[key].type is int:
        return None if value is None else checked_number(value, key, int, minimum=1)
    return str(value)


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
    """Everything about a workload that can be known without a tokenizer: its file, the options its dataset
    reads and their values (the dataset's declaration checks them)."""
    dataset = dataset_named(w.dataset)
    files = [d.name for d in DATASETS.values() if d.needs_path]
    if dataset.needs_path:
        if not w.path:
            raise PlanError(f"dataset {w.dataset} needs --dataset-path")
        if not Path(w.path).expanduser().is_file():
            raise PlanError(f"--dataset-path {w.path}: no such file")
    elif w.path:
        raise PlanError(
            f"--dataset-path is for the file datasets ({', '.join(files)}); "
            f"dataset {w.dataset} makes its own prompts (give --dataset {' or '.join(files)})"
        )
    used = dataset.options
    for key in sorted(cli_given & set(SHAPE_OPTIONS) - set(used)):
        reads = ", ".join(flag(k) for k in SHAPE_OPTIONS if k in used) or "none of the length options"
        raise PlanError(f"{flag(key)} does not apply to dataset {w.dataset} (it reads {reads})")
    for key in sorted(used):
        try:
            dataset.check(key, getattr(w, key))
        except ValueError as exc:
            raise PlanError(f"{flag(key)}: {exc}") from None
