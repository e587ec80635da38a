"""Check published claims about CUDA graphs in LLM serving against our H200 measurements, and tabulate the
decode-latency results, from the JSON lines that benchmarks/decode_latency.py wrote.

    python benchmarks/graph_claims.py benchmarks/results/h200

writes its part of that folder's README.md, between two markers; what follows them (later measurements,
written by hand) is kept.

Each claim gets our engine's and vLLM's numbers and a plain verdict. E2E at batch 1 = TTFT + 127 x TPOT.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

SHAPES = ["llama-3.2-1b", "llama-2-7b", "llama-2-13b"]
NEW = 128
# commits measured: the current one, and the one before the attention rewrite
OURS, PREV = "66d2f29", "7675120"


def load(folder: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (folder / name).read_text().splitlines() if line.strip()]


def index(rows: list[dict]) -> dict[tuple, dict]:
    return {(r["shape"], r["mode"], r["batch"]): r for r in rows}


def e2e(row: dict) -> float:
    return row["ttft_ms"] + (NEW - 1) * row["tpot_ms"]


def fmt(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def latency_table(ours: dict, ours_prev: dict, vllm: dict, hf: dict) -> list[str]:
    lines = [
        "| shape | batch | ours graphs TPOT | ours eager TPOT | vLLM graphs TPOT | vLLM eager TPOT | "
        "transformers static TPOT | ours graphs roofline | ours TTFT | vLLM TTFT |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shape in SHAPES:
        for batch in (1, 8, 32, 64):
            g, e = ours.get((shape, "graphs", batch)), ours.get((shape, "eager", batch))
            pg, pe = ours_prev.get((shape, "graphs", batch)), ours_prev.get((shape, "eager", batch))
            vg, ve = vllm.get((shape, "graphs", batch)), vllm.get((shape, "eager", batch))
            h = hf.get((shape, "static-cache", batch))

            def both(a, b):
                if a is None:
                    return "—"
                return fmt(a["tpot_ms"]) + (f" ({fmt(b['tpot_ms'])})" if b else "")

            lines.append(
                f"| {shape} | {batch} | {both(g, pg)} | {both(e, pe)} | "
                f"{fmt(vg['tpot_ms']) if vg else '—'} | {fmt(ve['tpot_ms']) if ve else '—'} | "
                f"{fmt(h['tpot_ms']) if h else '—'} | {g['roofline_fraction']:.0%} | "
                f"{fmt(g['ttft_ms'], 1)} | {fmt(vg['ttft_ms'], 1) if vg else '—'} |"
            )
    return lines


def claims(ours: dict, ours_prev: dict, vllm: dict) -> list[str]:
    out = ["| # | claim | ours (H200) | vLLM 0.26 (H200) | verdict |", "| --- | --- | --- | --- | --- |"]

    def gain(tab, shape, batch, metric=e2e):
        g, e = tab.get((shape, "graphs", batch)), tab.get((shape, "eager", batch))
        return (metric(e) / metric(g), g, e) if g and e else (float("nan"), g, e)

    r, g, e = gain(ours, "llama-2-7b", 1)
    r2, _, _ = gain(ours_prev, "llama-2-7b", 1)
    v, vg, ve = gain(vllm, "llama-2-7b", 1)
    out.append(
        f"| 1 | batch 1, 7B: end-to-end latency falls about 1.8x with graphs | {r:.1f}x "
        f"({fmt(e2e(e), 0)} → {fmt(e2e(g), 0)} ms); {r2:.1f}x at {PREV} | {v:.1f}x ({fmt(e2e(ve), 0)} "
        f"→ {fmt(e2e(vg), 0)} ms) | holds in direction, understated: on an H200 the GPU work per step "
        "is so small that launch overhead dominates eager decode, and graphs gain more than 1.8x |"
    )
    g, e = ours.get(("llama-2-13b", "graphs", 1)), ours.get(("llama-2-13b", "eager", 1))
    vg, ve = vllm.get(("llama-2-13b", "graphs", 1)), vllm.get(("llama-2-13b", "eager", 1))
    out.append(
        f"| 2 | 13B TTFT falls from 42 to 23 ms with graphs (H100) | TTFT {fmt(e['ttft_ms'], 1)} "
        f"eager, {fmt(g['ttft_ms'], 1)} graphs: our graphs capture decode only, prefill always runs "
        f"eager | {fmt(ve['ttft_ms'], 1)} eager, {fmt(vg['ttft_ms'], 1)} graphs | does not hold here: "
        "TTFT is the prefill, which our graphs do not touch; vLLM V1 captures piecewise graphs for "
        "batches up to 512 tokens (attention outside them), so a 512-token prefill can replay one, "
        "but we measured no gain; TGI captures decode batch sizes only; TensorRT-LLM's graphs are for "
        "generation steps |"
    )
    r, g, e = gain(ours, "llama-2-7b", 8, lambda x: x["tpot_ms"])
    v, vg, ve = gain(vllm, "llama-2-7b", 8, lambda x: x["tpot_ms"])
    r64, _, _ = gain(ours, "llama-2-7b", 64, lambda x: x["tpot_ms"])
    v64, _, _ = gain(vllm, "llama-2-7b", 64, lambda x: x["tpot_ms"])
    out.append(
        f"| 3 | at batch 8 the gain shrinks to about 20% | 7B TPOT {r:.1f}x at batch 8, {r64:.2f}x at "
        f"64 | {v:.1f}x at batch 8, {v64:.1f}x at 64 | does not hold at batch 8 on an H200: the gain "
        "shrinks only once the step is long enough to hide launches (batch 64 for us, where eager "
        "decode is still bound by the host) |"
    )
    g = ours.get(("llama-2-7b", "graphs", 1))
    s = g["setup"]
    n = len(s["cuda_graph_buckets"])
    out.append(
        f"| 4 | each graph costs about 150 MB for a 7B model, 1.5 GB for 10 graphs | {n} buckets "
        f"share one pool: {s['cuda_graph_pool_bytes'] / 2**20:.0f} MiB in all | `Graph capturing "
        "finished ..., took 0.24 GiB` for all its sizes (log) | does not hold: graphs captured into "
        "one pool share their activation memory; the cost is the largest batch's activations, not a "
        "sum |"
    )
    g, e = ours.get(("llama-2-13b", "graphs", 1)), ours.get(("llama-2-13b", "eager", 1))
    gp, ep = ours_prev.get(("llama-2-13b", "graphs", 1)), ours_prev.get(("llama-2-13b", "eager", 1))
    vg, ve = vllm.get(("llama-2-13b", "graphs", 1)), vllm.get(("llama-2-13b", "eager", 1))
    out.append(
        f"| 5 | batch 1, 512 in / 128 out, 13B: TTFT 38 → 21 ms, TPOT 12 → 9 ms, 12.3 → 15.8 req/s "
        f"(A100) | TTFT {fmt(e['ttft_ms'], 1)} → {fmt(g['ttft_ms'], 1)} ms, TPOT {fmt(e['tpot_ms'])} "
        f"→ {fmt(g['tpot_ms'])} ms, {1e3 / e2e(e):.2f} → {1e3 / e2e(g):.2f} req/s ({PREV}: TPOT "
        f"{fmt(ep['tpot_ms'])} → {fmt(gp['tpot_ms'])}) | TTFT {fmt(ve['ttft_ms'], 1)} → "
        f"{fmt(vg['ttft_ms'], 1)}, TPOT {fmt(ve['tpot_ms'])} → {fmt(vg['tpot_ms'])}, "
        f"{1e3 / e2e(ve):.2f} → {1e3 / e2e(vg):.2f} req/s "
        "| the TPOT direction holds (the gain is larger here); the request rate cannot: at batch 1 "
        "with 128 tokens at 9 ms each a request takes over a second, so 15.8 req/s is arithmetically "
        "impossible |"
    )
    out.append(
        "| 6 | disabling graphs frees 10-15% of device memory | "
        f"{s['cuda_graph_pool_bytes'] / 2**20:.0f} "
        "MiB of 141 GB (under 0.1%); our KV budget keeps 1 GiB for graphs, 0.7% | 0.24 GiB (0.2%) | "
        "does not hold: graph memory is a fraction of a percent; the 10-15% likely counts a KV-cache "
        "utilisation setting |"
    )
    same = {}
    for name, tab in (("ours", ours), ("vLLM", vllm)):
        counts = []
        for shape in SHAPES:
            a, b = tab.get((shape, "eager", 8)), tab.get((shape, "graphs", 8))
            if a and b and a.get("tokens") and b.get("tokens"):
                counts.append(sum(x == y for x, y in zip(a["tokens"], b["tokens"], strict=True)))
        same[name] = f"{sum(counts)}/{8 * len(counts)} sequences of 128 greedy tokens identical at batch 8"
    out.append(
        f"| 7 | graph replay gives results identical to eager | {same['ours']}; our test over every "
        "bucket and in-between size (`tests/test_gpu.py`, passes on the H200): logits within 1e-5 "
        "(float32) and 2e-2 (bfloat16) of eager, tokens parting only at near-ties | "
        f"{same['vLLM']} | holds when the batch fills its bucket; a padded batch runs different GEMM "
        "kernels (cuBLAS picks by row count), so bf16 logits differ in the last bits and greedy "
        "tokens can part at near-ties. Our decode attention splits every sequence the same way "
        "whatever the batch, so it adds no difference of its own; identical kernels replayed are "
        "identical |"
    )
    return out


START, END = "<!-- graph_claims:start -->", "<!-- graph_claims:end -->"


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/h200")
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        write_tables(folder)
    readme = folder / "README.md"
    old = readme.read_text() if readme.exists() else ""
    rest = old.split(END, 1)[1] if END in old else "\n"
    readme.write_text(f"{START}\n{text.getvalue()}{END}{rest}")


def write_tables(folder: Path) -> None:
    ours = index(load(folder, f"reference-{OURS}.jsonl"))
    ours_prev = index(load(folder, f"reference-{PREV}.jsonl"))
    attention = load(folder, f"decode-attention-{OURS}.jsonl")
    vllm = index(load(folder, "vllm-0.26.0.jsonl"))
    hf = index(load(folder, "transformers-static-cache.jsonl"))
    first = next(iter(ours.values()))
    print("# Decode latency and CUDA-graph claims on an NVIDIA H200\n")
    print(
        f"Machine: {first['gpu']}, torch {first['torch']}, Python {first['python']}, measured "
        f"device-to-device copy bandwidth {first['copy_bandwidth_tb_s']:.2f} TB/s (read + write). Random "
        "bf16 weights, 512-token prompts, 128 new tokens, greedy, `ignore_eos`.\n"
    )
    print("Commands (our rows run on {date}):\n".format(date=first["date"]))
    print(
        "```\npython benchmarks/decode_latency.py --backend reference --repeats 2 --out "
        "reference-<commit>.jsonl"
    )
    print(
        "python benchmarks/decode_latency.py --backend hf --batches 1 --repeats 1 --out "
        "transformers-static-cache.jsonl"
    )
    print(
        "PYTHONPATH=SITE VLLM_USE_FLASHINFER_SAMPLER=0 python benchmarks/decode_latency.py --backend vllm "
        "--shapes llama-2-7b,llama-2-13b,llama-3.2-1b --repeats 1 --out vllm-0.26.0.jsonl"
    )
    print(
        "python benchmarks/decode_attention.py --impl-root CHECKOUT_OF_b033a5b --sweep default --label "
        "b033a5b --out decode-attention-<commit>.jsonl"
    )
    print(
        "python benchmarks/decode_attention.py --sweep default --label <commit> --out "
        "decode-attention-<commit>.jsonl"
    )
    print("python benchmarks/profile_decode.py --shape llama-2-7b --batches 1,64 > profile-<commit>.txt")
    print("python benchmarks/graph_claims.py benchmarks/results/h200\n```\n")
    print(
        "The sweep of launch settings that chose the decode attention's defaults (`python "
        "benchmarks/decode_attention.py --batches 1,64`, at commit ca0eed7) is in "
        "`decode-attention-ca0eed7.jsonl`.\n"
    )
    print(
        "Our TPOT is the median per-request (last token - first token) / 127 from per-step timestamps; "
        "vLLM's and transformers' are (time for 128 tokens - time for 1 token) / 127 over the batch, which "
        "is exact at batch 1 and flatters vLLM at large batches (its chunked prefill overlaps the first "
        "decode steps), which is why its large-batch rows exceed the roofline. Roofline: weights + KV "
        "bytes a decode step must read, over the measured copy bandwidth.\n"
    )
    print(
        f"Ours: commit {OURS} (decode attention: one query vector per program for MHA, GQA groups on the "
        f"tensor cores, 64-token partitions), in brackets commit {PREV} (the previous decode attention), "
        "measured earlier the same day on another machine of the same kind. Eager decode is bound by the "
        "host's Python speed, so its numbers move between machines.\n"
    )
    print("\n".join(latency_table(ours, ours_prev, vllm, hf)))
    g = ours[("llama-2-7b", "graphs", 1)]["setup"]
    print(
        f"\nStart-up of the 7B shape with graphs: {ours[('llama-2-7b', 'graphs', 1)]['startup_s']:.1f} s "
        f"(phases {', '.join(f'{k} {v:.2f} s' for k, v in g['phases'].items())}). Capture per bucket: "
        f"{', '.join(f'{k}: {v:.3f} s' for k, v in g['cuda_graph_capture_seconds'].items())}. The decode "
        "kernel now has one specialisation for every bucket (its partition no longer depends on the "
        "batch), so at most the first bucket compiles it; Triton's on-disk cache may have held it from "
        f"earlier runs on the same machine. At {PREV}: "
        f"{ours_prev[('llama-2-7b', 'graphs', 1)]['startup_s']:.1f} s, about "
        "1 s for each bucket that needed a new specialisation. vLLM: `init engine` 41.6 s for 7B with "
        "graphs (torch.compile 21.8 s, capture 2 s, 0.24 GiB), 20.2 s eager.\n"
    )
    print(
        "Decode attention alone, one layer's call, GPU time from CUDA-graph replays over cycled caches "
        "(contexts 512-640 tokens, launched for 1024 as in a graph; `benchmarks/decode_attention.py`, both "
        "on the same machine, one after the other; the previous kernel is b033a5b's, the same as "
        f"{PREV}'s):\n"
    )
    print("| shape | batch | previous kernel (us) | current (us) | current KV read (TB/s) |")
    print("| --- | --- | --- | --- | --- |")
    by = {(r["label"], r["shape"], r["batch"]): r for r in attention}
    for shape in SHAPES:
        for batch in sorted({r["batch"] for r in attention}):
            old, new = by.get(("b033a5b", shape, batch)), by.get((OURS, shape, batch))
            if old and new:
                print(f"| {shape} | {batch} | {old['us']:.1f} | {new['us']:.1f} | {new['kv_tb_s']:.2f} |")
    print()
    print("## The CUDA-graph claims\n")
    print("\n".join(claims(ours, ours_prev, vllm)))


if __name__ == "__main__":
    main()
