"""Every option of `compare run`, declared once, and the `RunPlan` they make.

`RUN_OPTIONS` holds each option's command-line flag, run-file key, built-in default, help, help panel, how
the plan reads it, and its key in the manifest. The typer command (`compare.cli`), the run file's known keys
and defaults (`compare.plan.build`) and `RunPlan.describe()` are all made from it. An option that the plan
keeps as it is (after `read`) has a `manifest` key and a typed field of `RunPlan`, below; the options that
`compare.plan.build.build_plan` combines (backends, workloads and load points) have neither: the plan holds
and describes what it made of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workloads.catalog import DATASETS, DEFAULT_DATASET, dataset_named
from workloads.schedule import ClosedLoop, OpenLoop, Schedule

WORKLOAD, LOAD, BACKENDS = "Workload", "Load", "Backends and servers"
SLO_COST, OUTPUT, SCALE_OUT = "SLO and cost", "Output and statistics", "Scale-out (Ray)"
LAUNCHERS = ("process", "docker")
SLO_KEYS = ("ttft", "tpot", "e2e")
PIN_MODES = ("auto", "off")
GPU_TELEMETRY_MODES = ("auto", "off")  # --gpu-telemetry (compare/measure/gpu_sampling.py)
SPACINGS = ("geometric", "linear")  # --sweep-spacing
CAPACITY_PERCENTILES = (50, 90, 95, 99)  # the percentiles summary.csv has, with intervals
LOCAL_RAY = "local"  # `--ray` alone: start a Ray instance on this host


class PlanError(ValueError):
    """The run as asked for cannot be planned (bad option, unknown backend, missing endpoint)."""


#: the plan's value of an option from the value given (command line, run file or default); PlanError if wrong
Read = Callable[[Any, "RunOption"], Any]


def _as_given(value: Any, _option: RunOption) -> Any:
    return value


@dataclass(frozen=True)
class RunOption:
    """One option of `compare run`. `default` applies when neither the command line nor the run file gives
    it; on the command line every plan option defaults to None, "not given", so that the run file can give
    it instead."""

    name: str  # the run file's key, `build_plan`'s key and the typer parameter's name
    type: type | Any  # as the command line gives it
    default: Any
    help: str
    panel: str  # the help panel of `compare run --help`
    metavar: str | None = None
    flags: tuple[str, ...] = ()  # the command-line names, when not --name (a bool: the flag alone, no --no-)
    read: Read = _as_given  # for a RunPlan field: its value from the one given
    manifest: str | None = None  # the manifest's config key of a RunPlan field (`ray.KEY`: under `ray`)
    plan: bool = True  # False: the command line's alone (no run-file key, not in the plan)
    minimum: int | None = None  # the command line rejects less (options that are not planned)

    @property
    def flag(self) -> str:
        return self.flags[0].split("/")[0] if self.flags else "--" + self.name.replace("_", "-")


# -- reading values ---------------------------------------------------------------------------------------


def whole(minimum: int | None = None) -> Read:
    return lambda value, option: checked_number(value, option.name, int, minimum=minimum)


def number(above: float) -> Read:
    return lambda value, option: checked_number(value, option.name, float, above=above)


def positive(kind: type) -> Read:
    """An optional quantity: None when not given, else a number > 0."""
    return lambda value, option: None if value is None else checked_number(value, option.name, kind, above=0)


def optional(read: Read) -> Read:
    return lambda value, option: None if value is None else read(value, option)


def choice(choices: tuple[str, ...]) -> Read:
    """One of `choices`. In a run file a bare `off` is YAML's false and `on` its true: they mean off and
    auto where those are the choices."""

    def read(value: Any, option: RunOption) -> str:
        if isinstance(value, bool) and {"auto", "off"} <= set(choices):
            value = "auto" if value else "off"
        chosen = str(value or option.default)
        if chosen not in choices:
            raise PlanError(f"unknown {option.flag} {chosen!r}; known: {', '.join(choices)}")
        return chosen

    return read


def _text(value: Any, option: RunOption) -> str:
    return str(value)


def _text_or_default(value: Any, option: RunOption) -> str:
    return str(value or option.default)


def _flag_value(value: Any, _option: RunOption) -> bool:
    return bool(value)


def _request_count(value: Any, option: RunOption) -> int | None:
    return checked_number(value, option.name, int, minimum=1) if value not in (None, 0) else None


def _duration(value: Any, option: RunOption) -> float | None:
    duration = parse_duration(value) if value not in (None, 0, "0", "none") else None
    if duration is not None and not duration > 0:
        raise PlanError(f"{option.flag} must be > 0, got {value!r}")
    return duration


def _slo(value: Any, _option: RunOption) -> dict[str, float]:
    return parse_slo(value)


def _repeats(value: Any, option: RunOption) -> int:
    repeats = checked_number(value, option.name, int)
    if repeats < 1:
        raise PlanError(f"repeats must be >= 1, got {repeats}")
    return repeats


def _images(value: Any, _option: RunOption) -> dict[str, str]:
    return parse_images(value)


def _ray_address(value: Any, _option: RunOption) -> str | None:
    if value in (None, False, ""):
        return None
    return LOCAL_RAY if value is True else str(value)


def _ray_actors(value: Any, option: RunOption) -> int | None:
    actors = None if value is None else checked_number(value, option.name, int)
    if actors is not None and actors < 1:
        raise PlanError(f"ray_actors must be >= 1, got {actors}")
    return actors


def _resources(value: Any, _option: RunOption) -> dict[str, float]:
    return parse_resources(value)


def _percentile(value: Any, option: RunOption) -> int:
    q = checked_number(value, option.name, int)
    if q not in CAPACITY_PERCENTILES:
        raise PlanError(f"{option.flag} must be one of {', '.join(map(str, CAPACITY_PERCENTILES))}, got {q}")
    return q


def _interval(value: Any, option: RunOption) -> float:
    seconds = checked_number(value, option.name, float, above=0)
    if not math.isfinite(seconds):
        raise PlanError(f"{option.flag} must be a finite number of seconds, got {value!r}")
    return seconds


def _fraction(value: Any, option: RunOption) -> float:
    x = checked_number(value, option.name, float, above=0)
    if not x < 1:
        raise PlanError(f"{option.flag} must be < 1 (a fraction of the bracket's upper end), got {value!r}")
    return x


def _dataset_help() -> str:
    """--dataset's help: every declared dataset (workloads/catalog.py), with what it is."""
    return f"{_either(f'{d.name} ({d.about})' for d in DATASETS.values())} [default: {DEFAULT_DATASET}]"


