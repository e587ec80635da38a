"""`compare` with llama.cpp, without a server: where it finds llama-server, when the default run picks it,
how a launch starts it, and how its settings reach the parity audit. The live runs are in
tests/test_llamacpp_live.py."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from compare.analysis.declared_settings import declared_settings
from compare.analysis.parity import findings
from compare.common.datatypes import SetupReport
from compare.launch.backend_launch import make_launcher
from compare.launch.launcher import LaunchError
from compare.measure.run_dir import RunDir
from compare.plan.build import build_plan
from compare.plan.default_candidates import llamacpp_executable, with_llamacpp


def no_which(_: str) -> None:
    return None


def test_llama_server_is_looked_for_where_the_launch_would_start_it():
    env = {"LLM_COMPARE_LLAMACPP": "/opt/llamacpp/bin/llama-server"}
    is_file = {"/opt/llamacpp/bin/llama-server"}.__contains__
    exe = "/opt/llamacpp/bin/llama-server"
    assert llamacpp_executable(None, env, no_which, is_file) == (exe, exe)
    assert llamacpp_executable("/missing/llama-server", env, no_which, is_file) == (
        "/missing/llama-server",
        None,
    )
    on_path = {"llama-server": "/usr/bin/llama-server"}.get
    assert llamacpp_executable(None, {}, on_path, is_file) == ("llama-server", "/usr/bin/llama-server")


def test_default_run_compares_reference_with_llamacpp_on_the_builtin_model():
    which = {"llama-server": "/usr/bin/llama-server"}.get
    chosen = with_llamacpp(None, "process", "smollm2-135m", env={}, which=which)
    assert chosen is not None and chosen.backends == ["reference", "llamacpp"]
    assert "llama-server was found (/usr/bin/llama-server)" in chosen.reason and "GGUF" in chosen.reason
    # a model it cannot serve (no GGUF), a container launch, or no llama-server: today's choice instead
    assert with_llamacpp(None, "process", "/srv/some-checkpoint", env={}, which=which) is None
    assert with_llamacpp(None, "docker", "smollm2-135m", env={}, which=which) is None
    nowhere = {"which": no_which, "is_file": lambda p: False}
    assert with_llamacpp(None, "process", "smollm2-135m", env={}, **nowhere) is None


def test_default_plan_with_llamacpp(tmp_path, monkeypatch):
    monkeypatch.delenv("LLM_COMPARE_VLLM", raising=False)
    monkeypatch.setattr("shutil.which", no_which)
    server = tmp_path / "bin" / "llama-server"  # a file where LLM_COMPARE_LLAMACPP says: found, never run
    server.parent.mkdir()
    server.write_text("")
    monkeypatch.setenv("LLM_COMPARE_LLAMACPP", str(server))
    plan = build_plan({})
    assert [b.name for b in plan.backends] == ["reference", "llamacpp"]
    assert str(server) in plan.candidates_reason
    assert build_plan({"llamacpp_bin": str(tmp_path / "nothing")}).backends[1].name == "reference"


def _plan(**given):
    backends = [
        SimpleNamespace(
            name="llamacpp", variant="", key="llamacpp", options=(), server_args=[], launched=True
        )
    ]
    return SimpleNamespace(
        repeats=1,
        served_model=None,
        model="m",
        dtype="auto",
        max_model_len=None,
        backends=backends,
        vllm_bin=None,
        launch="process",
        startup_timeout=5.0,
        match_serving=True,
        **given,
    ), backends[0]


def test_a_launch_runs_the_llama_server_it_was_given(tmp_path, monkeypatch):
    monkeypatch.setattr("compare.launch.backend_launch.devices.gpu_visible", lambda: False)
    monkeypatch.delenv("LLM_COMPARE_LLAMACPP", raising=False)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    run = RunDir.create(tmp_path / "run", {"model": "m"}, ["compare", "run"])
    plan, backend = _plan(llamacpp_bin=sys.executable)
    launcher = make_launcher(plan, backend, run, 0, str(tmp_path))
    command = launcher.command
    assert command[0] == sys.executable
    assert command[command.index("--model") + 1] == str(tmp_path / "model.gguf")
    assert command[command.index("--host") + 1] == "127.0.0.1"
    # no executable where it was looked for: the error says where to look
    plan, backend = _plan(llamacpp_bin=str(tmp_path / "no-llama-server"))
    with pytest.raises(LaunchError, match="LLM_COMPARE_LLAMACPP"):
        make_launcher(plan, backend, run, 0, str(tmp_path))


def test_props_feed_the_parity_audit_of_an_endpoint():
    """A running llama-server whose log we do not have: /props says its quantisation and slots."""
    setup = SetupReport(
        "llamacpp",
        "",
        "endpoint",
        "http://a",
        props_settings={
            "dtype": "q4_1",
            "quantization": "q4_1",
            "max_num_seqs": "4",
            "max_model_len": "1024",
        },
    )
    d = declared_settings(setup)
    assert (d.dtype, d.quantization, d.max_num_seqs, d.max_model_len) == ("q4_1", "q4_1", 4, 1024)
    assert d.sources["quantization"] == "props" and d.sources["max_num_seqs"] == "props"
    reference = declared_settings(
        SetupReport(
            "reference", "", "process", "http://b", log_settings={"dtype": "float32", "max_num_seqs": "64"}
        )
    )
    flagged = {f.name for f in findings({"llamacpp": d, "reference": reference})}
    assert {"dtype", "quantization", "max_num_seqs"} <= flagged
