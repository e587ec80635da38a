"""Steps with prompt tokens through the pieces between attention calls (piecewise_graphs.py), on the CPU with
stand-in graphs: each replay runs its piece over the whole padded bucket from the runner's fixed buffers, as a
captured graph does, so the staging, padding and buffer hand-offs are what is tested; CUDA capture itself is
tested on the GPU (test_gpu.py)."""

from __future__ import annotations

import random

import pytest
import torch

from reference_engine import Engine, EngineConfig, SamplingParams
from reference_engine.piecewise_graphs import PiecewiseGraphRunner, mixed_graph_sizes


class PieceOnCPU:
    """Stands in for one captured piece: checks the padded rows write no cache slot, records the replay and
    runs the piece over every row of its bucket."""

    def __init__(self, runner: PiecewiseGraphRunner, size: int, index: int, replayed: list) -> None:
        self.runner, self.size, self.index, self.replayed = runner, size, index, replayed

    def replay(self) -> None:
        _, _, slots = self.runner.inputs(self.size)
        real = int((slots >= 0).sum())
        assert bool((slots[real:] == -1).all()), "padded rows must come after the step's rows, slot -1"
        self.replayed.append((self.size, self.index, real))
        self.runner.run_piece(self.size, self.index)


def with_stand_in_pieces(engine: Engine, sizes: list[int]) -> list[tuple[int, int, int]]:
    runner = PiecewiseGraphRunner(engine.runner.model, engine.device, sizes)
    replayed: list[tuple[int, int, int]] = []
    pieces = len(engine.runner.model.layers) + 1
    for size in sizes:
        runner.graphs[size] = [PieceOnCPU(runner, size, index, replayed) for index in range(pieces)]
    engine.runner.mixed_graphs = runner
    return replayed