def _read_by(key: str, forms: str = "") -> str:
    """The help of a workload option: what it means to each dataset that reads it (as its declaration
    says), then the forms it takes."""
    meanings: dict[str, list[str]] = {}
    for d in DATASETS.values():
        if key in d.options:
            default = d.options[key].default
            means = d.options[key].means + (f" [default: {default}]" if default is not None else "")
            meanings.setdefault(means, []).append(d.name)
    text = "; ".join(f"{', '.join(names)}: {means}" for means, names in meanings.items())
    return f"{text}{' ' if forms.startswith('[') else '. '}{forms}" if forms else text


def _either(items: Any) -> str:
    """`a, b or c`."""
    items = list(items)
    return " or ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


# -- the options, in the order of `compare run --help` -------------------------------------------------------

RUN_OPTIONS: tuple[RunOption, ...] = (
    RunOption(
        "backends",
        str,
        None,
        help="adapter names separated by commas, each optionally :variant (e.g. vllm,reference:eager) "
        "[default: reference]",
        panel=BACKENDS,
        metavar="NAMES",
    ),
    RunOption(
        "endpoints",
        list[str],
        {},
        help="a running server (repeat); backends without one are launched (--launch)",
        panel=BACKENDS,
        metavar="NAME=URL",
        flags=("--endpoint",),
    ),
    RunOption(
        "launch",
        str,
        "process",
        help="how backends without an endpoint are started [default: process]",
        panel=BACKENDS,
        metavar="process|docker",
        read=choice(LAUNCHERS),
        manifest="launch",
    ),
    RunOption(
        "vllm_bin",
        str,
        None,
        help="the vllm executable for --launch process [default: $LLM_COMPARE_VLLM, else vllm]",
        panel=BACKENDS,
        metavar="PATH",
        manifest="vllm_bin",
    ),
    RunOption(
        "llamacpp_bin",
        str,
        None,
        help="the llama-server executable for --launch process [default: $LLM_COMPARE_LLAMACPP, else "
        "llama-server]",
        panel=BACKENDS,
        metavar="PATH",
        manifest="llamacpp_bin",
    ),
    RunOption(
        "match_serving",
        bool,
        True,
        help="give launched backends alike the serving settings both can set: HTTP front-end processes "
        "(the larger default), max concurrent sequences and batch token budget (the reference engine's "
        "defaults), unless a candidate sets one itself; the report lists what could not be matched "
        "[default: on]",
        panel=BACKENDS,
        metavar="",
        flags=("--match-serving/--as-given",),
        read=_flag_value,
        manifest="match_serving",
    ),
    RunOption(
        "images",
        list[str],
        {},
        help="the container image of a backend or server family, for --launch docker (repeat)",
        panel=BACKENDS,
        metavar="NAME=IMAGE",
        flags=("--image",),
        read=_images,
        manifest="images",
    ),
    RunOption(
        "dtype",
        str,
        "auto",
        help="weights dtype for launched servers [default: auto]",
        panel=BACKENDS,
        metavar="DTYPE",
        read=_text_or_default,
        manifest="dtype",
    ),
    RunOption(
        "max_model_len",
        int,
        None,
        help="context length for launched servers",
        panel=BACKENDS,
        metavar="N",
        read=positive(int),
        manifest="max_model_len",
    ),
    RunOption(
        "model",
        str,
        "smollm2-135m",
        help="checkpoint dir, hub id or built-in name [default: smollm2-135m]",
        panel=BACKENDS,
        metavar="MODEL",
        read=_text,
        manifest="model",
    ),
    RunOption(
        "tokenizer",
        str,
        None,
        help="tokenizer for token-exact prompts: a directory or hub id [default: the model's]",
        panel=WORKLOAD,
        metavar="TOKENIZER",
        manifest="tokenizer",
    ),
    RunOption(
        "served_model",
        str,
        None,
        help="model name sent in requests [default: --model]",
        panel=BACKENDS,
        metavar="NAME",
        manifest="served_model",
    ),
    RunOption(
        "server_args",
        str,
        [],
        help="extra arguments for launched servers, one string",
        panel=BACKENDS,
        metavar="ARGS",
    ),
    RunOption(
        "startup_timeout",
        float,
        600.0,
        help="seconds a launched server may take to be ready [default: 600]",
        panel=BACKENDS,
        metavar="S",
        read=number(above=0),
        manifest="startup_timeout_s",
    ),
    RunOption(
        "repeats",
        int,
        1,
        help="launch every backend this many times, in alternating order, and check that a winner wins in "
        "each [default: 1]",
        panel=BACKENDS,
        metavar="N",
        read=_repeats,
        manifest="repeats",
    ),
    RunOption(
        "dataset",
        str,
        DEFAULT_DATASET,
        help=_dataset_help(),
        panel=WORKLOAD,
        metavar="NAME",
    ),
    RunOption(
        "dataset_path",
        str,
        None,
        help=f"the file of --dataset {_either(d.name for d in DATASETS.values() if d.needs_path)}",
        panel=WORKLOAD,
        metavar="FILE",
    ),
    RunOption(
        "input_len",
        str,
        "128",
        help=_read_by(
            "input_len", "N, uniform:LO:HI, normal:MEAN:STD or lognormal:MEDIAN:SIGMA [default: 128]"
        ),
        panel=WORKLOAD,
        metavar="LEN",
    ),
    RunOption(
        "output_len",
        str,
        "16",
        help=_read_by("output_len", "The same forms as --input-len [default: 16]"),
        panel=WORKLOAD,
        metavar="LEN",
    ),
    RunOption(
        "prefix_len",
        int,
        256,
        help=_read_by("prefix_len", "[default: 256]"),
        panel=WORKLOAD,
        metavar="N",
    ),
    RunOption(
        "prefix_groups",
        int,
        4,
        help=_read_by("prefix_groups", "[default: 4]"),
        panel=WORKLOAD,
        metavar="N",
    ),
    RunOption(
        "turns",
        int,
        None,
        help=_read_by("turns", "Each turn carries the conversation so far; --concurrency counts sessions"),
        panel=WORKLOAD,
        metavar="N",
    ),
    RunOption(
        "think_time",
        str,
        "0",
        help=_read_by("think_time", "S, uniform:LOW:HIGH or exponential:MEAN [default: 0]"),
        panel=WORKLOAD,
        metavar="S",
    ),
    RunOption(
        "seed",
        int,
        0,
        help="dataset and arrival seed [default: 0]",
        panel=WORKLOAD,
        metavar="N",
        read=whole(minimum=0),
        manifest="seed",
    ),
    RunOption(
        "concurrency",
        str,
        [1, 4],
        help="closed-loop load points: requests kept in flight, e.g. 1,8,32 [default: 1,4, unless --rate or "
        "--trace is given]",
        panel=LOAD,
        metavar="N[,N...]",
    ),
    RunOption(
        "rate",
        str,
        [],
        help="open-loop load points in requests/s, e.g. 2,8; inf sends every request at once (a burst, "
        "capped by --max-concurrency)",
        panel=LOAD,
        metavar="R[,R...]",
    ),
    RunOption(
        "arrival",
        str,
        "poisson",
        help="open loop: gaps between sends [default: poisson]",
        panel=LOAD,
        metavar="poisson|gamma|constant",
    ),
    RunOption(
        "burstiness",
        float,
        1.0,
        help="gamma arrival shape, < 1 burstier [default: 1]",
        panel=LOAD,
        metavar="K",
    ),
    RunOption(
        "max_concurrency",
        int,
        None,
        help="open loop and trace: cap on requests in flight",
        panel=LOAD,
        metavar="N",
    ),
    RunOption(
        "trace",
        str,
        None,
        help="one more load point, replaying a trace: one send time per line, in seconds (or JSON lines "
        'with a "timestamp"), made relative to the first',
        panel=LOAD,
        metavar="FILE",
    ),
    RunOption(
        "trace_scale",
        float,
        1.0,
        help="multiply the trace's gaps by X (0.5: twice as fast) [default: 1]",
        panel=LOAD,
        metavar="X",
    ),
    RunOption(
        "sweep",
        bool,
        False,
        help="per backend, choose the load points: concurrency 1 and a saturating closed loop "
        "(--sweep-concurrency), then open-loop rates between their throughputs, stopping once the backend "
        "saturates; replaces --concurrency, --rate and --trace",
        panel=LOAD,
        metavar="",
        flags=("--sweep",),
        read=_flag_value,
        manifest="sweep",
    ),
    RunOption(
        "sweep_points",
        int,
        5,
        help="--sweep: open-loop rates between the synchronous and the saturating throughput [default: 5]",
        panel=LOAD,
        metavar="N",
        read=whole(minimum=1),
        manifest="sweep_points",
    ),
    RunOption(
        "sweep_spacing",
        str,
        "geometric",
        help="--sweep: spacing of those rates [default: geometric]",
        panel=LOAD,
        metavar="geometric|linear",
        read=choice(SPACINGS),
        manifest="sweep_spacing",
    ),
    RunOption(
        "sweep_concurrency",
        int,
        64,
        help="--sweep: concurrency of the saturating closed loop; give more than the backend can batch "
        "[default: 64]",
        panel=LOAD,
        metavar="N",
        read=whole(minimum=2),
        manifest="sweep_concurrency",
    ),
    RunOption(
        "num_requests",
        int,
        16,
        help="measured requests per load point; 0: bound by --duration only [default: 16]",
        panel=LOAD,
        metavar="N",
        read=_request_count,
        manifest="num_requests",
    ),
    RunOption(
        "duration",
        str,
        30.0,
        help="bound per load point, e.g. 60s; 0: none [default: 30s]",
        panel=LOAD,
        metavar="TIME",
        read=_duration,
        manifest="duration_s",
    ),
    # -- prompts and blocks (a prompt of its own for every request; running endpoints in alternating blocks)
    RunOption(
        "prompt_pool",
        int,
        None,
        help="send only N prompts per load point, cycled (ids suffixed ~k): a server with a prefix cache "
        "answers the repeats from it [default: a prompt of its own for every request]",
        panel=LOAD,
        metavar="N",
        read=optional(whole(minimum=1)),
        manifest="prompt_pool",
    ),
    RunOption(
        "blocks",
        int,
        None,
        help="measure each point in N alternating blocks (A B B A ...), each 1/N of its requests or "
        "duration, so that drift of the machine is not taken for a difference; running endpoints only "
        "[default: 2 for two or more running endpoints, else 1]",
        panel=LOAD,
        metavar="N",
        read=optional(whole(minimum=1)),
        manifest="blocks",
    ),
    RunOption(
        "warmup",
        int,
        None,
        help="warm-up requests per load point [default: one per stream]",
        panel=LOAD,
        metavar="N",
        read=optional(whole(minimum=0)),
        manifest="warmup",
    ),
    RunOption(
        "request_timeout",
        float,
        600.0,
        help="seconds one request may take [default: 600]",
        panel=LOAD,
        metavar="S",
        read=number(above=0),
        manifest="request_timeout_s",
    ),
    RunOption(
        "busy_poll",
        bool,
        False,
        help="keep the load generator's CPU polling instead of sleeping between events: no CPU wake-up can "
        "then merge two events into one read (exact at low concurrency on VMs); costs one CPU for the run",
        panel=LOAD,
        metavar="",
        flags=("--busy-poll",),
        read=_flag_value,
        manifest="busy_poll",
    ),
    RunOption(
        "pin",
        str,
        "auto",
        help="auto: client and launched servers on CPUs of their own when there are >= 4 [default: auto]",
        panel=LOAD,
        metavar="auto|off",
        read=choice(PIN_MODES),
        manifest="pin",
    ),
    RunOption(
        "slo",
        str,
        {},
        help="latency objectives for goodput, e.g. ttft=200ms,tpot=50ms,e2e=2s (a bare number is ms)",
        panel=SLO_COST,
        metavar="METRIC=TIME[,...]",
        read=_slo,
        manifest="slo_s",
    ),
    RunOption(
        "capacity",
        bool,
        False,
        help="per backend, search the highest request rate at which --slo holds (bisection over open-loop "
        "rates, after the --sweep it implies); selection then ranks by it",
        panel=SLO_COST,
        metavar="",
        flags=("--capacity",),
        read=_flag_value,
        manifest="capacity",
    ),
    RunOption(
        "capacity_percentile",
        int,
        99,
        help="--capacity: the percentile of each SLO metric that must be within it [default: 99]",
        panel=SLO_COST,
        metavar="50|90|95|99",
        read=_percentile,
        manifest="capacity_percentile",
    ),
    RunOption(
        "capacity_precision",
        float,
        0.1,
        help="--capacity: bisect until the bracket's width is at most this fraction of its upper end "
        "[default: 0.1]",
        panel=SLO_COST,
        metavar="X",
        read=_fraction,
        manifest="capacity_precision",
    ),
    RunOption(
        "gpu_price",
        float,
        None,
        help="price per GPU-hour, for the cost per 1M output tokens",
        panel=SLO_COST,
        metavar="PRICE",
        read=positive(float),
        manifest="gpu_price_per_hour",
    ),
    RunOption(
        "mem_bandwidth_gbs",
        float,
        None,
        help="memory bandwidth in GB/s, for the roofline",
        panel=SLO_COST,
        metavar="GB/S",
        flags=("--mem-bandwidth",),
        read=positive(float),
        manifest="mem_bandwidth_gbs",
    ),
    RunOption(
        "model_bytes",
        float,
        None,
        help="bytes of weights a decode step reads, for the roofline",
        panel=SLO_COST,
        metavar="BYTES",
        read=positive(float),
        manifest="model_bytes",
    ),
    RunOption(
        "config",
        Path,
        None,
        help="YAML run file: the same keys as the options, plus matrices of backends, variants, load points "
        "and workloads; options given here win over it",
        panel=OUTPUT,
        metavar="FILE",
        flags=("--config", "-c"),
        plan=False,
    ),
    RunOption(
        "out",
        Path,
        None,
        help="run directory, new or empty [default: runs/<timestamp>]",
        panel=OUTPUT,
        metavar="DIR",
        plan=False,
    ),
    RunOption(
        "n_boot",
        int,
        1000,
        help="bootstrap resamples for the intervals",
        panel=OUTPUT,
        metavar="N",
        plan=False,
        minimum=1,
    ),
    RunOption(
        "gpu_telemetry",
        str,
        "auto",
        help="auto: where NVML finds an NVIDIA GPU, sample the GPUs each backend uses during every load "
        "point (power, energy, memory, utilisation: summary.csv's gpu_* columns, the report's GPU energy and "
        "power); off: never [default: auto]",
        panel=OUTPUT,
        metavar="auto|off",
        read=choice(GPU_TELEMETRY_MODES),
        manifest="gpu_telemetry",
    ),
    RunOption(
        "gpu_telemetry_interval",
        float,
        0.1,
        help="seconds between GPU samples [default: 0.1]",
        panel=OUTPUT,
        metavar="S",
        read=_interval,
        manifest="gpu_telemetry_interval_s",
    ),
    RunOption(
        "ray",
        str,
        None,
        help="run on Ray: --ray alone starts a local instance; --ray ADDRESS joins a cluster (HOST:PORT, "
        "auto, ray://HOST:PORT)",
        panel=SCALE_OUT,
        metavar="[ADDRESS]",
        read=_ray_address,
        manifest="ray.address",
    ),
    RunOption(
        "ray_actors",
        int,
        None,
        help="with --ray: load generators per load point [default: one per node; local: 2]",
        panel=SCALE_OUT,
        metavar="N",
        read=_ray_actors,
        manifest="ray.actors",
    ),
    RunOption(
        "ray_actor_cpus",
        float,
        1.0,
        help="with --ray: CPUs each load generator reserves [default: 1]",
        panel=SCALE_OUT,
        metavar="CPUS",
        read=number(above=0),
        manifest="ray.actor_cpus",
    ),
    RunOption(
        "ray_cells",
        bool,
        False,
        help="with --ray: each backend x variant x load point is a Ray task that launches, warms up, loads "
        "and stops its server on the node it is given",
        panel=SCALE_OUT,
        metavar="",
        flags=("--ray-cells",),
        read=_flag_value,
        manifest="ray.cells",
    ),
    RunOption(
        "ray_cell_resources",
        str,
        None,
        help="with --ray-cells: resources per cell [default: GPU=1 on a cluster with GPUs, else CPU=1]",
        panel=SCALE_OUT,
        metavar="NAME=AMOUNT[,...]",
        read=_resources,
        manifest="ray.cell_resources",
    ),
)
OPTIONS = {o.name: o for o in RUN_OPTIONS}
#: the built-in defaults of the planned options (which are also the run file's keys)
DEFAULTS: dict[str, Any] = {o.name: o.default for o in RUN_OPTIONS if o.plan}


