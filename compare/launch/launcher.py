"""Where a backend comes from: a running endpoint, or a server we start, time and always stop.

A launch yields a `SetupReport` (`compare/common/datatypes.py`): spawn to healthy as measured here, the phases
the server logs about itself, memory, and the device memory it added. `Launcher` holds what every way of
starting shares: poll the health route until it answers 200 or the start-up timeout passes (the error quotes
the server's log), notice a server that exits first, and stop it on every way out (normal end, error, Ctrl-C,
SIGTERM, interpreter exit). `ProcessLauncher` runs a command in a process group of its own, so a Ctrl-C in
the terminal reaches only us and we stop the server in order; `compare/launch/containers.py` starts a
container.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from compare.common import devices
from compare.common.datatypes import SetupReport
from compare.launch.setup_log import apply_log, parse_log

__all__ = [
    "Health",
    "LaunchError",
    "Launcher",
    "ProcessLauncher",
    "ServerProcess",
    "check_health",
    "endpoint_report",
    "free_port",
]

LOG_TAIL_CHARS = 3000


class LaunchError(RuntimeError):
    """A backend could not be started or reached; the message says why and quotes its log."""


# -- health -------------------------------------------------------------------------------------------------


#: how long a running endpoint may refuse connections before we say so: long enough for a server that is
#: just restarting its listener, far below a start-up timeout (nothing listening will not start to)
REFUSED_GRACE_S = 0.5


@dataclass(frozen=True)
class Health:
    """One health check: `ok` when the route answered 200, else `state` says what happened instead."""

    ok: bool
    state: str  # "HTTP 200", "HTTP 503", "connection refused", "no answer within 1 s", "unreachable: ..."
    refused: bool = False  # nothing listens at the address


def check_health(url: str, timeout: float = 1.0) -> Health:
    """Ask `url` once, and say how it answered (or why it did not)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return Health(resp.status == 200, f"HTTP {resp.status}")
    except urllib.error.HTTPError as exc:
        return Health(False, f"HTTP {exc.code}")
    except urllib.error.URLError as exc:
        return _failed(exc.reason if isinstance(exc.reason, BaseException) else exc, timeout)
    except (ConnectionError, TimeoutError, OSError) as exc:
        return _failed(exc, timeout)


def _failed(exc: BaseException, timeout: float) -> Health:
    if isinstance(exc, ConnectionRefusedError):
        return Health(False, "connection refused", refused=True)
    if isinstance(exc, TimeoutError):
        return Health(False, f"no answer within {timeout:g} s")
    return Health(False, f"unreachable: {exc}")


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


def group_peak_rss_bytes(pgid: int) -> float | None:
    """The sum of the peak resident memory of every process in a process group: a server such as vLLM runs
    its engine in child processes. An upper bound of the group's peak (each process's own peak, whenever it
    was), Linux only."""
    total, found = 0.0, False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields after the name: state, ppid, pgrp
                continue
        except (OSError, ValueError, IndexError):
            continue
        rss = peak_rss_bytes(int(stat.parent.name))
        if rss is not None:
            total, found = total + rss, True
    return total if found else None


# -- launchers ----------------------------------------------------------------------------------------------

_LIVE: set[Launcher] = set()


@atexit.register
def _stop_all() -> None:
    for launcher in list(_LIVE):
        with contextlib.suppress(Exception):
            launcher.stop(timeout=5.0)


