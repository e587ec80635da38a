"""The `compare run` command line itself: wrong options fail before any work (exit 2, one message, no run
directory), signals stop a run whatever its parent did, and every documented form parses."""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest
from compare_cli import ROOT, compare_cmd, compare_env
from typer.testing import CliRunner

import compare.cli as cli
from compare.cli import app
from workloads.scripted_server import ScriptedSchedule, scripted_server

runner = CliRunner()


@pytest.fixture
def no_work(monkeypatch):
    """A run that gets past the checks fails the test at once instead of preparing a model."""

    def started(*_args, **_kwargs):
        raise AssertionError("the run started its work")

    monkeypatch.setattr(cli, "execute", started)


def _files(tmp_path):
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text("[]")
    bad_keys = tmp_path / "bad-keys.yaml"
    bad_keys.write_text("backends: [reference]\nnum_request: 5\n")
    bad_workload = tmp_path / "bad-workload.yaml"
    bad_workload.write_text("workloads: [{dataset: random, input_length: 5}]\n")
    bad_value = tmp_path / "bad-value.yaml"
    bad_value.write_text("num_requests: many\n")
    return {
        "SHAREGPT": str(sharegpt),
        "MISSING": str(tmp_path / "missing.json"),
        "BAD_KEYS": str(bad_keys),
        "BAD_WORKLOAD": str(bad_workload),
        "BAD_VALUE": str(bad_value),
    }


