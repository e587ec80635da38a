"""Run the `compare` CLI as users do: a fresh interpreter, from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compare_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "compare.cli", *args]


def compare_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def run_compare(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run to the end; a non-zero exit fails the test with the end of both output streams."""
    proc = subprocess.run(
        compare_cmd(*args), env=compare_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
