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
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )

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


def vllm_spec(vllm: str, checkpoint: str, port: int, run_dir: Path):
    """vLLM's CPU build as `compare run` launches it on a machine without a GPU (the adapter's launch spec:
    float32, eager, a fixed 1 GB KV cache, caches in the run's folder; docs/vllm_cpu.md says why)."""
    from adapters.launch_spec import ModelSource, Variant
    from adapters.vllm import VLLMCompletionsAdapter

    return VLLMCompletionsAdapter.launch_spec(
        ModelSource(checkpoint, checkpoint), Variant(), port, workdir=run_dir, gpu=False, executable=vllm
    )


def vllm_server_cmd(vllm: str, checkpoint: str, port: int, *extra: str) -> list[str]:
    return [*vllm_spec(vllm, checkpoint, port, Path("/unused")).command, *extra]


def vllm_env(run_dir: Path) -> dict[str, str]:
    """Keep every cache and temp file of vLLM inside the run's folder; no usage reporting."""
    spec = vllm_spec("vllm", "model", 0, run_dir)
    for path in spec.dirs:
        Path(path).mkdir(parents=True, exist_ok=True)
    return {**spec.env, **spec.process_env}


@contextmanager
def vllm_server(vllm: str, checkpoint: str, run_dir: Path, *extra: str):
    """A live vLLM server. Healthy is not enough (an unsupported shape fails only at the first request), so
    one short completion must succeed before the server is handed out."""
    port = free_port()
    server = ServerProcess(
        vllm_server_cmd(vllm, checkpoint, port, *extra),
        port,
        run_dir / f"vllm-{port}.log",
        env=vllm_env(run_dir),
    )
    try:
        server.wait_healthy(timeout=400)
        resp = requests.post(
            server.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=120
        )
        if resp.status_code != 200:
            raise RuntimeError(f"vLLM answered {resp.status_code}: {resp.text[:500]}\n{server.log()[-3000:]}")
        yield server
    finally:
        server.stop()
