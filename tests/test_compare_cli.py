"""The `compare run` command line itself: wrong options fail before any work (exit 2, one message, no run
directory), signals stop a run whatever its parent did, and every documented form parses."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from compare_cli import ROOT, compare_cmd, compare_env, run_compare
from typer.testing import CliRunner

import compare.cli as cli
from compare.cli import app
from instruments.scripted_server import ScriptedSchedule, scripted_server
from workloads.records import read_records
from workloads.schedule import TraceReplay

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
    bad_trace = tmp_path / "bad-trace.txt"
    bad_trace.write_text("0.0\n0.5\nsoon\n")
    return {
        "SHAREGPT": str(sharegpt),
        "MISSING": str(tmp_path / "missing.json"),
        "BAD_KEYS": str(bad_keys),
        "BAD_WORKLOAD": str(bad_workload),
        "BAD_VALUE": str(bad_value),
        "BAD_TRACE": str(bad_trace),
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
    (["--dataset", "prefix", "--prefix-len", "0"], "--prefix-len must be >= 1"),
    (["--dataset", "prefix", "--prefix-groups", "0"], "--prefix-groups must be >= 1"),
    (["--prefix-len", "64"], "does not apply"),
    (["--dataset", "multi-turn", "--turns", "0"], "--turns must be >= 1"),
    (["--dataset", "multi-turn", "--think-time", "soon"], "cannot read think time"),
    (["--dataset", "multi-turn", "--rate", "2"], "closed loop"),
    (["--dataset", "multi-turn", "--sweep"], "run them apart"),
    (["--dataset", "sharegpt-turns"], "needs --dataset-path"),
    (["--turns", "3"], "does not apply"),
    (["--think-time", "1"], "does not apply"),
    (["--trace", "MISSING"], "no such file"),
    (["--trace", "BAD_TRACE"], "expected a number"),
    (["--trace-scale", "2"], "needs --trace"),
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
    (["--gpu-telemetry", "on"], "unknown --gpu-telemetry"),
    (["--gpu-telemetry-interval", "0"], "--gpu-telemetry-interval must be > 0"),
    (["--launch", "kubernetes"], "unknown --launch"),
    (["--backends", "nosuch"], "unknown backend"),
    (["--backends", "openai"], "cannot start it"),
    (["--backends", "reference:turbo"], "unknown variant"),
    (["--backends", "reference", "--endpoint", "vllm=http://127.0.0.1:9"], "not in --backends"),
    (["--endpoint", "vllm"], "NAME=URL"),
    (["--model", "MISSING"], "no such file"),
    (["--ray-cells"], "needs --ray"),
    (["--ray-actors", "2"], "needs --ray"),
    (["--sweep", "--rate", "4"], "--sweep chooses the load points itself; drop --rate"),
    (["--sweep", "--concurrency", "1,8"], "drop --concurrency"),
    (["--sweep", "--sweep-points", "0"], "--sweep-points must be >= 1"),
    (["--sweep", "--sweep-spacing", "log"], "unknown --sweep-spacing"),
    (["--sweep", "--sweep-concurrency", "1"], "--sweep-concurrency must be >= 2"),
    (["--sweep", "--repeats", "2"], "give --repeats 1"),
    (["--sweep-points", "4"], "--sweep-points needs --sweep"),
    (["--capacity"], "give --slo too"),
    (["--capacity", "--slo", "ttft=1s", "--capacity-percentile", "97"], "must be one of 50, 90, 95, 99"),
    (["--capacity", "--slo", "ttft=1s", "--capacity-precision", "1.5"], "--capacity-precision must be < 1"),
    (["--capacity", "--slo", "ttft=1s", "--capacity-precision", "0"], "--capacity-precision must be > 0"),
    (["--slo", "ttft=1s", "--capacity-precision", "0.2"], "--capacity-precision needs --capacity"),
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


def _backend_args(mode: str, url: str, model_dir: str) -> list[str]:
    if mode == "launched":  # our reference server, started (and to be stopped) by the run
        return ["--backends", "reference", "--model", model_dir]
    args = [
        "--backends",
        "vllm",
        "--endpoint",
        f"vllm={url}",
        "--model",
        "scripted-model",
        "--tokenizer",
        model_dir,
    ]
    return args + (["--ray", "--ray-actors", "1"] if mode == "ray" else [])


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, mode",
    [("TERM", "endpoint"), ("INT", "endpoint"), ("TERM", "ray"), ("TERM", "launched")],
    ids=["SIGTERM", "SIGINT", "SIGTERM on Ray", "SIGTERM with a launched server"],
)
def test_a_background_run_stops_on_kill_with_a_partial_report(sig, mode, llama_dir, tmp_path):
    """`compare run ... &` from a script, then `kill`: the shell started it with SIGINT ignored, yet both
    signals stop it as Ctrl-C does (exit 130, in-flight requests cancelled, launched servers stopped, a
    partial report), on Ray too (whose start-up sets a SIGTERM handler of its own). The kill comes once a
    request has finished, never after a fixed sleep."""
    if mode == "ray":
        pytest.importorskip("ray")
    out, log = tmp_path / "run", tmp_path / "run.log"
    slow = ScriptedSchedule(ttft_s=0.02, itl_s=0.02)  # one second per 50-token request
    with scripted_server(flavor="vllm", default_schedule=slow) as server:
        command = compare_cmd(
            "run",
            *_backend_args(mode, server.url, str(llama_dir)),
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
    if mode == "launched":
        pid = manifest["setups"][0]["pid"]
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


# -- parsing and help ---------------------------------------------------------------------------------------


@pytest.fixture
def planned(monkeypatch):
    """The plan a command line builds, kept instead of run."""
    plans = []

    def keep(plan, out, n_boot=1000):
        plans.append(plan)
        return 0

    monkeypatch.setattr(cli, "execute", keep)
    return plans


RAY_FORMS = [
    (["--ray"], "local", None),
    (["--ray", "--ray-actors", "2"], "local", 2),
    (["--ray-actors", "2", "--ray"], "local", 2),
    (["--ray", "local"], "local", None),
    (["--ray", "10.0.0.5:6379", "--ray-actors", "16"], "10.0.0.5:6379", 16),
    (["--ray=auto"], "auto", None),
    (["--ray", "ray://head:10001", "--ray-cells", "--ray-cell-resources", "GPU=1"], "ray://head:10001", None),
]


@pytest.mark.parametrize("args, address, actors", RAY_FORMS, ids=[" ".join(a) for a, _, _ in RAY_FORMS])
def test_every_form_of_ray_parses(args, address, actors, planned):
    result = runner.invoke(app, ["run", *args])
    assert result.exit_code == 0, result.output
    assert (planned[0].ray, planned[0].ray_actors) == (address, actors)


def test_a_run_file_names_the_run_directory_and_the_command_line_wins(monkeypatch, tmp_path):
    dirs = []
    monkeypatch.setattr(cli, "execute", lambda plan, out, n_boot=1000: dirs.append(out) or 0)
    run_file = tmp_path / "run.yaml"
    run_file.write_text(f"backends: [reference:eager]\nout: {tmp_path / 'from-file'}\n")
    assert runner.invoke(app, ["run", "-c", str(run_file)]).exit_code == 0
    assert runner.invoke(app, ["run", "-c", str(run_file), "--out", str(tmp_path / "given")]).exit_code == 0
    assert dirs == [tmp_path / "from-file", tmp_path / "given"]
    run_file.write_text("backends: [reference:eager]\nout: [1, 2]\n")
    result = runner.invoke(app, ["run", "-c", str(run_file)])
    assert result.exit_code == 2 and "out is a directory path" in result.output


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _readme_run_commands() -> list[list[str]]:
    """Every `compare run` command line in the README's shell blocks (continuations joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", _readme(), re.S)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    commands = [shlex.split(line.split("#")[0]) for line in lines if line.strip().startswith("compare run")]
    return [[a for a in c[2:] if a != "..."] for c in commands if "--help" not in c]  # `...`: more options


