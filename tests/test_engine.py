"""Engine behaviour on CPU: preemption, chunked prefill, prefix caching, sampling, aborts and bad input."""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter

import pytest
import torch

from reference_engine import Engine, EngineConfig, SamplingParams
from reference_engine.host_copy import lists_to_device
from reference_engine.model_config import UnsupportedModelError
from reference_engine.sampler import Sampler
from reference_engine.sequence import Sequence

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def random_prompts(n: int, vocab: int, lo: int = 1, hi: int = 60) -> list[list[int]]:
    rng = random.Random()
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def assert_nothing_held(engine: Engine) -> None:
    stats = engine.stats()
    assert stats.running == 0 and stats.waiting == 0
    assert stats.kv_blocks_used == 0 and stats.kv_blocks_free == stats.kv_blocks_total
    assert all(block.ref_count == 0 for block in engine.block_manager.blocks)


def test_preemption_gives_the_same_tokens_and_leaks_nothing(llama_dir):
    prompts = random_prompts(32, 300, 5, 40)
    ample = Engine(EngineConfig(model=str(llama_dir), device="cpu", block_size=4, max_num_seqs=32))
    expected = [o.token_ids for o in ample.generate(prompts, GREEDY)]
    assert ample.scheduler.num_preemptions == 0
    # 40 blocks of 4 tokens hold 160 tokens; 32 requests of up to 64 tokens need far more.
    tight = Engine(
        EngineConfig(model=str(llama_dir), device="cpu", block_size=4, max_num_seqs=32, num_kv_blocks=40)
    )
    got = [o.token_ids for o in tight.generate(prompts, GREEDY)]
    assert tight.scheduler.num_preemptions > 0
    assert got == expected
    assert_nothing_held(tight)


def test_chunked_prefill_matches_one_shot_prefill(qwen2_dir):
    prompts = random_prompts(6, 300, 20, 90)
    whole = Engine(EngineConfig(model=str(qwen2_dir), device="cpu", max_num_batched_tokens=4096))
    chunked = Engine(EngineConfig(model=str(qwen2_dir), device="cpu", max_num_batched_tokens=7))
    assert [o.token_ids for o in chunked.generate(prompts, GREEDY)] == [
        o.token_ids for o in whole.generate(prompts, GREEDY)
    ]
    assert_nothing_held(chunked)


