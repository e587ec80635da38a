"""Overlapped decode (`async_scheduling`) on the CPU: the same tokens, finish reasons and per-step outputs as
the synchronous engine, with EOS and stop tokens mid-batch, length limits, arrivals, aborts and preemption."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import pytest
import torch

from reference_engine import Engine, EngineConfig, SamplingParams
from reference_engine.cuda_graphs import CUDAGraphRunner
from reference_engine.kernels.attention import AttentionBatch, decode_mask
from reference_engine.serving.async_engine import AsyncEngine

VOCAB = 300


def random_prompts(n: int, vocab: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def assert_nothing_held(engine: Engine) -> None:
    stats = engine.stats()
    assert stats.running == 0 and stats.waiting == 0
    assert stats.kv_blocks_used == 0 and all(block.ref_count == 0 for block in engine.block_manager.blocks)


@dataclass
class Script:
    """What happens to an engine between steps: requests added (before step k) and aborted (after step k)."""

    adds: dict[int, list[tuple[str, list[int], SamplingParams]]] = field(default_factory=dict)
    aborts: dict[int, list[str]] = field(default_factory=dict)


@dataclass
class Run:
    tokens: dict[str, list[int]]
    reasons: dict[str, str]
    steps: list[list[tuple]]  # per step: request, new tokens, their logprobs, finished
    engine: Engine


def drive(model_dir, script: Script, overlap: bool, eos: set[int] | None = None, **config) -> Run:
    engine = Engine(EngineConfig(model=str(model_dir), device="cpu", async_scheduling=overlap, **config))
    if eos is not None:
        engine.eos_token_ids = set(eos)
        engine.sampler.eos_token_ids = sorted(eos)
    tokens: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    steps = []
    k = 0
    while engine.has_unfinished_requests() or any(i >= k for i in script.adds):
        for rid, prompt, params in script.adds.get(k, []):
            engine.add_request(prompt, params, request_id=rid)
        outs = engine.step()
        steps.append([(o.request_id, tuple(o.new_token_ids), o.new_logprobs, o.finished) for o in outs])
        for o in outs:
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            assert o.token_ids == tokens[o.request_id]
            if o.finished:
                reasons[o.request_id] = o.finish_reason
        for rid in script.aborts.get(k, []):
            out = engine.abort(rid)
            if out is not None:
                reasons[rid] = out.finish_reason
        k += 1
        assert k < 2000, "the engine does not finish"
    assert_nothing_held(engine)
    return Run(tokens, reasons, steps, engine)


def both(model_dir, script: Script, **kwargs) -> tuple[Run, Run]:
    """The same script without and with overlap: the same tokens and finish reasons. A request aborted after a
    given step may have one token fewer with overlap (an arrival joins one step later), never another one."""
    sync = drive(model_dir, script, overlap=False, **kwargs)
    overlapped = drive(model_dir, script, overlap=True, **kwargs)
    assert sync.engine.num_overlapped_steps == 0
    assert overlapped.engine.num_overlapped_steps > 0, "the overlapped path never ran"
    aborted = {rid for rids in script.aborts.values() for rid in rids}
    assert overlapped.reasons == sync.reasons
    for rid, tokens in sync.tokens.items():
        if rid in aborted and sync.reasons[rid] == "abort":
            got = overlapped.tokens.get(rid, [])
            assert got == tokens[: len(got)] and len(tokens) - len(got) <= 1, rid
        else:
            assert overlapped.tokens[rid] == tokens, rid
    return sync, overlapped


def common_token(model_dir, prompts: list[list[int]]) -> int:
    """A token the free runs produce often mid-output, to serve as EOS or a stop token that ends requests
    early."""
    engine = Engine(EngineConfig(model=str(model_dir), device="cpu", async_scheduling=False))
    outs = engine.generate(prompts, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    counts: dict[int, int] = {}
    for o in outs:
        for t in set(o.token_ids[3:20]):
            counts[t] = counts.get(t, 0) + 1
    return max(counts, key=counts.get)


def test_eos_stop_tokens_and_lengths_mid_batch(llama_dir):
    rng = random.Random(1)
    prompts = random_prompts(12, VOCAB, 3, 40)
    eos = common_token(llama_dir, prompts)
    stop = common_token(llama_dir, prompts[6:])
    params = [SamplingParams(max_tokens=rng.randint(1, 40), temperature=0.0) for _ in range(7)]
    params += [
        SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=[stop], ignore_eos=True),
        SamplingParams(max_tokens=35, temperature=0.8, seed=7),
        SamplingParams(max_tokens=25, temperature=1.0, top_k=20, top_p=0.9, seed=11),
        SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
    ]
    script = Script(
        adds={0: [(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]}
    )
    sync, overlapped = both(llama_dir, script, eos={eos}, block_size=4)
    assert sum(t[-1] in (eos, stop) for t in sync.tokens.values()) >= 3, (
        "EOS and stop should end some requests"
    )
    assert "length" in sync.reasons.values()
    # Nothing arrived mid-run, so each step returned the same outputs; nearly every decode step overlapped.
    assert overlapped.steps == sync.steps
    assert overlapped.engine.num_overlapped_steps >= len(sync.steps) - 3


def test_logprobs_and_min_tokens_overlap(llama_dir):
    prompts = random_prompts(6, VOCAB, 3, 40, seed=4)
    eos = common_token(llama_dir, prompts)
    params = [
        SamplingParams(max_tokens=30, temperature=0.0, logprobs=True),
        SamplingParams(max_tokens=40, temperature=0.0, min_tokens=12),
        SamplingParams(max_tokens=25, temperature=0.7, seed=5, logprobs=True),
        *[SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=i == 0) for i in range(3)],
    ]
    script = Script(
        adds={0: [(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]}
    )
    sync, overlapped = both(llama_dir, script, eos={eos})
    assert overlapped.steps == sync.steps  # the logprobs too
    assert any(step and step[0][2] for step in sync.steps), "logprobs should be reported"
    # min_tokens bans EOS by the position being sampled, so its decode steps overlap too; EOS mid-batch
    # (a dropped row makes the next step synchronous) costs a few.
    assert overlapped.engine.num_overlapped_steps >= len(sync.steps) - 8


def test_forced_output_length_overlaps_every_decode_step(llama_dir):
    """What benchmark clients send (ignore_eos with min_tokens = max_tokens), and min_tokens with EOS live:
    the stop token is banned up to exactly min_tokens under overlap as without."""
    prompts = random_prompts(4, VOCAB, 5, 30, seed=7)
    eos = common_token(llama_dir, prompts)
    forced = SamplingParams(max_tokens=20, min_tokens=20, temperature=0.0, ignore_eos=True)
    script = Script(adds={0: [(str(i), p, forced) for i, p in enumerate(prompts)]})
    sync, overlapped = both(llama_dir, script, eos={eos})
    assert overlapped.steps == sync.steps and set(sync.reasons.values()) == {"length"}
    # as without min_tokens: every decode step, the first too (queued while the prefill that samples runs)
    assert overlapped.engine.num_overlapped_steps == 19
    banned = SamplingParams(max_tokens=30, min_tokens=10, temperature=0.0)
    script = Script(adds={0: [(str(i), p, banned) for i, p in enumerate(prompts)]})
    sync, overlapped = both(llama_dir, script, eos={eos})
    assert overlapped.steps == sync.steps and overlapped.tokens == sync.tokens
    assert all(eos not in tokens[:10] for tokens in sync.tokens.values())
    assert "stop" in sync.reasons.values()  # EOS is live after min_tokens and ends some request


def test_greedy_max_tokens_only_overlaps_every_decode_step(llama_dir):
    prompts = random_prompts(5, VOCAB, 5, 30)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    script = Script(adds={0: [(str(i), p, params) for i, p in enumerate(prompts)]})
    sync, overlapped = both(llama_dir, script)
    assert overlapped.steps == sync.steps
    # One prefill step, 19 decode steps, each queued behind the step before (the first behind the prefill,
    # in which every sequence samples); none is computed past the length limit.
    assert overlapped.engine.num_overlapped_steps == 19
    assert len(overlapped.steps) == 20
    # Blocks filled by decode steps are registered for prefix reuse as they are without overlap.
    assert overlapped.engine.block_manager.cached == sync.engine.block_manager.cached


def test_arrivals_and_aborts_mid_run(qwen2_dir):
    rng = random.Random(2)
    prompts = random_prompts(16, VOCAB, 2, 50)
    eos = common_token(qwen2_dir, prompts)
    script = Script()
    for i, prompt in enumerate(prompts):
        at = 0 if i < 4 else rng.randint(1, 40)
        params = SamplingParams(max_tokens=rng.randint(5, 45), temperature=0.0, ignore_eos=i % 3 == 0)
        script.adds.setdefault(at, []).append((f"r{i}", prompt, params))
    script.aborts = {5: ["r0"], 9: ["r1", "r5"], 20: ["r7", "r8"], 30: ["r2"]}
    sync, overlapped = both(qwen2_dir, script, eos={eos}, block_size=8)
    assert overlapped.engine.num_overlapped_admissions > 0  # arrivals joined steps queued behind another
    assert sync.reasons.get("r0") == "abort"
    assert set(sync.tokens) == {f"r{i}" for i in range(16)}


def test_preemption_with_a_small_cache(llama_dir):
    prompts = random_prompts(24, VOCAB, 5, 40)
    eos = common_token(llama_dir, prompts)
    rng = random.Random(3)
    params = [
        SamplingParams(max_tokens=rng.randint(10, 30), temperature=0.0, ignore_eos=i % 2 == 0)
        for i in range(24)
    ]
    script = Script(
        adds={
            0: [(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))],
            12: [("late", prompts[0], SamplingParams(max_tokens=30, temperature=0.0))],
        }
    )
    # 40 blocks of 4 tokens hold 160 tokens, far less than the requests need at once.
    sync, overlapped = both(llama_dir, script, eos={eos}, block_size=4, max_num_seqs=24, num_kv_blocks=40)
    assert sync.engine.scheduler.num_preemptions > 0
    assert overlapped.engine.scheduler.num_preemptions == sync.engine.scheduler.num_preemptions


def test_token_budget_smaller_than_the_batch(llama_dir):
    """With fewer tokens a step than running sequences, decode steps leave some out and must not overlap."""
    prompts = random_prompts(6, VOCAB, 3, 12)
    params = SamplingParams(max_tokens=15, temperature=0.0, ignore_eos=True)
    script = Script(adds={0: [(str(i), p, params) for i, p in enumerate(prompts)]})
    sync = drive(llama_dir, script, overlap=False, max_num_batched_tokens=4)
    overlapped = drive(llama_dir, script, overlap=True, max_num_batched_tokens=4)
    assert overlapped.tokens == sync.tokens and overlapped.steps == sync.steps


@pytest.mark.parametrize("overlap", [False, True])
def test_default_is_off_on_the_cpu_and_the_option_is_honoured(llama_dir, overlap):
    assert not Engine(EngineConfig(model=str(llama_dir), device="cpu")).async_scheduling
    engine = Engine(EngineConfig(model=str(llama_dir), device="cpu", async_scheduling=overlap))
    assert engine.async_scheduling is overlap


def test_async_engine_streams_the_same_tokens(llama_dir):
    prompts = random_prompts(6, VOCAB, 3, 30)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

    async def serve(overlap: bool) -> dict[int, list[int]]:
        engine = AsyncEngine(
            Engine(EngineConfig(model=str(llama_dir), device="cpu", async_scheduling=overlap))
        )
        engine.start()
        for i, prompt in enumerate(prompts):
            engine.submit(str(i), prompt, params)
        streams = [engine.stream(str(i)) for i in range(len(prompts))]

        async def read(stream) -> list[int]:
            return [t async for out in stream for t in out.new_token_ids]

        got = dict(enumerate(await asyncio.gather(*(read(s) for s in streams))))
        await engine.close()
        assert engine.engine.num_overlapped_steps == (11 if overlap else 0)  # every decode step
        return got

    assert asyncio.run(serve(True)) == asyncio.run(serve(False))


@pytest.mark.parametrize(
    ("argv", "expected"), [([], None), (["--async-scheduling"], True), (["--no-async-scheduling"], False)]
)
def test_server_flag(argv, expected):
    from reference_engine.serving.options import parse_args

    assert parse_args(argv).async_scheduling is expected


class ReplayOnCPU:
    """Stands in for a captured decode graph: reads the runner's static input buffers, as a replay does, and
    runs the model on the rows that are not padding into the graph's static logits."""

    def __init__(
        self, runner: CUDAGraphRunner, size: int, bound: int, block_size: int, replayed: list[tuple[int, int]]
    ) -> None:
        self.runner, self.size, self.bound, self.block_size = runner, size, bound, block_size
        self.replayed = replayed

    def replay(self) -> None:
        r = self.runner
        n = int((r.slot_mapping[: self.size] >= 0).sum())
        longest, shorter = int(r.context_lens[:n].max()), [b for b in r.context_bounds if b < self.bound]
        assert longest <= self.bound, "a graph replayed for a context beyond its bound"
        assert not shorter or longest > shorter[-1], "a shorter bound would have held this step"
        self.replayed.append((self.size, self.bound))
        assert bool((r.slot_mapping[n : self.size] == -1).all()), "padded rows must write no cache slot"
        batch = AttentionBatch(
            slot_mapping=r.slot_mapping[:n],
            num_decode=n,
            decode_block_tables=r.block_tables[:n],
            decode_context_lens=r.context_lens[:n],
            decode_max_context=r.max_model_len,
        )
        batch.decode_mask = decode_mask(batch.decode_context_lens, r.max_blocks * self.block_size)
        r.logits[self.size, self.bound][:n] = r.model.logits(r.model(r.input_ids[:n], r.positions[:n], batch))