def test_every_documented_run_command_parses(planned, monkeypatch, tmp_path):
    """The README's examples name files of the author's machine: only their existence is not checked."""
    monkeypatch.setattr("compare.plan.build._check_local_path", lambda *_: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("backends: [reference:eager]\nload: {concurrency: [1, 8]}\n")
    (tmp_path / "arrivals.txt").write_text("0\n0.25\n0.5\n")
    commands = _readme_run_commands()
    assert len(commands) >= 10 and [] in commands and ["--ray"] in commands
    for args in commands:
        result = runner.invoke(app, ["run", *args])
        assert result.exit_code == 0, f"compare run {shlex.join(args)}\n{result.output}"
    assert len(planned) == len(commands)


def test_help_is_whole_and_grouped():
    top = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert "import other tools' results, or try the reference engine (demo)." in " ".join(top.split())
    commands = re.findall(r"^│ (\w+) ", top.split("Commands")[1], re.M)
    assert set(commands) == {"demo", "run", "report", "diff", "import"}
    readme = _readme()
    assert all(f"compare {name}" in readme for name in commands)

    run_help = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    for panel in ("Workload", "Load", "Backends and servers", "SLO and cost", "Output", "Scale-out (Ray)"):
        assert f"─ {panel}" in run_help
    for metavar in (
        "N[,N...]",
        "R[,R...]",
        "NAME=URL",
        "NAME=IMAGE",
        "METRIC=TIME[,...]",
        "[ADDRESS]",
        "FILE",
    ):
        assert metavar in run_help
    assert "<list[str]>" not in run_help and "<str>" not in run_help
    assert "[default: reference]" in run_help and "inf sends every request at once" in run_help


def test_help_defaults_are_the_defaults():
    """A default written into a help text (`[default: X]`) is the value the option takes when not given."""
    from compare.plan.run_options import RUN_OPTIONS

    checked = 0
    for option in RUN_OPTIONS:
        written = re.search(r"\[default: ([^\]]*)\]", option.help)
        if written is None or option.default is None or isinstance(option.default, bool):
            continue
        text = written.group(1).split(",")[0] if isinstance(option.default, list) else written.group(1)
        value = option.default[0] if isinstance(option.default, list) else option.default
        try:
            assert float(text.removesuffix("s")) == float(value), option.name
        except ValueError:
            assert text == str(value), option.name
        checked += 1
    assert checked >= 10


def _scripted_run(server_url: str, tokenizer: str, out, *args: str) -> None:
    run_compare(
        "run",
        "--backends",
        "vllm",
        "--endpoint",
        f"vllm={server_url}",
        "--model",
        "scripted-model",
        "--tokenizer",
        tokenizer,
        "--warmup",
        "0",
        "--n-boot",
        "50",
        "--out",
        str(out),
        *args,
    )


@pytest.mark.live
@pytest.mark.slow
def test_a_trace_is_replayed_as_a_load_point(llama_dir, tmp_path):
    """Send times 0, 0.3, 0.6, ... s (scaled by 0.5: every 0.15 s), one JSON line with a timestamp among
    them; the requests go out on those times and the trace's end ends the point."""
    trace = tmp_path / "arrivals.txt"
    times = [100 + 0.3 * i for i in range(8)]
    trace.write_text(
        "# send times\n" + "\n".join(str(t) for t in times[:-1]) + f'\n{{"timestamp": {times[-1]}}}\n'
    )
    out = tmp_path / "run"
    with scripted_server(
        flavor="vllm", default_schedule=ScriptedSchedule(ttft_s=0.01, itl_s=0.002)
    ) as server:
        _scripted_run(
            server.url, str(llama_dir), out, "--trace", str(trace), "--trace-scale", "0.5",
            "--rate", "inf", "--num-requests", "20", "--input-len", "16", "--output-len", "8",
        )  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert [p["kind"] for p in manifest["config"]["load_points"]] == ["open", "trace"]
    records = [r for r in read_records(out / "requests.jsonl") if r.load_point == "trace=arrivals.txt"]
    assert len(records) == 8 and all(r.ok for r in records)  # the trace's 8 sends, not --num-requests
    sent = sorted(r.scheduled_s for r in records)
    assert [t - sent[0] for t in sent] == pytest.approx([0.15 * i for i in range(8)], abs=1e-6)
    summary = pd.read_csv(out / "summary.csv").set_index("load_point")
    assert summary.loc["r=inf", "requests_ok"] == 20 and summary.loc["trace=arrivals.txt", "requests_ok"] == 8


@pytest.mark.live
@pytest.mark.slow
def test_shared_prefix_dataset_runs_with_its_shape(llama_dir, tmp_path):
    """3 groups of prompts of 24 shared + 8 own tokens; each load point has prefixes of its own."""
    out = tmp_path / "run"
    with scripted_server(
        flavor="vllm", default_schedule=ScriptedSchedule(ttft_s=0.01, itl_s=0.002)
    ) as server:
        _scripted_run(
            server.url, str(llama_dir), out, "--dataset", "prefix", "--prefix-len", "24", "--prefix-groups",
            "3", "--input-len", "8", "--output-len", "4", "--concurrency", "1,2", "--num-requests", "7",
        )  # fmt: skip
    records = list(read_records(out / "requests.jsonl"))
    assert len(records) == 14 and all(r.ok and r.prompt_tokens == 32 for r in records)
    assert all(r.wanted_output_tokens == 4 for r in records)
    by_point = {p: {r.request_id for r in records if r.load_point == p} for p in ("c=1", "c=2")}
    assert {i.rsplit("-", 2)[0] for i in by_point["c=1"]} == {"prefix0"}
    assert {i.rsplit("-", 2)[0] for i in by_point["c=2"]} == {"prefix1"}
    assert {i.split("-")[1] for i in by_point["c=1"]} == {"g0", "g1", "g2"}  # 7 requests over the 3 groups
    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["workload"]) == {"prefix-3x24+8x4"}


