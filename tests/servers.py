"""Start real servers as subprocesses on loopback ports, wait until healthy, and always stop them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, cmd: list[str], port: int, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"server not healthy after {timeout} s:\n{self.log()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def reference_server_cmd(model: str, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "reference_engine.server", "--model", model, "--port", str(port), *extra]


@contextmanager
def reference_server(model: str, log_dir: Path, *extra: str):
    port = free_port()
    server = ServerProcess(reference_server_cmd(model, port, *extra), port, log_dir / f"server-{port}.log")
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()
