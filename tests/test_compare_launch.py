"""Launching: start-up log parsing per backend, and a process launcher that always tears down."""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from compare.common.datatypes import SetupReport
from compare.launch.launcher import LaunchError, ProcessLauncher, ServerProcess, free_port
from compare.launch.setup_log import apply_log, parse_log

DATA = Path(__file__).parent / "data"

REFERENCE_LOG = "\n".join(
    [
        "2025-03-01 12:00:01,000 INFO reference_engine.server: starting llm-compare reference"
        " server 0.1.0, model m",
        "2025-03-01 12:00:02,000 INFO reference_engine: model m resolved, tokenizer loaded in 0.980 s",
        "2025-03-01 12:00:03,800 INFO reference_engine: weights loaded: 0.501 GiB, torch.float32"
        " on cpu in 1.783 s",
        "2025-03-01 12:00:07,100 INFO reference_engine: KV cache allocated: 1456 blocks of 16"
        " tokens, 1.000 GiB in 3.327 s",
        "2025-03-01 12:00:09,000 INFO reference_engine: CUDA graphs captured: 4 buckets [1, 2, 4,"
        " 8], pool 0.250 GiB in 1.900 s",
        "2025-03-01 12:00:09,600 INFO reference_engine: CUDA graphs for steps with prompt tokens: 429 pieces"
        " over token counts [16, 32, 1024], pool 0.145 GiB in 0.600 s",
        "2025-03-01 12:00:09,700 INFO reference_engine.server: server ready at"
        " http://127.0.0.1:8000 in 6.097 s",
        "",
    ]
)


def test_reference_log_phases_memory_and_offsets():
    parsed = parse_log("reference", REFERENCE_LOG)
    assert [p.name for p in parsed.phases] == [
        "tokenizer",
        "weights",
        "kv_cache",
        "cuda_graphs",
        "server_ready",
    ]
    assert [p.seconds for p in parsed.phases[:4]] == [0.980, 1.783, 3.327, 2.5]  # decode + piecewise capture
    assert parsed.memory["weights"] == pytest.approx(0.501 * 2**30)
    assert parsed.memory["kv_cache"] == 2**30 and parsed.memory["kv_tokens"] == 1456 * 16
    assert parsed.memory["graph_pool"] == pytest.approx((0.25 + 0.145) * 2**30)  # the two pools add
    assert (parsed.device, parsed.dtype, parsed.server_ready_s) == ("cpu", "float32", 6.097)
    spawned = datetime(2025, 3, 1, 12, 0, 0).timestamp()
    report = SetupReport("reference", "graphs", "process", "http://x", spawned_at=spawned)
    apply_log(report, parsed)
    phases = {p.name: p for p in report.phases}
    assert phases["process_start"].seconds == pytest.approx(1.0)  # spawn to the first log line
    assert phases["weights"].end_s == pytest.approx(3.8)
    assert phases["kv_cache"].end_s == pytest.approx(7.1)
    assert phases["cuda_graphs"].end_s == pytest.approx(9.6)


def test_a_phase_that_ran_beside_others_says_so_in_the_set_up_line():
    """The front end's tokenizer loads while the engine core loads its weights (the log's clock shows both
    running at once): the set-up line must not read as a sum of sequential phases."""
    from compare.analysis.selection import describe_setup

    clock = "2025-03-01 12:00:0"
    log = "\n".join(
        [
            f"{clock}1,000 INFO reference_engine.server: "
            "starting llm-compare reference server 0.1.0, model m",
            f"{clock}5,000 INFO reference_engine.server: tokenizer loaded in 3.900 s",
            f"{clock}6,000 INFO reference_engine: weights loaded: 0.501 GiB, torch.float32 on cpu in 4.200 s",
            f"{clock}7,000 INFO reference_engine: KV cache allocated: 1456 blocks of 16 tokens, 1.000 GiB"
            " in 0.900 s",
            "",
        ]
    )
    report = SetupReport(
        "reference",
        "graphs",
        "process",
        "http://x",
        spawned_at=datetime(2025, 3, 1, 12, 0, 0).timestamp(),
        ready_s=7.2,
    )
    apply_log(report, parse_log("reference", log))
    line = describe_setup(report)
    assert "tokenizer 3.9 s (beside weights), weights 4.2 s, kv_cache 0.9 s)" in line
    assert "process_start 1.0 s," in line and "process_start 1.0 s (beside" not in line  # before: sequential


def test_every_chat_and_protocol_variant_reads_its_servers_log():
    """One place holds each server's log knowledge: the chat and TGI-protocol adapters of a server read the
    same lines as its main adapter."""
    assert parse_log("reference-tgi", REFERENCE_LOG).memory == parse_log("reference", REFERENCE_LOG).memory
    text = (DATA / "vllm_h200_startup.log").read_text()
    assert parse_log("vllm-chat", text) == parse_log("vllm", text)
    text = (DATA / "tgi_2x_startup.log").read_text()
    assert parse_log("tgi-openai", text) == parse_log("tgi", text)


