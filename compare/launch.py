"""Where a backend comes from: a running endpoint, or a server process we start, time and always stop.

A launch yields a `SetupReport`: spawn to healthy as we measured it, the start-up phases the backend logs
about itself (weights, compile, KV allocation, graph capture), and memory. Reading a backend's log is
pluggable: `LOG_PARSERS` maps a backend family to a function from log text to `ParsedLog`.

The process launcher starts the server in a process group of its own (so a Ctrl-C in the terminal reaches
only us, and we stop it in order), writes its log into the run directory, polls its health route until it
answers 200 or the start-up timeout passes (the error quotes the log's end), and stops it on every way out:
normal end, error, Ctrl-C, SIGTERM (which the CLI turns into Ctrl-C), and interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

GIB = 2**30
LOG_TAIL_CHARS = 3000


@dataclass
class Phase:
    """One start-up phase: `seconds` long, ending `end_s` after the spawn (None: unknown, laid end to end)."""

    name: str
    seconds: float
    end_s: float | None = None
    detail: str = ""


@dataclass
class ParsedLog:
    phases: list[Phase] = field(default_factory=list)  # end_s holds an absolute epoch time here, if logged
    memory: dict[str, float] = field(default_factory=dict)
    device: str | None = None
    dtype: str | None = None
    server_ready_s: float | None = None  # the server's own spawn-to-ready figure, if it logs one
    first_line_epoch: float | None = None  # when the process logged its first line (after its imports)


@dataclass
class SetupReport:
    """What it cost to get a backend ready to serve; `memory` in bytes (weights, kv_cache, graph_pool,
    peak_rss), `kv_tokens` where the backend says how many tokens its KV cache holds."""

    backend: str
    variant: str
    launcher: str  # process | endpoint
    url: str
    command: list[str] = field(default_factory=list)
    log_path: str | None = None
    spawned_at: float | None = None  # epoch seconds
    ready_s: float | None = None  # spawn to the first healthy answer, measured by us
    server_ready_s: float | None = None
    phases: list[Phase] = field(default_factory=list)
    memory: dict[str, float] = field(default_factory=dict)
    device: str | None = None
    dtype: str | None = None
    notes: list[str] = field(default_factory=list)
    exit_code: int | None = None
    pinned_cpus: list[int] | None = None
    pid: int | None = None
    repeat: int = 0  # which launch of this backend (--repeats)
    ready_runs: list[float] = field(default_factory=list)  # every launch's ready_s, when combined

    @property
    def key(self) -> str:
        return f"{self.backend}:{self.variant}" if self.variant else self.backend

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SetupReport:
        data = dict(data)
        data["phases"] = [Phase(**p) for p in data.get("phases", [])]
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


class LaunchError(RuntimeError):
    """A backend could not be started or reached; the message says why and quotes its log."""


# -- log parsers --------------------------------------------------------------------------------------------

_REF_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
_REF_PHASES = [
    ("tokenizer", re.compile(r"model .* resolved, tokenizer loaded in ([0-9.]+) s")),
    ("weights", re.compile(r"weights loaded: ([0-9.]+) GiB, (?:torch\.)?(\w+) on (\S+) in ([0-9.]+) s")),
    (
        "kv_cache",
        re.compile(r"KV cache allocated: (\d+) blocks of (\d+) tokens, ([0-9.]+) GiB in ([0-9.]+) s"),
    ),
    ("cuda_graphs", re.compile(r"CUDA graphs captured: (\d+) buckets .*pool ([0-9.]+) GiB in ([0-9.]+) s")),
]
_REF_READY = re.compile(r"server ready at \S+ in ([0-9.]+) s")


def _epoch(stamp: str, fmt: str) -> float | None:
    try:
        return datetime.strptime(stamp, fmt).timestamp()
    except ValueError:
        return None


def parse_reference_log(text: str) -> ParsedLog:
    """Our reference server's start-up lines (`reference_engine/engine.py`, `server.py`)."""
    out = ParsedLog()
    for line in text.splitlines():
        m = _REF_TIME.match(line)
        when = _epoch(m.group(1), "%Y-%m-%d %H:%M:%S,%f") if m else None
        if when is not None and out.first_line_epoch is None:
            out.first_line_epoch = when
        for name, pattern in _REF_PHASES:
            found = pattern.search(line)
            if not found:
                continue
            g = found.groups()
            if name == "tokenizer":
                out.phases.append(Phase("tokenizer", float(g[0]), when, "model resolved, tokenizer loaded"))
            elif name == "weights":
                out.memory["weights"] = float(g[0]) * GIB
                out.dtype, out.device = g[1], g[2].rstrip(",")
                out.phases.append(Phase("weights", float(g[3]), when, f"{g[0]} GiB {g[1]} on {out.device}"))
            elif name == "kv_cache":
                blocks, size, gib = int(g[0]), int(g[1]), float(g[2])
                out.memory["kv_cache"] = gib * GIB
                out.memory["kv_tokens"] = blocks * size
                out.phases.append(
                    Phase("kv_cache", float(g[3]), when, f"{blocks} blocks x {size} tokens, {gib} GiB")
                )
            else:
                out.memory["graph_pool"] = float(g[1]) * GIB
                out.phases.append(Phase("cuda_graphs", float(g[2]), when, f"{g[0]} buckets, pool {g[1]} GiB"))
        ready = _REF_READY.search(line)
        if ready:
            out.server_ready_s = float(ready.group(1))
            out.phases.append(Phase("server_ready", 0.0, when, "HTTP server listening"))
    return out


