"""llm-compare's reference engine: a small, readable LLM inference engine used as the measured baseline.

The names below are imported on first use, not with the package: `python -m reference_engine.server` imports
this package before its own code runs, and must start the engine core's process before anything imports
torch, so that the two processes import it side by side (reference_engine/server.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reference_engine.config import EngineConfig, SamplingParams
    from reference_engine.engine import Engine
    from reference_engine.engine_info import EngineStartup, EngineStats
    from reference_engine.sequence import RequestOutput

_HOMES = {
    "Engine": "reference_engine.engine",
    "EngineConfig": "reference_engine.config",
    "EngineStartup": "reference_engine.engine_info",
    "EngineStats": "reference_engine.engine_info",
    "RequestOutput": "reference_engine.sequence",
    "SamplingParams": "reference_engine.config",
}
__all__ = ["Engine", "EngineConfig", "EngineStartup", "EngineStats", "RequestOutput", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'reference_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
