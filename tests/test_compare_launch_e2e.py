"""`compare run --launch process|docker` end to end, as users run it (a subprocess of the CLI): servers
started, timed and measured, set-up reports and results written, the set-up-against-latency section computed
from those reports, and nothing left running after a Ctrl-C, whenever it comes."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from compare_cli import ROOT, compare_cmd, compare_env, run_compare

pytestmark = [pytest.mark.live, pytest.mark.slow]

SMALL = [
    "--concurrency",
    "1",
    "--num-requests",
    "4",
    "--input-len",
    "16",
    "--output-len",
    "8",
    "--n-boot",
    "100",
]


def setups(out: Path) -> dict[str, dict]:
    return {s["backend"]: s for s in json.loads((out / "manifest.json").read_text())["setups"]}


def test_launch_docker_runs_the_reference_container(docker_client, reference_image, llama_dir, tmp_path):
    out = tmp_path / "run"
    run_compare(
        "run",
        "--launch",
        "docker",
        "--image",
        f"reference={reference_image.id}",
        "--backends",
        "reference",
        "--model",
        str(llama_dir),
        *SMALL,
        "--out",
        str(out),
    )
    setup = setups(out)["reference"]
    assert setup["launcher"] == "docker" and setup["image"] == reference_image.id and setup["exit_code"] == 0
    assert [p["name"] for p in setup["phases"]][:2] == ["container_start", "process_start"]
    assert {"weights", "kv_cache", "server_ready"} <= {p["name"] for p in setup["phases"]}
    assert 0 < setup["cold_first_token_s"] < setup["ready_s"]
    session = setup["labels"]["llm-compare.session"]
    assert docker_client.containers.list(all=True, filters={"label": f"llm-compare.session={session}"}) == []
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["requests_ok"]) == [4]
    report = (out / "report.md").read_text()
    assert "| reference:eager | docker |" in report
    assert "server stopped" in (out / "logs" / "reference-eager.log").read_text()


@pytest.mark.parametrize("when", ["start-up", "load"])
def test_ctrl_c_removes_the_container(docker_client, reference_image, llama_dir, tmp_path, when):
    """SIGINT while the container is still starting, and while the load runs: exit 130, a partial report, and
    no container left with the launch's session label."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        compare_cmd(
            "run",
            "--launch",
            "docker",
            "--image",
            f"reference={reference_image.id}",
            "--backends",
            "reference",
            "--model",
            str(llama_dir),
            "--concurrency",
            "2",
            "--num-requests",
            "200",
            "--input-len",
            "16",
            "--output-len",
            "200",
            "--warmup",
            "0",
            "--n-boot",
            "100",
            "--out",
            str(out),
        ),
        env=compare_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        log = out / "logs" / "reference-eager.log"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if when == "start-up" and log.exists():
                break
            path = out / "requests.jsonl"
            if when == "load" and path.exists() and len(path.read_text().splitlines()) >= 2:
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.05)
        else:
            pytest.fail(f"the run did not reach its {when} within 120 s")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-3000:]
    setup = setups(out)["reference"]
    if when == "start-up":
        assert setup["ready_s"] is None  # interrupted before it was healthy
    assert setup["container_id"]
    session = setup["labels"]["llm-compare.session"]
    assert docker_client.containers.list(all=True, filters={"label": f"llm-compare.session={session}"}) == []
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    assert (out / "report.md").exists()


def test_launch_process_runs_real_vllm_and_ours_and_weighs_set_up_against_latency(
    vllm_bin, llama_dir, tmp_path
):
    """The real vLLM (its CPU build) started by `compare run`, its phases read from its own log, beside our
    server; the break-even table is computed from the two set-up reports."""
    out = tmp_path / "run"
    run_compare(
        "run",
        "--launch",
        "process",
        "--vllm-bin",
        vllm_bin,
        "--backends",
        "vllm,reference",
        "--model",
        str(llama_dir),
        *SMALL,
        "--out",
        str(out),
        timeout=400,
    )
    by_backend = setups(out)
    vllm, ours = by_backend["vllm"], by_backend["reference"]
    assert vllm["command"][:2] == [vllm_bin, "serve"] and "--enforce-eager" in vllm["command"]
    phases = {p["name"]: p for p in vllm["phases"]}
    assert {"process_start", "model_init", "weights", "init_engine", "server_ready"} <= set(phases)
    assert phases["init_engine"]["seconds"] > 0 and phases["server_ready"]["end_s"] <= vllm["ready_s"] + 1.0
    assert vllm["memory"]["kv_cache"] == 2**30 and vllm["memory"]["kv_tokens"] > 0
    assert (vllm["device"], vllm["dtype"]) == ("cpu", "float32")
    assert vllm["memory"]["peak_rss"] > ours["memory"]["peak_rss"]  # API server, engine core and worker
    for setup in (vllm, ours):
        assert setup["exit_code"] is not None and 0 < setup["cold_first_token_s"] < 30
        proc = Path(f"/proc/{setup['pid']}")
        assert not proc.exists() or "Z" in (proc / "stat").read_text()
    report = (out / "report.md").read_text()
    section = report.split("## Set-up cost against latency", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| random-16x8")]
    assert len(rows) == 2  # interactive and batch
    ready = {"vllm": vllm["ready_s"], "reference:eager": ours["ready_s"]}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        fast, slow, readies = cells[2], cells[3], cells[4]
        assert readies == f"{ready[fast]:.1f} / {ready[slow]:.1f}"
        assert re.match(r"(immediately|after [\d,]+ requests|never)", cells[6]), cells[6]
    assert "cold first token" in report