def test_steps_that_decode_carry_at_most_the_mixed_prefill_budget(llama_dir, monkeypatch):
    """A wave of prompts arriving while others decode is prefilled a few tokens a step (decodes keep their
    pace): at most the cap given, or by default a share of the budget in proportion to the sequences on their
    prompt against those decoding. A step with nothing to decode takes the whole budget, and the tokens are
    those of an uncapped engine."""
    from reference_engine import scheduler
    from reference_engine.scheduler import decoding

    monkeypatch.setattr(scheduler, "MIN_SHARED_PREFILL_TOKENS", 2)
    rng = random.Random()
    first, wave = random_prompts(3, 300, 5, 20), random_prompts(5, 300, 20, 60)
    budget, cap = 64, rng.randint(3, 9)
    runs, batches = {}, []
    for mode, mixed, power in (
        ("uncapped", budget, 1),
        ("cap", cap, 1),
        ("shared", None, 1),
        ("quadratic", None, 2),
    ):
        engine = Engine(
            EngineConfig(
                model=str(llama_dir),
                device="cpu",
                block_size=4,
                max_num_seqs=16,
                max_num_batched_tokens=budget,
                mixed_prefill_tokens=mixed,
                mixed_prefill_share="quadratic" if power == 2 else "linear",
            )
        )
        schedule = engine.scheduler.schedule

        def recorded(schedule=schedule, sched=engine.scheduler, mode=mode, power=power):
            decoders = [seq for seq in sched.running if decoding(seq)]
            prompts = len(sched.waiting) + len(sched.running) - len(decoders)
            share = max(2, int(budget * (prompts / max(1, prompts + len(decoders))) ** power))
            batch = schedule()
            prompt_tokens = sum(n for seq, n in batch.items if seq not in decoders)
            batches.append((mode, bool(decoders), prompt_tokens, share))
            return batch

        engine.scheduler.schedule = recorded
        ids = [engine.add_request(p, GREEDY) for p in first]
        outs: dict[str, list[int]] = {}
        for step in range(300):
            if step == 3:
                ids += [engine.add_request(p, GREEDY) for p in wave]
            if not engine.has_unfinished_requests():
                break
            for o in engine.step():
                outs.setdefault(o.request_id, []).extend(o.new_token_ids)
        runs[mode] = [outs[i] for i in ids]
        assert_nothing_held(engine)
    assert runs["cap"] == runs["shared"] == runs["quadratic"] == runs["uncapped"]
    mixed = {
        mode: [(tokens, share) for m, decodes, tokens, share in batches if m == mode and decodes]
        for mode in runs
    }
    assert all(tokens <= cap for tokens, _ in mixed["cap"])
    assert all(tokens <= share for tokens, share in mixed["shared"])
    assert all(tokens <= share for tokens, share in mixed["quadratic"])
    assert max(tokens for tokens, _ in mixed["shared"]) > cap  # five prompts against three decoding
    assert max(tokens for tokens, _ in mixed["uncapped"]) > max(tokens for tokens, _ in mixed["shared"])
    alone = [tokens for m, decodes, tokens, _ in batches if m == "cap" and not decodes]
    assert max(alone) > cap  # the first prefill, with nothing decoding: the whole budget
    with pytest.raises(ValueError, match="mixed_prefill_tokens"):
        EngineConfig(model="random:tiny", mixed_prefill_tokens=0)
    with pytest.raises(ValueError, match="mixed_prefill_share"):
        EngineConfig(model="random:tiny", mixed_prefill_share="cubic")


def test_prefix_cache_hits_and_gives_the_same_tokens(llama_dir):
    rng = random.Random()
    stem = [rng.randrange(3, 300) for _ in range(40)]
    prompts = [stem + [rng.randrange(3, 300) for _ in range(rng.randint(1, 10))] for _ in range(5)]
    cold = Engine(EngineConfig(model=str(llama_dir), device="cpu", enable_prefix_caching=False))
    warm = Engine(EngineConfig(model=str(llama_dir), device="cpu", block_size=16))
    expected = [o.token_ids for o in cold.generate(prompts, GREEDY)]
    first = warm.generate(prompts[:1], GREEDY)[0]
    assert first.num_cached_tokens == 0
    rest = warm.generate(prompts[1:], GREEDY)
    assert [first.token_ids] + [o.token_ids for o in rest] == expected
    assert all(o.num_cached_tokens == 32 for o in rest)  # two full 16-token blocks of the 40-token stem
    assert warm.stats().prefix_hit_tokens == 4 * 32


def test_abort_frees_blocks_mid_generation(llama_dir):
    engine = Engine(EngineConfig(model=str(llama_dir), device="cpu", block_size=4))
    ids = [
        engine.add_request(p, SamplingParams(max_tokens=50, ignore_eos=True)) for p in random_prompts(6, 300)
    ]
    for _ in range(5):
        engine.step()
    assert engine.stats().kv_blocks_used > 0
    for rid in ids[::2]:
        out = engine.abort(rid)
        assert out.finished and out.finish_reason == "abort"
    assert engine.abort(ids[0]) is None
    while engine.has_unfinished_requests():
        engine.step()
    assert_nothing_held(engine)


