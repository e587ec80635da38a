"""The run directory: what every stage writes and the next one reads, so any stage can be re-run alone.

RUN_DIR/
  manifest.json        versions, machine, the plan, each load point's run id, set-up reports, status
  requests.jsonl       one RequestRecord per request (warm-up included, flagged), appended as each ends
  runs.jsonl           one RunSummary per load point (offered vs achieved rate, lag, interrupted, the
                       growth of the backend's own /metrics counters)
  telemetry.jsonl      GPU samples during each load point (compare/measure/gpu_sampling.py; none without a
  GPU) logs/<backend>.log   the log of each server we launched
  imported/*.jsonl     records read from other tools (`compare import`), beside ours
  summary.csv          one row per backend x variant x workload x load point (summary.parquet: the same)
  report.md, report.html
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from compare.common.datatypes import PointInfo, SetupReport
from compare.measure.gpu_sampling import TELEMETRY, read_samples
from workloads.records import RequestRecord, RunSummary, read_records, read_run_summaries

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
RUNS = "runs.jsonl"
SUMMARY_CSV = "summary.csv"
SUMMARY_PARQUET = "summary.parquet"
IMPORTED = "imported"
PACKAGES = (
    "llm-compare",
    "torch",
    "transformers",
    "aiohttp",
    "pandas",
    "numpy",
    "pyarrow",
    "pydantic",
    "typer",
    "rich",
)


def default_run_dir(root: str | Path = "runs") -> Path:
    return Path(root) / time.strftime("%Y%m%d-%H%M%S")


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def machine() -> dict[str, Any]:
    cpus = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "cpus": len(cpus),
        "cpu_ids": cpus,
        "memory_gib": _mem_gib(),
    }
    try:
        import torch

        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        else:
            info["gpus"] = []
    except Exception:
        info["gpus"] = "unknown (torch not importable)"
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return None


@dataclass
class RunDir:
    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, path: str | Path, plan: dict[str, Any], command: list[str]) -> RunDir:
        path = Path(path)
        if (path / REQUESTS).exists() or (path / MANIFEST).exists():
            raise FileExistsError(f"{path} already holds a run; choose another --out")
        path.mkdir(parents=True, exist_ok=True)
        run = cls(
            path,
            {
                "schema_version": 1,
                "run_id": path.name,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "status": "running",
                "command": command,
                "versions": versions(),
                "machine": machine(),
                "config": plan,
                "points": [],
                "setups": [],
                "notes": [],
            },
        )
        run.save()
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        path = Path(path)
        if not (path / MANIFEST).exists() and not (path / REQUESTS).exists():
            raise FileNotFoundError(f"{path} is not a run directory (no {MANIFEST} or {REQUESTS})")
        manifest = json.loads((path / MANIFEST).read_text()) if (path / MANIFEST).exists() else {}
        return cls(path, manifest)

    def save(self) -> None:
        tmp = self.path / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(self.manifest, indent=1, default=str) + "\n")
        tmp.replace(self.path / MANIFEST)

    # -- what the run writes ---------------------------------------------------------------------------

    @property
    def requests_path(self) -> Path:
        return self.path / REQUESTS

    @property
    def runs_path(self) -> Path:
        return self.path / RUNS

    @property
    def telemetry_path(self) -> Path:
        return self.path / TELEMETRY

    def log_path(self, key: str) -> Path:
        """logs/<backend-variant>.log (a variant's `/` and other odd characters as `_`)."""
        return self.path / "logs" / (re.sub(r"[^\w.=+-]", "_", key.replace(":", "-")) + ".log")

    def add_point(
        self,
        run_id: str,
        backend: str,
        variant: str,
        workload: str,
        load_point: str,
        schedule: dict[str, Any],
        repeat: int = 0,
    ) -> None:
        self.manifest.setdefault("points", []).append(
            {
                "run_id": run_id,
                "backend": backend,
                "variant": variant,
                "workload": workload,
                "load_point": load_point,
                "schedule": schedule,
                "repeat": repeat,
            }
        )
        self.save()

    def set_setup(self, report: SetupReport) -> None:
        setups = [
            s
            for s in self.manifest.get("setups", [])
            if not (
                s["backend"] == report.backend
                and s["variant"] == report.variant
                and s.get("repeat", 0) == report.repeat
            )
        ]
        setups.append(report.to_dict())
        self.manifest["setups"] = setups
        self.save()

    # -- what the comparator reads ---------------------------------------------------------------------

    def records(self) -> list[RequestRecord]:
        path = _plain_or_xz(self.requests_path)
        out = read_records(path) if path.exists() else []
        imported = self.path / IMPORTED
        if imported.is_dir():
            for file in sorted(imported.glob("*.jsonl")):
                out += read_records(file)
        return out

    def run_summaries(self) -> list[RunSummary]:
        return read_run_summaries(self.runs_path) if self.runs_path.exists() else []

    def telemetry(self) -> pd.DataFrame:
        """Every GPU sample of the run, one row each (empty without telemetry)."""
        return read_samples(_plain_or_xz(self.telemetry_path))

    def setups(self) -> list[SetupReport]:
        return [SetupReport.from_dict(s) for s in self.manifest.get("setups", [])]

    def points(self) -> dict[str, PointInfo]:
        """run id -> what is known of its load point: workload from the manifest, schedule and interruption
        from runs.jsonl, imported points from the manifest's `imported` list."""
        summaries = {s.run_id: s for s in self.run_summaries()}
        out: dict[str, PointInfo] = {}
        for p in self.manifest.get("points", []):
            sched = p.get("schedule") or {}
            summary = summaries.get(p["run_id"])
            out[p["run_id"]] = _point(p.get("workload", ""), sched, summary, int(p.get("repeat", 0)))
        for rid, summary in summaries.items():
            if rid not in out:
                out[rid] = _point("", summary.schedule, summary)
        for p in self.manifest.get("imported", []):
            out[p["run_id"]] = PointInfo(
                workload=p.get("workload", ""),
                mode="imported",
                concurrency=p.get("concurrency"),
                rate=p.get("rate"),
                duration_s=p.get("duration_s"),
                lag_measured=False,
                source=p.get("source", "imported"),
            )
        return out

    def slo(self) -> dict[str, float]:
        return dict((self.manifest.get("config") or {}).get("slo_s") or {})

    def write_summary(self, summary: pd.DataFrame) -> None:
        summary.to_csv(self.path / SUMMARY_CSV, index=False, float_format="%.6g")
        summary.to_parquet(self.path / SUMMARY_PARQUET, index=False)


def _plain_or_xz(path: Path) -> Path:
    """`path`, or its `.xz` beside it when only that exists (a committed run directory keeps its large files
    compressed, and `compare report` reads them as they are)."""
    packed = path.with_name(path.name + ".xz")
    return packed if not path.exists() and packed.exists() else path


def _point(workload: str, sched: dict[str, Any], summary: RunSummary | None, repeat: int = 0) -> PointInfo:
    kind = sched.get("kind", "")
    rate = sched.get("rate") if kind in ("open", "trace") else None
    if summary is not None and summary.offered_rate is not None:
        rate = summary.offered_rate
    return PointInfo(
        workload=workload,
        mode=kind,
        concurrency=sched.get("concurrency") if kind == "closed" else sched.get("max_concurrency"),
        rate=rate,
        arrival=sched.get("arrival"),
        interrupted=bool(summary.interrupted) if summary is not None else False,
        repeat=repeat,
    )
