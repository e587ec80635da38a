"""The tokenizer that goes with a model: the checkpoint's own, or a synthetic one for random weights.

A random-weight model has no tokenizer of its own; the synthetic one maps token id i to the word `<i>`, so
any id sequence has a text form that encodes back to exactly the same ids (what workloads need to build
token-exact prompts).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from reference_engine.model_config import ModelSpec

if TYPE_CHECKING:  # transformers is imported where a tokenizer is loaded: an engine core never needs it
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast


def load_tokenizer(checkpoint: Path | None, spec: ModelSpec, override: str | None = None
                   ) -> PreTrainedTokenizerBase:
    source = override or (str(checkpoint) if checkpoint is not None else None)
    if source is None:
        return synthetic_tokenizer(spec)
    return checkpoint_tokenizer(source)


def checkpoint_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """The tokenizer stored at `source` (a directory, or a hub id)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(f"could not load a tokenizer from {source}: {exc}") from exc


def synthetic_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {_word(i): i for i in range(spec.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=_word(0)))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos = spec.eos_token_ids[0] if spec.eos_token_ids else None
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=_word(0),
        bos_token=_word(spec.bos_token_id) if spec.bos_token_id is not None else None,
        eos_token=_word(eos) if eos is not None else None,
    )


def _word(token_id: int) -> str:
    # Bracketed, so that no word is a substring of another (special tokens match inside words).
    return f"<{token_id}>"
