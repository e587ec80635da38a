"""GPU telemetry during each load point: NVML (the `nvidia-ml-py` package, imported as `pynvml`) sampled by a
thread of its own while the point's load runs, into RUN_DIR/telemetry.jsonl; `read_samples` reads the file
back (what the samples mean over a point's window: `compare/analysis/gpu_energy.py`).

Every `interval_s` (default 0.1 s) each GPU the backend uses gives one JSON line:

    {"run_id": "3f2a...", "tick": 7, "gpu": 0, "t": 81234.5671, "power_w": 231.4, "energy_j": 9182.113,
     "energy_source": "counter", "mem_used_bytes": 40532901888, "util_pct": 87}

`t` is `time.perf_counter()`, the load generator's clock (a record's `t0_monotonic + send_s`), so samples
line up with requests. `energy_j` is the GPU's total-energy counter (nvmlDeviceGetTotalEnergyConsumption,
joules since the driver loaded). A GPU without one (before Volta, or where NVML answers "not supported") has
`null` there and `energy_source` "power integral": its energy is the trapezoid integral of `power_w`
(nvmlDeviceGetPowerUsage, which many GPUs average over the last second). A field that fails to read is `null`
in that sample, and the thread goes on. The first sample is taken before the load starts and the last after
it ends, so the samples bracket the measured window.

Telemetry is off, nothing is written and the manifest's `gpu_telemetry` entry says why, with
`--gpu-telemetry off`, without nvidia-ml-py, when NVML does not start (no driver), without a GPU, and for a
backend that uses none of this machine's GPUs. Which GPUs a backend uses: those the CUDA_VISIBLE_DEVICES of
its server's environment leaves visible, as nvidia-smi indices (`compare.common.devices.visible_indices`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any

import pandas as pd

from compare.common import devices
from workloads.records import read_json_lines

if TYPE_CHECKING:
    from compare.launch.launcher import Launcher
    from compare.measure.run_dir import RunDir

TELEMETRY = "telemetry.jsonl"
DEFAULT_INTERVAL_S = 0.1
COUNTER, INTEGRAL = "counter", "power integral"
STOP_WAIT_S = 5.0  # the longest a point waits for the sampler's last sample after its load ended
SAMPLE_FIELDS = (
    "run_id",
    "tick",
    "gpu",
    "t",
    "power_w",
    "energy_j",
    "energy_source",
    "mem_used_bytes",
    "util_pct",
)


# -- sampling ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's index, the same as nvidia-smi's
    handle: Any  # NVML's opaque device handle
    name: str
    counter: bool  # the total-energy counter answers


@dataclass
class GpuTelemetry:
    """NVML for one run: started once, shut down at its end (`close`). `entry` is the manifest's
    `gpu_telemetry` entry, kept up to date as backends and points are sampled. Without NVML or a GPU it is
    off: `watch` gives None and nothing is sampled."""

    nvml: ModuleType | None  # pynvml while on
    gpus: list[Gpu]
    interval_s: float
    entry: dict[str, Any]

    @property
    def on(self) -> bool:
        return bool(self.entry.get("on"))

    def watch(self, key: str, launcher: Launcher | None, endpoint: str | None) -> GpuWatch | None:
        """The GPUs backend `key` uses (started by `launcher`, or reached at `endpoint`), or None when none of
        this machine's is; the manifest says which and why."""
        if not self.on:
            return None
        if launcher is not None:
            env = launcher.gpu_env()
        elif endpoint is not None and _on_this_host(endpoint):
            env = dict(os.environ)  # a server here of unknown make: the GPUs this process sees
        else:
            self.entry["backends"][key] = {"gpus": [], "chosen": "a running endpoint on another host"}
            return None
        wanted, chosen = backend_gpus(env)
        gpus = [g for g in self.gpus if wanted is None or g.index in wanted]
        self.entry["backends"][key] = {"gpus": [g.index for g in gpus], "chosen": chosen}
        return GpuWatch(self, gpus) if gpus else None

    def close(self) -> None:
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
            self.nvml = None


@dataclass(frozen=True)
class GpuWatch:
    """One backend's GPUs, sampled during each of its load points."""

    telemetry: GpuTelemetry
    gpus: list[Gpu]

    @contextlib.contextmanager
    def sample(self, run_dir: RunDir, run_id: str) -> Iterator[None]:
        """Sample from before the body starts to after it ends (Ctrl-C included); the point's summary goes
        into the manifest."""
        sampler = Sampler(
            self.telemetry.nvml, self.gpus, run_dir.telemetry_path, run_id, self.telemetry.interval_s
        )
        try:
            sampler.start()  # inside: a Ctrl-C while it waits for the first sample stops it too
            yield
        finally:
            self.telemetry.entry["points"][run_id] = sampler.stop()
            run_dir.save()


