"""Launch specs: every server's command line and container from one model and variant, with each variant on
its server's real flags; and docker/compose.yaml agreeing with them.

TGI and TensorRT-LLM cannot run on these machines (they need an NVIDIA GPU): their specs are checked against
their documented command lines and options (tests/data/README.md names the sources), not against a server.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from adapters import ADAPTERS
from adapters.launch_spec import CONFIG_MOUNT, LaunchSpecError, ModelSource, Variant

ROOT = Path(__file__).resolve().parents[1]


def spec(
    backend: str,
    variant: str = "",
    gpu: bool = True,
    model: ModelSource | None = None,
    tmp: Path = Path("/w"),
):
    model = model or ModelSource("hub/model", "m")
    return ADAPTERS[backend].launch_spec(model, Variant.parse(variant), 8123, workdir=tmp, gpu=gpu)


def flags_after(command: list[str], flag: str) -> list[str]:
    i = command.index(flag)
    out = []
    for item in command[i + 1 :]:
        if item.startswith("--"):
            break
        out.append(item)
    return out


def test_variant_syntax():
    v = Variant.parse("graphs=4/1/2+block=32+batch=64")
    assert (v.graphs, v.graph_sizes, v.block_size, v.max_num_seqs) == (True, (1, 2, 4), 32, 64)
    assert Variant.parse("eager").graphs is False and Variant.parse("").graphs is None
    assert Variant.parse("x", graph_sizes=[8, 1], max_batch_size=16) == Variant("x", True, (1, 8), None, 16)
    for bad, message in (
        ("turbo", "unknown variant item"),
        ("block=0", "positive"),
        ("eager+graphs", "off and on"),
    ):
        with pytest.raises(LaunchSpecError, match=message):
            Variant.parse(bad)


def test_vllm_flags_on_a_gpu(monkeypatch):
    monkeypatch.delenv("LLM_COMPARE_VLLM", raising=False)
    s = spec("vllm", "graphs=1/2/4+block=32+batch=64")
    assert s.command[:3] == ["vllm", "serve", "hub/model"]
    assert flags_after(s.command, "--cudagraph-capture-sizes") == ["1", "2", "4"]
    assert flags_after(s.command, "--block-size") == ["32"]
    assert flags_after(s.command, "--max-num-seqs") == ["64"]
    assert "--enforce-eager" not in s.command and s.gpus and s.container_error is None
    assert "--enforce-eager" in spec("vllm", "eager").command
    assert s.image.startswith("vllm/vllm-openai:") and s.shm_size == "16g" and s.container_port == 8000
    assert s.container_args[:2] == ["--model", "hub/model"]
    assert "--cudagraph-capture-sizes" in s.container_args


def test_vllm_on_a_cpu_gets_the_cpu_build_flags_and_caches_in_its_folder(tmp_path):
    model = ModelSource(str(tmp_path), "m")  # a local checkpoint directory
    s = spec("vllm", "graphs", gpu=False, model=model, tmp=Path("/runs/r/launch/vllm"))
    for flag in ("--enforce-eager", "--kv-cache-memory-bytes"):
        assert flag in s.command
    assert flags_after(s.command, "--dtype") == ["float32"]
    assert flags_after(s.command, "--max-model-len") == ["1024"]
    assert "--cudagraph-capture-sizes" not in s.command
    assert all(Path(v).is_relative_to("/runs/r/launch/vllm") for v in s.process_env.values())
    assert s.dirs == list(s.process_env.values()) and s.scratch == []
    deep = spec("vllm", gpu=False, tmp=Path("/runs") / ("d" * 80))  # ZeroMQ's socket paths must stay short
    assert len(deep.process_env["TMPDIR"]) < 60 and deep.scratch == [deep.process_env["TMPDIR"]]
    assert s.env["VLLM_NO_USAGE_STATS"] == "1" and s.env["HF_HUB_OFFLINE"] == "1"
    assert "runs eager" in s.notes[0]
    assert s.container_error and "needs an NVIDIA GPU" in s.container_error
    assert s.volumes == {str(tmp_path.resolve()): {"bind": "/models", "mode": "ro"}}
    assert s.container_args[:2] == ["--model", "/models"]


def test_tgi_flags_as_its_launcher_documents_them():
    s = spec("tgi", "graphs=1/2/4+batch=32", model=ModelSource("hub/model", "m", "bfloat16", 4096))
    assert s.command[:3] == ["text-generation-launcher", "--model-id", "hub/model"]
    assert flags_after(s.command, "--cuda-graphs") == ["1,2,4"]
    assert flags_after(s.command, "--max-batch-size") == ["32"]
    assert flags_after(s.command, "--max-total-tokens") == ["4096"]
    assert flags_after(s.command, "--max-input-tokens") == ["4095"]
    assert flags_after(s.command, "--dtype") == ["bfloat16"]
    assert flags_after(spec("tgi", "eager").command, "--cuda-graphs") == ["0"]
    with pytest.raises(LaunchSpecError, match="no flag for the KV-cache block size"):
        spec("tgi", "block=16")
    with pytest.raises(LaunchSpecError, match="float16 or bfloat16"):
        spec("tgi", model=ModelSource("hub/model", "m", "float32"))
    assert spec("tgi-openai").image == spec("tgi").image


def test_trtllm_options_yaml_and_flags(tmp_path):
    s = spec("trtllm", "eager+block=64+batch=8", tmp=tmp_path)
    assert s.command[:2] == ["trtllm-serve", "hub/model"]
    assert flags_after(s.command, "--backend") == ["pytorch"]
    assert flags_after(s.command, "--max_batch_size") == ["8"]
    assert flags_after(s.command, "--extra_llm_api_options") == [str(tmp_path / "extra-llm-api-options.yml")]
    options = s.files["extra-llm-api-options.yml"]
    assert "cuda_graph_config: null" in options  # null turns graphs off; left out, they are on
    assert yaml.safe_load(options) == {"cuda_graph_config": None, "kv_cache_config": {"tokens_per_block": 64}}
    assert yaml.safe_load(spec("trtllm", "graphs=1/8", tmp=tmp_path).files["extra-llm-api-options.yml"]) == {
        "cuda_graph_config": {"batch_sizes": [1, 8]}
    }
    assert spec("trtllm", tmp=tmp_path).files == {}  # the defaults need no options file
    assert s.container_args[0] == "trtllm-serve"  # the release image starts no server itself
    options = f"{CONFIG_MOUNT}/extra-llm-api-options.yml"
    assert flags_after(s.container_args, "--extra_llm_api_options") == [options]
    assert s.volumes[str(tmp_path.resolve())] == {"bind": CONFIG_MOUNT, "mode": "ro"}
    assert s.ulimits == {"memlock": -1, "stack": 67108864}
    assert (s.served_as, s.container_served_as) == ("hub/model", "hub/model")


def test_reference_flags_are_ones_our_server_accepts():
    from reference_engine.serving.options import parse_args

    s = spec(
        "reference", "graphs=1/2+block=32+batch=8", model=ModelSource("random:tiny", "m", "float32", 512)
    )
    assert s.command[:3] == [sys.executable, "-m", "reference_engine.server"]
    args = parse_args(s.command[3:])
    assert (args.cudagraph_capture_sizes, args.block_size, args.max_num_seqs) == ([1, 2], 32, 8)
    got = (args.max_model_len, args.dtype, args.enforce_eager, args.host)
    assert got == (512, "float32", False, "127.0.0.1")
    assert parse_args(spec("reference", "eager").command[3:]).enforce_eager
    assert spec("reference", gpu=False).image == "llm-compare/reference-cpu:latest"
    assert spec("reference", gpu=True).image == "llm-compare/reference-cuda:latest"
    assert spec("reference", gpu=False).container_error is None  # our CPU image runs anywhere


def test_reference_containers_keep_their_compiled_kernels(tmp_path):
    """On a GPU our container's /cache (where its image points Triton's cache) is a named volume, so a second
    start on the host loads the kernels the first compiled; the checkpoint stays mounted read-only."""
    from adapters.reference import REFERENCE_CACHE_VOLUME

    s = spec("reference", gpu=True, model=ModelSource(str(tmp_path), "m"))
    assert s.volumes == {
        str(tmp_path.resolve()): {"bind": "/models", "mode": "ro"},
        REFERENCE_CACHE_VOLUME: {"bind": "/cache", "mode": "rw"},
    }
    assert REFERENCE_CACHE_VOLUME not in spec("reference", gpu=False).volumes
    dockerfile = (ROOT / "docker" / "reference-cuda.Dockerfile").read_text()
    assert "TRITON_CACHE_DIR=/cache/triton" in dockerfile
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    assert "reference-cache:/cache" in compose["services"]["reference"]["volumes"]
    assert "reference-cache" in compose["volumes"]


def test_servers_that_are_not_ours_to_start_say_so():
    for backend in ("openai", "openai-chat", "trtllm-triton"):
        with pytest.raises(LaunchSpecError, match="--endpoint"):
            spec(backend)


def test_compose_file_agrees_with_the_launch_specs():
    """docker/compose.yaml starts each image with what `compare run --launch docker` gives it for the default
    variant on a GPU host."""
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    served = "${SERVED_MODEL_NAME:-model}"
    model = ModelSource("/srv/models/x", served)
    for service, backend in (
        ("vllm", "vllm"),
        ("tgi", "tgi"),
        ("trtllm", "trtllm"),
        ("reference", "reference"),
    ):
        s = ADAPTERS[backend].launch_spec(model, Variant.parse(""), 8000, workdir=Path("/w"), gpu=True)
        s.container_args = [a.replace("/srv/models/x", "/models") for a in s.container_args]
        assert compose[service]["command"] == s.container_args, service
        image = compose[service].get("image", "")
        if service != "reference":
            assert image.split(":-", 1)[1].split(":")[0] == s.image.split(":")[0], service
        assert compose[service]["shm_size"] == "${SHM_SIZE:-" + s.shm_size + "}", service
        assert compose[service]["ports"][0].endswith(f":{s.container_port}"), service
    trt = compose["trtllm"]["ulimits"]
    assert trt == {"memlock": -1, "stack": 67108864}
    runner = compose["runner"]["command"]
    assert runner[runner.index("--endpoint") + 1].startswith("${BACKEND:-vllm}=http://")