def with_stand_in_graphs(
    engine: Engine, sizes: list[int], bounds: list[int] | None = None
) -> list[tuple[int, int]]:
    """Stand-in graphs for every batch size and context bound; returns the list their replays append to."""
    bs = engine.block_manager.block_size
    runner = CUDAGraphRunner(engine.runner.model, engine.max_model_len, bs, engine.device, bounds)
    runner._alloc(max(sizes))
    replayed: list[tuple[int, int]] = []
    for size in sizes:
        for bound in runner.context_bounds:
            runner.graphs[size, bound] = ReplayOnCPU(runner, size, bound, bs, replayed)
            runner.logits[size, bound] = torch.zeros(size, engine.spec.vocab_size)
    engine.runner.graphs = runner
    return replayed


@pytest.mark.parametrize("context_bounds", [None, [8, 32]])
def test_graph_runner_staging_and_device_gather(llama_dir, context_bounds):
    """The graph path's input staging (alternating host buffers, padded rows, token ids gathered from the last
    step's samples) on the CPU, with stand-in graphs; batches of 1-7 rows fill buckets 1, 2, 4 and 8 or
    pad. With context bounds 8 and 32 (and max_model_len, 128) each step replays the smallest bound that holds
    its longest context."""
    prompts = random_prompts(7, VOCAB, 2, 40, seed=8)
    eos = common_token(llama_dir, prompts)
    rng = random.Random(8)
    params = [
        SamplingParams(max_tokens=rng.randint(3, 40), temperature=0.0, logprobs=i == 2) for i in range(7)
    ]
    runs = {}
    for overlap in (False, True):
        engine = Engine(
            EngineConfig(
                model=str(llama_dir),
                device="cpu",
                kernels="torch",
                block_size=4,
                max_model_len=128,
                async_scheduling=overlap,
            )
        )
        engine.eos_token_ids, engine.sampler.eos_token_ids = {eos}, [eos]
        replayed = with_stand_in_graphs(engine, [1, 2, 4, 8], context_bounds)
        ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        outs = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                outs.setdefault(o.request_id, []).extend(o.new_token_ids)
        runs[overlap] = [outs[i] for i in ids]
        assert engine.runner.graphs.num_runs > 10
        assert_nothing_held(engine)
        assert engine.num_overlapped_steps > 0 if overlap else engine.num_overlapped_steps == 0
        bounds = {bound for _, bound in replayed}
        assert bounds == {32, 128} if context_bounds else bounds == {128}
    assert runs[True] == runs[False]
    assert sum(t[-1] == eos for t in runs[False]) >= 2


