"""Container images for launched backends: our reference engine's CPU image built locally and offline (its
context made by docker/prepare_reference_context.sh), reused while its sources are unchanged; official images
used as they are, pulled only when missing.

The reference image records a hash of what it is made of (the base image, the packages' sources, pyproject,
README, the recipe and the context script) in a label; an image whose label matches is reused, any other is
rebuilt, and the image it replaces is removed when this module built it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the Docker SDK ships no type hints: these read as Any, and say what is meant
    from docker.client import DockerClient
    from docker.models.images import Image

ROOT = Path(__file__).resolve().parents[2]
CPU_DOCKERFILE = "reference-cpu.Dockerfile"
DEFAULT_BASE_IMAGE = "llm-compare/base:bookworm"
SOURCE_LABEL = "llm-compare.source-sha256"
BUILT_LABEL = "llm-compare.built-by-compare"  # images this module built, and may remove when it rebuilds
PACKAGES = ("reference_engine", "adapters", "workloads", "compare")


class ImageError(RuntimeError):
    """An image is missing and cannot be built or pulled here; the message says what to do."""


def source_digest(base_id: str) -> str:
    """What the reference CPU image is made of, as one hash."""
    h = hashlib.sha256()
    files = [
        ROOT / "pyproject.toml",
        ROOT / "README.md",
        ROOT / "docker" / CPU_DOCKERFILE,
        ROOT / "docker" / "prepare_reference_context.sh",
    ]
    for pkg in PACKAGES:
        files += sorted(p for p in (ROOT / pkg).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(os.environ.get("REFERENCE_TORCH", "").encode() + b"\0" + base_id.encode())
    return h.hexdigest()


def can_build_reference() -> bool:
    """A source checkout has the recipe; an installed package does not."""
    return (ROOT / "docker" / CPU_DOCKERFILE).is_file() and (
        ROOT / "docker" / "prepare_reference_context.sh"
    ).is_file()


def ensure_reference_cpu_image(
    client: DockerClient,
    tag: str,
    base_image: str | None = None,
    labels: dict[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> Image:
    """The reference engine's CPU image under `tag`: reused if its sources are unchanged, else built offline
    (about 80 s the first time on two cores, seconds when only the project changed)."""
    import docker

    base_image = base_image or os.environ.get("LLM_COMPARE_BASE_IMAGE", DEFAULT_BASE_IMAGE)
    old = _get(client, tag)
    if not can_build_reference():
        if old is None:
            raise ImageError(
                f"image {tag} is missing and this installation has no docker/ recipe to build it"
            )
        return old
    base = _get(client, base_image)
    if base is None:
        raise ImageError(
            f"base image {base_image} is missing: `.ci/setup_podman.sh RUN_DIR` makes it; on a Docker host "
            "set LLM_COMPARE_BASE_IMAGE to any image with CPython 3.11 and venv, e.g. "
            "python:3.11-slim-bookworm"
        )
    digest = source_digest(base.id)
    if old is not None and old.labels.get(SOURCE_LABEL) == digest:
        return old
    if log:
        log(f"building {tag} from docker/{CPU_DOCKERFILE} (offline; about a minute the first time)")
    with tempfile.TemporaryDirectory(prefix="reference-context-") as ctx:
        subprocess.run(
            ["bash", str(ROOT / "docker" / "prepare_reference_context.sh"), ctx],
            check=True,
            env={**os.environ, "PYTHON": sys.executable},
            timeout=1800,
        )
        try:
            # podman's API wants the Dockerfile named even when it lies at the context's root
            built, _ = client.images.build(
                path=ctx,
                dockerfile=CPU_DOCKERFILE,
                tag=tag,
                rm=True,
                forcerm=True,
                buildargs={"BASE_IMAGE": base_image},
                labels={**(labels or {}), SOURCE_LABEL: digest, BUILT_LABEL: "1"},
            )
        except docker.errors.BuildError as exc:
            output = "".join(chunk.get("stream", "") for chunk in exc.build_log)
            raise ImageError(f"building {tag} failed: {exc}\n{output[-4000:]}") from exc
    ours = old is not None and (
        old.labels.get(BUILT_LABEL) == "1"
        or (bool(labels) and all(old.labels.get(k) == v for k, v in (labels or {}).items()))
    )
    if ours and old is not None and old.id != built.id:
        with contextlib.suppress(docker.errors.APIError):  # the image this one replaces, now untagged
            client.images.remove(old.id)
    return built


def ensure_image(client: DockerClient, image: str, log: Callable[[str], None] | None = None) -> Image:
    """An image that should be here (an official one, or one the user named): pulled when missing."""
    import docker

    found = _get(client, image)
    if found is not None:
        return found
    if log:
        log(f"pulling {image}")
    try:
        return client.images.pull(image)
    except docker.errors.APIError as exc:
        raise ImageError(f"image {image} is not here and could not be pulled: {exc}") from exc


def _get(client: DockerClient, name: str) -> Image | None:
    import docker

    try:
        return client.images.get(name)
    except docker.errors.ImageNotFound:
        return None
