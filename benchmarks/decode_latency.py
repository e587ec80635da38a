"""Decode latency on a GPU: our engine (eager and CUDA graphs), Hugging Face transformers (static cache) and
vLLM (eager and graphs), random bf16 weights of real model shapes, 512-token prompts, 128 new tokens.

    python benchmarks/decode_latency.py --backend reference --out results.jsonl
    python benchmarks/decode_latency.py --backend hf --batches 1 --out results.jsonl
    PYTHONPATH=SITE VLLM_USE_FLASHINFER_SAMPLER=0 python benchmarks/decode_latency.py --backend vllm ...

One JSON line per (backend, mode, shape, batch): TTFT and TPOT medians over requests and repeats, the
memory-bandwidth roofline (weights + KV bytes read per decode step over the measured copy bandwidth), and the
backend's start-up cost (set-up phases, graph capture per bucket, graph pool memory).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from knobs import add_set_option, set_knobs

from reference_engine.model_config import ModelSpec, named_shape

PROMPT_LEN = 512
NEW_TOKENS = 128


def copy_bandwidth(gib: float = 4.0) -> float:
    """Device-to-device copy bandwidth, bytes read plus written per second (median of 20)."""
    n = int(gib * 2**30) // 2
    src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * n * 2 / statistics.median(times[5:])


def roofline_seconds(spec: ModelSpec, batch: int, context: float, bandwidth: float) -> float:
    """Fewest bytes a decode step must move: every weight once (an untied input embedding only for the batch's
    rows, which we neglect), plus each sequence's K/V context."""
    untied_embedding = 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden_size
    weights = (spec.num_parameters() - untied_embedding) * 2
    kv = batch * context * spec.kv_bytes_per_token(2)
    return (weights + kv) / bandwidth


def random_prompts(batch: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, PROMPT_LEN), generator=g).tolist()


