"""Start-up phases read from backends' real logs: vLLM's CPU build here, vLLM 0.26 on an H200, our server."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters import get_adapter
from adapters.startup_log import log_lines, parse_duration, parse_startup_log

DATA = Path(__file__).parent / "data"


def phases_by_name(text: str, adapter: str) -> dict:
    return {p.name: p for p in parse_startup_log(text, get_adapter(adapter).startup_patterns)}


def test_vllm_cpu_log():
    phases = phases_by_name((DATA / "vllm_cpu_serve.log").read_text(), "vllm")
    assert phases["weights_loaded"].seconds == pytest.approx(0.29)
    assert phases["kv_cache_tokens"].fields["tokens"] == "23,296"
    assert phases["engine_ready"].seconds == pytest.approx(1.75)
    assert "server_ready" in phases
    assert "graphs_captured" not in phases  # served with --enforce-eager


def test_vllm_gpu_log_with_graphs():
    phases = phases_by_name((DATA / "vllm_h200_startup.log").read_text(), "vllm")
    assert phases["model_loaded"].gib == pytest.approx(12.55) and phases["model_loaded"].seconds == pytest.approx(1.96157)
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


def test_reference_graph_line_and_durations():
    line = "INFO reference_engine: CUDA graphs captured: 9 buckets [1, 2, 4, 8, 16, 24, 32, 48, 64], pool 0.045 GiB in 0.340 s"
    (phase,) = parse_startup_log(line, get_adapter("reference").startup_patterns)
    assert phase.name == "graphs_captured" and phase.gib == pytest.approx(0.045) and phase.seconds == pytest.approx(0.34)
    assert phase.fields["buckets"] == "9"
    assert parse_duration("10.212938047s") == pytest.approx(10.212938047)
    assert parse_duration("890.5ms") == pytest.approx(0.8905)
    assert log_lines("a\rb\rc\nnext\x1b[32m!\x1b[0m") == ["c", "next!"]