def test_stop_conditions(qwen2_dir):
    engine = Engine(EngineConfig(model=str(qwen2_dir), device="cpu"))
    prompt = random_prompts(1, 300, 10, 10)[0]
    free_run = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    tokens = free_run.token_ids
    stop_at = tokens[5]
    first = tokens.index(stop_at)
    out = engine.generate(
        [prompt], SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[stop_at], ignore_eos=True)
    )[0]
    assert out.token_ids == tokens[: first + 1] and out.finish_reason == "stop"
    # min_tokens forbids the stop token until enough tokens exist.
    out = engine.generate(
        [prompt],
        SamplingParams(
            max_tokens=20, min_tokens=first + 3, temperature=0.0, stop_token_ids=[stop_at], ignore_eos=True
        ),
    )[0]
    assert len(out.token_ids) >= first + 3 and stop_at not in out.token_ids[: first + 2]
    # EOS stops unless ignore_eos; treat the free run's 3rd token as EOS to force it.
    engine.eos_token_ids = {tokens[2]}
    engine.sampler.eos_token_ids = [tokens[2]]
    out = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0))[0]
    assert out.token_ids == tokens[: tokens.index(tokens[2]) + 1] and out.finish_reason == "stop"
    out = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))[0]
    assert out.token_ids == tokens and out.finish_reason == "length"