_VLLM_TIME = re.compile(r"^(?:\(\w+ pid=\d+\)\s*)?(?:INFO|WARNING|DEBUG)\s+(\d\d-\d\d \d\d:\d\d:\d\d)")
_VLLM_PATTERNS = [
    ("model_init", re.compile(r"Initializing model took ([0-9.]+) s")),
    ("checkpoint", re.compile(r"Checkpoint size: ([0-9.]+) GiB")),
    ("weights", re.compile(r"Loading weights took ([0-9.]+) s")),
    ("model_load", re.compile(r"Model loading took ([0-9.]+) GiB(?: memory)? and ([0-9.]+) s")),
    ("compile", re.compile(r"torch\.compile takes ([0-9.]+) s in total")),
    ("cuda_graphs", re.compile(r"Graph capturing finished in ([0-9.]+) secs?, took ([0-9.]+) GiB")),
    ("kv_tokens", re.compile(r"(?:GPU|CPU) KV cache size: ([0-9,]+) tokens")),
    (
        "kv_cache",
        re.compile(r"set \(([0-9.]+)/[0-9.]+\) GiB for KV cache|Available KV cache memory: ([0-9.]+) GiB"),
    ),
    ("init_engine", re.compile(r"init engine \(.*\) took ([0-9.]+) s")),
    ("server_ready", re.compile(r"Starting vLLM (?:API )?server on (\S+)")),
]


def parse_vllm_log(text: str) -> ParsedLog:
    """vLLM's start-up lines (`Loading weights took`, `Graph capturing finished in`, `init engine ...
    took`, `KV cache size`, `Starting vLLM server on`)."""
    out = ParsedLog()
    year = datetime.now().year
    for line in text.splitlines():
        m = _VLLM_TIME.match(line.strip())
        when = _epoch(f"{year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S") if m else None
        if when is not None and out.first_line_epoch is None:
            out.first_line_epoch = when
        for name, pattern in _VLLM_PATTERNS:
            found = pattern.search(line)
            if not found:
                continue
            g = found.groups()
            if name == "model_init":
                out.phases.append(Phase("model_init", float(g[0]), when, "building the model"))
            elif name == "checkpoint":
                out.memory.setdefault("weights", float(g[0]) * GIB)
            elif name == "weights":
                out.phases.append(Phase("weights", float(g[0]), when, "loading weights"))
            elif name == "model_load":
                out.memory["weights"] = float(g[0]) * GIB
            elif name == "compile":
                out.phases.append(Phase("compile", float(g[0]), when, "torch.compile"))
            elif name == "cuda_graphs":
                out.memory["graph_pool"] = float(g[1]) * GIB
                out.phases.append(Phase("cuda_graphs", float(g[0]), when, f"pool {g[1]} GiB"))
            elif name == "kv_tokens":
                out.memory["kv_tokens"] = float(g[0].replace(",", ""))
            elif name == "kv_cache":
                out.memory["kv_cache"] = float(g[0] or g[1]) * GIB
            elif name == "init_engine":
                out.phases.append(Phase("init_engine", float(g[0]), when, "profile, KV cache, warm-up"))
            else:
                out.phases.append(Phase("server_ready", 0.0, when, "HTTP server listening"))
    return out


#: backend family -> log parser; the launch issue adds TGI and TensorRT-LLM here
LOG_PARSERS: dict[str, Callable[[str], ParsedLog]] = {
    "reference": parse_reference_log,
    "vllm": parse_vllm_log,
}


def family(backend: str) -> str:
    return backend.split("-", 1)[0]


def parse_log(backend: str, text: str) -> ParsedLog:
    parser = LOG_PARSERS.get(family(backend))
    return parser(text) if parser else ParsedLog()


def apply_log(report: SetupReport, parsed: ParsedLog) -> None:
    """Fill `report` from a parsed log: phases as offsets from the spawn, laid end to end where the log gives
    no clock, with the interpreter start-up (spawn to the first log line) as a phase of its own."""
    spawned = report.spawned_at
    phases: list[Phase] = []
    if spawned is not None and parsed.first_line_epoch is not None:
        start = max(0.0, parsed.first_line_epoch - spawned)
        phases.append(Phase("process_start", start, start, "interpreter and imports, to the first log line"))
    cursor = phases[-1].end_s if phases else 0.0
    for p in parsed.phases:
        end = p.end_s - spawned if (p.end_s is not None and spawned is not None) else None
        if end is None or end < (cursor or 0.0) - 1.0:  # no clock, or a clock that disagrees: lay end to end
            end = (cursor or 0.0) + p.seconds
        phases.append(Phase(p.name, p.seconds, round(end, 3), p.detail))
        cursor = end
    report.phases = phases
    report.memory.update(parsed.memory)
    report.device, report.dtype = parsed.device or report.device, parsed.dtype or report.dtype
    report.server_ready_s = parsed.server_ready_s


