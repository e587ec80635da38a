"""CUDA-graph replay against eager execution on the GPU (skipped without one)."""

from __future__ import annotations

import random

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from reference_engine import Engine, EngineConfig, SamplingParams
from reference_engine.serving.async_engine import AsyncEngine
from reference_engine.serving.server_metrics import ServerMetrics

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# Every bucket size and sizes between buckets (max_num_seqs 48: buckets 1 2 4 8 16 24 32 48).
BATCH_SIZES = [1, 2, 3, 4, 5, 8, 13, 16, 20, 24, 31, 32, 47, 48]


class LogitRecorder:
    def __init__(self, sampler) -> None:
        self.sampler = sampler
        self.rows: dict[str, list[torch.Tensor]] = {}

    def __call__(self, logits, seqs):
        for row, seq in enumerate(seqs):
            self.rows.setdefault(seq.request_id, []).append(logits[row].float().cpu())
        return self.sampler(logits, seqs)


def assert_same_up_to_a_near_tie(
    eager_logits: list[torch.Tensor],
    eager_tokens: list[int],
    graph_logits: list[torch.Tensor],
    graph_tokens: list[int],
    rel: float,
    what: str,
) -> None:
    """A padded batch runs other GEMM kernels than the unpadded eager batch (cuBLAS picks them by row count),
    so logits may differ in their last bits, by up to `rel` of their norm. Greedy tokens may then part only at
    a near-tie: where the eager top-2 margin is within what that noise can close (per element a few times
    rel * std, twice over as both tokens move), hence `tie`. Up to where they part, the sequences saw the same
    tokens, so their logits must be close; after it they see different inputs and are not compared."""
    le, lg = torch.stack(eager_logits), torch.stack(graph_logits)
    assert len(le) == len(lg) == len(eager_tokens) == len(graph_tokens)
    tie = max(1e-3, 8 * rel)
    top2 = le.topk(2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]) / le.std(dim=-1)
    parted = [i for i, (a, b) in enumerate(zip(eager_tokens, graph_tokens, strict=True)) if a != b]
    same = parted[0] if parted else len(eager_tokens)
    if parted:
        assert margins[same] <= tie, (
            f"{what}: parted at step {same}, top-2 margin {margins[same]:.3f} std > {tie}"
        )
    err = ((le[: same + 1] - lg[: same + 1]).norm() / le[: same + 1].norm()).item()
    assert err < rel, f"{what}: logits differ by {err:.2e} over {same + 1} steps"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_gives_eager_tokens(llama_dir, dtype):
    engines = {}
    for mode in ("eager", "graphs"):
        engine = Engine(
            EngineConfig(
                model=str(llama_dir),
                device="cuda",
                dtype=dtype,
                max_num_seqs=48,
                max_model_len=1024,
                num_kv_blocks=4096,
                enforce_eager=mode == "eager",
                async_scheduling=False,
            )
        )  # the recorder reads each step's logits at once
        engine.sampler = LogitRecorder(engine.sampler)
        engines[mode] = engine
    assert engines["graphs"].setup.cuda_graph_buckets == [1, 2, 4, 8, 16, 24, 32, 48]
    assert engines["eager"].setup.cuda_graph_buckets == []
    rng = random.Random()
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    rel = 1e-5 if dtype == "float32" else 2e-2
    for n in BATCH_SIZES:
        prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(1, 200))] for _ in range(n)]
        eager = engines["eager"].generate(prompts, params)
        graphs = engines["graphs"].generate(prompts, params)
        for e, g in zip(eager, graphs, strict=True):
            assert len(g.token_ids) == len(e.token_ids) == 128
            assert_same_up_to_a_near_tie(
                engines["eager"].sampler.rows[e.request_id],
                e.token_ids,
                engines["graphs"].sampler.rows[g.request_id],
                g.token_ids,
                rel,
                f"batch of {n}",
            )
    for engine in engines.values():
        assert engine.stats().kv_blocks_used == 0


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="programmatic dependent launch needs Hopper or later",
)
@pytest.mark.parametrize(
    "knob, on, off",
    [
        ("USE_PDL", True, False),
        ("MERGE_PDL", True, False),
        ("MERGE_LETS_NEXT_START", True, False),
        ("GEMV_EPILOGUES", True, False),
        ("GEMV_PRELOAD_MIN_ROW_BYTES", 0, 1 << 62),
    ],
)
def test_launch_choices_change_no_bit(monkeypatch, knob, on, off):
    """PDL only moves when a kernel starts; each waits for the one before it ahead of any read of its outputs
    (and the GEMV prefetches and preloads only weights). A missing wait would read stale activations: logits
    must be the bits of the same engine launched without PDL (or without the attention merge's early launch,
    which the 1B's GQA takes at batch 1, or with no GEMV loading its first tile early), at batch 1 (every
    linear on the GEMV) and at a batch of 5. Likewise the GEMV epilogues (SiLU * up, rotary + cache write)
    give the bits of the separate kernels."""
    from reference_engine.kernels import triton_ops
    from reference_engine.kernels.triton_ops import GemvLinear

    rng = random.Random()
    prompts = [[rng.randrange(3, 30000) for _ in range(rng.randint(20, 300))] for _ in range(5)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    logits = {}
    for value in (on, off):
        monkeypatch.setattr(triton_ops, knob, value)
        engine = Engine(
            EngineConfig(
                model="random:llama-3.2-1b",
                device="cuda",
                dtype="bfloat16",
                max_num_seqs=8,
                max_model_len=512,
                num_kv_blocks=256,
                async_scheduling=False,
                seed=1234,
            )
        )
        assert sum(isinstance(m, GemvLinear) for m in engine.runner.model.modules()) == 16 * 4 + 1
        engine.sampler = LogitRecorder(engine.sampler)
        outs = [engine.generate(prompts[:1], params), engine.generate(prompts, params)]
        logits[value] = [torch.stack(engine.sampler.rows[o.request_id]) for batch in outs for o in batch]
        del engine
        torch.cuda.empty_cache()
    for with_it, without in zip(logits[on], logits[off], strict=True):
        assert torch.equal(with_it, without)


def recording(pick, picked: list):
    """`pick`, appending what it returns to `picked`."""

    def call(*args):
        picked.append(pick(*args))
        return picked[-1]

    return call


def test_graphs_for_shorter_context_bounds_change_no_bit(monkeypatch):
    """Decode graphs captured per context bound (--cudagraph-context-bounds) launch fewer attention programs
    for short contexts but cut every sequence as the max_model_len graph does: the same logits to the bit,
    for a batch whose longest context crosses from the 1024 bound to the 4096 one while it decodes."""
    rng = random.Random()
    prompts = [[rng.randrange(3, 30000) for _ in range(rng.randint(20, 300))] for _ in range(4)]
    prompts.append([rng.randrange(3, 30000) for _ in range(1010)])
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    logits, bounds_used = {}, {}
    for buckets in (True, False):
        engine = Engine(
            EngineConfig(
                model="random:llama-3.2-1b",
                device="cuda",
                dtype="bfloat16",
                max_num_seqs=8,
                max_model_len=4096,
                num_kv_blocks=1024,
                cuda_graph_context_bounds=[1024] if buckets else [],
                async_scheduling=False,
                seed=1234,
            )
        )
        graphs = engine.runner.graphs
        assert graphs.context_bounds == ([1024, 4096] if buckets else [4096])
        used: list[int] = []
        monkeypatch.setattr(graphs, "bound_for", recording(graphs.bound_for, used))
        engine.sampler = LogitRecorder(engine.sampler)
        outs = [engine.generate(prompts[:4], params), engine.generate(prompts, params)]
        logits[buckets] = [torch.stack(engine.sampler.rows[o.request_id]) for batch in outs for o in batch]
        bounds_used[buckets] = set(used)
        del engine, graphs
        torch.cuda.empty_cache()
    assert bounds_used == {True: {1024, 4096}, False: {4096}}
    for with_it, without in zip(logits[True], logits[False], strict=True):
        assert torch.equal(with_it, without)


def test_capture_is_measured_and_large_batches_run_eager(llama_dir):
    engine = Engine(
        EngineConfig(
            model=str(llama_dir),
            device="cuda",
            dtype="bfloat16",
            max_num_seqs=8,
            max_model_len=512,
            num_kv_blocks=1024,
            cuda_graph_batch_sizes=[1, 2, 4],
        )
    )
    setup = engine.setup
    assert setup.cuda_graph_buckets == [1, 2, 4]
    assert (
        all(t > 0 for t in setup.cuda_graph_capture_seconds.values()) and setup.cuda_graph_warmup_seconds > 0
    )
    assert setup.phases["capture_cuda_graphs"] >= setup.cuda_graph_warmup_seconds + sum(
        setup.cuda_graph_capture_seconds.values()
    )
    assert setup.cuda_graph_pool_bytes >= 0
    text = ServerMetrics("m").render(AsyncEngine(engine), engine.setup).decode()
    samples = {
        (s.name, s.labels.get("batch_size")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    for size, seconds in setup.cuda_graph_capture_seconds.items():
        assert samples["reference:cuda_graph_capture_seconds", str(size)] == pytest.approx(seconds)
    warmup = setup.cuda_graph_warmup_seconds
    assert samples["reference:cuda_graph_warmup_seconds", None] == pytest.approx(warmup)
    assert samples["reference:cuda_graph_buckets", None] == 3
    prompts = [[random.randrange(3, 300) for _ in range(20)] for _ in range(8)]  # 8 > largest bucket: eager
    outs = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert all(len(o.token_ids) == 16 for o in outs)


def assert_nothing_held(engine: Engine) -> None:
    stats = engine.stats()
    assert stats.running == 0 and stats.waiting == 0 and stats.kv_blocks_used == 0


def _drive(
    engine: Engine, prompts: list[list[int]], params: list[SamplingParams], late: int
) -> dict[str, list[int]]:
    """Run the prompts, the last `late` of them added after a few steps; return each request's tokens."""
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts[:-late], params[:-late], strict=True)]
    tokens: dict[str, list[int]] = {}
    for k in range(10_000):
        if k == 5:
            ids += [engine.add_request(p, sp) for p, sp in zip(prompts[-late:], params[-late:], strict=True)]
        elif k > 5 and not engine.has_unfinished_requests():
            break
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert_nothing_held(engine)
    return {i: tokens[i] for i in ids}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_steps_with_prompt_tokens_through_piecewise_graphs_give_the_eager_tokens(llama_dir, dtype):
    """Prompts of 5-300 tokens arriving while others decode, at most 256 tokens a step: steps carrying prompt
    chunks replay the pieces between attention calls (padded to a token bucket), against an engine whose
    such steps run eagerly (decode graphs in both)."""
    rng = random.Random()
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(5, 300))] for _ in range(24)]
    params = [
        SamplingParams(max_tokens=rng.randint(8, 48), temperature=0.0, ignore_eos=True) for _ in prompts
    ]
    engines, tokens, replays = {}, {}, []
    for mode, sizes in (("eager", []), ("pieces", None)):
        engine = Engine(
            EngineConfig(
                model=str(llama_dir),
                device="cuda",
                dtype=dtype,
                max_num_seqs=16,
                max_model_len=1024,
                max_num_batched_tokens=256,
                num_kv_blocks=2048,
                mixed_cuda_graph_sizes=sizes,
                async_scheduling=False,
            )
        )
        engine.sampler = LogitRecorder(engine.sampler)
        if mode == "pieces":
            assert engine.setup.mixed_graph_sizes == [16, 32, 64, 96, 128, 192, 256]
            assert "capture_mixed_graphs" in engine.setup.phases
            pieces = engine.runner.mixed_graphs
            run = pieces.run
            pieces.run = lambda *args, run=run: replays.append(len(args[0])) or run(*args)
        else:
            assert engine.runner.mixed_graphs is None
        engines[mode] = engine
        tokens[mode] = _drive(engine, prompts, params, late=16)
    assert len(replays) > 10 and max(replays) > 16 + 1  # prompt chunks beside decodes, not only decodes
    rel = 1e-5 if dtype == "float32" else 2e-2
    for request, eager in tokens["eager"].items():
        assert_same_up_to_a_near_tie(
            engines["eager"].sampler.rows[request],
            eager,
            engines["pieces"].sampler.rows[request],
            tokens["pieces"][request],
            rel,
            f"request {request}",
        )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_overlapped_decode_on_graphs_gives_the_synchronous_tokens(llama_dir, dtype):
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(1, 120))] for _ in range(40)]
    # In float32 EOS, a stop token and lengths end requests mid-batch. In bfloat16 a dropped row can move a
    # batch to another graph bucket, whose GEMMs differ in the last bits, so there only lengths end them.
    stops = dtype == "float32"
    params = [
        SamplingParams(
            max_tokens=rng.randint(1, 100),
            temperature=0.0,
            ignore_eos=not stops,
            stop_token_ids=[13] if stops and i % 4 == 0 else [],
        )
        for i in range(len(prompts))
    ]
    params[3] = SamplingParams(max_tokens=60, temperature=0.9, seed=3, ignore_eos=True)
    runs = {}
    for overlap in (False, True):
        engine = Engine(
            EngineConfig(
                model=str(llama_dir),
                device="cuda",
                dtype=dtype,
                max_num_seqs=48,
                max_model_len=512,
                num_kv_blocks=2048,
                async_scheduling=overlap,
            )
        )
        engine.eos_token_ids = {7, 11}
        engine.sampler.eos_token_ids = [7, 11]
        runs[overlap] = (_drive(engine, prompts, params, late=8), engine.num_overlapped_steps)
    assert runs[False][1] == 0 and runs[True][1] > 50
    assert runs[True][0] == runs[False][0]