def test_seeded_sampling_is_reproducible_and_batch_independent(llama_dir):
    engine = Engine(EngineConfig(model=str(llama_dir), device="cpu"))
    prompt = random_prompts(1, 300, 12, 12)[0]
    params = SamplingParams(max_tokens=32, temperature=1.0, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    alone = engine.generate([prompt], params)[0].token_ids
    others = random_prompts(7, 300)
    unseeded = SamplingParams(max_tokens=40, temperature=1.3, ignore_eos=True)
    batch = engine.generate([*others[:3], prompt, *others[3:]], [unseeded] * 3 + [params] + [unseeded] * 4)
    assert batch[3].token_ids == alone
    different = engine.generate(
        [prompt],
        SamplingParams(max_tokens=32, temperature=1.0, top_p=0.95, top_k=50, seed=4321, ignore_eos=True),
    )[0].token_ids
    assert different != alone
    again = Engine(EngineConfig(model=str(llama_dir), device="cpu", seed=99)).generate([prompt], params)[0]
    assert again.token_ids == alone


def _sampled_frequencies(logits_row: torch.Tensor, params: SamplingParams, n: int) -> Counter:
    sampler = Sampler((), torch.device("cpu"), seed=random.randrange(2**31))
    seqs = [Sequence(str(i), [1], params, i, None) for i in range(n)]
    tokens = sampler(logits_row.repeat(n, 1), seqs)
    return Counter(tokens)


def test_sampler_draws_from_the_filtered_distribution():
    logits = torch.randn(12) * 2
    n = 40000
    probs = torch.softmax(logits / 0.7, dim=-1)
    freq = _sampled_frequencies(logits, SamplingParams(temperature=0.7), n)
    for token in range(12):
        expected = probs[token].item()
        assert abs(freq[token] / n - expected) < 4 * (expected * (1 - expected) / n) ** 0.5 + 1e-3
    # top-k keeps exactly the k largest; top-p the smallest prefix reaching p.
    order = torch.argsort(logits, descending=True).tolist()
    freq = _sampled_frequencies(logits, SamplingParams(temperature=1.0, top_k=3), 5000)
    assert set(freq) <= set(order[:3]) and len(freq) == 3
    sorted_probs = torch.softmax(logits, -1)[order]
    keep = int((sorted_probs.cumsum(0) < 0.8).sum().item()) + 1
    freq = _sampled_frequencies(logits, SamplingParams(temperature=1.0, top_p=0.8), 5000)
    assert set(freq) <= set(order[:keep])
    assert _sampled_frequencies(logits, SamplingParams(temperature=0.0), 10) == Counter({order[0]: 10})


def test_bad_input_is_refused_clearly(llama_dir, tmp_path):
    engine = Engine(EngineConfig(model=str(llama_dir), device="cpu", max_model_len=64))
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(list(range(3, 70)), SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        engine.add_request(list(range(3, 40)), SamplingParams(max_tokens=30))
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([], SamplingParams())
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request([5, 10**6], SamplingParams())
    for bad in (
        dict(max_tokens=0),
        dict(temperature=-1.0),
        dict(top_p=0.0),
        dict(top_k=-5),
        dict(min_tokens=5, max_tokens=2),
    ):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    assert not engine.has_unfinished_requests()
    with pytest.raises(FileNotFoundError, match="neither a checkpoint"):
        Engine(EngineConfig(model=str(tmp_path / "no-such-model"), device="cpu"))
    gpt2 = tmp_path / "gpt2"
    shutil.copytree(llama_dir, gpt2)
    cfg = json.loads((gpt2 / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (gpt2 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        Engine(EngineConfig(model=str(gpt2), device="cpu"))
    with pytest.raises(ValueError, match="max_model_len"):
        Engine(EngineConfig(model=str(llama_dir), device="cpu", max_model_len=10**6))
    with pytest.raises(ValueError, match="unknown random shape"):
        Engine(EngineConfig(model="random:nope", device="cpu"))


def test_random_shapes_and_synthetic_tokenizer_round_trip():
    engine = Engine(EngineConfig(model="random:tiny", device="cpu"))
    ids = random_prompts(1, engine.spec.vocab_size, 30, 30)[0]
    text = engine.tokenizer.decode(ids)
    assert engine.tokenizer.encode(text) == ids
    out = engine.generate([ids], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 5


def test_lists_to_device_keeps_each_list_whole_and_in_order():
    rng = random.Random(3)
    lists = [[rng.randrange(-5, 10**6) for _ in range(rng.randint(0, 9))] for _ in range(6)] + [[]]
    for dtype in (torch.int32, torch.long):
        views = lists_to_device(lists, torch.device("cpu"), dtype)
        assert [v.tolist() for v in views] == lists
        assert all(v.dtype == dtype and v.is_contiguous() for v in views)


def test_warm_up_runs_every_step_shape_and_leaves_no_trace(llama_dir):
    """The pre-serving warm-up runs each eager step shape once over the real cache, then zeroes the cache: the
    engine's tokens afterwards are the same as a cold engine's, and nothing is held."""
    prompts = random_prompts(8, 300, 5, 50)
    config = dict(model=str(llama_dir), device="cpu", block_size=4, max_num_seqs=8, max_model_len=128)
    cold = Engine(EngineConfig(**config, warm_up=False))
    warm = Engine(EngineConfig(**config, warm_up=True))
    assert "warm_up" in warm.setup.phases and "warm_up" not in cold.setup.phases
    for layer in warm.runner.model.layers:
        assert not layer.self_attn.k_cache.any() and not layer.self_attn.v_cache.any()
    assert [o.token_ids for o in warm.generate(prompts, GREEDY)] == [
        o.token_ids for o in cold.generate(prompts, GREEDY)
    ]
    assert_nothing_held(warm)


def test_scheduling_limits_default_by_device_and_keep_what_is_given():
    from reference_engine.config import EngineConfig

    gpu, cpu = EngineConfig().for_device("cuda"), EngineConfig().for_device("cpu")
    assert (gpu.max_num_seqs, gpu.max_num_batched_tokens) == (256, 8192)  # 128 streams all served on a GPU
    assert (cpu.max_num_seqs, cpu.max_num_batched_tokens) == (64, 2048)
    given = EngineConfig(max_num_seqs=5, max_num_batched_tokens=77).for_device("cuda")
    assert (given.max_num_seqs, given.max_num_batched_tokens) == (5, 77)


def test_graph_buckets_reach_max_num_seqs():
    from reference_engine.cuda_graphs import graph_batch_sizes

    assert graph_batch_sizes(256) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256]
    # the largest batch the scheduler makes replays a graph too
    assert graph_batch_sizes(100)[-2:] == [96, 100]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(256, [3, 300]) == [3]
