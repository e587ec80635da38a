"""A real Hugging Face checkpoint of a named Llama shape: random bf16 weights, saved as safetensors beside a
real tokenizer's files, so that vLLM and our engine load the very same files (as a user's checkpoint) and
their responses re-tokenise to the token counts they report.

    python benchmarks/h200_serving/random_checkpoint.py OUT_DIR llama-2-7b --tokenizer TOKENIZER_DIR

The vocabulary is the tokenizer's; every other dimension is the shape's (reference_engine.model_config).
Weights are drawn on the GPU when there is one (a 7B in seconds), seeded, then written with transformers.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from reference_engine.model_config import named_shape

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("shape", help="a named shape, e.g. llama-3.2-1b, llama-2-7b")
    p.add_argument(
        "--tokenizer", type=Path, required=True, help="a directory with tokenizer.json and its config"
    )
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (args.tokenizer / name).exists():
            shutil.copy(args.tokenizer / name, args.out / name)
    tok = AutoTokenizer.from_pretrained(args.out)
    s = named_shape(args.shape)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        rms_norm_eps=s.rms_norm_eps,
        rope_theta=s.rope_theta,
        max_position_embeddings=args.max_len,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(args.seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    params = sum(t.numel() for t in model.parameters())
    print(
        f"{args.out}: {args.shape}, {params / 1e9:.2f} B parameters, vocab {len(tok)}, "
        f"{time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
