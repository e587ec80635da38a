"""The model as the servers read it (a built-in one converted first) and the tokenizer the prompts are made
with, each wait told to the watcher."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from compare.measure.watcher import Watcher
from compare.plan.run_options import RunPlan

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def model_and_tokenizer(plan: RunPlan, watcher: Watcher) -> tuple[str, PreTrainedTokenizerBase]:
    """The model as the servers read it (a built-in one converted first) and the tokenizer of the prompts."""
    launched = any(b.launched for b in plan.backends)
    model_path = _resolve_model(plan.model, watcher) if (launched or plan.tokenizer is None) else plan.model
    tok_name = plan.tokenizer or model_path
    tok_name = _resolve_model(tok_name, watcher) if tok_name == plan.model else tok_name
    with watcher.wait(f"loading the tokenizer ({tok_name})"):
        return model_path, _load_tokenizer(tok_name)


def _resolve_model(model: str, watcher: Watcher) -> str:
    from reference_engine.builtin_models import BUILTIN_MODELS, builtin_checkpoint

    if model in BUILTIN_MODELS:
        started = time.perf_counter()
        with watcher.wait(f"built-in model {model}: preparing the checkpoint (converted once, then cached)"):
            path = str(builtin_checkpoint(model))
        watcher.say(f"built-in model {model}: checkpoint ready in {time.perf_counter() - started:.1f} s")
        return path
    return model


def _load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    if name.startswith("random:"):  # random weights of a named shape: the server's synthetic tokenizer
        from reference_engine.loader import resolve_model
        from reference_engine.tokenizer import synthetic_tokenizer

        return synthetic_tokenizer(resolve_model(name).spec)
    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:
        raise RuntimeError(
            f"cannot load the tokenizer {name!r} (give --tokenizer a local directory): {exc}"
        ) from exc
