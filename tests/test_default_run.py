"""The run `compare run` makes with nothing given: two candidates chosen for the machine (vLLM when its
executable is found, else two settings of the reference engine)."""

from __future__ import annotations

import os

from compare.plan.build import build_plan
from compare.plan.default_candidates import choose, vllm_executable


def no_which(_: str) -> None:
    return None


def test_vllm_is_looked_for_where_the_launch_would_start_it():
    env = {"LLM_COMPARE_VLLM": "/opt/vllm-cpu/bin/vllm"}
    is_file = {"/opt/vllm-cpu/bin/vllm", "/elsewhere/vllm"}.__contains__
    exe = "/opt/vllm-cpu/bin/vllm"
    assert vllm_executable(None, env, no_which, is_file) == (exe, exe)
    # --vllm-bin wins over the environment, as in the launch; not found there means not found
    assert vllm_executable("/missing/vllm", env, no_which, is_file) == ("/missing/vllm", None)
    on_path = {"vllm": "/usr/bin/vllm"}.get
    assert vllm_executable(None, {}, on_path, is_file) == ("vllm", "/usr/bin/vllm")
    assert vllm_executable(None, {}, no_which, is_file) == ("vllm", None)


def test_vllm_found_is_compared_with_the_reference_engine():
    chosen = choose(None, "process", gpu=False, cpus=2, env={}, which={"vllm": "/usr/bin/vllm"}.get)
    assert chosen.backends == ["vllm", "reference"]
    assert "vLLM was found (/usr/bin/vllm)" in chosen.reason
    # a container launch does not start the vllm on this host's PATH
    docker = choose(None, "docker", gpu=False, cpus=2, env={}, which={"vllm": "/usr/bin/vllm"}.get)
    assert "vllm" not in docker.backends
    assert "only looked for when servers start as processes" in docker.reason


def test_without_vllm_two_settings_of_the_reference_engine():
    cpu = choose(None, "process", gpu=False, cpus=2, env={}, which=no_which, is_file=lambda p: False)
    assert cpu.backends[0] == "reference"
    assert cpu.backends[1] == {
        "name": "reference",
        "variant": "threads-2",
        "graphs": False,
        "args": ["--cpu-threads", "2"],
    }
    assert "vLLM was not found (vllm;" in cpu.reason and "its default of 1 torch thread" in cpu.reason
    gpu = choose(None, "process", gpu=True, env={}, which=no_which, is_file=lambda p: False)
    assert gpu.backends == ["reference:graphs", "reference:eager"] and "CUDA graphs" in gpu.reason
    single = choose(None, "process", gpu=False, cpus=1, env={}, which=no_which, is_file=lambda p: False)
    assert single.backends == ["reference", "reference:eager+batch=1"]


def test_default_plan_with_and_without_vllm(tmp_path, monkeypatch):
    monkeypatch.delenv("LLM_COMPARE_VLLM", raising=False)
    monkeypatch.delenv("LLM_COMPARE_LLAMACPP", raising=False)  # found, llama.cpp would be chosen first
    monkeypatch.setattr("shutil.which", no_which)
    plan = build_plan({})
    cpus = os.cpu_count() or 1
    if cpus >= 2 and all(b.variant != "graphs" for b in plan.backends):  # a CPU machine
        assert [b.key for b in plan.backends] == ["reference:eager", f"reference:threads-{cpus}"]
        assert plan.backends[1].server_args == ("--cpu-threads", str(cpus))
    assert all(b.name == "reference" for b in plan.backends) and len(plan.backends) == 2
    assert "not found" in plan.candidates_reason
    vllm = tmp_path / "vllm-cpu" / "bin" / "vllm"  # a file where LLM_COMPARE_VLLM says: found, never run
    vllm.parent.mkdir(parents=True)
    vllm.write_text("")
    monkeypatch.setenv("LLM_COMPARE_VLLM", str(vllm))
    plan = build_plan({})
    assert plan.backends[0].key == "vllm" and plan.backends[1].name == "reference"
    assert str(vllm) in plan.candidates_reason
    assert build_plan({"vllm_bin": str(tmp_path / "nothing-here")}).backends[0].name == "reference"