def test_graph_context_bounds():
    from reference_engine.cuda_graphs import graph_context_bounds

    assert graph_context_bounds(4096, []) == [4096]
    assert graph_context_bounds(4096, None) == [1024, 4096]  # the default ladder: 1024, then x4
    assert graph_context_bounds(32768, None) == [1024, 4096, 16384, 32768]
    assert graph_context_bounds(1024, None) == [1024]  # no bound below a short max_model_len
    assert graph_context_bounds(512, None) == [512]
    assert graph_context_bounds(4096, [4096, 1024, 1024]) == [1024, 4096]
    assert graph_context_bounds(1024, [2048, 512]) == [512, 1024]  # none at or past max_model_len
    with pytest.raises(ValueError, match="cuda_graph_context_bounds"):
        EngineConfig(model="random:tiny", cuda_graph_context_bounds=[0])
    from reference_engine.serving.options import engine_config, parse_args

    args = parse_args(["--model", "random:tiny", "--cudagraph-context-bounds", "1024", "2048"])
    config = engine_config(args)
    assert config.cuda_graph_context_bounds == [1024, 2048]
    assert engine_config(parse_args(["--model", "random:tiny"])).cuda_graph_context_bounds is None
    args = parse_args(["--model", "random:tiny", "--cudagraph-context-bounds"])
    assert engine_config(args).cuda_graph_context_bounds == []