def test_overlapped_decode_under_preemption_on_graphs(llama_dir):
    rng = random.Random(6)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(5, 60))] for _ in range(32)]
    params = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)] * len(prompts)
    runs = {}
    for overlap in (False, True):
        engine = Engine(
            EngineConfig(
                model=str(llama_dir),
                device="cuda",
                dtype="float32",
                max_num_seqs=32,
                block_size=4,
                num_kv_blocks=120,
                async_scheduling=overlap,
            )
        )
        runs[overlap] = _drive(engine, prompts, params, late=4)
        assert engine.scheduler.num_preemptions > 0
    assert runs[True] == runs[False]


def test_eager_steps_never_wait_for_the_device(llama_dir, monkeypatch):
    """An eager step (prefill or decode) and the sampler queue their work without synchronising the stream:
    their host lists reach the device through pinned memory. A synchronising copy would make each step's
    launches wait for the step before to finish on the GPU, adding host time to GPU time instead of
    overlapping them."""
    engine = Engine(
        EngineConfig(
            model=str(llama_dir),
            device="cuda",
            dtype="bfloat16",
            max_num_seqs=8,
            max_model_len=512,
            num_kv_blocks=512,
            enforce_eager=True,
            async_scheduling=True,
        )
    )
    checked = []

    def never_synchronising(fn):
        def call(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")  # a synchronising CUDA call raises
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                checked.append(fn.__name__)

        return call

    monkeypatch.setattr(engine.runner, "run", never_synchronising(engine.runner.run))
    monkeypatch.setattr(engine.sampler, "choose", never_synchronising(engine.sampler.choose))
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(20, 90))] for _ in range(5)]
    params = [
        SamplingParams(
            max_tokens=24,
            temperature=0.0 if i % 2 else 0.8,
            seed=i,
            min_tokens=4,
            stop_token_ids=[13] if i % 2 else [],
        )
        for i in range(len(prompts))
    ]
    outs = engine.generate(prompts, params)
    assert all(len(o.token_ids) >= 4 for o in outs)
    assert checked.count("run") > 20 and checked.count("choose") > 20
    assert engine.num_overlapped_steps > 10


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_no_served_step_compiles_after_warm_up(llama_dir, enforce_eager):
    """Ready means ready: after the engine's warm-up, mixed prefill + decode steps at every context length and
    a full token budget compile no Triton kernel (a compile stalled the first served steps for up to 1.8
    s)."""
    from triton import knobs

    engine = Engine(
        EngineConfig(
            model=str(llama_dir),
            device="cuda",
            dtype="bfloat16",
            max_num_seqs=16,
            max_model_len=1024,
            max_num_batched_tokens=512,
            num_kv_blocks=2048,
            enforce_eager=enforce_eager,
        )
    )
    assert "warm_up" in engine.setup.phases
    compiles = []
    knobs.runtime.jit_post_compile_hook = lambda *a, **k: compiles.append(1)
    try:
        rng = random.Random()
        lengths = [rng.randint(1, 900) for _ in range(24)] + [1, 63, 64, 65, 1000]
        prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in lengths]
        params = [
            SamplingParams(
                max_tokens=min(rng.randint(1, 40), 1024 - len(p)), temperature=0.0, ignore_eos=True
            )
            for p in prompts
        ]
        for out in engine.generate(prompts, params):
            assert out.finished
    finally:
        knobs.runtime.jit_post_compile_hook = None
    assert compiles == []