def test_vllm_h200_log_with_compile_and_graphs():
    """vLLM 0.26 on an H200, recorded: the real line is `torch.compile took 21.78 s in total`."""
    near = datetime(2025, 11, 29, 17, 0).timestamp()
    parsed = parse_log("vllm", (DATA / "vllm_h200_startup.log").read_text(), near=near)
    got = {p.name: p.seconds for p in parsed.phases}
    assert got == {
        "model_load": pytest.approx(1.96157),
        "compile": 21.78,
        "profile": 0.75,
        "cuda_graphs": 2.0,
        "init_engine": 41.59,
    }
    assert parsed.memory == {
        "weights": pytest.approx(12.55 * 2**30),
        "kv_cache": pytest.approx(104.58 * 2**30),
        "kv_tokens": 214176,
        "graph_pool": pytest.approx(0.24 * 2**30),
    }
    assert datetime.fromtimestamp(parsed.first_line_epoch) == datetime(2025, 11, 29, 17, 24, 45)


def test_a_yearless_clock_takes_the_year_of_the_launch():
    """vLLM stamps `MM-DD hh:mm:ss`: a log of 31 December read on 1 January belongs to the year before."""
    line = "INFO 12-31 23:59:58 [core.py:1] init engine (profile, create kv cache, warmup model) took 1.0 s"
    parsed = parse_log("vllm", line, near=datetime(2026, 1, 1, 0, 0, 5).timestamp())
    assert datetime.fromtimestamp(parsed.first_line_epoch) == datetime(2025, 12, 31, 23, 59, 58)


def test_unknown_or_generic_backend_log_parses_to_nothing():
    for backend in ("openai", "no-such-backend"):
        parsed = parse_log(backend, "anything")
        assert parsed.phases == [] and parsed.memory == {}