def test_a_cached_prompt_joins_a_graph_decode_step(llama_dir):
    """A prompt whose every block but its last token is in the prefix cache arrives as one new token: joined
    to the decode step queued behind the one in flight, it is one more row of a decode graph, fed from the
    host while the other rows' token ids are gathered on the device (stand-in graphs on the CPU)."""
    rng = random.Random()
    shared = [rng.randrange(3, VOCAB) for _ in range(9)]  # 2 blocks of 4 cached, 1 token left to compute
    others = random_prompts(3, VOCAB, 3, 12, seed=rng.randrange(1 << 20))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    runs = {}
    for overlap in (False, True):
        engine = Engine(
            EngineConfig(
                model=str(llama_dir),
                device="cpu",
                kernels="torch",
                block_size=4,
                max_model_len=128,
                async_scheduling=overlap,
            )
        )
        with_stand_in_graphs(engine, [1, 2, 4, 8])
        engine.add_request(shared, params, request_id="first")
        for i, prompt in enumerate(others):
            engine.add_request(prompt, params, request_id=f"other {i}")
        outs: dict[str, list[int]] = {}
        for step in range(60):
            if step in (3, 6):
                engine.add_request(shared, params, request_id=f"repeat {step}")
            for o in engine.step():
                outs.setdefault(o.request_id, []).extend(o.new_token_ids)
            if not engine.has_unfinished_requests():
                break
        assert_nothing_held(engine)
        runs[overlap] = outs
        if overlap:
            assert engine.num_overlapped_admissions == 2
    assert runs[True] == runs[False]
    assert runs[False]["repeat 3"] == runs[False]["first"]


