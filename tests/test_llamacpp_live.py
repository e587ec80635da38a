"""The real llama.cpp `llama-server` on loopback, serving the built-in SmolLM2-135M Q4_1 GGUF as `compare`
launches it: every request recorded, token counts equal to its own usage, load points at several
concurrencies with no failure (it closes keep-alive connections after a stream: the load generator's
stale-connection retry), a client that hangs up mid-stream, its start-up phases and settings, and
`compare run` end to end. Skipped, saying why, where no llama-server is found (`.ci/install_llamacpp.sh DIR`
builds one; `LLM_COMPARE_LLAMACPP` names it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from transformers import AutoTokenizer

from adapters import ADAPTERS, get_adapter
from adapters.launch_spec import ModelSource, Variant
from adapters.prometheus import common_metrics
from compare.launch.launcher import ProcessLauncher, ServerProcess, free_port
from workloads.datasets import random_dataset
from workloads.loadgen import PointJob, run_load_sync
from workloads.records import read_records
from workloads.schedule import ClosedLoop

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[1]
SLOTS = 4


@pytest.fixture(scope="session")
def llamacpp_bin() -> str:
    path = os.environ.get("LLM_COMPARE_LLAMACPP") or shutil.which("llama-server")
    if not path or not Path(path).is_file():
        pytest.skip(
            "no llama-server: LLM_COMPARE_LLAMACPP names none and none is on the PATH "
            "(.ci/install_llamacpp.sh DIR builds it; .ci/run does)"
        )
    return path


def launcher_for(llamacpp_bin: str, checkpoint: Path, log_dir: Path, slots: int = SLOTS) -> ProcessLauncher:
    """llama-server as `compare run --launch process` starts it (the adapter's launch spec)."""
    port = free_port()
    source = ModelSource(str(checkpoint), "smollm2")
    spec = ADAPTERS["llamacpp"].launch_spec(
        source, Variant(max_num_seqs=slots), port, workdir=log_dir, gpu=False, executable=llamacpp_bin
    )
    log = log_dir / f"llamacpp-{port}.log"
    return ProcessLauncher(
        "llamacpp",
        "",
        ServerProcess(spec.command, spec.env),
        f"http://127.0.0.1:{port}",
        spec.health_path,
        log,
        startup_timeout=300,
    )


@pytest.fixture(scope="module")
def llamacpp(llamacpp_bin, smollm2_dir, tmp_path_factory):
    launcher = launcher_for(llamacpp_bin, smollm2_dir, tmp_path_factory.mktemp("llamacpp"))
    with launcher:
        launcher.start()
        yield launcher


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def check_records(records, specs):
    wanted = {s.request_id: s.wanted_output_tokens for s in specs}
    assert len(records) == len(specs)
    for r in records:
        assert r.error_kind is None, (r.request_id, r.error_kind, r.error_message)
        # ignore_eos: exactly the length asked for, by its own usage and by the events' counts
        assert r.output_tokens == r.usage_completion_tokens == wanted[r.request_id]
        assert sum(e[1] for e in r.events) == r.usage_completion_tokens
        assert r.server_timings is not None and r.server_timings["predicted_n"] == r.usage_completion_tokens
        assert r.send_s <= r.headers_s <= r.events[0][0] <= r.end_s


@pytest.mark.parametrize("adapter_name", ["llamacpp", "llamacpp-chat"])
def test_streams_and_usage(llamacpp, tokenizer, adapter_name, tmp_path):
    specs = random_dataset(tokenizer, 6, "uniform:8:64", "uniform:4:24", seed=3)
    adapter = get_adapter(adapter_name, model="smollm2")
    records = run_load_sync(
        PointJob(
            llamacpp.url,
            adapter,
            specs,
            ClosedLoop(2),
            tokenizer=tokenizer,
            output_path=tmp_path / "requests.jsonl",
        )
    )
    check_records(records, specs)
    assert read_records(tmp_path / "requests.jsonl") == records
    by_id = {s.request_id: s for s in specs}
    for r in records:
        if adapter_name == "llamacpp":  # the prompt as sent, no BOS added
            assert r.usage_prompt_tokens == by_id[r.request_id].prompt_len
        else:  # wrapped in the GGUF's chat template
            assert r.usage_prompt_tokens > by_id[r.request_id].prompt_len


def test_load_points_at_several_concurrencies(llamacpp, tokenizer):
    """c=1, 2 and 4 on one server (slots: 4): no request fails, though the server closes each keep-alive
    connection after its stream and the pool hands those out again (sent once more, and recorded so)."""
    adapter = get_adapter("llamacpp", model="smollm2")
    before = common_metrics(requests.get(llamacpp.url + "/metrics", timeout=10).text, adapter.metric_names)
    total = 0
    for c in (1, 2, 4):
        specs = random_dataset(tokenizer, 2 * c + 2, "uniform:16:48", "uniform:4:12", seed=10 + c)
        records = run_load_sync(PointJob(llamacpp.url, adapter, specs, ClosedLoop(c), tokenizer=tokenizer))
        check_records(records, specs)
        total += sum(s.wanted_output_tokens for s in specs)
        for r in records:
            if r.stale_retry_s is not None:
                assert r.start_s <= r.stale_retry_s <= r.send_s
    after = common_metrics(requests.get(llamacpp.url + "/metrics", timeout=10).text, adapter.metric_names)
    # its metrics, mapped: every token we counted, nothing left running
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == total
    assert after["requests_running"] == 0 and after["decode_steps_total"] > before["decode_steps_total"]


def _busy_slots(url: str) -> int:
    return sum(bool(s.get("is_processing")) for s in requests.get(url + "/slots", timeout=10).json())


def test_a_client_hanging_up_mid_stream(llamacpp, tokenizer):
    """A client that closes its connection after a few tokens of a long answer: the server stops that
    request (its slot frees) and goes on serving."""
    body = {
        "prompt": "Once upon a time",
        "max_tokens": 900,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    with requests.post(llamacpp.url + "/v1/completions", json=body, stream=True, timeout=60) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        seen = 0
        for line in lines:
            seen += line.startswith(b"data: {")
            if seen == 3:
                break
        assert _busy_slots(llamacpp.url) == 1  # still generating when we hang up
    deadline = time.monotonic() + 120  # a bound, not a measurement: it stops at its next token
    while _busy_slots(llamacpp.url) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _busy_slots(llamacpp.url) == 0
    specs = random_dataset(tokenizer, 2, "uniform:8:16", "uniform:4:8", seed=5)
    check_records(run_load_sync(PointJob(llamacpp.url, get_adapter("llamacpp"), specs, ClosedLoop(2))), specs)


def test_launch_measures_its_setup(llamacpp):
    """The set-up report of the launch: ready, phases from its log on the launch's time line, memory."""
    report = llamacpp.report
    assert report.ready_s is not None and report.ready_s > 0
    phases = {p.name: p for p in report.phases}
    for name in ("weights", "kv_cache", "warmup"):
        assert phases[name].seconds > 0, report.phases
        assert 0 < phases[name].end_s <= report.ready_s + 1.0  # placed by its own clock, before ready
    assert report.memory["weights"] > 50 * 2**20 and report.memory["kv_cache"] > 0
    assert report.memory["kv_tokens"] == SLOTS * 1024
    settings = report.log_settings
    assert settings["quantization"] == "q4_1" and settings["max_num_seqs"] == str(SLOTS)
    assert settings["max_model_len"] == "1024"
    props = ADAPTERS["llamacpp"].read_props(requests.get(llamacpp.url + "/props", timeout=10).json())
    assert props == {
        "dtype": "q4_1",
        "quantization": "q4_1",
        "max_num_seqs": str(SLOTS),
        "max_model_len": "1024",
    }


def run_compare(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "compare.cli", "run", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_compare_run_launches_llamacpp(llamacpp_bin, smollm2_dir, tmp_path):
    """`compare run --backends llamacpp` as users run it: launched as a process on the built-in model's GGUF,
    measured, stopped; its parity column says Q4_1 and its slots."""
    import pandas as pd

    out = tmp_path / "run"
    run_compare(
        "--backends",
        "llamacpp",
        "--llamacpp-bin",
        llamacpp_bin,
        "--dataset",
        "random",
        "--input-len",
        "32",
        "--output-len",
        "8",
        "--concurrency",
        "1,2",
        "--num-requests",
        "4",
        "--out",
        str(out),
        env={},
    )
    records = [r for r in read_records(out / "requests.jsonl") if not r.warmup]
    assert len(records) == 8 and all(r.error_kind is None for r in records)
    assert all(r.output_tokens == r.usage_completion_tokens == 8 for r in records)
    summary = pd.read_csv(out / "summary.csv")
    assert (summary["requests_ok"] == 4).all() and (summary["requests_failed"] == 0).all()
    report = (out / "report.md").read_text()
    parity = report.split("## Parity of the backends", 1)[1].split("\n## ", 1)[0]
    assert "| quantisation | q4_1 (log) |" in parity and "| max concurrent sequences | 64 (log) |" in parity
    assert "weights" in report and "warmup" in report
    [setup] = json.loads((out / "manifest.json").read_text())["setups"]
    assert setup["command"][0] == llamacpp_bin and setup["exit_code"] is not None  # started, and stopped
    assert {p["name"] for p in setup["phases"]} >= {"weights", "kv_cache", "warmup"}


def test_default_run_compares_reference_with_llamacpp(llamacpp_bin, smollm2_dir, tmp_path):
    """`compare run` with no backend and llama-server found: the reference engine against llama.cpp on the
    built-in model, both launched here, and the report says why they were chosen."""
    out = tmp_path / "run"
    run_compare(
        "--concurrency",
        "1",
        "--num-requests",
        "3",
        "--input-len",
        "32",
        "--output-len",
        "8",
        "--out",
        str(out),
        env={"LLM_COMPARE_LLAMACPP": llamacpp_bin, "LLM_COMPARE_VLLM": ""},
    )
    records = [r for r in read_records(out / "requests.jsonl") if not r.warmup]
    assert sorted({r.backend for r in records}) == ["llamacpp", "reference"]
    assert all(r.error_kind is None for r in records) and len(records) == 6
    report = (out / "report.md").read_text()
    assert "llama-server was found" in report
    parity = report.split("## Parity of the backends", 1)[1].split("\n## ", 1)[0]
    assert "q4_1" in parity and "float32" in parity
