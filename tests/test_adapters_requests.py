"""What each adapter sends: exact-length requests where the backend allows it, and its quirks."""

from __future__ import annotations

import json

import pytest

from adapters import ADAPTERS, get_adapter
from adapters.prometheus import common_metrics
from adapters.request_spec import RequestSpec
from adapters.tgi import TGI_METRICS
from adapters.vllm import VLLM_METRICS

SPEC = RequestSpec("req-7", (11, 12, 13, 14), "The quick brown fox", 37, extra_headers={"X-Trace": "on"})


def body(name: str, **options) -> dict:
    request = get_adapter(name, **options).build_request(SPEC)
    json.dumps(request.body)  # always serialisable
    return {"path": request.path, **request.body}


def test_vllm_forces_length_and_asks_for_continuous_usage():
    assert body("vllm", model="m") == {
        "path": "/v1/completions",
        "model": "m",
        "prompt": "The quick brown fox",
        "max_tokens": 37,
        "temperature": 0.0,
        "ignore_eos": True,
        "min_tokens": 37,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chat = body("vllm-chat")
    assert chat["path"] == "/v1/chat/completions"
    assert chat["messages"] == [{"role": "user", "content": "The quick brown fox"}]
    assert body("vllm", prompt_as_token_ids=True)["prompt"] == [11, 12, 13, 14]
    assert get_adapter("vllm").forces_output_length and get_adapter("vllm").cumulative_usage


def test_plain_openai_sends_only_openai_fields():
    b = body("openai", model="gpt-x")
    assert "ignore_eos" not in b and "min_tokens" not in b
    assert b["stream_options"] == {"include_usage": True}
    assert not get_adapter("openai").forces_output_length
    assert "stream_options" not in body("openai", include_usage=False)


def test_tgi_native_asks_for_details_and_cannot_force():
    assert body("tgi") == {
        "path": "/generate_stream",
        "inputs": "The quick brown fox",
        "parameters": {"max_new_tokens": 37, "details": True, "do_sample": False},
    }
    assert not get_adapter("tgi").forces_output_length
    assert get_adapter("tgi").build_request(SPEC, stream=False).path == "/generate"
    with pytest.raises(ValueError, match="cannot force"):
        get_adapter("tgi-openai", force_output_length=True)
    with pytest.raises(ValueError, match="no continuous usage"):
        get_adapter("tgi-openai", continuous_usage=True)
    assert "stream_options" not in body("tgi-openai-completions")


def test_trtllm_serve_quirks():
    with pytest.raises(ValueError, match="requires the model"):
        get_adapter("trtllm")
    b = body("trtllm", model="llama")
    assert b["model"] == "llama" and b["ignore_eos"] is True and b["min_tokens"] == 37
    assert b["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    extra = RequestSpec("r", (1,), "x", 2, extra_body={"return_token_ids": True})
    with pytest.raises(ValueError, match="rejects unknown request fields: return_token_ids"):
        get_adapter("trtllm", model="llama").build_request(extra)
    with pytest.raises(ValueError, match="rejects unknown request fields: typo_field"):
        get_adapter("trtllm-chat", model="llama", sampling={"typo_field": 1}).build_request(SPEC)


def test_triton_generate():
    assert body("trtllm-triton") == {
        "path": "/v2/models/ensemble/generate_stream",
        "text_input": "The quick brown fox",
        "max_tokens": 37,
        "stream": True,
        "min_length": 37,
    }
    adapter = get_adapter(
        "trtllm-triton",
        model="tensorrt_llm_bls",
        min_length_field="min_tokens",
        sampling={"temperature": 0.0},
    )
    b = adapter.build_request(SPEC).body
    assert (
        b["min_tokens"] == 37
        and b["temperature"] == 0.0
        and adapter.info_path == "/v2/models/tensorrt_llm_bls"
    )


def test_reference_speaks_vllm_and_tgi():
    assert body("reference") == {**body("vllm"), "path": "/v1/completions"}
    assert body("reference-tgi") == body("tgi")
    assert body("reference-chat")["path"] == "/v1/chat/completions"


def test_extra_body_and_registry():
    spec = RequestSpec("r", (1,), "x", 2, extra_body={"seed": 7, "temperature": 0.7})
    b = get_adapter("vllm").build_request(spec).body
    assert b["seed"] == 7 and b["temperature"] == 0.7
    with pytest.raises(ValueError, match="unknown adapter 'sglang'"):
        get_adapter("sglang")
    assert set(ADAPTERS) >= {
        "openai",
        "openai-chat",
        "vllm",
        "tgi",
        "tgi-openai",
        "trtllm",
        "trtllm-triton",
        "reference",
    }
    for name, cls in ADAPTERS.items():
        adapter = get_adapter(name, **({"model": "m"} if name in ("trtllm", "trtllm-chat") else {}))
        assert adapter.health_path.startswith("/") and adapter.metrics_path.startswith("/")
        assert adapter.describe()["adapter"] == name == cls.name


@pytest.mark.parametrize(
    "name,response,text,tokens",
    [
        (
            "vllm",
            {
                "id": "c",
                "object": "text_completion",
                "choices": [{"index": 0, "text": " ok", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 4, "total_tokens": 9, "completion_tokens": 5},
            },
            " ok",
            5,
        ),
        (
            "vllm-chat",
            {
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 4, "completion_tokens": 2},
            },
            "hi",
            2,
        ),
        (
            "tgi",
            {"generated_text": " Deep", "details": {"finish_reason": "length", "generated_tokens": 3}},
            " Deep",
            3,
        ),
    ],
)
def test_whole_responses(name, response, text, tokens):
    event = get_adapter(name).parse_response(json.dumps(response).encode())
    assert (event.text, event.n_tokens, event.is_done) == (text, tokens, True)


def test_prometheus_names_map_to_common_names():
    text = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3
vllm:num_requests_running{model_name="b"} 1
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="a"} 0.25
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{model_name="a"} 1200
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="a"} 2
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="a"} 5
vllm:e2e_request_latency_seconds_sum{model_name="a"} 7.5
vllm:e2e_request_latency_seconds_count{model_name="a"} 5
# TYPE unrelated_metric gauge
unrelated_metric 9
"""
    assert common_metrics(text, VLLM_METRICS) == {
        "requests_running": 4.0,
        "kv_cache_usage": 0.25,
        "generation_tokens_total": 1200.0,
        "e2e_seconds_sum": 7.5,
        "e2e_seconds_count": 5.0,
    }
    tgi = (
        "# TYPE tgi_queue_size gauge\ntgi_queue_size 2\n"
        "# TYPE tgi_request_count counter\ntgi_request_count 10\n"
    )
    assert common_metrics(tgi, TGI_METRICS) == {"requests_waiting": 2.0, "requests_total": 10.0}