def test_random_arrivals_aborts_and_a_small_cache(llama_dir):
    """Fresh random scripts: arrivals at random steps (some repeating an earlier prompt, so the prefix cache
    answers part of it), random lengths, stop tokens, min_tokens, aborts, and a KV cache small enough that
    admissions beside an overlapped step run short of blocks and decodes are preempted. The overlapped engine
    gives the synchronous engine's tokens (an aborted request's up to where either was cut: with preemptions
    the two engines' timings can drift by more than a step)."""
    rng = random.Random()
    prompts = random_prompts(14, VOCAB, 2, 30, seed=rng.randrange(1 << 20))
    prompts += [prompts[rng.randrange(len(prompts))] for _ in range(4)]
    eos = common_token(llama_dir, prompts[:6])
    script = Script()
    for i, prompt in enumerate(prompts):
        at = 0 if i < 3 else rng.randint(1, 40)
        max_tokens = rng.randint(2, 30)
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=rng.random() < 0.5,
            min_tokens=min(max_tokens, rng.choice([0, 0, 3])),
        )
        script.adds.setdefault(at, []).append((f"r{i}", prompt, params))
    aborted = {f"r{rng.randrange(len(prompts))}" for _ in range(3)}
    for rid in aborted:
        script.aborts.setdefault(rng.randint(2, 45), []).append(rid)
    config = dict(eos={eos}, block_size=4, num_kv_blocks=48, max_num_seqs=8, max_num_batched_tokens=48)
    sync = drive(llama_dir, script, overlap=False, **config)
    overlapped = drive(llama_dir, script, overlap=True, **config)
    assert overlapped.engine.num_overlapped_steps > 0
    for rid, tokens in sync.tokens.items():
        got = overlapped.tokens.get(rid, [])
        if rid in aborted:  # cut wherever the abort found it: the tokens before agree
            shorter = min(len(got), len(tokens))
            assert got[:shorter] == tokens[:shorter], rid
        else:
            assert got == tokens and overlapped.reasons[rid] == sync.reasons[rid], rid