BAD_RUNS = [
    (["--input-len", "-5"], "--input-len"),
    (["--input-len", "zipf:3"], "cannot read length"),
    (["--output-len", "uniform:9:3"], "LOW <= HIGH"),
    (["--dataset", "sharegpt"], "needs --dataset-path"),
    (["--dataset", "sharegpt", "--dataset-path", "MISSING"], "no such file"),
    (["--dataset", "jsonl", "--dataset-path", "MISSING"], "no such file"),
    (["--dataset-path", "SHAREGPT"], "makes its own prompts"),
    (["--dataset", "fixed", "--dataset-path", "SHAREGPT"], "makes its own prompts"),
    (["--dataset", "fixed", "--input-len", "64"], "does not apply"),
    (["--dataset", "sharegpt", "--dataset-path", "SHAREGPT", "--output-len", "64"], "does not apply"),
    (["--dataset", "wiki"], "unknown dataset"),
    (["--slo", "ttft=fast"], "cannot read duration"),
    (["--slo", "latency=1s"], "unknown SLO"),
    (["--slo", "ttft=0"], "must be > 0"),
    (["--concurrency", "0"], "concurrency must be >= 1"),
    (["--concurrency", "1.5"], "numbers"),
    (["--rate", "0"], "rate must be > 0"),
    (["--rate", "fast"], "numbers"),
    (["--rate", "2", "--arrival", "bursty"], "unknown --arrival"),
    (["--rate", "2", "--arrival", "gamma", "--burstiness", "0"], "--burstiness must be > 0"),
    (["--rate", "2", "--max-concurrency", "0"], "--max-concurrency must be >= 1"),
    (["--num-requests", "-1"], "--num-requests must be >= 1"),
    (["--duration", "soon"], "cannot read duration"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--request-timeout", "0"], "--request-timeout must be > 0"),
    (["--gpu-price", "-2"], "--gpu-price must be > 0"),
    (["--pin", "on"], "unknown --pin"),
    (["--launch", "kubernetes"], "unknown --launch"),
    (["--backends", "nosuch"], "unknown backend"),
    (["--backends", "openai"], "cannot start it"),
    (["--backends", "reference:turbo"], "unknown variant"),
    (["--endpoint", "vllm=http://127.0.0.1:9"], "not in --backends"),
    (["--endpoint", "vllm"], "NAME=URL"),
    (["--model", "MISSING"], "no such file"),
    (["--ray-cells"], "needs --ray"),
    (["--ray-actors", "2"], "needs --ray"),
    (["-c", "MISSING"], "run file not found"),
    (["-c", "BAD_KEYS"], "unknown keys num_request"),
    (["-c", "BAD_WORKLOAD"], "unknown keys input_length"),
    (["-c", "BAD_VALUE"], "--num-requests must be a whole number"),
]


@pytest.mark.parametrize("args, message", BAD_RUNS, ids=[" ".join(a) for a, _ in BAD_RUNS])
def test_wrong_options_fail_before_any_work(args, message, tmp_path, no_work):
    files = _files(tmp_path)
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", *[files.get(a, a) for a in args], "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.output.lower().count("error") == 1, result.output
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [["--input-len", "-5"], ["--dataset", "sharegpt"], ["--dataset-path", "README.md"]],
    ids=["negative length", "no dataset path", "path with random"],
)
def test_as_users_run_it_exit_2_without_a_run_directory(args, tmp_path):
    """A fresh interpreter with the built-in defaults: the error comes before the model is prepared."""
    out = tmp_path / "run"
    proc = subprocess.run(
        compare_cmd("run", *args, "--out", str(out)),
        env=compare_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert output.lower().count("error") == 1 and "built-in model" not in output, output
    assert not out.exists()


def test_a_failure_during_the_run_is_printed_once(tmp_path):
    """A tokenizer that cannot be loaded fails the run (exit 1); its error is not repeated as a warning."""
    empty = tmp_path / "tokenizer"
    empty.mkdir()
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "run",
            "--backends",
            "vllm",
            "--endpoint",
            "vllm=http://127.0.0.1:9",
            "--tokenizer",
            str(empty),
            "--n-boot",
            "10",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 1, result.output
    assert result.output.count("cannot load the tokenizer") == 1, result.output
    assert (out / "manifest.json").is_file()


# -- signals ------------------------------------------------------------------------------------------------

BACKGROUND_RUN = """
"$@" > "$LOG" 2>&1 &
pid=$!
for _ in $(seq 1200); do [ -s "$OUT/requests.jsonl" ] && break; sleep 0.1; done
[ -s "$OUT/requests.jsonl" ] || { kill -9 $pid; exit 99; }
kill -s "$SIG" $pid
wait $pid
"""


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize("sig", ["TERM", "INT"])
def test_a_background_run_stops_on_kill_with_a_partial_report(sig, llama_dir, tmp_path):
    """`compare run ... &` from a script, then `kill`: the shell started it with SIGINT ignored, yet both
    signals stop it as Ctrl-C does (exit 130, in-flight requests cancelled, a partial report). The kill
    comes once a request has finished, never after a fixed sleep."""
    out, log = tmp_path / "run", tmp_path / "run.log"
    slow = ScriptedSchedule(ttft_s=0.02, itl_s=0.02)  # one second per 50-token request
    with scripted_server(flavor="vllm", default_schedule=slow) as server:
        command = compare_cmd(
            "run",
            "--backends",
            "vllm",
            "--endpoint",
            f"vllm={server.url}",
            "--model",
            "scripted-model",
            "--tokenizer",
            str(llama_dir),
            "--concurrency",
            "2",
            "--num-requests",
            "400",
            "--input-len",
            "16",
            "--output-len",
            "50",
            "--warmup",
            "0",
            "--n-boot",
            "50",
            "--out",
            str(out),
        )
        env = compare_env() | {"OUT": str(out), "LOG": str(log), "SIG": sig}
        proc = subprocess.run(
            ["bash", "-c", BACKGROUND_RUN, "bash", *command], env=env, timeout=300, cwd=ROOT
        )
    output = log.read_text()
    assert proc.returncode == 130, output[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    row = pd.read_csv(out / "summary.csv").iloc[0]
    assert row["requests_ok"] >= 1 and row["requests_cancelled"] >= 1 and bool(row["interrupted"])
    assert row["requests"] < 400
    assert "**interrupted**" in (out / "report.md").read_text()
