"""How far the engines' greedy outputs agree on a few prompts: each engine is launched as `compare run`
launches it (its adapter's launch spec, on this machine), asked for the same greedy completions, and its
tokens are compared with the first engine's: identical answers, and the tokens they share before the first
difference.

A comparison of speed is only one of engines if they compute the same thing; where the weights differ (the
built-in model: llama.cpp reads the Q4_1 GGUF, the others the float32 checkpoint converted from it) the
outputs drift apart, and this says how soon.

    LLM_COMPARE_LLAMACPP=... LLM_COMPARE_VLLM=... python benchmarks/output_agreement.py \
        --backends reference,llamacpp,vllm --out benchmarks/results/cpu_three_engines/output_agreement.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters import ADAPTERS
from adapters.launch_spec import ModelSource, Variant
from compare.launch.launcher import ProcessLauncher, ServerProcess, free_port, package_env

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "A good way to learn a new language is",
]


def greedy_answers(backend: str, checkpoint: str, served: str, max_tokens: int, log_dir: Path) -> list[str]:
    """Each prompt's greedy completion as the server wrote it (compared as tokens of the checkpoint's
    tokenizer, which llama.cpp's GGUF carries too)."""
    cls = ADAPTERS[backend]
    port = free_port()
    spec = cls.launch_spec(
        ModelSource(checkpoint, served), Variant(max_num_seqs=4), port, workdir=log_dir, gpu=False
    )
    for path in spec.dirs:
        Path(path).mkdir(parents=True, exist_ok=True)
    env = {**spec.env, **spec.process_env, **(package_env() if cls.server_family == "reference" else {})}
    launcher = ProcessLauncher(
        backend,
        "",
        ServerProcess(spec.command, env, None, list(spec.scratch)),
        f"http://127.0.0.1:{port}",
        spec.health_path,
        log_dir / f"{backend}.log",
        600,
    )
    texts = []
    with launcher:
        launcher.start()
        for prompt in PROMPTS:
            body = {"model": served, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
            resp = requests.post(f"{launcher.url}/v1/completions", json=body, timeout=300)
            resp.raise_for_status()
            texts.append(resp.json()["choices"][0]["text"])
    return texts


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="reference,llamacpp,vllm")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from reference_engine.builtin_models import BUILTIN_MODELS, builtin_checkpoint

    checkpoint = str(builtin_checkpoint(args.model)) if args.model in BUILTIN_MODELS else args.model
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    answers: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="agreement-") as tmp:
        for backend in backends:
            answers[backend] = greedy_answers(
                backend, checkpoint, args.model, args.max_tokens, Path(tmp) / backend
            )
    ids = {b: [tokenizer.encode(t, add_special_tokens=False) for t in texts] for b, texts in answers.items()}
    base = backends[0]
    rows = []
    for other in backends[1:]:
        prefixes = [shared_prefix(a, b) for a, b in zip(ids[base], ids[other], strict=True)]
        same = sum(a == b for a, b in zip(answers[base], answers[other], strict=True))
        rows.append(
            {
                "pair": f"{base} vs {other}",
                "identical": same,
                "prompts": len(PROMPTS),
                "shared_prefix_tokens": prefixes,
                "of_tokens": [len(a) for a in ids[base]],
            }
        )
        print(
            f"{base} vs {other}: {same}/{len(PROMPTS)} identical; tokens shared before the first "
            f"difference: {prefixes} (of {[len(a) for a in ids[base]]})"
        )
    result = {
        "model": args.model,
        "max_tokens": args.max_tokens,
        "prompts": PROMPTS,
        "answers": answers,
        "agreement": rows,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