# -- health -------------------------------------------------------------------------------------------------


def healthy(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def peak_rss_bytes(pid: int) -> float | None:
    """The process's peak resident memory (VmHWM), Linux only."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# -- launchers ----------------------------------------------------------------------------------------------

_LIVE: set[ProcessLauncher] = set()


@atexit.register
def _stop_all() -> None:
    for launcher in list(_LIVE):
        launcher.stop(timeout=5.0)


class ProcessLauncher:
    """Starts one server command, waits for health, always stops it (use as a context manager)."""

    def __init__(
        self,
        backend: str,
        variant: str,
        command: list[str],
        url: str,
        health_path: str,
        log_path: Path,
        startup_timeout: float = 600.0,
        env: dict[str, str] | None = None,
        cpus: set[int] | None = None,
        stop_timeout: float = 30.0,
    ) -> None:
        self.command, self.url, self.log_path = command, url.rstrip("/"), log_path
        self.health_url = self.url + health_path
        self.startup_timeout, self.stop_timeout = startup_timeout, stop_timeout
        self.env, self.cpus = env, cpus
        self.proc: subprocess.Popen | None = None
        self.report = SetupReport(backend, variant, "process", self.url, list(command), str(log_path))
        self._log_file: Any = None

    def start(self) -> SetupReport:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("wb")
        self.report.spawned_at = time.time()
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            self.command,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(self.env or {})},
        )
        _LIVE.add(self)
        self.report.pid = self.proc.pid
        if self.cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.proc.pid, self.cpus)
                self.report.pinned_cpus = sorted(self.cpus)
        deadline = started + self.startup_timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                self.report.exit_code = code
                self.stop()
                raise LaunchError(
                    f"{self.report.key} exited with code {code} before it was ready "
                    f"(log: {self.log_path}):\n{self.log_tail()}"
                )
            if healthy(self.health_url, timeout=1.0):
                break
            if time.perf_counter() > deadline:
                self.stop()
                raise LaunchError(
                    f"{self.report.key} not healthy at {self.health_url} after "
                    f"{self.startup_timeout:.0f} s (log: {self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.1)
        self.report.ready_s = round(time.perf_counter() - started, 3)
        self.refresh()
        return self.report

    def refresh(self) -> None:
        """Re-read the log and the process's peak memory into the report."""
        apply_log(self.report, parse_log(self.report.backend, self.log_text()))
        if self.proc is not None:
            rss = peak_rss_bytes(self.proc.pid)
            if rss is not None:
                self.report.memory["peak_rss"] = max(rss, self.report.memory.get("peak_rss", 0.0))

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        text = self.log_text()
        return text[-chars:] if text else "(the log is empty)"

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after `timeout`; idempotent."""
        proc = self.proc
        if (
            proc is not None
            and self.report.ready_s is not None
            and self.report.exit_code is None
            and proc.poll() not in (None, 0)
        ):
            self.report.notes.append(
                f"the server exited with code {proc.returncode} during the run (log: {self.log_path})"
            )
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                self.refresh()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self.report.notes.append("did not stop on SIGTERM in time: killed")
        if proc is not None and self.report.exit_code is None:
            self.report.exit_code = proc.returncode
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        _LIVE.discard(self)
        return None if proc is None else proc.returncode

    def __enter__(self) -> ProcessLauncher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def reference_command(
    model: str,
    port: int,
    variant: str,
    served_model: str,
    extra: list[str] | tuple[str, ...],
    host: str = "127.0.0.1",
) -> list[str]:
    from compare.plan import REFERENCE_VARIANTS

    return [
        sys.executable,
        "-m",
        "reference_engine.server",
        "--model",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        served_model,
        "--shutdown-timeout",
        "5",
        *REFERENCE_VARIANTS.get(variant, []),
        *extra,
    ]


def package_env() -> dict[str, str]:
    """PYTHONPATH with this checkout first, so a launched server runs the same code as we do."""
    root = str(Path(__file__).resolve().parents[1])
    return {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def endpoint_report(
    backend: str, variant: str, url: str, health_path: str, timeout: float = 10.0
) -> SetupReport:
    """A running server: check that it answers; its set-up cost is not ours to know."""
    report = SetupReport(
        backend,
        variant,
        "endpoint",
        url.rstrip("/"),
        notes=["running endpoint, not launched by llm-compare: set-up cost not measured"],
    )
    deadline = time.monotonic() + timeout
    while not healthy(report.url + health_path, timeout=2.0):
        if time.monotonic() > deadline:
            raise LaunchError(
                f"{report.key}: no healthy answer from {report.url + health_path} within {timeout:.0f} s"
            )
        time.sleep(0.2)
    return report
