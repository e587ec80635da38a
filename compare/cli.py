"""The `compare` command line."""

from __future__ import annotations

import logging
import time

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=False, help=__doc__)
console = Console()

DEMO_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about paged attention.",
    "Explain in one sentence why batching helps LLM serving.",
    "List three prime numbers.",
]


@app.command()
def demo(
    model: str = typer.Option("smollm2-135m", help="checkpoint dir, hub id, built-in name or random:<shape>"),
    max_tokens: int = typer.Option(48, min=1),
    device: str = typer.Option("auto"),
    dtype: str = typer.Option("auto"),
) -> None:
    """Generate answers to a few chat prompts with the reference engine (greedy) and report the speed."""
    from reference_engine import Engine, EngineConfig, SamplingParams

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    engine = Engine(EngineConfig(model=model, device=device, dtype=dtype))
    tok = engine.tokenizer
    prompts = []
    for text in DEMO_PROMPTS:
        if getattr(tok, "chat_template", None):
            prompts.append(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=False))
        else:
            prompts.append(tok.encode(text))
    start = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    elapsed = time.perf_counter() - start
    table = Table("prompt", "answer", "tokens", "finish")
    for text, out in zip(DEMO_PROMPTS, outs, strict=True):
        table.add_row(text, tok.decode(out.token_ids, skip_special_tokens=True), str(len(out.token_ids)),
                      out.finish_reason or "")
    console.print(table)
    n = sum(len(o.token_ids) for o in outs)
    console.print(f"{n} tokens in {elapsed:.2f} s ({n / elapsed:.1f} tok/s) on {engine.device}; "
                  f"set-up {engine.setup.phases['total']:.2f} s")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
