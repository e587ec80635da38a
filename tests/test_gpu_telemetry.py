"""GPU telemetry (compare/measure/gpu_sampling.py, compare/analysis/gpu_energy.py) against a fake NVML whose
power, energy, memory and utilisation readings are drawn at random and remembered: the sampler writes what
NVML said, the energy over a window is the counter's difference or, without a counter, the power's trapezoid
integral, the summary's GPU columns and the report's section come from the run directory alone, and without
NVML nothing is sampled and nothing fails. No assert depends on how fast this machine is: samples are awaited,
never counted after a sleep."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from checkpoints import make_tokenizer
from typer.testing import CliRunner

import compare.cli as cli
from compare.analysis import gpu_energy
from compare.analysis.gpu_energy import Window, gpu_energy_j, window_columns
from compare.analysis.results import analyze
from compare.cli import app
from compare.launch.launcher import ProcessLauncher, ServerProcess
from compare.measure.gpu_sampling import open_telemetry
from compare.measure.run_dir import RunDir
from compare.report.write import write_reports
from instruments.scripted_server import ScriptedSchedule, scripted_server
from workloads.records import RecordWriter, RequestRecord

runner = CliRunner()
LOCAL = "http://127.0.0.1:1"


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class FakeNvml(types.ModuleType):
    """`pynvml` with `gpus` GPUs. Every reading is drawn from a seeded generator and kept, per GPU, in the
    order it was read: power in mW, the energy counter in mJ (growing by a random amount per read), memory
    used in bytes, utilisation in percent. `counter[i]` False: GPU i's counter is not supported; a field in
    `failing` always raises."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(
        self,
        gpus: int = 2,
        counter: tuple[bool, ...] = (True, True),
        failing: tuple[str, ...] = (),
        init_error: Exception | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__("pynvml")
        self.gpus, self.counter, self.failing, self.init_error = gpus, counter, failing, init_error
        self.rng = np.random.default_rng(seed)
        self.power: dict[int, list[int]] = {i: [] for i in range(gpus)}
        self.energy: dict[int, list[int]] = {i: [] for i in range(gpus)}
        self.memory: dict[int, list[int]] = {i: [] for i in range(gpus)}
        self.util: dict[int, list[int]] = {i: [] for i in range(gpus)}
        self.total_mj = {i: int(self.rng.integers(10**6, 10**9)) for i in range(gpus)}
        self.shut = False

    def _fail(self, name: str) -> None:
        if name in self.failing:
            raise NVMLError(f"{name} failed")

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return f"Fake GPU {handle}"

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._fail("power")
        value = int(self.rng.integers(60_000, 700_000))
        self.power[handle].append(value)
        return value

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        if not self.counter[handle]:
            raise NVMLError_NotSupported("Not Supported")
        self._fail("energy")
        self.total_mj[handle] += int(self.rng.integers(1_000, 80_000))
        self.energy[handle].append(self.total_mj[handle])
        return self.total_mj[handle]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        self._fail("memory")
        used = int(self.rng.integers(2**30, 80 * 2**30))
        self.memory[handle].append(used)
        return types.SimpleNamespace(used=used, total=141 * 2**30, free=141 * 2**30 - used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> types.SimpleNamespace:
        self._fail("util")
        gpu = int(self.rng.integers(0, 101))
        self.util[handle].append(gpu)
        return types.SimpleNamespace(gpu=gpu, memory=0)


@pytest.fixture
def fake_nvml(monkeypatch):
    """Installs a FakeNvml as `pynvml` (call it with FakeNvml's arguments); no CUDA_VISIBLE_DEVICES."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(**kwargs) -> FakeNvml:
        fake = FakeNvml(**kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


def wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the sampler wrote too few samples"
        time.sleep(0.01)


def ticks_written(path: Path) -> int:
    if not path.exists():
        return 0
    return len({json.loads(line)["tick"] for line in path.read_text().splitlines() if line.endswith("}")})


def sample_point(run: RunDir, run_id: str, interval_s: float = 0.02, at_least: int = 4) -> pd.DataFrame:
    """One point sampled until at least `at_least` ticks are written; its samples."""
    telemetry = open_telemetry("auto", interval_s)
    run.manifest["gpu_telemetry"] = telemetry.entry
    watch = telemetry.watch("vllm", None, LOCAL)
    assert watch is not None
    with watch.sample(run, run_id):
        wait_until(lambda: ticks_written(run.telemetry_path) >= at_least)
    telemetry.close()
    samples = run.telemetry()
    return samples[samples["run_id"] == run_id]


# -- sampling ----------------------------------------------------------------------------------------------


def test_the_sampler_writes_what_nvml_said_at_about_the_interval(tmp_path, fake_nvml):
    fake = fake_nvml()
    run = RunDir.create(tmp_path / "run", {}, ["compare", "run"])
    interval = 0.05
    samples = sample_point(run, "p1", interval)
    entry = json.loads((run.path / "manifest.json").read_text())["gpu_telemetry"]
    assert entry["on"] and entry["interval_s"] == interval and entry["energy_source"] == "counter"
    assert entry["backends"]["vllm"] == {"gpus": [0, 1], "chosen": "no CUDA_VISIBLE_DEVICES: every GPU"}
    point = entry["points"]["p1"]
    assert point["samples"] >= 4 and point["read_errors"] == {} and "error" not in point
    assert fake.shut
    for gpu in (0, 1):
        mine = samples[samples["gpu"] == gpu].sort_values("tick")
        assert mine["tick"].tolist() == list(range(point["samples"]))  # one line per GPU per tick
        # every reading, in the order NVML gave it, in watts, joules, bytes and percent
        assert mine["power_w"].tolist() == pytest.approx([p / 1e3 for p in fake.power[gpu]])
        _probe, *read = fake.energy[gpu]  # the first read asked whether the counter works
        assert mine["energy_j"].tolist() == pytest.approx([e / 1e3 for e in read])
        assert mine["mem_used_bytes"].tolist() == fake.memory[gpu]
        assert mine["util_pct"].tolist() == fake.util[gpu]
        assert set(mine["energy_source"]) == {"counter"}
        gaps = np.diff(mine["t"].to_numpy())
        assert (gaps > 0).all()
        # a sample is never due before the interval has passed (a busy machine only makes gaps longer); the
        # last one is taken when the point ends, whenever that is
        assert (gaps[:-1] >= 0.5 * interval).all()


def test_energy_is_the_counter_difference(tmp_path, fake_nvml):
    fake = fake_nvml(gpus=1, counter=(True,), seed=3)
    run = RunDir.create(tmp_path / "run", {}, ["compare", "run"])
    samples = sample_point(run, "p1")
    t = samples["t"].to_numpy()
    energy, source = gpu_energy_j(samples, t[0], t[-1])
    assert source == "counter"
    # over the whole span: the last reading minus the first one, in joules
    assert energy == pytest.approx((fake.energy[0][-1] - fake.energy[0][1]) / 1e3)
    # inside it: the counter read between samples by linear interpolation
    mid, e = (t[1] + t[2]) / 2, samples["energy_j"].to_numpy()
    assert gpu_energy_j(samples, mid, t[-1])[0] == pytest.approx(e[-1] - (e[1] + e[2]) / 2)


def test_energy_is_integrated_when_the_counter_is_not_supported(tmp_path, fake_nvml):
    fake = fake_nvml(gpus=1, counter=(False,))
    run = RunDir.create(tmp_path / "run", {}, ["compare", "run"])
    samples = sample_point(run, "p1")
    entry = run.manifest["gpu_telemetry"]
    assert entry["energy_source"] == entry["gpus"][0]["energy_source"] == "power integral"
    assert samples["energy_j"].isna().all() and set(samples["energy_source"]) == {"power integral"}
    t, watts = samples["t"].to_numpy(), np.array(fake.power[0]) / 1e3
    energy, source = gpu_energy_j(samples, t[0], t[-1])
    trapezoids = sum((watts[i] + watts[i + 1]) / 2 * (t[i + 1] - t[i]) for i in range(len(t) - 1))
    assert source == "power integral" and energy == pytest.approx(trapezoids)
    # a window between samples: the power at its ends interpolated, by hand
    hand = pd.DataFrame({"t": [0.0, 1.0, 2.0], "power_w": [100.0, 200.0, 400.0], "energy_j": [np.nan] * 3})
    assert gpu_energy_j(hand, 0.5, 1.5) == (pytest.approx(87.5 + 125.0), "power integral")  # 150-200-300 W


def test_a_field_that_fails_does_not_stop_the_sampler(tmp_path, fake_nvml):
    fake_nvml(gpus=1, counter=(True,), failing=("util",))
    run = RunDir.create(tmp_path / "run", {}, ["compare", "run"])
    samples = sample_point(run, "p1")
    point = run.manifest["gpu_telemetry"]["points"]["p1"]
    assert point["read_errors"] == {"util_pct": point["samples"]} and point["samples"] >= 4
    assert samples["util_pct"].isna().all() and samples["power_w"].notna().all()


def test_stopping_is_prompt_and_happens_on_ctrl_c(tmp_path, fake_nvml):
    """An interval of a minute: stopping waits for no sleep to end, and Ctrl-C in the body stops it too."""
    fake_nvml(gpus=1, counter=(True,))
    run = RunDir.create(tmp_path / "run", {}, ["compare", "run"])
    telemetry = open_telemetry("auto", 60.0)
    run.manifest["gpu_telemetry"] = telemetry.entry
    watch = telemetry.watch("vllm", None, LOCAL)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt), watch.sample(run, "p1"):
        raise KeyboardInterrupt
    assert time.monotonic() - began < 30.0
    assert not [t for t in threading.enumerate() if t.name.startswith("gpu-telemetry")]
    # the sample before the body and the one after it
    saved = json.loads((run.path / "manifest.json").read_text())["gpu_telemetry"]
    assert saved["points"]["p1"]["samples"] == 2
    telemetry.close()


# -- which GPUs --------------------------------------------------------------------------------------------


def test_the_backends_gpus_come_from_its_cuda_visible_devices(tmp_path, fake_nvml, monkeypatch):
    fake_nvml(gpus=3, counter=(True, True, True))
    telemetry = open_telemetry("auto")
    own = ProcessLauncher(
        "reference",
        "",
        ServerProcess(["x"], {"CUDA_VISIBLE_DEVICES": "2"}),
        "http://h:1",
        "/health",
        tmp_path / "a.log",
    )
    assert [g.index for g in telemetry.watch("a", own, None).gpus] == [2]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # inherited by a process the launcher sets none for
    inherits = ProcessLauncher(
        "reference", "", ServerProcess(["x"]), "http://h:1", "/health", tmp_path / "b.log"
    )
    assert [g.index for g in telemetry.watch("b", inherits, None).gpus] == [0, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5d1e")  # not indices: every GPU, as for the memory note
    assert [g.index for g in telemetry.watch("c", inherits, None).gpus] == [0, 1, 2]
    assert telemetry.watch("d", None, "http://10.1.2.3:8000") is None  # another host's server: not ours
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert telemetry.watch("e", inherits, None) is None  # the server sees no GPU
    backends = telemetry.entry["backends"]
    assert backends["a"]["chosen"] == "CUDA_VISIBLE_DEVICES=2" and backends["d"]["gpus"] == []
    assert "names no nvidia-smi indices" in backends["c"]["chosen"]
    telemetry.close()


# -- absent ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "nvml, why",
    [
        (None, "nvidia-ml-py (pynvml) is not installed"),
        (FakeNvml(init_error=NVMLError_LibraryNotFound("Shared Library Not Found")), "NVML did not start"),
        (FakeNvml(gpus=0), "NVML found no GPU"),
    ],
    ids=["no pynvml", "nvmlInit raises", "no GPU"],
)
def test_without_nvml_nothing_is_sampled(nvml, why, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # None: `import pynvml` raises ImportError
    telemetry = open_telemetry("auto")
    assert not telemetry.on and why in telemetry.entry["why"]
    assert telemetry.watch("vllm", None, LOCAL) is None
    telemetry.close()
    assert "--gpu-telemetry off" in open_telemetry("off").entry["why"]


# -- the summary's columns and the report ------------------------------------------------------------------


def test_joules_per_output_token_over_the_measured_windows():
    """Two launches of one point, one GPU with a counter: energy and tokens add up over both windows."""
    samples = pd.DataFrame(
        {
            "run_id": ["a"] * 4 + ["b"] * 3,
            "tick": [0, 1, 2, 3, 0, 1, 2],
            "gpu": [0] * 7,
            "t": [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0],
            "power_w": [90.0, 110.0, 150.0, 50.0, 300.0, 100.0, 100.0],
            "energy_j": [0.0, 100.0, 250.0, 300.0, 1000.0, 1150.0, 1300.0],
            "energy_source": ["counter"] * 7,
            "mem_used_bytes": [1.0, 2.0, 3.0, 1.5, 1.0, 1.0, 1.0],
            "util_pct": [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0],
        }
    )
    only_a = window_columns(samples, [Window("a", 1.0, 3.0, 50)])
    assert only_a["gpu_energy_j"] == pytest.approx(200.0) and only_a["gpu_joules_per_out_token"] == 4.0
    assert only_a["gpu_power_mean_w"] == pytest.approx(100.0)  # 200 J over 2 s
    both = window_columns(samples, [Window("a", 1.0, 3.0, 50), Window("b", 10.5, 12.0, 25)])
    assert both["gpu_energy_j"] == pytest.approx(200.0 + 225.0)
    assert both["gpu_joules_per_out_token"] == pytest.approx(425.0 / 75)
    assert both["gpu_power_mean_w"] == pytest.approx(425.0 / 3.5)
    # the samples from the one before each window to the one after it: b's tick 0 (before 10.5) counts
    assert both["gpu_power_max_w"] == 300.0 and both["gpu_energy_source"] == "counter"
    assert both["gpu_util_mean_pct"] == pytest.approx(np.mean([20, 30, 40, 50, 60, 70]))
    assert all(math.isnan(v) for v in window_columns(None, [Window("a", 1.0, 3.0, 50)]).values())


def _record(run_id: str, i: int, send: float, tokens: int) -> RequestRecord:
    events = [(send + 0.05 + 0.01 * k, 1, 3) for k in range(tokens)]
    return RequestRecord(
        run_id=run_id,
        request_id=f"{run_id}-{i}",
        backend="vllm",
        variant="",
        load_point=run_id,
        t0_monotonic=5000.0,
        prompt_tokens=10,
        wanted_output_tokens=tokens,
        output_length_forced=True,
        scheduled_s=send,
        start_s=send,
        send_s=send,
        headers_s=send + 0.01,
        end_s=events[-1][0] + 0.001,
        events=events,
        http_status=200,
        finish_reason="length",
        usage_prompt_tokens=10,
        usage_completion_tokens=tokens,
        event_tokens=tokens,
        output_tokens=tokens,
        output_tokens_source="usage",
    )


def _run_with_samples(path: Path, rng: np.random.Generator) -> tuple[RunDir, dict[str, tuple[float, float]]]:
    """Two points, c=1 with telemetry (GPU 0 with a counter, GPU 1 without) and c=2 without; the absolute
    throughput window of c=1."""
    run = RunDir.create(path, {"model": "m"}, ["compare", "run"])
    windows = {}
    with RecordWriter(run.requests_path) as writer:
        for run_id in ("c=1", "c=2"):
            schedule = {"kind": "closed", "concurrency": int(run_id[-1])}
            run.add_point(run_id, "vllm", "", "wl", run_id, schedule)
            records = [_record(run_id, i, 0.2 + 0.3 * i, 20) for i in range(5)]
            for r in records:
                writer.append(r)
            # the throughput window of a closed loop at c=1: its first first token to its last, which holds
            # the first four requests' outputs wholly and none of the fifth's
            windows[run_id] = (5000.0 + records[0].events[0][0], 5000.0 + records[-1].events[0][0])
    start, end = windows["c=1"]
    lines, counter = [], 1000.0
    for tick, t in enumerate(np.arange(start - 0.15, end + 0.15, 0.05)):
        counter += rng.uniform(5, 40)
        for gpu in (0, 1):
            lines.append(
                {
                    "run_id": "c=1",
                    "tick": tick,
                    "gpu": gpu,
                    "t": float(t) + 0.001 * gpu,
                    "power_w": float(rng.uniform(80, 600)),
                    "energy_j": counter if gpu == 0 else None,
                    "energy_source": "counter" if gpu == 0 else "power integral",
                    "mem_used_bytes": float(rng.integers(2**30, 2**36)),
                    "util_pct": float(rng.integers(0, 100)),
                }
            )
    run.telemetry_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run.manifest["gpu_telemetry"] = {
        "on": True,
        "interval_s": 0.05,
        "backends": {"vllm": {"gpus": [0, 1], "chosen": "no CUDA_VISIBLE_DEVICES: every GPU"}},
    }
    run.manifest["status"] = "complete"
    run.save()
    return run, windows


def test_summary_columns_and_report_from_the_run_directory(tmp_path):
    run, windows = _run_with_samples(tmp_path / "run", np.random.default_rng(11))
    results = analyze(run, n_boot=50)
    write_reports(results)
    summary = pd.read_csv(run.path / "summary.csv").set_index("load_point")
    per_token = results.summary.set_index("load_point").loc["c=1", "gpu_joules_per_out_token"]
    samples = run.telemetry()
    start, end = windows["c=1"]
    gpu0, gpu1 = (samples[samples["gpu"] == g] for g in (0, 1))
    e0 = np.interp(end, gpu0["t"], gpu0["energy_j"]) - np.interp(start, gpu0["t"], gpu0["energy_j"])
    e1 = gpu_energy.integral(gpu1["t"].to_numpy(), gpu1["power_w"].to_numpy(), start, end)
    row = summary.loc["c=1"]
    assert row["gpu_energy_j"] == pytest.approx(e0 + e1, rel=1e-5)
    assert row["gpu_joules_per_out_token"] == pytest.approx((e0 + e1) / 80, rel=1e-5)  # 4 requests x 20
    assert row["gpu_power_mean_w"] == pytest.approx((e0 + e1) / (end - start), rel=1e-5)
    assert row["gpu_energy_source"] == "counter, power integral"
    # the highest and the mean: the ticks from the last one before the window to the first one after it
    ticks = samples.groupby("tick").agg(
        t=("t", "min"), w=("power_w", "sum"), m=("mem_used_bytes", "sum"), u=("util_pct", "mean")
    )
    lo, hi = ticks["t"][ticks["t"] <= start].max(), ticks["t"][ticks["t"] >= end].min()
    around = ticks[(ticks["t"] >= lo) & (ticks["t"] <= hi)]
    assert len(around) < len(ticks)  # the samples well before and after the window do not count
    assert row["gpu_power_max_w"] == pytest.approx(around["w"].max(), rel=1e-5)
    assert row["gpu_mem_peak_gib"] == pytest.approx(around["m"].max() / 2**30, rel=1e-5)
    assert row["gpu_util_mean_pct"] == pytest.approx(around["u"].mean(), rel=1e-5)
    assert summary.loc["c=2", list(gpu_energy.COLUMNS)].isna().all()  # no samples: NaN, not an error
    report = (run.path / "report.md").read_text()
    section = report.split("## GPU energy and power", 1)[1].split("\n## ", 1)[0]
    assert f"| {per_token:,.3f} |" in section and "nvmlDeviceGetTotalEnergyConsumption" in section
    assert "vllm: GPU 0, 1 (no CUDA_VISIBLE_DEVICES: every GPU)" in section
    assert "Joules per output token:" in report.split("## Definitions", 1)[1]
    html = (run.path / "report.html").read_text()
    assert 'aria-label="GPU power over time: vllm"' in html and "seconds since the load point started" in html


def test_without_telemetry_the_report_leaves_the_section_out(tmp_path):
    run, _ = _run_with_samples(tmp_path / "run", np.random.default_rng(1))
    run.telemetry_path.unlink()
    write_reports(analyze(run, n_boot=50))
    summary = pd.read_csv(run.path / "summary.csv")
    assert summary[list(gpu_energy.COLUMNS)].isna().all().all()
    report = (run.path / "report.md").read_text()
    assert "GPU energy and power" not in report and "Joules per output token" not in report
    assert "GPU power over time" not in (run.path / "report.html").read_text()


# -- the options ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpu-telemetry-interval", "0"], "--gpu-telemetry-interval must be > 0"),
        (["--gpu-telemetry-interval", "-0.5"], "--gpu-telemetry-interval must be > 0"),
        (["--gpu-telemetry-interval", "inf"], "finite"),
        (["--gpu-telemetry-interval", "soon"], "--gpu-telemetry-interval"),
        (["--gpu-telemetry", "on"], "unknown --gpu-telemetry 'on'"),
        (["-c", "RUN_FILE"], "--gpu-telemetry-interval must be a number"),
    ],
    ids=["zero", "negative", "inf", "not a number", "unknown mode", "run file"],
)
def test_a_bad_telemetry_option_exits_2_before_any_run_directory(args, message, tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "execute", lambda *_a, **_k: pytest.fail("the run started its work"))
    run_file = tmp_path / "run.yaml"
    run_file.write_text("gpu_telemetry_interval: fast\n")
    out = tmp_path / "run"
    args = [str(run_file) if a == "RUN_FILE" else a for a in args]
    result = runner.invoke(app, ["run", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists()


def test_the_telemetry_options_reach_the_plan_from_the_command_line_and_a_run_file(tmp_path):
    from compare.plan.build import build_plan

    endpoint = {"backends": "vllm", "endpoints": ["vllm=http://h:1"], "tokenizer": "gpt2"}
    plan = build_plan(endpoint)
    assert (plan.gpu_telemetry, plan.gpu_telemetry_interval) == ("auto", 0.1)
    run_file = tmp_path / "run.yaml"
    run_file.write_text("gpu_telemetry: off\ngpu_telemetry_interval: 0.25\n")  # YAML: a bare off is false
    plan = build_plan(endpoint, run_file)
    assert (plan.gpu_telemetry, plan.gpu_telemetry_interval) == ("off", 0.25)
    plan = build_plan({**endpoint, "gpu_telemetry": "auto", "gpu_telemetry_interval": "0.5"}, run_file)
    assert (plan.gpu_telemetry, plan.gpu_telemetry_interval) == ("auto", 0.5)  # the command line wins
    assert plan.describe()["gpu_telemetry"] == "auto" and plan.describe()["gpu_telemetry_interval_s"] == 0.5


# -- end to end --------------------------------------------------------------------------------------------


@pytest.mark.live
def test_compare_run_samples_every_point_against_the_scripted_server(tmp_path, fake_nvml):
    """`compare run` with a fake NVML of two GPUs, one without an energy counter: telemetry.jsonl holds
    every point's samples, summary.csv its GPU columns, the report its section and the HTML its plot."""
    fake_nvml(gpus=2, counter=(True, False), seed=5)
    make_tokenizer(tmp_path / "tok")
    out = tmp_path / "run"
    schedule = ScriptedSchedule(ttft_s=0.02, itl_s=0.01, output_tokens=6)
    with scripted_server(default_schedule=schedule) as server:
        result = runner.invoke(
            app,
            [
                "run",
                "--backends",
                "vllm",
                "--endpoint",
                f"vllm={server.url}",
                "--model",
                "scripted-model",
                "--tokenizer",
                str(tmp_path / "tok"),
                "--input-len",
                "8",
                "--output-len",
                "6",
                "--concurrency",
                "1,2",
                "--num-requests",
                "8",
                "--n-boot",
                "50",
                "--gpu-telemetry-interval",
                "0.02",
                "--out",
                str(out),
            ],
        )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["gpu_telemetry"]
    assert entry["on"] and entry["energy_source"] == "per GPU" and entry["backends"]["vllm"]["gpus"] == [0, 1]
    run_ids = [p["run_id"] for p in manifest["points"]]
    samples = RunDir.open(out).telemetry()
    assert set(samples["run_id"]) == set(run_ids)
    assert all(entry["points"][rid]["samples"] >= 2 for rid in run_ids)
    summary = pd.read_csv(out / "summary.csv")
    assert summary[list(gpu_energy.COLUMNS[:-1])].notna().all().all()
    assert (summary["gpu_energy_j"] > 0).all()
    assert set(summary["gpu_energy_source"]) == {"counter, power integral"}
    assert summary["gpu_joules_per_out_token"].tolist() == pytest.approx(
        (summary["gpu_energy_j"] / (summary["window_requests"] * 6)).tolist(), rel=1e-4
    )  # over the output tokens the throughput window counts: 6 for each of its completions
    assert "## GPU energy and power" in (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    section = html.split('aria-label="GPU power over time: vllm"', 1)[1].split("</svg>", 1)[0]
    assert section.count("<polyline") == 2  # one line per point