def test_launch_failure_quotes_the_log(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('cannot load the model: boom', flush=True); sys.exit(3)"]
    launcher = ProcessLauncher(
        "reference",
        "eager",
        ServerProcess(cmd),
        "http://127.0.0.1:9",
        "/health",
        tmp_path / "a.log",
        startup_timeout=30,
    )
    with pytest.raises(LaunchError, match="exited with code 3") as info:
        launcher.start()
    assert "boom" in str(info.value)
    assert launcher.report.exit_code == 3


@pytest.mark.timing
def test_startup_timeout_stops_the_server(tmp_path):
    cmd = [sys.executable, "-c", "import time; print('warming up forever', flush=True); time.sleep(120)"]
    launcher = ProcessLauncher(
        "reference",
        "eager",
        ServerProcess(cmd),
        "http://127.0.0.1:9",
        "/health",
        tmp_path / "b.log",
        startup_timeout=1.5,
    )
    with pytest.raises(LaunchError, match="not healthy") as info:
        launcher.start()
    assert "warming up forever" in str(info.value)
    assert launcher.proc.poll() is not None


@pytest.mark.timing
def test_teardown_on_interrupt_kills_the_whole_process_group(tmp_path):
    """A server that starts a helper of its own: Ctrl-C in the middle of the run stops both."""
    port = free_port()
    pid_file = tmp_path / "helper.pid"
    script = (
        f"import subprocess, sys, http.server; h = subprocess.Popen([sys.executable, '-c', "
        f"'import time; time.sleep(300)']); open({str(pid_file)!r}, 'w').write(str(h.pid)); "
        f"http.server.ThreadingHTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler)"
        f".serve_forever()"
    )
    launcher = ProcessLauncher(
        "reference",
        "eager",
        ServerProcess([sys.executable, "-c", script]),
        f"http://127.0.0.1:{port}",
        "/",
        tmp_path / "c.log",
        startup_timeout=30,
        stop_timeout=5,
    )
    with pytest.raises(KeyboardInterrupt), launcher:
        report = launcher.start()
        assert report.ready_s is not None and report.ready_s > 0
        raise KeyboardInterrupt
    assert launcher.proc.poll() is not None
    helper = int(pid_file.read_text())
    deadline = time.monotonic() + 30  # it goes at once; a loaded machine may take a while to reap it
    while alive(helper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(helper)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_vllm_cpu_serve_log_recorded_from_a_real_start():
    """tests/data/vllm_cpu_serve.log: `vllm serve` of SmolLM2 on this CPU, as the project recorded it."""
    text = (DATA / "vllm_cpu_serve.log").read_text()
    parsed = parse_log("vllm", text, near=datetime(2025, 11, 29, 16, 0).timestamp())
    got = {p.name: p.seconds for p in parsed.phases}
    assert got == {"model_init": 0.096251, "weights": 0.29, "init_engine": 1.75, "server_ready": 0.0}
    assert parsed.memory == {"weights": pytest.approx(0.5 * 2**30), "kv_cache": 2**30, "kv_tokens": 23296}
    assert (parsed.device, parsed.dtype) == ("cpu", "float32")
    first = datetime.fromtimestamp(parsed.first_line_epoch)
    report = SetupReport("vllm", "", "process", "http://x", spawned_at=first.timestamp())
    apply_log(report, parsed)
    ends = {p.name: p.end_s for p in report.phases}
    # first line 16:23:28, weights logged 16:23:48, engine ready 16:23:50, server listening 16:23:52
    assert ends["weights"] == pytest.approx(20) and ends["init_engine"] == pytest.approx(22)
    assert ends["server_ready"] == pytest.approx(24)


def test_device_memory_at_ready_is_read_with_nvidia_smi(tmp_path, monkeypatch):
    """There is no GPU here: a stand-in `nvidia-smi` on PATH answers as the real one does to the query the
    launcher makes (1000 MiB in use on GPU 0 before the spawn, 3048 MiB at ready; GPU 1 is hidden by
    CUDA_VISIBLE_DEVICES)."""
    calls = tmp_path / "calls"
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "--query-gpu=index,memory.used" ] || exit 9\n'
        f"echo x >> {calls}\n"
        f'if [ "$(wc -l < {calls})" -le 1 ]; then echo "0, 1000"; else echo "0, 3048"; fi\n'
        'echo "1, 5"\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    port = free_port()
    server = [
        sys.executable,
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(tmp_path),
    ]
    launcher = ProcessLauncher(
        "reference", "eager", ServerProcess(server), f"http://127.0.0.1:{port}", "/", tmp_path / "d.log", 30
    )
    with launcher:
        report = launcher.start()
    assert report.memory["device_used"] == (3048 - 1000) * 2**20
    assert "nvidia-smi on GPU 0: 2.98 GiB in use at ready, 0.98 GiB before the launch" in report.notes[0]


def test_a_server_that_is_healthy_but_cannot_generate_is_not_ready(tmp_path):
    """vLLM's CPU build answers /health for a model its kernels refuse; the first request is what tells."""
    from adapters import get_adapter
    from adapters.request_spec import RequestSpec
    from compare.launch.backend_launch import measure_cold_first_token

    port = free_port()
    server = [
        sys.executable,
        "-m",
        "http.server",
        str(port),
        "--bind",
        "127.0.0.1",
        "--directory",
        str(tmp_path),
    ]
    launcher = ProcessLauncher(
        "vllm", "", ServerProcess(server), f"http://127.0.0.1:{port}", "/", tmp_path / "e.log", 30
    )
    with launcher:
        launcher.start()
        with pytest.raises(
            LaunchError, match="answered its health check, but its first request failed: HTTP 501"
        ):
            measure_cold_first_token(
                launcher, get_adapter("vllm", model="m"), RequestSpec("c", (1,), "hi", 2), 10
            )
    assert launcher.report.cold_first_token_s is None


@pytest.mark.parametrize("ours", [None, "FASTEST_FIRST"])
def test_launched_servers_number_gpus_as_nvidia_smi_does(tmp_path, monkeypatch, ours):
    """A server `compare` launches as a process numbers GPUs in PCI bus order, as nvidia-smi and NVML do, so
    the GPUs its CUDA_VISIBLE_DEVICES names are the ones memory notes and telemetry read; an order the user
    set is left as it is."""
    from compare.launch.backend_launch import make_launcher
    from compare.measure.run_dir import RunDir
    from compare.plan.build import build_plan

    if ours is None:
        monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    else:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", ours)
    plan = build_plan({"backends": "reference", "model": "random:tiny"})
    run = RunDir.create(tmp_path / "run", {"model": "random:tiny"}, ["compare", "run"])
    launcher = make_launcher(plan, plan.backends[0], run, 0, "random:tiny")
    assert launcher.gpu_env()["CUDA_DEVICE_ORDER"] == (ours or "PCI_BUS_ID")


def test_launched_servers_and_images_find_the_checkout():
    """The checkout's root, as launched servers (PYTHONPATH) and the CPU image build (docker/) need it, from
    modules that sit two packages deep in compare/."""
    from compare.launch.images import ROOT
    from compare.launch.launcher import package_env

    assert (ROOT / "docker").is_dir() and (ROOT / "pyproject.toml").is_file()
    first = Path(package_env()["PYTHONPATH"].split(os.pathsep)[0])
    assert (first / "reference_engine").is_dir() and (first / "compare").is_dir()