def test_a_run_file_takes_a_trace_and_a_prefix_workload(planned, tmp_path):
    (tmp_path / "arrivals.txt").write_text("1.0\n1.5\n2.5\n")
    run_file = tmp_path / "run.yaml"
    run_file.write_text(
        f"load: {{trace: {tmp_path / 'arrivals.txt'}, trace_scale: 2}}\n"
        "workloads: [{dataset: prefix, prefix_len: 64, prefix_groups: 2, input_len: 16, output_len: 8}]\n"
    )
    result = runner.invoke(app, ["run", "-c", str(run_file)])
    assert result.exit_code == 0, result.output
    (plan,) = planned
    (trace,) = plan.load_points  # a trace alone: no default concurrencies
    assert isinstance(trace, TraceReplay) and list(trace.offsets(3)) == [0.0, 1.0, 3.0]
    (workload,) = plan.workloads
    assert (workload.prefix_len, workload.prefix_groups, workload.label) == (64, 2, "prefix-2x64+16x8")


def test_every_run_option_answers_to_its_declared_flag():
    """The command line takes each run option under the name the option table declares, whatever typer makes
    of metavars (typer 0.27 named options without explicit names after their metavar: --MODEL)."""
    import typer

    from compare.cli import app
    from compare.plan.run_options import RUN_OPTIONS

    run = typer.main.get_command(app).commands["run"]
    opts = {opt for param in run.params for opt in param.opts}
    assert {option.flag for option in RUN_OPTIONS} <= opts
    assert not [opt for opt in opts if opt.startswith("--") and opt != opt.lower()]
