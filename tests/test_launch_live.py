"""Launchers against real servers on loopback: our reference server started from its launch spec as a process
and as a container, its set-up phases read from its own log, the cold first token measured, and nothing left
behind afterwards (checked by pid and by label)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adapters import ADAPTERS, get_adapter
from adapters.launch_spec import ModelSource, Variant
from adapters.request_spec import RequestSpec
from compare.launch.backend_launch import measure_cold_first_token
from compare.launch.launcher import LaunchError, ProcessLauncher, ServerProcess, free_port, package_env

pytestmark = [pytest.mark.live, pytest.mark.slow]

PROBE = RequestSpec("cold-0", (5, 6, 7, 8), "the paged cache", 3)


def reference_spec(checkpoint: Path, workdir: Path, variant: str = "eager"):
    model = ModelSource(str(checkpoint), "tiny", max_model_len=256)
    return ADAPTERS["reference"].launch_spec(
        model, Variant.parse(variant), free_port(), workdir=workdir, gpu=False
    )


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def check_reference_setup(report) -> None:
    names = [p.name for p in report.phases]
    assert {"process_start", "tokenizer", "weights", "kv_cache", "server_ready"} <= set(names), names
    ends = [p.end_s for p in report.phases]
    assert ends == sorted(ends) and ends[-1] <= report.ready_s + 0.05  # laid on the launch's time line
    assert report.memory["weights"] > 0 and report.memory["kv_tokens"] > 0 and report.memory["peak_rss"] > 0
    assert (report.device, report.dtype) == ("cpu", "float32")
    assert 0 < report.server_ready_s < report.ready_s
    assert 0 < report.cold_first_token_s < 30
    assert report.exit_code == 0


def test_reference_as_a_process(llama_dir, tmp_path):
    spec = reference_spec(llama_dir, tmp_path)
    launcher = ProcessLauncher(
        "reference",
        "eager",
        ServerProcess(spec.command, {**spec.env, **package_env()}),
        f"http://127.0.0.1:{spec.port}",
        spec.health_path,
        tmp_path / "reference.log",
        120,
    )
    with launcher:
        launcher.start()
        measure_cold_first_token(launcher, get_adapter("reference", model="tiny"), PROBE, 60)
    check_reference_setup(launcher.report)
    assert launcher.report.launcher == "process" and not alive(launcher.report.pid)
    assert "server stopped" in (tmp_path / "reference.log").read_text()


def our_containers(client, session: str) -> list:
    return client.containers.list(all=True, filters={"label": f"llm-compare.session={session}"})


def test_reference_in_a_container(docker_client, reference_image, llama_dir, tmp_path):
    from compare.launch.containers import ContainerLauncher

    spec = reference_spec(llama_dir, tmp_path)
    launcher = ContainerLauncher(
        "reference",
        "eager",
        spec,
        tmp_path / "reference.log",
        180,
        image=reference_image.id,
        client=docker_client,
    )
    with launcher:
        report = launcher.start()
        measure_cold_first_token(launcher, get_adapter("reference", model="tiny"), PROBE, 60)
        container = docker_client.containers.get(report.container_id)
        host = container.attrs["HostConfig"]
        bindings = container.attrs["NetworkSettings"]["Ports"]["8000/tcp"]
        assert [b["HostIp"] for b in bindings] == ["127.0.0.1"] and report.url.startswith("http://127.0.0.1:")
        assert host.get("Init") is True
        assert [(m["Destination"], m["RW"]) for m in container.attrs["Mounts"]] == [("/models", False)]
        assert container.labels["llm-compare"] == "1"
        assert container.labels["llm-compare.backend"] == "reference:eager"
        assert not host.get("DeviceRequests")  # no GPU asked for when none is visible
    check_reference_setup(report)
    assert report.launcher == "docker" and report.phases[0].name == "container_start"
    assert our_containers(docker_client, launcher.session) == []
    assert "server stopped" in (tmp_path / "reference.log").read_text()  # the whole log, kept


def test_a_container_that_exits_is_removed_and_quoted(docker_client, reference_image, tmp_path):
    from compare.launch.containers import ContainerLauncher

    (tmp_path / "empty").mkdir()
    spec = reference_spec(tmp_path / "empty", tmp_path)
    launcher = ContainerLauncher(
        "reference",
        "eager",
        spec,
        tmp_path / "reference.log",
        120,
        image=reference_image.id,
        client=docker_client,
    )
    started = time.monotonic()
    with pytest.raises(LaunchError, match="exited with code 2 before it was ready") as info:
        launcher.start()
    assert "has no config.json" in str(info.value)  # the end of the server's own log
    assert time.monotonic() - started < 60
    assert our_containers(docker_client, launcher.session) == []


def test_the_default_image_of_a_gpu_server_is_refused_without_a_gpu(tmp_path):
    from compare.launch.containers import ContainerLauncher

    spec = ADAPTERS["vllm"].launch_spec(ModelSource("m", "m"), Variant(), 8000, workdir=tmp_path, gpu=False)
    with pytest.raises(LaunchError, match="needs an NVIDIA GPU"):
        ContainerLauncher("vllm", "", spec, tmp_path / "vllm.log", 10).start()
