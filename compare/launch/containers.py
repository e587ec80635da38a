"""A backend's server in a container, through the Docker SDK against whatever Docker-compatible API
`DOCKER_HOST` names (Docker, or podman's service on our CI machines).

The container runs with an init process (so SIGTERM reaches the server at once), its port published on
127.0.0.1 only (a free host port, read back after the start), the checkpoint mounted read-only, GPUs
requested only when the spec asks, and labels on everything: `llm-compare=1`, the backend, and a session id
unique to this launch, which the set-up report records, so clean-up is exact and checkable. Its output is
streamed into the run directory as it comes, and written out once more, whole, before the container is
removed. The container is stopped and removed on every way out, as a process is (see
`compare/launch/launcher.py`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from adapters.launch_spec import LaunchSpec
from compare.common.datatypes import Phase
from compare.launch.launcher import Launcher, LaunchError

if TYPE_CHECKING:  # the Docker SDK ships no type hints: these read as Any, and say what is meant
    from docker.client import DockerClient
    from docker.models.containers import Container

LABEL = "llm-compare"
SESSION_LABEL = "llm-compare.session"
BACKEND_LABEL = "llm-compare.backend"


def docker_client(timeout: int = 300) -> DockerClient:
    """A client for the API at DOCKER_HOST (Docker's default socket if unset), checked with a ping."""
    try:
        import docker
    except ImportError:
        raise LaunchError(
            "--launch docker needs the docker package: pip install 'llm-compare[docker]'"
        ) from None
    host = os.environ.get("DOCKER_HOST", "the default socket")
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:
        raise LaunchError(f"no Docker API answers at DOCKER_HOST={host}: {exc}") from exc
    return client


class ContainerLauncher(Launcher):
    """One `LaunchSpec` as a container (`image`: the spec's, or one the user named instead)."""

    kind = "docker"

    def __init__(
        self,
        backend: str,
        variant: str,
        spec: LaunchSpec,
        log_path: Path,
        startup_timeout: float = 600.0,
        image: str | None = None,
        client: DockerClient | None = None,
        cpus: set[int] | None = None,
    ) -> None:
        self.spec, self.image = spec, image or spec.image
        super().__init__(
            backend,
            variant,
            [self.image, *spec.container_args],
            "http://127.0.0.1:0",
            spec.health_path,
            log_path,
            startup_timeout,
        )
        self.session = uuid.uuid4().hex[:12]
        self.labels = {LABEL: "1", SESSION_LABEL: self.session, BACKEND_LABEL: self.report.key}
        self.name = f"llm-compare-{backend}-{self.session}"
        self.client, self.cpus = client, cpus
        self.container: Container | None = None
        self._start_s: float | None = None  # the API's create and start calls
        self._log_file: BinaryIO | None = None
        self._follower: threading.Thread | None = None
        self.report.image, self.report.labels = self.image, dict(self.labels)

    def _spawn(self) -> None:
        import docker

        if self.spec.container_error and self.image == self.spec.image:
            raise LaunchError(f"{self.report.key}: {self.spec.container_error}")
        self.client = self.client or docker_client()
        kwargs: dict[str, Any] = dict(
            image=self.image,
            command=self.spec.container_args,
            name=self.name,
            labels=self.labels,
            init=True,
            detach=True,
            ports={f"{self.spec.container_port}/tcp": ("127.0.0.1", None)},
            volumes=self.spec.volumes,
            environment=self.spec.env,
        )
        if self.spec.entrypoint is not None:
            kwargs["entrypoint"] = self.spec.entrypoint
        if self.spec.shm_size:
            kwargs["shm_size"] = self.spec.shm_size
        if self.spec.ulimits:
            kwargs["ulimits"] = [
                docker.types.Ulimit(name=k, soft=v, hard=v) for k, v in self.spec.ulimits.items()
            ]
        if self.spec.gpus:
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        if self.cpus:
            kwargs["cpuset_cpus"] = ",".join(map(str, sorted(self.cpus)))
            self.report.pinned_cpus = sorted(self.cpus)
        try:
            began = time.perf_counter()
            self.container = self.client.containers.create(**kwargs)
            self.report.container_id = self.container.id
            self.container.start()
            self._start_s = time.perf_counter() - began
            self.container.reload()
        except docker.errors.APIError as exc:
            raise LaunchError(f"{self.report.key}: the container could not be started: {exc}") from exc
        bindings = (self.container.attrs["NetworkSettings"]["Ports"] or {}).get(
            f"{self.spec.container_port}/tcp"
        )
        if not bindings:
            raise LaunchError(
                f"{self.report.key}: the container published no port {self.spec.container_port}"
            )
        self.url = self.report.url = f"http://127.0.0.1:{bindings[0]['HostPort']}"
        self._log_file = self.log_path.open("wb")
        self._follower = threading.Thread(
            target=self._follow, args=(self.container, self._log_file), name=f"logs-{self.name}", daemon=True
        )
        self._follower.start()

    def gpu_env(self) -> dict[str, str] | None:
        """A container inherits nothing of ours: it sees every GPU when it asks for GPUs (unless its own
        environment sets CUDA_VISIBLE_DEVICES), else none."""
        return dict(self.spec.env) if self.spec.gpus else None

    @staticmethod
    def _follow(container: Container, out: BinaryIO) -> None:
        with contextlib.suppress(Exception):
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                out.write(chunk)
                out.flush()

    def _exit_code(self) -> int | None:
        if self.container is None:
            return None
        try:
            self.container.reload()
        except Exception:  # removed behind our back
            return -1
        if self.container.status in ("created", "running", "restarting", "configured", "initialized"):
            return None
        return int(self.container.attrs.get("State", {}).get("ExitCode", -1))

    def _terminate(self, timeout: float) -> None:
        """Stop (SIGTERM, then SIGKILL after `timeout`), keep the whole log, remove the container and
        anything else that carries this launch's session label."""
        if self.client is None:
            return
        import docker

        if self.container is not None:
            with contextlib.suppress(docker.errors.APIError):
                self.container.stop(timeout=max(1, int(timeout)))
            with contextlib.suppress(docker.errors.APIError):
                self.report.exit_code = (
                    self._exit_code() if self.report.exit_code is None else self.report.exit_code
                )
            if self._follower is not None:
                self._follower.join(timeout=5)
            with contextlib.suppress(docker.errors.APIError, OSError):
                self.log_path.write_bytes(self.container.logs(stdout=True, stderr=True))
        if self._log_file is not None:
            with contextlib.suppress(OSError):
                self._log_file.close()
            self._log_file = None
        with contextlib.suppress(docker.errors.APIError):
            for leftover in self.client.containers.list(
                all=True, filters={"label": f"{SESSION_LABEL}={self.session}"}
            ):
                with contextlib.suppress(docker.errors.APIError):
                    leftover.remove(force=True, v=True)

    def refresh(self) -> None:
        """The log's phases, with the container's own start (create and start through the API) split off
        the time to the server's first log line."""
        super().refresh()
        self._sample_memory()
        phases = self.report.phases
        if self._start_s is None or not phases or phases[0].name != "process_start":
            return
        first = phases[0]
        start = min(self._start_s, first.seconds)
        phases[0:1] = [
            Phase("container_start", round(start, 3), round(start, 3), "container created and started"),
            Phase(
                "process_start",
                first.seconds - start,
                first.end_s,
                "interpreter and imports, to the first log line",
            ),
        ]

    def _sample_memory(self) -> None:
        """The container's memory (its cgroup's usage; Docker's `max_usage` where the engine reports it,
        podman does not): the highest reading so far, as `peak_rss`."""
        if self.container is None or self._exit_code() is not None:
            return
        with contextlib.suppress(Exception):
            stats = self.container.stats(stream=False).get("memory_stats") or {}
            value = stats.get("max_usage") or stats.get("usage")
            if value:
                self.report.memory["peak_rss"] = max(float(value), self.report.memory.get("peak_rss", 0.0))

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