def run(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    """Three requests first, then one more every other step, so that prompt chunks join running decodes."""
    ids, outs = [], {}
    pending = list(zip(prompts, params, strict=True))
    steps = 0
    while pending or engine.has_unfinished_requests():
        if pending and (not ids or len(ids) < 3 or steps % 2 == 0):
            ids.append(engine.add_request(*pending.pop(0)))
            continue
        for o in engine.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
        steps += 1
    return [outs[i] for i in ids]


@pytest.mark.parametrize("kernels", ["torch", "auto"])
def test_pieces_give_the_eager_steps_tokens_and_cache(llama_dir, kernels):
    """Random prompts (two sharing a prefix, so some chunks start mid-sequence from the prefix cache) arriving
    while others decode, at most 40 tokens a step and 12 prompt tokens beside decodes: steps pad to the 8, 16
    or 24 bucket, or run eagerly above 24 tokens. Greedy tokens and the whole KV cache match an engine that
    runs every step eagerly."""
    rng = random.Random(21)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(5, 70))] for _ in range(9)]
    prompts.append(prompts[0][:32] + [rng.randrange(3, 300) for _ in range(9)])
    params = [
        SamplingParams(max_tokens=rng.randint(4, 20), temperature=0.0, ignore_eos=True) for _ in prompts
    ]
    config = dict(
        model=str(llama_dir),
        device="cpu",
        kernels=kernels,
        block_size=4,
        max_model_len=128,
        max_num_batched_tokens=40,
        mixed_prefill_tokens=12,
        async_scheduling=False,
    )
    eager = Engine(EngineConfig(**config))
    expected = run(eager, prompts, params)
    piecewise = Engine(EngineConfig(**config))
    replayed = with_stand_in_pieces(piecewise, [8, 16, 24])
    got = run(piecewise, prompts, params)
    assert got == expected
    layers = len(piecewise.runner.model.layers)
    assert {size for size, _, _ in replayed} == {8, 16, 24}
    assert all(real <= size for size, _, real in replayed) and any(real < size for size, _, real in replayed)
    # every step through the pieces replays all of them, in order
    assert [index for _, index, _ in replayed] == list(range(layers + 1)) * (len(replayed) // (layers + 1))
    for ours, theirs in zip(piecewise.runner.model.layers, eager.runner.model.layers, strict=True):
        torch.testing.assert_close(ours.self_attn.k_cache, theirs.self_attn.k_cache, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.self_attn.v_cache, theirs.self_attn.v_cache, rtol=1e-5, atol=1e-5)


def test_piece_logits_match_the_eager_forward(llama_dir):
    """One mixed step (three decodes and two prompt chunks, 29 tokens, padded to 32): the logits of its
    sampling rows through the pieces equal the eager forward's to float32 rounding."""
    from reference_engine.model_runner import StepInputs

    engine = Engine(
        EngineConfig(
            model=str(llama_dir),
            device="cpu",
            kernels="torch",
            block_size=4,
            max_model_len=128,
            async_scheduling=False,
        )
    )
    runner = engine.runner
    torch.manual_seed(5)
    step = StepInputs()
    tables = [list(range(i * 8, i * 8 + 8)) for i in range(5)]
    for table, (start, n) in zip(tables, [(9, 1), (20, 1), (3, 1), (0, 14), (11, 12)], strict=True):
        step.sample_rows.append(step.add(torch.randint(300, (n,)).tolist(), start, table, 4))
    for layer in runner.model.layers:  # earlier context for the rows that continue a sequence
        layer.self_attn.k_cache.normal_()
        layer.self_attn.v_cache.normal_()
    layers = runner.model.layers
    caches = [(layer.self_attn.k_cache.clone(), layer.self_attn.v_cache.clone()) for layer in layers]
    eager = runner.run(step)
    for layer, (k, v) in zip(runner.model.layers, caches, strict=True):
        layer.self_attn.k_cache.copy_(k)
        layer.self_attn.v_cache.copy_(v)
    with_stand_in_pieces(engine, [8, 32])
    pieces = runner.run(step)
    assert pieces.shape == eager.shape == (5, engine.spec.vocab_size)
    torch.testing.assert_close(pieces, eager, rtol=1e-5, atol=1e-5)


def test_mixed_graph_sizes_and_option():
    assert mixed_graph_sizes(8192) == [16, 32, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 1024]
    assert mixed_graph_sizes(300) == [16, 32, 64, 96, 128, 192, 256]
    assert mixed_graph_sizes(8192, [1, 48, 48, 4096, 9000]) == [48, 4096]
    assert mixed_graph_sizes(8192, []) == []
    from reference_engine.serving.options import engine_config, parse_args

    assert engine_config(parse_args(["--model", "random:tiny"])).mixed_cuda_graph_sizes is None
    args = parse_args(["--model", "random:tiny", "--mixed-cudagraph-sizes", "64", "512"])
    assert engine_config(args).mixed_cuda_graph_sizes == [64, 512]
    assert (
        engine_config(
            parse_args(["--model", "random:tiny", "--mixed-cudagraph-sizes"])
        ).mixed_cuda_graph_sizes
        == []
    )


def test_arrivals_join_an_overlapped_step_through_the_pieces(llama_dir):
    """With overlap, a request that arrives while a step is in flight joins the step queued behind it: its
    prompt beside the decodes, whose token ids are gathered on the device into the pieces' buffers (and into
    the eager step's above the buckets). Short random prompts, one arriving every other step: the same greedy
    tokens as an engine that runs every step eagerly and synchronously."""
    rng = random.Random()
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(3, 20))] for _ in range(12)]
    params = [
        SamplingParams(max_tokens=rng.randint(4, 20), temperature=0.0, ignore_eos=True) for _ in prompts
    ]
    config = dict(
        model=str(llama_dir),
        device="cpu",
        kernels="torch",
        block_size=4,
        max_model_len=128,
        max_num_batched_tokens=40,
        mixed_prefill_tokens=24,
    )

    def staggered(engine: Engine) -> dict[str, list[int]]:
        outs: dict[str, list[int]] = {}
        pending = list(zip(prompts, params, strict=True))
        for first in range(3):
            engine.add_request(*pending.pop(0), request_id=f"first {first}")
        steps = 0
        while pending or engine.has_unfinished_requests():
            if pending and steps % 2 == 1:
                engine.add_request(*pending.pop(0), request_id=f"before step {steps}")
            for o in engine.step():
                outs.setdefault(o.request_id, []).extend(o.new_token_ids)
            steps += 1
        return outs

    expected = staggered(Engine(EngineConfig(**config, async_scheduling=False)))
    overlapped = Engine(EngineConfig(**config, async_scheduling=True))
    replayed = with_stand_in_pieces(overlapped, [8, 16])
    pieces, gathered = overlapped.runner.mixed_graphs, []
    plain_run = pieces.run

    def run_noting_gathers(input_ids, positions, slots, batch_for, gather=None):
        gathered.append(gather is not None)  # decodes queued behind the step in flight, beside a prompt
        return plain_run(input_ids, positions, slots, batch_for, gather)

    pieces.run = run_noting_gathers
    assert staggered(overlapped) == expected
    assert overlapped.num_overlapped_admissions > 0 and replayed and any(gathered)