def open_telemetry(mode: str, interval_s: float = DEFAULT_INTERVAL_S) -> GpuTelemetry:
    """NVML started and the GPUs found (`mode` auto), or telemetry off with the reason."""
    if mode == "off":
        return telemetry_off("off: --gpu-telemetry off")
    try:
        import pynvml
    except ImportError:
        return telemetry_off("off: nvidia-ml-py (pynvml) is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no NVIDIA driver here
        return telemetry_off(f"off: NVML did not start ({type(exc).__name__}: {exc})")
    try:
        gpus = [_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception as exc:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
        return telemetry_off(f"off: NVML could not list the GPUs ({type(exc).__name__}: {exc})")
    if not gpus:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
        return telemetry_off("off: NVML found no GPU")
    sources = {_source(g) for g in gpus}
    entry = {
        "on": True,
        "interval_s": interval_s,
        "clock": "time.perf_counter, the clock of the records",
        "energy_source": sources.pop() if len(sources) == 1 else "per GPU",
        "gpus": [{"index": g.index, "name": g.name, "energy_source": _source(g)} for g in gpus],
        "backends": {},
        "points": {},
    }
    return GpuTelemetry(pynvml, gpus, interval_s, entry)


def telemetry_off(why: str) -> GpuTelemetry:
    return GpuTelemetry(None, [], 0.0, {"on": False, "why": why})


def _source(gpu: Gpu) -> str:
    return COUNTER if gpu.counter else INTEGRAL


def _gpu(nvml: ModuleType, index: int) -> Gpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    try:
        name = nvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        name = "unknown"
    try:
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        counter = True
    except Exception:  # NVMLError_NotSupported: power is integrated instead
        counter = False
    return Gpu(index, handle, name, counter)


def backend_gpus(env: Mapping[str, str] | None) -> tuple[set[int] | None, str]:
    """(the NVML indices a server with environment `env` uses, None: all; how that was chosen). `env` None:
    the server is given no GPU."""
    if env is None:
        return set(), "the server is given no GPU"
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None, "no CUDA_VISIBLE_DEVICES: every GPU"
    wanted = devices.visible_indices(env)
    if wanted is None:
        return None, f"CUDA_VISIBLE_DEVICES={value} names no nvidia-smi indices: every GPU"
    return wanted, f"CUDA_VISIBLE_DEVICES={value}"


def _on_this_host(url: str) -> bool:
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1", "0.0.0.0", socket.gethostname().lower()) or host.startswith("127.")


#: one field of a sample, read from NVML (the module, a device handle); it may raise
Read = Callable[[Any, Any], float]


class Sampler:
    """Samples `gpus` every `interval_s` into `path`, in a daemon thread, from `start` to `stop`. The first
    sample is taken before `start` returns and the last after `stop` is called."""

    def __init__(
        self, nvml: ModuleType | None, gpus: Sequence[Gpu], path: Path, run_id: str, interval_s: float
    ) -> None:
        self.nvml, self.gpus, self.path, self.run_id = nvml, list(gpus), Path(path), run_id
        self.interval_s = interval_s
        self.ticks, self.first_t, self.last_t = 0, math.nan, math.nan
        self.failed: dict[str, int] = {}  # reads that raised, per field
        self.error = ""  # what ended the thread early (the file could not be written)
        self._abandoned = False  # stop() gave up waiting: the thread must write nothing more
        self._stop, self._first = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gpu-telemetry-{run_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._first.wait(STOP_WAIT_S)

    def stop(self) -> dict[str, Any]:
        """Take the last sample, end the thread; what was sampled (for the manifest)."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(STOP_WAIT_S + self.interval_s)
        if self._thread.is_alive():
            self._abandoned = True
            self.error = self.error or f"the sampler did not stop within {STOP_WAIT_S:g} s; left behind"
        return {
            "gpus": [g.index for g in self.gpus],
            "samples": self.ticks,
            "span_s": self.last_t - self.first_t if self.ticks > 1 else 0.0,
            "read_errors": dict(self.failed),
            **({"error": self.error} if self.error else {}),
        }

    def _run(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as out:
                due = time.perf_counter()
                while True:
                    self._tick(out)
                    self._first.set()
                    due = max(due + self.interval_s, time.perf_counter())  # late: no burst to catch up
                    if self._stop.wait(due - time.perf_counter()):
                        self._tick(out)  # after the load ended
                        return
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._first.set()

    def _tick(self, out: IO[str]) -> None:
        if self._abandoned:
            return
        lines = []
        for gpu in self.gpus:
            t = time.perf_counter()
            sample: dict[str, Any] = {
                "run_id": self.run_id,
                "tick": self.ticks,
                "gpu": gpu.index,
                "t": t,
                "energy_source": _source(gpu),
            }
            for name, read in READS.items():
                skip = name == "energy_j" and not gpu.counter
                sample[name] = None if skip else self._read(name, read, gpu.handle)
            lines.append(json.dumps(sample))
            self.first_t = t if self.ticks == 0 else self.first_t
            self.last_t = t
        out.write("\n".join(lines) + "\n")
        out.flush()
        self.ticks += 1

    def _read(self, name: str, read: Read, handle: Any) -> float | None:
        """One field of one sample; a failure is counted and leaves it null."""
        try:
            return read(self.nvml, handle)
        except Exception:
            self.failed[name] = self.failed.get(name, 0) + 1
            return None


#: what each sample reads, from NVML's units: milliwatts, millijoules, bytes, percent
READS: dict[str, Read] = {
    "power_w": lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1e3,
    "energy_j": lambda nvml, h: nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3,
    "mem_used_bytes": lambda nvml, h: int(nvml.nvmlDeviceGetMemoryInfo(h).used),
    "util_pct": lambda nvml, h: int(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
}


# -- reading back -----------------------------------------------------------------------------------------


def read_samples(path: str | Path) -> pd.DataFrame:
    """Every sample of a telemetry.jsonl (empty, with the columns, when there is no such file)."""
    path = Path(path)
    rows = [obj for _, obj in read_json_lines(path)] if path.exists() else []
    frame = pd.DataFrame(rows, columns=list(SAMPLE_FIELDS))
    for name in ("t", "power_w", "energy_j", "mem_used_bytes", "util_pct"):
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype(float)
    return frame
