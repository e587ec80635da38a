"""The tokenizer that goes with a model: the checkpoint's own, or a synthetic one for random weights.

A random-weight model has no tokenizer of its own; the synthetic one maps token id i to the word `t{i}`, so
any id sequence has a text form that encodes back to exactly the same ids (what workloads need to build
token-exact prompts).
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from reference_engine.model_config import ModelSpec


def load_tokenizer(checkpoint: Path | None, spec: ModelSpec, override: str | None = None
                   ) -> PreTrainedTokenizerBase:
    source = override or (str(checkpoint) if checkpoint is not None else None)
    if source is None:
        return synthetic_tokenizer(spec)
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(f"could not load a tokenizer from {source}: {exc}") from exc


def synthetic_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(spec.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos = spec.eos_token_ids[0] if spec.eos_token_ids else None
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="t0",
        bos_token=f"t{spec.bos_token_id}" if spec.bos_token_id is not None else None,
        eos_token=f"t{eos}" if eos is not None else None,
    )
