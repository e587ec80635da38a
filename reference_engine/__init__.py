"""llm-compare's reference engine: a small, readable LLM inference engine used as the measured baseline."""

from reference_engine.config import EngineConfig, SamplingParams
from reference_engine.engine import Engine, EngineStartup, EngineStats
from reference_engine.sequence import RequestOutput

__all__ = ["Engine", "EngineConfig", "EngineStartup", "EngineStats", "RequestOutput", "SamplingParams"]
