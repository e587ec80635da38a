"""CUDA-graph replay against eager execution on the GPU (skipped without one)."""

from __future__ import annotations

import random

import pytest
import torch

from reference_engine import Engine, EngineConfig, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_replay_gives_eager_tokens(llama_dir, dtype):
    engines = {}
    for mode in ("eager", "graphs"):
        engine = Engine(EngineConfig(model=str(llama_dir), device="cuda", dtype=dtype, max_num_seqs=48,
                                     max_model_len=1024, num_kv_blocks=4096, enforce_eager=mode == "eager"))
        engine.sampler = LogitRecorder(engine.sampler)
        engines[mode] = engine
    assert engines["graphs"].setup.cuda_graph_buckets == [1, 2, 4, 8, 16, 24, 32, 48]
    assert engines["eager"].setup.cuda_graph_buckets == []
    rng = random.Random()
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    # A padded batch runs other GEMM kernels than the unpadded eager batch (cuBLAS picks them by row count), so
    # logits may differ in their last bits, by up to `rel` of their norm. Greedy tokens may then part only at a
    # near-tie: where the eager top-2 margin is within what that noise can close (per element a few times
    # rel * std, twice over as both tokens move), hence `tie`. Up to where they part, the sequences saw the same
    # tokens, so their logits must be close; after it they see different inputs and are not compared.
    rel = 1e-5 if dtype == "float32" else 2e-2
    tie = max(1e-3, 8 * rel)
    for n in BATCH_SIZES:
        prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(1, 200))] for _ in range(n)]
        eager = engines["eager"].generate(prompts, params)
        graphs = engines["graphs"].generate(prompts, params)
        for e, g in zip(eager, graphs, strict=True):
            le = torch.stack(engines["eager"].sampler.rows[e.request_id])
            lg = torch.stack(engines["graphs"].sampler.rows[g.request_id])
            assert len(g.token_ids) == len(e.token_ids) == len(le) == len(lg) == 128
            top2 = le.topk(2, dim=-1).values
            margins = (top2[:, 0] - top2[:, 1]) / le.std(dim=-1)
            parted = [i for i, (a, b) in enumerate(zip(e.token_ids, g.token_ids, strict=True)) if a != b]
            same = parted[0] if parted else len(e.token_ids)
            if parted:
                assert margins[same] <= tie, (
                    f"batch of {n}: parted at step {same}, top-2 margin {margins[same]:.3f} std > {tie}")
            err = ((le[:same + 1] - lg[:same + 1]).norm() / le[:same + 1].norm()).item()
            assert err < rel, f"batch of {n}: logits differ by {err:.2e} over {same + 1} steps"
    for engine in engines.values():
        assert engine.stats().kv_blocks_used == 0


def test_capture_is_measured_and_large_batches_run_eager(llama_dir):
    engine = Engine(EngineConfig(model=str(llama_dir), device="cuda", dtype="bfloat16", max_num_seqs=8,
                                 max_model_len=512, num_kv_blocks=1024, cuda_graph_batch_sizes=[1, 2, 4]))
    setup = engine.setup
    assert setup.cuda_graph_buckets == [1, 2, 4]
    assert all(t > 0 for t in setup.cuda_graph_capture_seconds.values())
    assert setup.phases["capture_cuda_graphs"] > 0 and setup.cuda_graph_pool_bytes >= 0
    prompts = [[random.randrange(3, 300) for _ in range(20)] for _ in range(8)]  # 8 > largest bucket: eager
    outs = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert all(len(o.token_ids) == 16 for o in outs)
