"""What the comparator does differently for a backend is a capability its adapter class declares
(`adapters/base.py::Adapter`), never a comparison of backend names in `compare/`: each capability as every
registered adapter sets it (the families that had it when `compare/` compared names), and the code paths
that read the ones no other test reaches."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from adapters import ADAPTERS
from adapters.base import Adapter
from compare.common.datatypes import SetupReport
from compare.plan.run_options import RunPlan

ROOT = Path(__file__).resolve().parents[1]

#: capability -> the server families whose adapters have it
FLAGS = {
    "vllm_style_flags": {"vllm", "reference"},
    "serving_matchable": {"vllm", "reference"},
    "runs_from_checkout": {"reference"},
    "cpu_image_built_here": {"reference"},
    "variant_by_device": {"reference"},
    "eager_on_cpu": {"reference"},
}
VALUES = {  # capability -> {family: value}, every other family the base class's
    "api_servers_default": {"vllm": "per_data_parallel_rank", "reference": "one_unless_logged"},
    "gpu_memory_default": {"reference": 0.9},
    "executable_option": {"vllm": "vllm_bin", "llamacpp": "llamacpp_bin"},
    "props_path": {"llamacpp": "/props"},
}


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_each_adapter_declares_what_its_family_needs(name):
    cls = ADAPTERS[name]
    family = cls.server_family
    for capability, families in FLAGS.items():
        assert getattr(cls, capability) is (family in families), capability
    for capability, values in VALUES.items():
        assert getattr(cls, capability) == values.get(family or "", getattr(Adapter, capability)), capability
    assert cls.own_model_name is (name == "trtllm-triton")
    assert bool(cls.executable_hint) is (cls.executable_option is not None)


def test_executable_options_are_run_options():
    options = {cls.executable_option for cls in ADAPTERS.values()} - {None}
    assert options and options <= set(RunPlan.__dataclass_fields__)


@pytest.mark.parametrize("gpu", [True, False])
def test_serving_defaults_are_fixed_only_where_the_server_fixes_them(monkeypatch, gpu):
    monkeypatch.setattr("reference_engine.serving.options.os.cpu_count", lambda: 16)
    assert ADAPTERS["vllm"].serving_defaults(gpu) == {"api_servers": 1}
    assert ADAPTERS["reference-chat"].serving_defaults(gpu) == (
        {"api_servers": 4, "max_num_seqs": 256, "max_batched_tokens": 8192}
        if gpu
        else {"api_servers": 1, "max_num_seqs": 64, "max_batched_tokens": 2048}
    )
    assert ADAPTERS["tgi"].serving_defaults(gpu) == ADAPTERS["llamacpp"].serving_defaults(gpu) == {}


def test_compare_names_no_backend():
    """No module of compare/ compares a name with a backend's or its server family's."""
    names = {cls.name for cls in ADAPTERS.values()} | {cls.server_family for cls in ADAPTERS.values()}
    quoted = [f'"{n}"' for n in names if n]
    found = []
    for path in sorted((ROOT / "compare").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            compared = any(op in code for op in ("==", "!=", " in (", "startswith("))
            if compared and any(q in code for q in quoted):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_the_cpu_note_names_the_engines_that_run_eager_there():
    from compare.report.decision_sections import _cpu_note

    setups = {
        key: SetupReport(backend, variant, "process", "http://a", device=device)
        for key, backend, variant, device in (
            ("reference-chat:graphs", "reference-chat", "graphs", "cpu"),
            ("reference:graphs", "reference", "graphs", "cuda:0"),
            ("vllm:graphs", "vllm", "graphs", "cpu"),
            ("imported", "vllm-bench", "", "cpu"),
        )
    }
    note = _cpu_note(SimpleNamespace(setups=setups))
    assert note.startswith("reference-chat:graphs ran on the CPU") and "vllm" not in note
    assert _cpu_note(SimpleNamespace(setups={"vllm:graphs": setups["vllm:graphs"]})) == ""


@pytest.mark.parametrize(
    ("backend", "served", "model"),
    [
        ("trtllm-triton", None, "ensemble"),  # Triton's model, not the checkpoint
        ("trtllm-triton", "tllm", "tllm"),
        ("vllm", None, "/models/m"),
        ("vllm", "m", "m"),
    ],
)
def test_an_adapter_is_given_the_served_name_unless_its_model_is_its_own(backend, served, model):
    from compare.measure.loop import Launch

    plan = SimpleNamespace(served_model=served, model="/models/m")
    launch = Launch(plan, None, SimpleNamespace(name=backend), 0, None, None)
    assert launch.adapter().model == model


def _launch_plan(name: str, launch: str = "process") -> tuple[SimpleNamespace, SimpleNamespace]:
    backend = SimpleNamespace(
        name=name,
        variant="eager" if name == "reference" else "",
        key=name,
        options=(),
        server_args=[],
        launched=True,
    )
    plan = SimpleNamespace(
        repeats=1,
        served_model=None,
        model="m",
        dtype="auto",
        max_model_len=None,
        backends=[backend],
        vllm_bin=sys.executable,
        launch=launch,
        startup_timeout=5.0,
        match_serving=False,
        images={},
    )
    return plan, backend


def test_only_our_server_runs_from_this_checkout(tmp_path, monkeypatch):
    from compare.launch.backend_launch import make_launcher
    from compare.measure.run_dir import RunDir

    monkeypatch.setattr("compare.launch.backend_launch.devices.gpu_visible", lambda: False)
    run = RunDir.create(tmp_path / "run", {"model": "m"}, ["compare", "run"])
    envs = {}
    for name in ("reference", "vllm"):
        plan, backend = _launch_plan(name)
        envs[name] = make_launcher(plan, backend, run, 0, str(tmp_path)).env
    assert "PYTHONPATH" in envs["reference"]
    assert "PYTHONPATH" not in envs["vllm"]


def test_only_our_cpu_image_is_built_here(tmp_path, monkeypatch):
    from compare.launch.backend_launch import make_launcher
    from compare.measure.run_dir import RunDir

    monkeypatch.setattr("compare.launch.backend_launch.devices.gpu_visible", lambda: False)
    monkeypatch.setattr("compare.launch.containers.docker_client", lambda: "client")
    asked = []
    monkeypatch.setattr(
        "compare.launch.images.ensure_reference_cpu_image",
        lambda client, tag, log=None: asked.append(("built", tag)),
    )
    monkeypatch.setattr(
        "compare.launch.images.ensure_image", lambda client, tag, log=None: asked.append(("pulled", tag))
    )
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    run = RunDir.create(tmp_path / "run", {"model": "m"}, ["compare", "run"])
    for name in ("reference", "llamacpp"):
        plan, backend = _launch_plan(name, launch="docker")
        make_launcher(plan, backend, run, 0, str(tmp_path))
    assert [how for how, _ in asked] == ["built", "pulled"]
