"""llama.cpp's adapter without a server: streams and a start-up log captured from a live llama-server
(tests/data), its launch spec, its `/props` and the GGUF it serves. The live server is
tests/test_llamacpp_live.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters import ADAPTERS, get_adapter
from adapters.launch_spec import LaunchSpecError, ModelSource, Variant
from adapters.llamacpp import DEFAULT_SLOTS, file_type_settings, find_gguf
from adapters.request_spec import RequestSpec
from adapters.startup_log import parse_startup_log, read_config
from compare.launch.setup_log import parse_log
from workloads.response_parsing import read_stream

DATA = Path(__file__).parent / "data"
STREAMS = DATA / "streams"

# file, adapter, per-event token counts, usage (prompt, completion), finish, text
CASES = [
    (
        "llamacpp_completions_timings.sse",
        "llamacpp",
        [1] * 8 + [0, 0],
        (7, 8),
        "length",
        " the capital of Japan.\n\nThe",
    ),
    ("llamacpp_completions_final_timings.sse", "llamacpp", [1] * 6 + [0, 0], (4, 6), "length", " 10:30"),
    (
        "llamacpp_chat_timings.sse",
        "llamacpp-chat",
        [0] + [1] * 12 + [0, 0, 0],
        (38, 12),
        "length",
        "Je suis en français, je suis en",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_recorded_llamacpp_streams(case):
    name, adapter_name, counts, (prompt, completion), finish, text = case
    adapter = get_adapter(adapter_name)
    body = (STREAMS / name).read_bytes()
    # cut the body anywhere: the reading must not depend on where socket reads split it
    for cuts in ([], list(range(0, len(body), 97)), [len(body) // 2]):
        pieces = [
            (float(i), body[a:b])
            for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(body)], strict=True))
            if b > a
        ]
        reading = read_stream(adapter, pieces)
        assert reading.problem is None
        assert reading.counts == counts
        assert (reading.usage_prompt_tokens, reading.usage_completion_tokens) == (prompt, completion)
        assert reading.finish_reason == finish and reading.text == text
        assert reading.event_tokens == completion
        timings = reading.server_timings
        assert timings is not None and timings["predicted_n"] == completion and timings["prompt_ms"] > 0


def test_timings_make_counts_exact():
    adapter = get_adapter("llamacpp")
    events = [
        adapter.parse_event(line[6:])
        for line in (STREAMS / "llamacpp_completions_timings.sse").read_text().split("\n\n")
        if line.strip()
    ]
    assert all(e.exact for e in events if e.is_output)
    # without per-token timings the rule of thumb counts chunks, and only the last one carries timings
    events = [
        get_adapter("llamacpp").parse_event(line[6:])
        for line in (STREAMS / "llamacpp_completions_final_timings.sse").read_text().split("\n\n")
        if line.strip()
    ]
    assert [e.server_timings is not None for e in events] == [False] * 6 + [True, False]


def test_request_asks_for_timings_and_forces_the_length():
    adapter = get_adapter("llamacpp", model="smollm2")
    spec = RequestSpec("r1", (1, 2, 3), "Hello there", 16)
    request = adapter.build_request(spec)
    assert request.path == "/v1/completions"
    body = request.body
    assert body["max_tokens"] == 16 and body["ignore_eos"] is True and "min_tokens" not in body
    assert body["timings_per_token"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.0 and body["model"] == "smollm2"
    chat = get_adapter("llamacpp-chat", timings_per_token=False).build_request(spec)
    assert chat.path == "/v1/chat/completions" and "timings_per_token" not in chat.body
    assert chat.body["messages"] == [{"role": "user", "content": "Hello there"}]
    unforced = get_adapter("llamacpp", force_output_length=False).build_request(spec).body
    assert "ignore_eos" not in unforced


def test_startup_phases_from_a_recorded_log():
    text = (DATA / "llamacpp_startup.log").read_text()
    spawned = 1_700_000_000.0
    parsed = parse_log("llamacpp", text, near=spawned)
    phases = {p.name: p for p in parsed.phases}
    assert list(phases) == ["weights", "kv_cache", "warmup", "server_ready"]
    assert all(phases[name].seconds > 0 for name in ("weights", "kv_cache", "warmup"))
    # laid on the spawn's clock: the log's stamps count from the process start
    assert phases["weights"].end_s < phases["kv_cache"].end_s < phases["warmup"].end_s < spawned + 60
    assert parsed.server_ready_s is None  # it says it listens, but gives no figure of its own
    assert parsed.memory["weights"] == pytest.approx(92.10 * 2**20)
    assert parsed.memory["kv_cache"] == pytest.approx(90.0 * 2**20)
    assert parsed.memory["kv_tokens"] == 4096
    assert parsed.device == "CPU"
    matched = {p.name for p in parse_startup_log(text, get_adapter("llamacpp").startup_patterns)}
    assert "server_ready" in matched


def test_settings_from_a_recorded_log():
    settings = read_config((DATA / "llamacpp_startup.log").read_text(), get_adapter("llamacpp").config_lines)
    assert settings == {
        "dtype": "q4_1",
        "quantization": "q4_1",
        "max_num_seqs": "4",
        "max_model_len": "1024",
        "max_batched_tokens": "2048",
        "kv_cache_dtype": "float16",
        "api_servers": "1",
        "enforce_eager": "True",
    }


@pytest.mark.parametrize(
    "file_type,dtype,quantization",
    [
        ("Q4_1", "q4_1", "q4_1"),
        ("Q4_K - Medium", "q4_k_medium", "q4_k_medium"),
        ("F16", "float16", "none"),
        ("BF16", "bfloat16", "none"),
        ("all F32", "float32", "none"),
    ],
)
def test_file_types(file_type, dtype, quantization):
    assert file_type_settings(file_type) == {"dtype": dtype, "quantization": quantization}


def test_props_read_as_settings():
    props = {
        "model_ftype": "Q4_1",
        "total_slots": 8,
        "default_generation_settings": {"n_ctx": 2048},
        "model_path": "/x.gguf",
    }
    assert ADAPTERS["llamacpp"].read_props(props) == {
        "dtype": "q4_1",
        "quantization": "q4_1",
        "max_num_seqs": "8",
        "max_model_len": "2048",
    }
    assert ADAPTERS["llamacpp"].read_props({}) == {}


def test_launch_spec(tmp_path, monkeypatch):
    gguf = tmp_path / "model.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.delenv("LLM_COMPARE_LLAMACPP", raising=False)
    cls = ADAPTERS["llamacpp"]
    spec = cls.launch_spec(ModelSource(str(tmp_path), "served"), Variant(), 8123, workdir=tmp_path, gpu=False)
    cmd = spec.command
    assert cmd[:2] == ["llama-server", "--model"] and cmd[2] == str(gguf)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--parallel") + 1] == str(DEFAULT_SLOTS)
    assert cmd[cmd.index("--kv-unified-per-slot") + 1] == "1024"
    assert "--metrics" in cmd and cmd[cmd.index("--alias") + 1] == "served"
    assert int(cmd[cmd.index("--threads") + 1]) >= 1
    assert spec.health_path == "/health"
    assert spec.container_args[:2] == ["--model", "/models/model.Q8_0.gguf"]
    assert spec.volumes == {str(tmp_path.resolve()): {"bind": "/models", "mode": "ro"}}
    # the variant's batch is its slots; the model's length the context of each
    spec = cls.launch_spec(
        ModelSource(str(gguf), "s", max_model_len=512),
        Variant.parse("batch=3"),
        1,
        workdir=tmp_path,
        gpu=False,
        executable="/opt/llama-server",
    )
    assert spec.command[0] == "/opt/llama-server"
    assert spec.command[spec.command.index("--parallel") + 1] == "3"
    assert spec.command[spec.command.index("--kv-unified-per-slot") + 1] == "512"
    monkeypatch.setenv("LLM_COMPARE_LLAMACPP", "/env/llama-server")
    assert (
        cls.launch_spec(ModelSource(str(gguf), "s"), Variant(), 1, workdir=tmp_path, gpu=False).command[0]
        == "/env/llama-server"
    )


def test_variants_it_cannot_express(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    cls = ADAPTERS["llamacpp"]
    for text in ("graphs", "graphs=1/2", "block=32"):
        with pytest.raises(LaunchSpecError):
            cls.launch_spec(ModelSource(str(gguf), "s"), Variant.parse(text), 1, workdir=tmp_path, gpu=False)
    source = ModelSource(str(gguf), "s")
    spec = cls.launch_spec(source, Variant.parse("eager"), 1, workdir=tmp_path, gpu=False)
    assert spec.notes and "no CUDA graphs" in spec.notes[0]


def test_the_gguf_it_serves(tmp_path):
    with pytest.raises(LaunchSpecError, match="GGUF"):
        find_gguf(str(tmp_path))  # a directory without one
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    assert find_gguf(str(tmp_path)) == tmp_path / "a.gguf"
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(LaunchSpecError, match="several"):
        find_gguf(str(tmp_path))
    with pytest.raises(LaunchSpecError):
        find_gguf(str(tmp_path / "missing.gguf"))


def test_the_builtin_checkpoint_serves_its_gguf(smollm2_dir):
    gguf = find_gguf(str(smollm2_dir))
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and gguf.read_bytes()[:4] == b"GGUF"