def run_reference(shape: str, mode: str, batches: list[int], repeats: int) -> list[dict]:
    from reference_engine import Engine, EngineConfig, SamplingParams

    spec = named_shape(shape)
    t0 = time.perf_counter()
    engine = Engine(
        EngineConfig(
            model=f"random:{shape}",
            device="cuda",
            dtype="bfloat16",
            max_num_seqs=64,
            max_model_len=1024,
            max_num_batched_tokens=64 * PROMPT_LEN,
            enforce_eager=mode == "eager",
            async_scheduling=mode != "graphs-sync",
        )
    )
    startup = time.perf_counter() - t0
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    engine.generate(random_prompts(2, spec.vocab_size, 0), params)  # warm-up (kernel compiles, cuBLAS)
    rows = []
    for batch in batches:
        ttfts, tpots = [], []
        for r in range(repeats + 1):  # the first round warms up this batch's prefill shape (first-use costs)
            prompts = random_prompts(batch, spec.vocab_size, 1000 * batch + r)
            first, last, final = {}, {}, {}
            torch.cuda.synchronize()
            submitted = time.perf_counter()
            ids = [engine.add_request(p, params) for p in prompts]
            while engine.has_unfinished_requests():
                outs = engine.step()
                now = time.perf_counter()
                for o in outs:
                    first.setdefault(o.request_id, now)
                    last[o.request_id] = now
                    if o.finished:
                        final[o.request_id] = o.token_ids
            if r == 0:
                continue
            ttfts += [t - submitted for t in first.values()]
            tpots += [(last[i] - first[i]) / (NEW_TOKENS - 1) for i in first]
        rows.append(
            dict(
                backend="reference",
                mode=mode,
                shape=shape,
                batch=batch,
                ttft_ms=1e3 * statistics.median(ttfts),
                tpot_ms=1e3 * statistics.median(tpots),
                startup_s=startup,
                setup=engine.setup.to_dict(),
                tokens=[final[i] for i in ids] if batch == 8 else None,
            )
        )
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def run_hf(shape: str, batches: list[int], repeats: int) -> list[dict]:
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = named_shape(shape)
    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        rope_theta=spec.rope_theta,
        rope_scaling=spec.rope_scaling,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cuda").to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.generation_config.eos_token_id = None
    rows = []
    for batch in batches:
        ttfts, e2es = [], []
        for r in range(repeats + 1):
            ids = torch.tensor(random_prompts(batch, spec.vocab_size, 7 + r), device="cuda")
            times = {}
            for new in (1, NEW_TOKENS):
                torch.cuda.synchronize()
                t = time.perf_counter()
                with torch.no_grad():
                    model.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=new,
                        min_new_tokens=new,
                        do_sample=False,
                        cache_implementation="static",
                        pad_token_id=0,
                    )
                torch.cuda.synchronize()
                times[new] = time.perf_counter() - t
            if r:  # the first round warms up
                ttfts.append(times[1])
                e2es.append(times[NEW_TOKENS])
        ttft, e2e = statistics.median(ttfts), statistics.median(e2es)
        rows.append(
            dict(
                backend="transformers",
                mode="static-cache",
                shape=shape,
                batch=batch,
                ttft_ms=1e3 * ttft,
                tpot_ms=1e3 * (e2e - ttft) / (NEW_TOKENS - 1),
            )
        )
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def vllm_model_dir(shape: str) -> str:
    """A folder with only config.json, for LLM(load_format="dummy")."""
    spec = named_shape(shape)
    folder = Path(tempfile.mkdtemp(prefix=f"vllm-{shape}-"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": spec.rope_scaling,
        "max_position_embeddings": spec.max_position_embeddings,
        "hidden_act": "silu",
        "tie_word_embeddings": spec.tie_word_embeddings,
        "torch_dtype": "bfloat16",
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_ids[0],
    }
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def run_vllm(shape: str, mode: str, batches: list[int], repeats: int) -> list[dict]:
    from vllm import LLM
    from vllm import SamplingParams as VllmParams

    spec = named_shape(shape)
    t0 = time.perf_counter()
    llm = LLM(
        model=vllm_model_dir(shape),
        load_format="dummy",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enforce_eager=mode == "eager",
        max_model_len=1024,
        max_num_seqs=64,
        gpu_memory_utilization=0.85,
        seed=0,
    )
    startup = time.perf_counter() - t0
    rows = []
    for batch in batches:
        ttfts, e2es = [], []
        for r in range(repeats + 1):
            prompts = [{"prompt_token_ids": p} for p in random_prompts(batch, spec.vocab_size, 11 + r)]
            times = {}
            for new in (1, NEW_TOKENS):
                params = VllmParams(
                    max_tokens=new, min_tokens=new, ignore_eos=True, temperature=0.0, detokenize=False
                )
                t = time.perf_counter()
                outs = llm.generate(prompts, params, use_tqdm=False)
                times[new] = time.perf_counter() - t
            tokens = [list(o.outputs[0].token_ids) for o in outs]
            if r:
                ttfts.append(times[1])
                e2es.append(times[NEW_TOKENS])
        ttft, e2e = statistics.median(ttfts), statistics.median(e2es)
        total, free = torch.cuda.mem_get_info()[1], torch.cuda.mem_get_info()[0]
        rows.append(
            dict(
                backend="vllm",
                mode=mode,
                shape=shape,
                batch=batch,
                ttft_ms=1e3 * ttft,
                tpot_ms=1e3 * (e2e - ttft) / (NEW_TOKENS - 1),
                startup_s=startup,
                gpu_memory_used_gib=total / 2**30 - free / 2**30,
                tokens=tokens if batch == 8 else None,
            )
        )
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["reference", "hf", "vllm"], required=True)
    p.add_argument("--shapes", default="llama-3.2-1b,llama-2-7b,llama-2-13b")
    p.add_argument(
        "--modes",
        default="graphs,eager",
        help="graphs, eager (both with overlapped decode for our engine), graphs-sync (ours without it)",
    )
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", required=True)
    add_set_option(p)
    args = p.parse_args()
    knobs = set_knobs(args.set)
    bandwidth = copy_bandwidth()
    machine = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        python=platform.python_version(),
        copy_bandwidth_tb_s=bandwidth / 1e12,
        command=" ".join(sys.argv),
        date=time.strftime("%Y-%m-%d"),
    )
    batches = [int(b) for b in args.batches.split(",")]
    with open(args.out, "a") as out:
        for shape in args.shapes.split(","):
            spec = named_shape(shape)
            for mode in args.modes.split(",") if args.backend != "hf" else ["static-cache"]:
                if args.backend == "reference":
                    rows = run_reference(shape, mode, batches, args.repeats)
                elif args.backend == "hf":
                    rows = run_hf(shape, batches, args.repeats)
                else:
                    rows = run_vllm(shape, mode, batches, args.repeats)
                for row in rows:
                    context = PROMPT_LEN + NEW_TOKENS / 2  # mean context over the decode steps
                    floor = roofline_seconds(spec, row["batch"], context, bandwidth)
                    row.update(
                        roofline_ms=1e3 * floor,
                        roofline_fraction=1e3 * floor / row["tpot_ms"],
                        knobs=knobs,
                        **machine,
                    )
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(
                        f"{row['backend']:>12} {row['mode']:>12} {shape:>13} b={row['batch']:<3} "
                        f"TTFT {row['ttft_ms']:8.2f} ms  TPOT {row['tpot_ms']:7.3f} ms  "
                        f"roofline {row['roofline_fraction']:.1%} {knobs or ''}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