class Launcher:
    """Starts one server, waits for health, always stops it (use as a context manager). Subclasses spawn
    (`_spawn`), say whether and how it ended (`_exit_code`), stop it (`_terminate`) and give its log."""

    kind = "process"

    def __init__(
        self,
        backend: str,
        variant: str,
        command: list[str],
        url: str,
        health_path: str,
        log_path: Path,
        startup_timeout: float = 600.0,
        stop_timeout: float = 30.0,
    ) -> None:
        self.url, self.health_path, self.log_path = url.rstrip("/"), health_path, log_path
        self.startup_timeout, self.stop_timeout = startup_timeout, stop_timeout
        self.report = SetupReport(backend, variant, self.kind, self.url, list(command), str(log_path))
        self.ready_at: float | None = None  # perf_counter() at the first healthy answer
        #: the model name the server answers to, where not the plan's (`LaunchSpec.served_as`)
        self.served_as: str | None = None
        self._gpu_before: dict[int, float] | None = None
        self._stopped = False

    @property
    def health_url(self) -> str:
        return self.url + self.health_path

    # -- what a subclass provides -------------------------------------------------------------------------

    def _spawn(self) -> None:
        raise NotImplementedError

    def _exit_code(self) -> int | None:
        """None while the server runs, else how it ended."""
        raise NotImplementedError

    def _terminate(self, timeout: float) -> None:
        raise NotImplementedError

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def gpu_env(self) -> dict[str, str] | None:
        """The environment whose CUDA_VISIBLE_DEVICES says which GPUs the server sees (None: it is given no
        GPU). By default it inherits ours."""
        return dict(os.environ)

    # -- shared -------------------------------------------------------------------------------------------

    def start(self, on_wait: Callable[[str], None] | None = None) -> SetupReport:
        """Spawn the server and poll its health route until it answers 200; `on_wait(state)` hears, about
        twice a second, what the health check answered and the last start-up phase the server logged
        (refused connections are expected until it listens). LaunchError when it exits first or the
        start-up timeout passes."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._gpu_before = devices.gpu_memory_used()
        self.report.spawned_at = time.time()
        started = time.perf_counter()
        _LIVE.add(self)
        try:
            self._spawn()
        except BaseException:
            self.stop()
            raise
        deadline = started + self.startup_timeout
        told = 0.0
        while True:
            code = self._exit_code()
            if code is not None:
                self.report.exit_code = code
                self.stop()
                raise LaunchError(
                    f"{self.report.key} exited with code {code} before it was ready "
                    f"(log: {self.log_path}):\n{self.log_tail()}"
                )
            health = check_health(self.health_url, timeout=1.0)
            if health.ok:
                break
            if on_wait is not None and time.perf_counter() - told >= 0.5:
                told = time.perf_counter()
                on_wait(self._waiting_on(health))
            if time.perf_counter() > deadline:
                self.stop()
                raise LaunchError(
                    f"{self.report.key} not healthy at {self.health_url} after "
                    f"{self.startup_timeout:.0f} s (last health check: {health.state}; log: {self.log_path}):"
                    f"\n{self.log_tail()}"
                )
            time.sleep(0.1)
        self.ready_at = time.perf_counter()
        self.report.ready_s = round(self.ready_at - started, 3)
        self._device_memory()
        self.refresh()
        return self.report

    def _waiting_on(self, health: Health) -> str:
        """What a start-up is at: the last phase the server logged, and what its health route answered."""
        parsed = parse_log(self.report.backend, self.log_text(), near=self.report.spawned_at)
        logged = f"{parsed.phases[-1].name} done" if parsed.phases else "no start-up phase logged yet"
        if parsed.server_ready_s is not None:
            logged = "HTTP server listening"
        return f"{logged}; {'not listening yet' if health.refused else 'health check: ' + health.state}"

    def _device_memory(self) -> None:
        at_ready = devices.gpu_memory_used()
        if at_ready is None:
            return
        added, note = devices.memory_note(self._gpu_before, at_ready)
        self.report.memory["device_used"] = added
        self.report.notes.append(note)

    def refresh(self) -> None:
        """Re-read the log into the report."""
        apply_log(self.report, parse_log(self.report.backend, self.log_text(), near=self.report.spawned_at))

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        text = self.log_text()
        return text[-chars:] if text else "(the log is empty)"

    def stop(self, timeout: float | None = None) -> int | None:
        """Stop the server (gracefully, then by force after `timeout`); idempotent."""
        if self._stopped:
            return self.report.exit_code
        code = self._exit_code()
        if self.report.ready_s is not None and self.report.exit_code is None and code not in (None, 0):
            self.report.notes.append(
                f"the server exited with code {code} during the run (log: {self.log_path})"
            )
        if code is None:
            with contextlib.suppress(Exception):
                self.refresh()
        self._terminate(self.stop_timeout if timeout is None else timeout)
        if self.report.exit_code is None:
            self.report.exit_code = self._exit_code()
        with contextlib.suppress(Exception):
            self.refresh()
        self._stopped = True
        _LIVE.discard(self)
        return self.report.exit_code

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class ServerProcess:
    """What a `ProcessLauncher` runs: the command, environment added to ours, the CPUs to pin it to, and
    host directories outside the run directory that it writes to (removed after the stop)."""

    command: list[str]
    env: dict[str, str] | None = None
    cpus: set[int] | None = None
    scratch: list[str] = field(default_factory=list)


class ProcessLauncher(Launcher):
    """A server command as a subprocess in its own process group, its output in `log_path`."""

    kind = "process"

    def __init__(
        self,
        backend: str,
        variant: str,
        process: ServerProcess,
        url: str,
        health_path: str,
        log_path: Path,
        startup_timeout: float = 600.0,
        stop_timeout: float = 30.0,
    ) -> None:
        super().__init__(
            backend, variant, process.command, url, health_path, log_path, startup_timeout, stop_timeout
        )
        self.command, self.env, self.cpus = process.command, process.env, process.cpus
        self.scratch = list(process.scratch)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: BinaryIO | None = None

    def _spawn(self) -> None:
        self._log_file = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.command,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(self.env or {})},
        )
        self.report.pid = self.proc.pid
        if self.cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.proc.pid, self.cpus)
                self.report.pinned_cpus = sorted(self.cpus)

    def _exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def gpu_env(self) -> dict[str, str]:
        """Ours, with the launch's own settings (a CUDA_VISIBLE_DEVICES among them) over it."""
        return {**os.environ, **(self.env or {})}

    def refresh(self) -> None:
        """Re-read the log and the process's peak memory into the report."""
        super().refresh()
        if self.proc is not None:
            rss = group_peak_rss_bytes(self.proc.pid)
            if rss is not None:
                self.report.memory["peak_rss"] = max(rss, self.report.memory.get("peak_rss", 0.0))

    def _terminate(self, timeout: float) -> None:
        """SIGTERM to the server's process group, SIGKILL after `timeout`."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self.report.notes.append("did not stop on SIGTERM in time: killed")
        if proc is not None:  # whatever the group leader left behind goes with it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        for path in self.scratch:
            shutil.rmtree(path, ignore_errors=True)


def package_env() -> dict[str, str]:
    """PYTHONPATH with this checkout first, so a launched server runs the same code as we do."""
    root = str(Path(__file__).resolve().parents[2])
    return {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def endpoint_report(
    backend: str, variant: str, url: str, health_path: str, timeout: float = 10.0
) -> SetupReport:
    """A running server: check that it answers; its set-up cost is not ours to know. A refused connection
    fails within `REFUSED_GRACE_S` (nothing listens, and waiting will not change that); other failures are
    retried until `timeout`."""
    report = SetupReport(
        backend,
        variant,
        "endpoint",
        url.rstrip("/"),
        notes=["running endpoint, not launched by llm-compare: set-up cost not measured"],
    )
    url = report.url + health_path
    deadline = time.monotonic() + timeout
    refused_since: float | None = None
    while not (health := check_health(url, timeout=2.0)).ok:
        now = time.monotonic()
        if health.refused:
            refused_since = now if refused_since is None else refused_since
            if now - refused_since >= REFUSED_GRACE_S:
                raise LaunchError(
                    f"{report.key}: connection refused at {url}: nothing listens there "
                    "(is the server running, and is the address right?)"
                )
        else:
            refused_since = None
        if now > deadline:
            raise LaunchError(
                f"{report.key}: no healthy answer from {url} within {timeout:.0f} s (last: {health.state})"
            )
        time.sleep(0.1 if health.refused else 0.2)
    return report
