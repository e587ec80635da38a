"""The reference server in a real container, driven through the Docker API with the `docker` SDK.

Needs a Docker-compatible API at DOCKER_HOST: in CI, podman's (`.ci/setup_podman.sh RUN_DIR` starts it and
prints the export), which also provides the base image `llm-compare/base:bookworm`. The image under test is
built from docker/reference-cpu.Dockerfile with a context made by docker/prepare_reference_context.sh, and
reused while the project's sources and the recipe are unchanged (compare/launch/images.py, shared with
`compare run --launch docker`; the fixtures are in conftest.py). Everything created here carries the label
`llm-compare.test=1`, and the containers also a label unique to this run, so clean-up is exact.
"""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from pathlib import Path

import pytest
import requests
from checkpoints import make_checkpoint

pytestmark = [pytest.mark.live, pytest.mark.slow]

LABEL = "llm-compare.test"
RUN_LABEL = "llm-compare.test.run"
RUN_ID = uuid.uuid4().hex[:12]
SERVER_ARGS = [
    "--model",
    "/models",
    "--served-model-name",
    "tiny",
    "--max-model-len",
    "256",
    "--shutdown-timeout",
    "10",
]


@pytest.fixture(scope="module")
def client(docker_client):
    return docker_client


@pytest.fixture(scope="module")
def image(reference_image):
    return reference_image


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama")


def our_containers(client):
    return client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={RUN_ID}"})


@pytest.fixture
def start_server(client, image, checkpoint):
    """Start the server container; yields (container, base_url, seconds from run to healthy)."""
    import docker

    started = []

    def start(*server_args: str):
        t0 = time.monotonic()
        container = client.containers.run(
            image.id,
            list(server_args),
            detach=True,
            init=True,
            name=f"llm-compare-test-{RUN_ID}-{len(started)}",
            labels={LABEL: "1", RUN_LABEL: RUN_ID},
            ports={"8000/tcp": ("127.0.0.1", None)},
            volumes={str(checkpoint): {"bind": "/models", "mode": "ro"}},
        )
        started.append(container)
        container.reload()
        bindings = container.attrs["NetworkSettings"]["Ports"]["8000/tcp"]
        assert [b["HostIp"] for b in bindings] == ["127.0.0.1"], bindings
        url = f"http://127.0.0.1:{bindings[0]['HostPort']}"
        deadline = time.monotonic() + 180
        while True:
            container.reload()
            if container.status not in ("created", "running"):
                pytest.fail(f"container exited ({container.status}):\n{container.logs().decode()[-3000:]}")
            try:
                if requests.get(url + "/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"not healthy after 180 s:\n{container.logs().decode()[-3000:]}")
            time.sleep(0.1)
        return container, url, time.monotonic() - t0

    yield start
    for container in started:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True, v=True)
    assert our_containers(client) == []


def test_reference_server_in_container(client, start_server, record_property):
    container, url, to_healthy = start_server(*SERVER_ARGS)
    record_property("container_start_to_healthy_s", round(to_healthy, 2))

    r = requests.post(
        url + "/v1/completions",
        timeout=60,
        json={"model": "tiny", "prompt": "the paged cache", "max_tokens": 4, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 4
    assert body["choices"][0]["finish_reason"] == "length"

    # The start-up phases, from the container's own log, as a launcher parses them.
    log = container.logs().decode()
    for phase in ("weights loaded:", "KV cache allocated:", "server ready at"):
        assert re.search(re.escape(phase) + r".* in \d+\.\d+ s", log), f"no {phase!r} line in:\n{log}"

    container.stop(timeout=30)
    container.reload()
    assert container.status == "exited"
    assert container.attrs["State"]["ExitCode"] == 0, container.logs().decode()[-3000:]
    assert "server stopped" in container.logs().decode()
    container.remove(v=True)
    assert our_containers(client) == []


def test_sigint_stops_container_promptly(client, start_server):
    """With an init process the server gets SIGINT itself, drains (nothing is running) and exits 0 at once."""
    container, _, _ = start_server(*SERVER_ARGS)
    t0 = time.monotonic()
    container.kill(signal="SIGINT")
    result = container.wait(timeout=30)
    assert time.monotonic() - t0 < 15
    assert result["StatusCode"] == 0, container.logs().decode()[-3000:]
    container.remove(v=True)
    assert our_containers(client) == []
