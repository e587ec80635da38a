"""From a planned backend to a started server: the adapter's launch spec for the model and the variant, run
as a local process or as a container, and the cold first token measured right after it is ready.

Each launch gets a folder of its own in the run directory (`launch/<backend>`): the configuration files a
spec asks for (TensorRT-LLM's options YAML) and, for processes, the caches and temporary files a server would
otherwise leave in the home directory (vLLM's).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from adapters import ADAPTERS
from adapters.base import Adapter
from adapters.launch_spec import LaunchSpec, LaunchSpecError, ModelSource, Variant
from adapters.request_spec import RequestSpec
from compare.common import devices
from compare.launch.first_token import FirstTokenError, first_token_s
from compare.launch.launcher import (
    Launcher,
    LaunchError,
    ProcessLauncher,
    ServerProcess,
    free_port,
    package_env,
)
from compare.launch.serving_match import Launch, MatchedSetting, apply_match, plan_match, record
from compare.plan.run_options import BackendSpec, RunPlan

if TYPE_CHECKING:
    from compare.measure.run_dir import RunDir


def safe_name(text: str) -> str:
    """A backend key as a file name (variants may hold `/`)."""
    return re.sub(r"[^\w.=+-]", "_", text.replace(":", "-"))


def make_launcher(
    plan: RunPlan,
    backend: BackendSpec,
    run_dir: RunDir,
    repeat: int,
    model_path: str,
    server_cpus: set[int] | None = None,
    log: Callable[[str], None] | None = None,
) -> Launcher:
    """A launcher for `backend` (not started yet); LaunchError says why it cannot be made."""
    cls = ADAPTERS[backend.name]
    suffix = f"-{repeat + 1}" if plan.repeats > 1 else ""
    log_path = run_dir.log_path(backend.key + suffix)
    workdir = run_dir.path / "launch" / safe_name(backend.key + suffix)
    workdir.mkdir(parents=True, exist_ok=True)
    gpu = devices.gpu_visible()
    model = ModelSource(model_path, plan.served_model or plan.model, plan.dtype, plan.max_model_len)
    port = free_port()
    try:
        spec = _spec(plan, backend, model, port, workdir, gpu)
    except LaunchSpecError as exc:
        raise LaunchError(f"{backend.key}: {exc}") from None
    if getattr(plan, "match_serving", True):
        matched = serving_match(plan, model, run_dir.path, gpu)
        spec = apply_match(spec, cls, backend.key, matched)
        record(run_dir.manifest, matched)
        run_dir.save()
    for name, text in spec.files.items():
        (workdir / name).write_text(text, encoding="utf-8")
    if plan.launch == "docker":
        launcher: Launcher = _container(plan, backend, cls, spec, log_path, gpu, server_cpus, log)
        served_as = spec.container_served_as
    else:
        launcher = _process(plan, backend, cls, spec, log_path, server_cpus)
        served_as = spec.served_as
    launcher.report.notes += spec.notes
    launcher.served_as = served_as
    return launcher


def _spec(
    plan: RunPlan, backend: BackendSpec, model: ModelSource, port: int, workdir: Path, gpu: bool
) -> LaunchSpec:
    """The adapter's launch spec for `backend` with its `--server-args` (LaunchSpecError if it cannot)."""
    cls = ADAPTERS[backend.name]
    variant = Variant.parse(backend.variant, **dict(backend.options))
    executable = getattr(plan, cls.executable_option, None) if cls.executable_option else None
    return cls.launch_spec(
        model,
        variant,
        port,
        workdir=workdir,
        gpu=gpu,
        executable=executable,
    ).with_extra_args(backend.server_args)


def serving_match(plan: RunPlan, model: ModelSource, run_path: Path, gpu: bool) -> dict[str, MatchedSetting]:
    """The serving settings every launched backend of the plan is given alike
    (`compare.launch.serving_match`), from their launch specs as planned (a backend that cannot be launched
    takes no part)."""
    launches: list[Launch] = []
    for other in plan.backends:
        if not other.launched:
            continue
        try:
            spec = _spec(plan, other, model, 0, run_path / "launch" / safe_name(other.key), gpu)
        except LaunchSpecError:
            continue
        launches.append((other.key, ADAPTERS[other.name], spec))
    return plan_match(launches, gpu)


def _process(
    plan: RunPlan,
    backend: BackendSpec,
    cls: type[Adapter],
    spec: LaunchSpec,
    log_path: Path,
    server_cpus: set[int] | None,
) -> Launcher:
    exe = spec.command[0]
    if shutil.which(exe) is None and not Path(exe).is_file():
        raise LaunchError(
            f"{backend.key}: {exe} not found{cls.executable_hint}; install it, or use --launch docker"
        )
    for path in spec.dirs:
        Path(path).mkdir(parents=True, exist_ok=True)
    env = {**spec.env, **spec.process_env}
    if cls.runs_from_checkout:
        env.update(package_env())
    if "CUDA_DEVICE_ORDER" not in os.environ and "CUDA_DEVICE_ORDER" not in env:
        # CUDA numbers GPUs fastest first unless told otherwise; nvidia-smi and NVML by PCI bus. In this order
        # the server's CUDA_VISIBLE_DEVICES names the GPUs that the memory notes and GPU telemetry read.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return ProcessLauncher(
        backend.name,
        backend.variant,
        ServerProcess(spec.command, env, server_cpus, list(spec.scratch)),
        f"http://127.0.0.1:{spec.port}",
        spec.health_path,
        log_path,
        plan.startup_timeout,
    )


def _container(
    plan: RunPlan,
    backend: BackendSpec,
    cls: type[Adapter],
    spec: LaunchSpec,
    log_path: Path,
    gpu: bool,
    server_cpus: set[int] | None,
    log: Callable[[str], None] | None,
) -> Launcher:
    from compare.launch.containers import ContainerLauncher, docker_client
    from compare.launch.images import ImageError, ensure_image, ensure_reference_cpu_image

    family = cls.server_family
    image = plan.images.get(backend.name) or (plan.images.get(family) if family else None)
    if spec.container_error and not image:
        raise LaunchError(f"{backend.key}: {spec.container_error}")
    client = docker_client()
    try:
        if image:
            ensure_image(client, image, log)
        elif cls.cpu_image_built_here and not gpu:
            ensure_reference_cpu_image(client, spec.image, log=log)
        else:
            ensure_image(client, spec.image, log)
    except ImageError as exc:
        raise LaunchError(f"{backend.key}: {exc}") from None
    return ContainerLauncher(
        backend.name,
        backend.variant,
        spec,
        log_path,
        plan.startup_timeout,
        image=image,
        client=client,
        cpus=server_cpus,
    )


def measure_cold_first_token(launcher: Launcher, adapter: Adapter, spec: RequestSpec, timeout: float) -> None:
    """Time the first request after ready into the set-up report; a server that cannot answer it is not
    ready after all (LaunchError, quoting its log)."""
    if launcher.ready_at is None:
        return
    try:
        seconds = first_token_s(launcher.url, adapter, spec, launcher.ready_at, timeout)
    except FirstTokenError as exc:
        launcher.refresh()
        raise LaunchError(
            f"{launcher.report.key} answered its health check, but its first request failed: {exc} "
            f"(log: {launcher.log_path}):\n{launcher.log_tail()}"
        ) from None
    launcher.report.cold_first_token_s = round(seconds, 4)
    launcher.refresh()
