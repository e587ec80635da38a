"""The parity audit of the serving configuration (HTTP front ends, max concurrent sequences, batch token
budget, chunked prefill, speculative decoding, KV-cache dtype, parallelism, GPU memory fraction) from each
source: launch flags, vLLM's `non-default args` and engine lines, our engine's configuration and front-end
lines, `/metrics` info gauges and `/v1/models`; the serving settings matched at launch; the committed H200
run rebuilt with the audit; and imported results of another workload kept out of the ranking."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_compare_parity import models, section
from test_compare_report import make_run
from typer.testing import CliRunner

from adapters import ADAPTERS
from adapters.launch_spec import ModelSource, Variant
from adapters.prometheus import info_settings
from adapters.vllm import VLLM_INFO_METRICS, non_default_args
from compare.analysis.declared_settings import declared_settings
from compare.analysis.parity import Declared, findings
from compare.analysis.results import analyze
from compare.cli import app
from compare.common.datatypes import SetupReport
from compare.launch.backend_launch import make_launcher
from compare.launch.serving_match import plan_match, serving_match_lines
from compare.launch.setup_log import parse_log
from compare.measure.run_dir import RunDir
from compare.report.write import write_reports

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).parent.parent
H200_RUN = REPO / "benchmarks/results/h200/serving/llama-3.2-1b/overlapped-arrivals-beside-vllm"

NON_DEFAULT = (
    "(APIServer pid=7) INFO 12-01 10:00:00 [utils.py:253] non-default args: {'model_tag': '/m', 'host': "
    "'127.0.0.1', 'api_server_count': 2, 'max_num_seqs': 8, 'max_num_batched_tokens': 4096, "
    "'enable_chunked_prefill': False, 'gpu_memory_utilization': 0.8, 'kv_cache_dtype': 'fp8', "
    "'tensor_parallel_size': 2, 'speculative_config': {'method': 'ngram', 'num_speculative_tokens': 4}}"
)


def vllm_launch(*flags: str, log: str = "", info: dict[str, str] | None = None) -> SetupReport:
    setup = SetupReport("vllm", "", "process", "http://a", command=["vllm", "serve", "/m", *flags])
    setup.log_settings = parse_log("vllm", log).settings if log else {}
    setup.metrics_settings = info or {}
    return setup


def test_vllm_non_default_args_line_is_read():
    assert non_default_args(NON_DEFAULT) == {
        "api_servers": "2",
        "max_num_seqs": "8",
        "max_batched_tokens": "4096",
        "chunked_prefill": "False",
        "gpu_memory_utilization": "0.8",
        "kv_cache_dtype": "fp8",
        "tensor_parallel": "2",
        "speculative": "ngram",
    }
    assert non_default_args("non-default args: {not a dict") == {}
    # the scheduler's line (vLLM's API server prints it when chunked prefill is on) gives the token budget
    chunked = (
        "(APIServer pid=7) INFO 12-01 10:00:00 [scheduler.py:231] Chunked prefill is enabled with "
        "max_num_batched_tokens=8192."
    )
    d = declared_settings(vllm_launch(log=chunked))
    assert (d.max_batched_tokens, d.chunked_prefill, d.sources["max_batched_tokens"]) == (8192, True, "log")
    d = declared_settings(vllm_launch(log=NON_DEFAULT))
    assert (d.api_servers, d.max_num_seqs, d.max_batched_tokens, d.chunked_prefill) == (2, 8, 4096, False)
    assert (d.gpu_memory_utilization, d.kv_cache_dtype, d.tensor_parallel, d.speculative) == (
        0.8,
        "fp8",
        2,
        "ngram",
    )
    assert d.sources["api_servers"] == "log" and d.pipeline_parallel == 1 and d.sources["pipeline_parallel"]
    # the recorded CPU log: its non-default args and its engine line (the resolved configuration)
    recorded = declared_settings(vllm_launch(log=(DATA / "vllm_cpu_serve.log").read_text()))
    assert (recorded.chunked_prefill, recorded.speculative, recorded.kv_cache_dtype) == (True, "none", "auto")
    assert (recorded.tensor_parallel, recorded.pipeline_parallel, recorded.api_servers) == (1, 1, 1)
    assert recorded.sources["chunked_prefill"] == "log" and recorded.sources["api_servers"] == "default"


def test_launch_flags_are_read_with_their_short_forms():
    flags = (
        "-tp",
        "4",
        "--api-server-count=3",
        "--max-num-seqs",
        "16",
        "--max-num-batched-tokens",
        "1024",
        "--no-enable-chunked-prefill",
        "--gpu-memory-utilization",
        "0.75",
        "--kv-cache-dtype",
        "fp8_e5m2",
        "--speculative-config",
        '{"method": "eagle", "num_speculative_tokens": 3}',
        "-pp",
        "2",
    )
    d = declared_settings(vllm_launch(*flags))
    assert (d.tensor_parallel, d.pipeline_parallel, d.api_servers, d.max_num_seqs) == (4, 2, 3, 16)
    assert (d.max_batched_tokens, d.chunked_prefill, d.gpu_memory_utilization) == (1024, False, 0.75)
    assert (d.kv_cache_dtype, d.speculative) == ("fp8_e5m2", "eagle")
    assert {d.sources[k] for k in ("api_servers", "max_num_seqs", "speculative")} == {"command"}
    # vLLM's front ends default to its data-parallel size; its batch limits have no fixed default
    d = declared_settings(vllm_launch("--data-parallel-size", "2"))
    assert d.api_servers == 2 and d.max_num_seqs is None and "default varies" not in d.unknown["max_num_seqs"]
    assert d.unknown["max_num_seqs"] == "no start-up log read, not in its flags"
    # a running endpoint: its flags are not known, so no default is assumed
    tgi = ["text-generation-launcher", "--max-batch-size", "32", "--num-shard", "2"]
    d = declared_settings(SetupReport("tgi", "", "process", "http://a", command=tgi))
    assert (d.max_num_seqs, d.tensor_parallel, d.api_servers) == (32, 2, None)
    endpoint = declared_settings(SetupReport("vllm", "", "endpoint", "http://a"))
    assert endpoint.api_servers is None and endpoint.unknown["api_servers"] == "endpoint: flags not known"


def test_metrics_cache_config_info_and_models_route_are_read():
    info = info_settings((DATA / "vllm_cpu_metrics.txt").read_text(), VLLM_INFO_METRICS)
    assert info == {
        "block_size": "128",
        "kv_cache_dtype": "auto",
        "prefix_caching": "True",
        "gpu_memory_utilization": "0.92",
    }
    d = declared_settings(vllm_launch(info=info))
    assert (d.block_size, d.gpu_memory_utilization, d.prefix_caching) == (128, 0.92, True)
    assert d.sources["gpu_memory_utilization"] == "metrics" and d.sources["block_size"] == "metrics"
    setup = vllm_launch()
    setup.models_route = models(2048)
    setup.models_route["data"][0].update(dtype="half", quantization="AWQ")
    d = declared_settings(setup)
    assert (d.max_model_len, d.dtype, d.quantization) == (2048, "float16", "awq")
    assert d.sources["quantization"] == "models route"


def test_reference_log_declares_its_front_ends_and_batch_limits():
    log = (H200_RUN / "reference-graphs.log").read_text()
    setup = SetupReport("reference", "graphs", "process", "http://b", command=["python"], device="cuda")
    setup.log_settings = parse_log("reference", log).settings
    d = declared_settings(setup)
    assert (d.api_servers, d.max_num_seqs, d.max_batched_tokens, d.block_size) == (4, 256, 8192, 16)
    assert {d.sources[k] for k in ("api_servers", "max_num_seqs", "max_batched_tokens")} == {"log"}
    # one front end prints no line: read as one where the engine's configuration line was read
    one = "\n".join(line for line in log.splitlines() if "front-end processes" not in line)
    setup.log_settings = parse_log("reference", one).settings
    assert declared_settings(setup).api_servers == 1
    on_cpu = SetupReport("reference", "", "process", "http://b", command=["python"], device="cpu")
    assert declared_settings(on_cpu).api_servers == 1  # several only with a GPU


def test_findings_name_their_setting():
    declared = {"ours": Declared(api_servers=4, max_num_seqs=256), "vllm": Declared(api_servers=1)}
    [finding] = findings(declared)  # an unknown max_num_seqs is no difference
    assert finding.name == "api_servers" and finding.sentence() == "Unequal HTTP front ends: ours 4, vllm 1."
    # a run with matching turned off says so where it would have matched
    assert serving_match_lines({"config": {"match_serving": False}}, declared) == [
        "Not matched: --as-given was given (HTTP front ends differ)."
    ]
    assert serving_match_lines({"config": {}}, declared) == []  # a run from before matching


def _specs(gpu: bool, reference_args: tuple[str, ...] = (), vllm_args: tuple[str, ...] = ()) -> list:
    model = ModelSource("/m", "m")
    out = []
    for key, args in (("reference:graphs", reference_args), ("vllm", vllm_args)):
        name, _, variant = key.partition(":")
        cls = ADAPTERS[name]
        spec = cls.launch_spec(model, Variant.parse(variant), 1, workdir=Path("/tmp/w"), gpu=gpu)
        out.append((key, cls, spec.with_extra_args(list(args))))
    return out


@pytest.mark.parametrize(
    ("gpu", "cores", "front_ends", "seqs", "tokens"),
    [
        (True, 16, 4, 256, 8192),  # ours runs 4 front ends on a GPU host with 16 cores: vLLM gets 4 too
        (True, 2, 1, 256, 8192),
        (False, 16, 1, 64, 2048),
    ],
)
def test_matching_gives_ours_and_vllm_the_same_values(monkeypatch, gpu, cores, front_ends, seqs, tokens):
    monkeypatch.setattr("reference_engine.serving.options.os.cpu_count", lambda: cores)
    matched = plan_match(_specs(gpu), gpu)
    assert {name: m.value for name, m in matched.items()} == {
        "api_servers": front_ends,
        "max_num_seqs": seqs,
        "max_batched_tokens": tokens,
    }
    assert all(m.given == ["reference:graphs", "vllm"] for m in matched.values())


def test_matching_keeps_a_value_given_on_purpose(monkeypatch):
    monkeypatch.setattr("reference_engine.serving.options.os.cpu_count", lambda: 16)
    matched = plan_match(_specs(True, vllm_args=("--api-server-count", "2")), True)
    m = matched["api_servers"]
    assert (m.value, m.kept, m.given) == (2, {"vllm": 2}, ["reference:graphs"])
    # a variant of ours that sets it: vLLM gets it, another variant of ours keeps its default
    model = ModelSource("/m", "m")
    eager = ADAPTERS["reference"].launch_spec(model, Variant.parse("eager"), 1, workdir=Path("/w"), gpu=True)
    launches = [*_specs(True, ("--max-num-seqs", "8")), ("reference:eager", ADAPTERS["reference"], eager)]
    m = plan_match(launches, True)["max_num_seqs"]
    assert (m.value, m.kept, m.given) == (8, {"reference:graphs": 8}, ["vllm"])
    matched = plan_match(_specs(True, ("--max-num-seqs", "8"), ("--max-num-seqs", "16")), True)
    m = matched["max_num_seqs"]
    assert m.value is None and m.given == [] and "different values" in m.rule


def test_launch_specs_are_matched_at_launch(tmp_path, monkeypatch):
    """make_launcher, as `compare run` calls it for ours and vLLM: both commands carry the same front-end
    count and batch limits, the manifest records it, and the audit of the two commands finds them equal."""
    monkeypatch.setattr("reference_engine.serving.options.os.cpu_count", lambda: 16)
    monkeypatch.setattr("compare.launch.backend_launch.devices.gpu_visible", lambda: True)
    run = RunDir.create(tmp_path / "run", {"model": "m"}, ["compare", "run"])
    backends = [
        SimpleNamespace(name=n, variant=v, key=k, options=(), server_args=[], launched=True)
        for n, v, k in (("reference", "graphs", "reference:graphs"), ("vllm", "", "vllm"))
    ]
    plan = SimpleNamespace(
        repeats=1,
        served_model=None,
        model="m",
        dtype="auto",
        max_model_len=None,
        backends=backends,
        vllm_bin=sys.executable,
        launch="process",
        startup_timeout=5.0,
        match_serving=True,
    )
    declared = {}
    for backend in backends:
        launcher = make_launcher(plan, backend, run, 0, str(tmp_path))
        command = launcher.command
        i = command.index("--api-server-count")
        assert command[i + 1] == "4" and "--max-num-seqs" in command and "--max-num-batched-tokens" in command
        setup = SetupReport(backend.name, backend.variant, "process", "http://a", command=command)
        declared[backend.key] = declared_settings(setup)
    assert [f.name for f in findings(declared)] == []
    assert declared["vllm"].max_num_seqs == declared["reference:graphs"].max_num_seqs == 256
    assert run.manifest["serving_match"]["api_servers"]["value"] == 4
    lines = serving_match_lines(run.manifest, declared)
    assert lines[0] == (
        "HTTP front ends: 4 (the largest default among them on this machine); given as a flag to "
        "reference:graphs, vllm."
    )
    plan.match_serving = False
    launcher = make_launcher(plan, backends[1], run, 0, str(tmp_path))
    assert "--api-server-count" not in launcher.command


def test_rebuilt_h200_run_shows_the_front_end_difference(tmp_path):
    """The committed 1B run beside vLLM (ours with 4 front ends, vLLM with none asked for): rebuilt from its
    manifest and our committed log, the parity table flags the front ends, the decision names them."""
    run_path = tmp_path / "run"
    run_path.mkdir()
    for name in ("manifest.json", "reference-graphs.log", "runs.jsonl"):
        shutil.copy(H200_RUN / name, run_path / name)
    results = analyze(RunDir.open(run_path), n_boot=10)
    write_reports(results)
    parity = section((run_path / "report.md").read_text(), "Parity of the backends")
    assert "| HTTP front ends | ⚠ **4** (log) | ⚠ **1** (default) |" in parity
    assert "Unequal HTTP front ends: reference:graphs 4, vllm 1." in parity
    vllm_unknown = "unknown (not in its flags or log; its default varies)"
    assert f"| max concurrent sequences | 256 (log) | {vllm_unknown} |" in parity
    assert "No difference among" not in parity


def _bench(path: Path, model: str, prompt: int, n: int = 12) -> Path:
    """A `vllm bench serve` result: `n` requests at concurrency 4, each a little quicker than ours."""
    path.write_text(
        json.dumps(
            {
                "model_id": model,
                "duration": 2.0,
                "max_concurrency": 4,
                "request_rate": float("inf"),
                "input_lens": [prompt] * n,
                "output_lens": [20] * n,
                "ttfts": [0.01] * n,
                "itls": [[0.001] * 19 for _ in range(n)],
                "errors": [""] * n,
            }
        )
    )
    return path


def test_imported_results_of_another_workload_are_never_ranked(tmp_path):
    """A file claiming a 70B model and 2048-token prompts, filed under our workload, sits in the parity
    table and the warnings but never in the ranking; one that matches ours (the same model by its tokenizer's
    name, though served under another; prompt lengths within 25 %) is ranked."""
    run = make_run(tmp_path / "run", {"reference": 0.02})  # model m, 100-token prompts, 20 out, c=1 and c=4
    far = _bench(tmp_path / "far.json", "meta-llama/Llama-3.1-70B-Instruct", 2048)
    result = CliRunner().invoke(app, ["import", str(far), "--into", str(run.path), "--workload", "wl"])
    assert result.exit_code == 0, result.output
    report = (run.path / "report.md").read_text()
    decision = section(report, "Decision")
    assert "**vllm-bench**" not in decision and "**reference**" in decision
    assert (
        "vllm-bench c=4 (imported, workload wl) is not ranked against this run's backends: its model "
        "meta-llama/Llama-3.1-70B-Instruct is not this run's m; its prompts average 2048 tokens against "
        "this run's 100." in decision
    )
    parity = section(report, "Parity of the backends")
    assert "| vllm-bench c=4 | meta-llama/Llama-3.1-70B-Instruct against m | 2048 against 100 |" in parity
    assert "| no |" in parity
    near = _bench(tmp_path / "near.json", "served-under-another-name", 110)
    near.write_text(near.read_text().replace('"model_id"', '"tokenizer_id": "m", "model_id"'))
    result = CliRunner().invoke(
        app, ["import", str(near), "--into", str(run.path), "--workload", "wl", "--backend", "other"]
    )
    assert result.exit_code == 0, result.output
    decision = section((run.path / "report.md").read_text(), "Decision")
    assert "**other**" in decision  # quicker than ours and measuring the same thing: ranked, and ahead


def test_model_names_are_compared_by_their_last_part():
    from compare.analysis.import_parity import same_model

    assert same_model("/tmp/ckpt-llama-3.2-1b", "meta-llama/Llama-3.2-1B") is True
    assert same_model("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m") is True
    assert same_model("smollm2-135m", "meta-llama/Llama-3.1-70B") is False
    assert same_model("m", "meta-llama/Llama-3.1-70B") is False  # a short name is not found inside another
    assert same_model(None, "m") is None


def test_collect_reads_the_models_route_and_the_metrics_info_gauges(tmp_path):
    """A loopback server answering `/v1/models` and `/metrics` (vLLM's recorded CPU metrics page), read as
    `compare run` reads a running endpoint."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from compare.launch.declared import collect

    pages = {
        "/v1/models": json.dumps(models(1024)).encode(),
        "/metrics": (DATA / "vllm_cpu_metrics.txt").read_bytes(),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        setup = SetupReport("vllm", "", "endpoint", f"http://127.0.0.1:{server.server_address[1]}")
        collect(setup, None)
    finally:
        server.shutdown()
        server.server_close()
    assert setup.metrics_settings["gpu_memory_utilization"] == "0.92"
    d = declared_settings(setup)
    assert (d.max_model_len, d.block_size, d.kv_cache_dtype, d.prefix_caching) == (1024, 128, "auto", True)
    assert d.sources["block_size"] == "metrics" and d.api_servers is None  # an endpoint's flags: unknown


def test_match_serving_option_reaches_the_plan(tmp_path):
    import typer

    from compare.plan.build import build_plan

    run = typer.main.get_command(app).commands["run"]
    assert run.make_context("run", ["--as-given"]).params["match_serving"] is False
    assert run.make_context("run", ["--match-serving"]).params["match_serving"] is True
    assert run.make_context("run", []).params["match_serving"] is None  # not given: the run file or on
    assert build_plan({"backends": "reference,vllm", "match_serving": None}).match_serving is True
    run_file = tmp_path / "run.yaml"
    run_file.write_text("backends: [reference, vllm]\nmatch_serving: false\n")
    plan = build_plan({"match_serving": None}, run_file)
    assert plan.match_serving is False and plan.describe()["match_serving"] is False
