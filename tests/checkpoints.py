"""Tiny random-weight Hugging Face checkpoints with a tokenizer trained here, made without any network.

Weights are drawn with a large init scale so that logits are peaked: greedy decoding then has clear winners,
and engine-vs-transformers comparisons test arithmetic, not tie-breaking between near-equal logits.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

WORDS = [
    "the",
    "a",
    "engine",
    "token",
    "cache",
    "block",
    "paged",
    "attention",
    "serving",
    "latency",
    "throughput",
    "request",
    "stream",
    "batch",
    "graph",
    "kernel",
    "memory",
    "prefix",
    "decode",
    "prefill",
    "sample",
    "model",
    "weight",
    "layer",
    "head",
    "query",
    "key",
    "value",
    "scale",
    "rope",
    "norm",
    "vocab",
    "merge",
    "byte",
    "unicode",
    "café",
    "naïve",
    "東京",
    "данные",
    "λόγος",
    "emoji",
    "🙂",
    "🚀",
    "numbers",
    "0",
    "1",
    "2",
    "3",
    "42",
    "3.14",
    "and",
    "or",
    "not",
    "if",
    "then",
    "else",
    "while",
    "for",
    "in",
    "of",
    "to",
    "with",
    "from",
    "by",
    "on",
    "at",
]


def training_corpus(n_lines: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20))) for _ in range(n_lines)]


def make_tokenizer(out_dir: Path, vocab_size: int = 384):
    """A byte-level BPE tokenizer trained on a small multilingual corpus, saved for AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
    )
    fast.save_pretrained(str(out_dir))
    return fast


def make_checkpoint(
    out_dir: Path, family: str = "llama", seed: int = 0, shard: bool = False, **overrides
) -> Path:
    """Save a tiny random checkpoint of `family` (llama, qwen2 or mistral) with its tokenizer; `overrides`
    replace config fields (hidden_size, intermediate_size, num_hidden_layers, ...)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(out_dir)
    # head_dim 32: vLLM's CPU attention kernels support no smaller head. Llama and Mistral take head_dim from
    # the config (so q/k/v are wider than the hidden size, which the engine must handle); Qwen2 in vLLM
    # derives it from hidden_size / heads, so Qwen2 gets hidden 128.
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.3,
    )
    common.update(overrides)
    if family == "llama":
        # Llama 3 style: GQA, large theta, llama3 rope scaling (with a short original context so it bites).
        config = LlamaConfig(
            **common,
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        )
    elif family == "qwen2":
        config = Qwen2Config(
            **{**common, "hidden_size": 128},
            tie_word_embeddings=True,
            rope_theta=1000000.0,
            use_sliding_window=False,
        )
    elif family == "mistral":
        config = MistralConfig(**common, tie_word_embeddings=False, rope_theta=10000.0, sliding_window=None)
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # norms away from 1 and biases away from 0, so that a wrong mapping shows
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(str(out_dir), max_shard_size="100KB" if shard else "5GB")
    return out_dir
