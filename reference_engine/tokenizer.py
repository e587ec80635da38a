"""The tokenizer that goes with a model: the checkpoint's own, or a synthetic one for random weights.

A random-weight model has no tokenizer of its own; the synthetic one maps token id i to the word `<i>`, so
any id sequence has a text form that encodes back to exactly the same ids (what workloads need to build
token-exact prompts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from reference_engine.model_config import ModelSpec

if TYPE_CHECKING:  # transformers is imported where a tokenizer is loaded: an engine core never needs it
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast


def load_tokenizer(
    checkpoint: Path | None, spec: ModelSpec, override: str | None = None
) -> PreTrainedTokenizerBase:
    source = override or (str(checkpoint) if checkpoint is not None else None)
    if source is None:
        return synthetic_tokenizer(spec)
    return checkpoint_tokenizer(source)


#: tokenizer classes that name no model's own: for these, with the conditions of `plain_fast_tokenizer`,
#: AutoTokenizer loads the tokenizers-library tokenizer itself (TokenizersBackend; PreTrainedTokenizerFast
#: before transformers 5)
GENERIC_TOKENIZER_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
#: model types whose generic tokenizer AutoTokenizer does not swap for a class of their own
PLAIN_TOKENIZER_MODEL_TYPES = frozenset({"llama"})  # qwen2, for one, gets Qwen2Tokenizer


def checkpoint_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """The tokenizer stored at `source` (a directory, or a hub id)."""
    try:
        if plain_fast_tokenizer(source):
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(source)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(f"could not load a tokenizer from {source}: {exc}") from exc


def plain_fast_tokenizer(source: str) -> bool:
    """Whether `source` is a local directory whose tokenizer AutoTokenizer would load as the plain
    tokenizers-library class: a tokenizer.json, a tokenizer_config.json naming a generic class and no code of
    its own, and a model type (config.json, if any) that keeps it (tests check each against AutoTokenizer).
    Loading that class directly skips AutoTokenizer's module, which imports transformers' model
    configuration and with it torch: 5-7 s of a front end's start-up on a GPU host, in a process that never
    runs a model."""
    folder = Path(source).expanduser()
    config_file = folder / "config.json"
    try:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        model_config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    except (OSError, ValueError):
        return False
    return (
        (folder / "tokenizer.json").is_file()
        and tokenizer_config.get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES
        and "auto_map" not in tokenizer_config
        and "auto_map" not in model_config
        and model_config.get("model_type", "llama") in PLAIN_TOKENIZER_MODEL_TYPES
    )


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
