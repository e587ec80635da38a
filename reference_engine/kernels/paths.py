"""Where the engine keeps what it builds once and reuses: the compiled C kernels (cpu_kernels) and the
converted built-in models (reference_engine/builtin_models.py)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where converted models live: $LLM_COMPARE_CACHE, else ~/.cache/llm-compare."""
    return Path(os.environ.get("LLM_COMPARE_CACHE", Path.home() / ".cache" / "llm-compare"))
