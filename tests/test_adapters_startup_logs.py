"""Start-up phases read from backends' real logs: vLLM's CPU build here, vLLM 0.26 on an H200, our server."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters import ADAPTERS, get_adapter
from adapters.startup_log import log_lines, parse_duration, parse_startup_log, read_config

DATA = Path(__file__).parent / "data"


def phases_by_name(text: str, adapter: str) -> dict:
    return {p.name: p for p in parse_startup_log(text, ADAPTERS[adapter].startup_patterns)}


def test_vllm_cpu_log():
    phases = phases_by_name((DATA / "vllm_cpu_serve.log").read_text(), "vllm")
    assert phases["weights_loaded"].seconds == pytest.approx(0.29)
    assert phases["kv_cache_tokens"].fields["tokens"] == "23,296"
    assert phases["engine_ready"].seconds == pytest.approx(1.75)
    assert "server_ready" in phases
    assert "graphs_captured" not in phases  # served with --enforce-eager


def test_vllm_gpu_log_with_graphs():
    phases = phases_by_name((DATA / "vllm_h200_startup.log").read_text(), "vllm")
    assert phases["model_loaded"].gib == pytest.approx(12.55)
    assert phases["model_loaded"].seconds == pytest.approx(1.96157)
    assert phases["torch_compile"].seconds == pytest.approx(21.78)
    assert phases["graphs_captured"].seconds == 2.0 and phases["graphs_captured"].gib == pytest.approx(0.24)
    assert phases["kv_cache_memory"].gib == pytest.approx(104.58)
    assert phases["engine_ready"].seconds == pytest.approx(41.59)


def test_reference_server_log(tiny_server):
    phases = phases_by_name(tiny_server.log(), "reference")
    assert phases["weights_loaded"].fields["device"] == "cpu" and phases["weights_loaded"].seconds > 0
    assert int(phases["kv_cache_allocated"].fields["blocks"]) > 0
    assert phases["server_ready"].fields["url"] == tiny_server.url
    assert "graphs_captured" not in phases
    # its configuration line, read for the parity audit: what the server was started with
    settings = read_config(tiny_server.log(), get_adapter("reference").config_lines)
    assert settings == {
        "dtype": "float32",
        "max_model_len": "256",
        "quantization": "none",
        "enforce_eager": "True",
        "prefix_caching": "True",
        "max_num_seqs": "32",
        "max_batched_tokens": "2048",
        "block_size": "16",
    }


def test_reference_graph_line_and_durations():
    line = (
        "INFO reference_engine: CUDA graphs captured: 9 buckets [1, 2, 4, 8, 16, 24, 32, 48, 64], "
        "pool 0.045 GiB in 0.340 s"
    )
    (phase,) = parse_startup_log(line, get_adapter("reference").startup_patterns)
    assert (
        phase.name == "graphs_captured"
        and phase.gib == pytest.approx(0.045)
        and phase.seconds == pytest.approx(0.34)
    )
    assert phase.fields["buckets"] == "9"
    assert parse_duration("10.212938047s") == pytest.approx(10.212938047)
    assert parse_duration("890.5ms") == pytest.approx(0.8905)
    assert log_lines("a\rb\rc\nnext\x1b[32m!\x1b[0m") == ["c", "next!"]


# TGI and TensorRT-LLM need an NVIDIA GPU, so their servers cannot run on these machines: their start-up lines
# come from public logs, copied line for line (tests/data/README.md names the sources).


def test_tgi_2x_log_recorded_from_a_public_start():
    from compare.launch.setup_log import parse_log

    text = (DATA / "tgi_2x_startup.log").read_text()
    phases = phases_by_name(text, "tgi")
    assert phases["shard_ready"].seconds == pytest.approx(9.709293463)
    assert phases["graphs_enabled"].fields["sizes"] == "[1, 2, 4, 8, 16, 32]"
    assert phases["max_batch_total_tokens"].fields["tokens"] == "43808"
    assert "connected" in phases
    parsed = parse_log("tgi", text)
    got = {p.name: p.seconds for p in parsed.phases}
    # download 22:11:52.564228 -> 22:11:56.268206; warm-up 22:12:06.158565 -> 22:12:09.754597 (the log's
    # clock)
    assert got == {
        "download": pytest.approx(3.703978),
        "shard_load": pytest.approx(9.709293463),
        "warmup": pytest.approx(3.596032),
        "server_ready": 0.0,
    }
    assert parsed.memory == {"kv_tokens": 43808}


def test_tgi_3x_kv_blocks_and_graph_sizes():
    from compare.launch.setup_log import parse_log

    text = (DATA / "tgi_3x_warmup.log").read_text()
    phases = phases_by_name(text, "tgi-openai")
    assert phases["kv_cache_blocks"].fields == {"blocks": "13807", "block_size": "1"}
    assert phases["graphs_enabled"].fields["sizes"] == "[32, 16, 8, 4, 2, 1]"
    # the router's figure comes after the shard's block count and is what it schedules with
    assert parse_log("tgi", text).memory == {"kv_tokens": 13793}


def test_trtllm_serve_log_recorded_from_a_public_start():
    from compare.launch.setup_log import parse_log

    text = (DATA / "trtllm_serve_startup.log").read_text()
    phases = phases_by_name(text, "trtllm")
    assert phases["model_init"].seconds == pytest.approx(49.14)
    assert phases["graphs_started"].fields["count"] == "11"
    parsed = parse_log("trtllm", text)
    got = {p.name: p.seconds for p in parsed.phases}
    # two sizing rounds, each autotuned and each capturing 11 graphs: 04:21:10-37 + 04:21:52-53 autotuning,
    # 04:21:37-50 + 04:21:53-57 capture
    assert got == {
        "weights": pytest.approx(49.14),
        "autotune": 28.0,
        "cuda_graphs": 17.0,
        "server_ready": 0.0,
    }
    assert parsed.memory == {
        "weights": pytest.approx(63.32 * 2**30),
        "kv_cache": pytest.approx(5.95 * 2**30),
        "kv_tokens": 86720,
    }  # the second, real, KV-cache sizing wins


def test_trtllm_engine_build_lines():
    from compare.launch.setup_log import parse_log

    parsed = parse_log("trtllm-chat", (DATA / "trtllm_build_engine.log").read_text())
    got = {p.name: p.seconds for p in parsed.phases}
    assert got == {"engine_build": pytest.approx(35.9738), "engine_build_total": 41.0}
    assert parse_duration("00:01:59") == 119.0
