"""llm-compare's reference engine: a small, readable LLM inference engine used as the measured baseline."""

from reference_engine.config import EngineConfig, SamplingParams
from reference_engine.engine import Engine, EngineStats, SetupReport
from reference_engine.sequence import RequestOutput

__all__ = ["Engine", "EngineConfig", "EngineStats", "RequestOutput", "SamplingParams", "SetupReport"]
