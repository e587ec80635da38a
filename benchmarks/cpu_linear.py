"""Float32 linears on one CPU thread: F.linear (MKL) against oneDNN on pre-packed weights, over every linear
of SmolLM2-135M's shapes (30 layers of QKV, O, gate/up, down and the 49152-row LM head: 540 MB, far more than
the caches, so each pass streams the weights from memory as a decode step does).

    python benchmarks/cpu_linear.py --out benchmarks/results/cpu_linear.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reference_engine.kernels.cpu_linear import PackedLinear

HIDDEN, INTERMEDIATE, QKV, VOCAB, LAYERS = 576, 1536, 576 * 3, 49152, 30


def weights() -> list[torch.Tensor]:
    per_layer = [(QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]
    return [torch.randn(shape) for _ in range(LAYERS) for shape in per_layer] + [torch.randn(VOCAB, HIDDEN)]


def seconds_per_pass(fns: list, inputs: dict[int, torch.Tensor], reps: int) -> float:
    for fn, k in fns:  # one untimed pass
        fn(inputs[k])
    start = time.perf_counter()
    for _ in range(reps):
        for fn, k in fns:
            fn(inputs[k])
    return (time.perf_counter() - start) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,8,64,256")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ws = weights()
    total = sum(w.numel() * 4 for w in ws)
    plain = [(lambda x, w=w: F.linear(x, w), w.shape[1]) for w in ws]
    packed_modules = []
    for w in ws:
        linear = nn.Linear(w.shape[1], w.shape[0], bias=False)
        linear.weight.data = w
        packed_modules.append((PackedLinear(linear), w.shape[1]))
    lines = [
        f"# Float32 linears on {args.threads} CPU thread(s): F.linear against oneDNN on packed weights",
        "",
        f"{platform.processor() or platform.machine()}, {platform.platform()}, torch {torch.__version__}; "
        f"all {len(ws)} linears of SmolLM2-135M ({total / 1e6:.0f} MB of float32 weights) per pass.",
        "",
        "```",
        "python " + " ".join(sys.argv),
        "```",
        "",
        "| rows | F.linear ms | GB/s | oneDNN packed ms | GB/s | speed-up |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            inputs = {k: torch.randn(rows, k) for k in (HIDDEN, INTERMEDIATE)}
            reps = 5 if rows <= 64 else 2
            t_plain = seconds_per_pass(plain, inputs, reps)
            t_packed = seconds_per_pass(packed_modules, inputs, reps)
            lines.append(
                f"| {rows} | {t_plain * 1e3:.1f} | {total / t_plain / 1e9:.1f} | {t_packed * 1e3:.1f} | "
                f"{total / t_packed / 1e9:.1f} | {t_plain / t_packed:.2f}x |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