def flag(key: str) -> str:
    """The command-line flag of a run-file key, for messages."""
    return OPTIONS[key].flag if key in OPTIONS else "--" + key.replace("_", "-")


# -- the plan they make -----------------------------------------------------------------------------------

#: the options that are RunPlan fields, read by `compare.plan.build.build_plan` and described by
# `RunPlan.describe`
PLANNED = tuple(o for o in RUN_OPTIONS if o.manifest is not None)


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
    """One workload: its dataset (declared in workloads/catalog.py) and the values of the options it reads
    (the lengths always kept, the others None where the dataset does not read them)."""

    dataset: str = DEFAULT_DATASET
    input_len: str = "128"
    output_len: str = "16"
    path: str | None = None
    name: str = ""
    prefix_len: int | None = None
    prefix_groups: int | None = None
    turns: int | None = None  # None: every turn (sharegpt-turns), or not read
    think_time: str | None = None

    @property
    def sessions(self) -> bool:
        """Whether the workload is multi-turn sessions (workloads/sessions.py) rather than single requests."""
        return dataset_named(self.dataset).sessions

    @property
    def label(self) -> str:
        return self.name or dataset_named(self.dataset).label(self)


@dataclass
class RunPlan:
    """What a run will do (made by `compare.plan.build.build_plan`). Besides backends, workloads and load
    points, a field per option of `PLANNED`, as its `read` made it (its default and help are in
    `RUN_OPTIONS`)."""

    backends: list[BackendSpec]
    workloads: list[WorkloadSpec]
    load_points: list[Schedule]
    model: str
    tokenizer: str | None
    served_model: str | None
    num_requests: int | None
    duration: float | None
    warmup: int | None  # None: one per concurrent stream (closed loop), 2 before an open loop
    slo: dict[str, float]  # seconds
    seed: int
    gpu_price: float | None  # per GPU-hour
    mem_bandwidth_gbs: float | None
    model_bytes: float | None
    request_timeout: float
    startup_timeout: float
    pin: str
    repeats: int  # launches of every backend, in alternating order (ABBA...), pooled per point
    launch: str  # how backends without an endpoint are started: process | docker
    vllm_bin: str | None
    llamacpp_bin: str | None
    images: dict[str, str]  # server family or backend -> container image
    dtype: str
    max_model_len: int | None
    busy_poll: bool  # the load generator's loop polls without sleeping (workloads.loadgen.keep_awake)
    ray: str | None  # None: no Ray; `local` or a cluster address
    ray_actors: int | None  # load generators per point (None: one per node)
    ray_actor_cpus: float
    ray_cells: bool  # backend x variant x load point as Ray tasks
    ray_cell_resources: dict[str, float]  # per cell; {} = the default
    sweep: bool = False  # choose the load points per backend (compare.analysis.sweep)
    sweep_points: int = 5
    sweep_spacing: str = "geometric"
    sweep_concurrency: int = 64
    capacity: bool = False  # search the highest rate meeting the SLO (compare.analysis.capacity)
    capacity_percentile: int = 99
    capacity_precision: float = 0.1
    gpu_telemetry: str = "auto"  # auto | off (compare/measure/gpu_sampling.py)
    gpu_telemetry_interval: float = 0.1  # seconds between samples
    sweep_open: OpenLoop | None = None  # the sweep's open-loop points: arrival and seed (rate replaced)
    candidates_reason: str = ""  # why these backends, when the tool chose them (no backend given)
    # prompts and blocks
    prompt_pool: int | None = None  # None: a prompt of its own for every request; N: N prompts cycled
    blocks: int | None = 1  # alternating blocks per point (running endpoints); None until planned
    match_serving: bool = True  # launched backends get alike what both can set (compare.launch.serving_match)

    def warmup_count(self, schedule: Schedule) -> int:
        if self.warmup is not None:
            return self.warmup
        return schedule.concurrency if isinstance(schedule, ClosedLoop) else 2

    def describe(self) -> dict[str, Any]:
        """JSON-ready, for the manifest: the backends, workloads and load points, then every option's value
        under its manifest key (the Ray ones in an entry of their own, present only with Ray)."""
        config: dict[str, Any] = {
            "backends": [asdict(b) | {"key": b.key, "launched": b.launched} for b in self.backends],
            "workloads": [asdict(w) | {"label": w.label} for w in self.workloads],
            "load_points": [s.describe() | {"label": s.label} for s in self.load_points],
        }
        ray: dict[str, Any] = {}
        for option in PLANNED:
            group, _, key = str(option.manifest).rpartition(".")
            (ray if group == "ray" else config)[key] = getattr(self, option.name)
        config["candidates_reason"] = self.candidates_reason or None
        return config | ({} if self.ray is None else {"ray": ray})


# -- parsing values ---------------------------------------------------------------------------------------

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


def checked_number(
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
        raise PlanError(f"{flag(key)} must be {what}, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise PlanError(f"{flag(key)} must be >= {minimum}, got {value!r}")
    if above is not None and not number > above:
        raise PlanError(f"{flag(key)} must be > {above}, got {value!r}")
    return number
