"""Triton kernels against the torch reference ops on fresh random inputs (compiled on a GPU, in bfloat16 and
float32; under Triton's interpreter on the CPU, in float32)."""

from __future__ import annotations

import random

import pytest
import torch

from reference_engine.kernels.ops import TorchOps

triton = pytest.importorskip("triton")
from reference_engine.kernels.triton_ops import TritonOps  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.bfloat16] if DEVICE.type == "cuda" else [torch.float32]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_residual(dtype):
    rows, cols = random.randint(1, 9), random.choice([64, 576, 1000])
    x = torch.randn(rows, cols, device=DEVICE, dtype=dtype)
    residual = torch.randn(rows, cols, device=DEVICE, dtype=dtype)
    weight = (1 + 0.1 * torch.randn(cols, device=DEVICE)).to(dtype)
    ref, tri = TorchOps(), TritonOps()
    assert rel_err(tri.rms_norm(x, weight, 1e-5), ref.rms_norm(x, weight, 1e-5)) < TOL[dtype]
    want_out, want_sum = ref.add_rms_norm(x, residual.clone(), weight, 1e-5)
    got_out, got_sum = tri.add_rms_norm(x, residual.clone(), weight, 1e-5)
    assert torch.equal(got_sum, want_sum)  # the add rounds exactly like torch's
    assert rel_err(got_out, want_out) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 2, 32), (9, 3, 64), (8, 8, 128)])
def test_rope_and_cache_write(dtype, heads, kv_heads, head_dim):
    tokens, block_size, num_blocks, max_len = random.randint(2, 20), 16, 8, 128
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=DEVICE, dtype=dtype)
    positions = torch.randint(0, max_len, (tokens,), device=DEVICE)
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), torch.rand(head_dim // 2))
    emb = torch.cat((freqs, freqs), dim=-1).to(DEVICE)
    cos, sin = emb.cos(), emb.sin()
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:tokens]
    slots[0] = -1  # a padding row: must write nowhere
    caches = {}
    for name, ops in (("ref", TorchOps()), ("tri", TritonOps())):
        k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), 7.0, device=DEVICE, dtype=dtype)
        v_cache = k_cache.clone()
        if name == "ref":  # the torch path writes every slot it is given; give it only the real ones
            q = ops.rope_and_write_kv(
                qkv[1:], positions[1:], cos, sin, k_cache, v_cache, slots[1:], heads, kv_heads
            )
            q = torch.cat(
                [
                    ops.rope_and_write_kv(
                        qkv[:1],
                        positions[:1],
                        cos,
                        sin,
                        k_cache.clone(),
                        v_cache.clone(),
                        slots[1:2],
                        heads,
                        kv_heads,
                    ),
                    q,
                ]
            )
        else:
            q = ops.rope_and_write_kv(qkv, positions, cos, sin, k_cache, v_cache, slots, heads, kv_heads)
        caches[name] = (q, k_cache, v_cache)
    (q_ref, k_ref, v_ref), (q_tri, k_tri, v_tri) = caches["ref"], caches["tri"]
    assert rel_err(q_tri, q_ref) < TOL[dtype]
    assert rel_err(k_tri, k_ref) < TOL[dtype]
    assert torch.equal(v_tri, v_ref)
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool, device=DEVICE)
    untouched[slots[1:]] = False
    assert (k_tri.view(-1, kv_heads, head_dim)[untouched] == 7.0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    x = torch.randn(random.randint(1, 9), 2 * random.choice([128, 1536, 3000]), device=DEVICE, dtype=dtype)
    assert rel_err(TritonOps().silu_and_mul(x), TorchOps().silu_and_mul(x)) < TOL[dtype]


def test_engine_with_triton_kernels_matches_torch_kernels(llama_dir):
    """The whole engine on Triton kernels (interpreted on the CPU) gives the torch path's greedy tokens."""
    from reference_engine import Engine, EngineConfig, SamplingParams

    rng = random.Random()
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(1, 40))] for _ in range(4)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = {}
    for kernels in ("torch", "triton"):
        # A fixed KV cache: on a GPU the default budget would give the first engine 90% of the memory.
        engine = Engine(
            EngineConfig(
                model=str(llama_dir),
                device=DEVICE.type,
                dtype="float32",
                kernels=kernels,
                block_size=8,
                enforce_eager=True,
                num_kv_blocks=256,
            )
        )
        outs[kernels] = [o.token_ids for o in engine.generate(prompts, params)]
    assert outs["triton"] == outs["torch"]


def test_engine_at_one_row_on_the_gemv_matches_torch_kernels(tmp_path):
    """A model wide enough for the single-row GEMV (hidden 512; its o projection, 128 wide, stays on torch),
    one sequence so that every decode step is one row, each qkv and gate/up GEMV with its epilogue (rotary +
    cache write, SiLU * up): the torch path's greedy tokens."""
    from checkpoints import make_checkpoint

    from reference_engine import Engine, EngineConfig, SamplingParams
    from reference_engine.kernels.triton_ops import GemvLinear

    model_dir = make_checkpoint(
        tmp_path / "wide",
        "llama",
        hidden_size=512,
        intermediate_size=512,
        num_hidden_layers=2,
        initializer_range=0.05,
    )
    rng = random.Random()
    prompt = [rng.randrange(3, 300) for _ in range(rng.randint(2, 30))]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    outs = {}
    for kernels in ("torch", "triton"):
        engine = Engine(
            EngineConfig(
                model=str(model_dir),
                device=DEVICE.type,
                dtype="float32",
                kernels=kernels,
                block_size=8,
                enforce_eager=True,
                num_kv_blocks=64,
            )
        )
        if kernels == "triton":  # qkv, gate/up, down in both layers, and the LM head
            assert sum(isinstance(m, GemvLinear) for m in engine.runner.model.modules()) == 2 * 3 + 1
        outs[kernels] = engine.generate([prompt], params)[0].token_ids
    assert outs["triton"] == outs["torch"]


@pytest.mark.parametrize("partition", [16, 1024])
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4)])
def test_decode_attention_single_and_split_partitions(monkeypatch, partition, heads, kv_heads):
    """One partition per (sequence, head) and many partitions merged by log-sum-exp give the same answer, for
    GQA (tensor-core products) and MHA (the vector kernel); sequences of one partition and of several share a
    launch, and a second launch gives the same bits."""
    from reference_engine.kernels import triton_ops
    from reference_engine.kernels.attention import AttentionBatch, decode_mask, paged_attention

    monkeypatch.setattr(triton_ops, "DECODE_PARTITION", partition)
    seqs, head_dim, block_size = 4, 32, 16
    lens = [random.randint(1, 16), *(random.randint(17, 300) for _ in range(seqs - 1))]
    num_blocks = sum(-(-n // block_size) for n in lens) + 2
    perm = torch.randperm(num_blocks).tolist()
    tables, at = [], 0
    for n in lens:
        nb = -(-n // block_size)
        tables.append(perm[at : at + nb])
        at += nb
    width = max(len(t) for t in tables)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(seqs, heads, head_dim, device=DEVICE)
    ctx = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    batch = AttentionBatch(
        slot_mapping=torch.empty(0, dtype=torch.long, device=DEVICE),
        num_decode=seqs,
        decode_block_tables=torch.tensor(
            [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=DEVICE
        ),
        decode_context_lens=ctx,
        decode_max_context=max(lens),
        decode_mask=decode_mask(ctx, width * block_size),
    )
    ref = paged_attention(q, k_cache, v_cache, batch, head_dim**-0.5)
    got = TritonOps().attend(q, k_cache, v_cache, batch, head_dim**-0.5)
    assert rel_err(got, ref) < 1e-5
    assert torch.equal(TritonOps().attend(q, k_cache, v_cache, batch, head_dim**-0.5), got)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("preload", [False, True])
def test_single_row_gemv_matches_linear(dtype, bias, preload, monkeypatch):
    """The batch-1 GEMV against F.linear: outputs not a multiple of its row block, inputs not a multiple of
    its column step, a tied-style shared weight, and more than one row handed back to cuBLAS; its first tile
    loaded in the loop or ahead of it."""
    from reference_engine.kernels import triton_ops
    from reference_engine.kernels.triton_ops import GemvLinear, gemv_suits, use_gemv_for_single_rows

    monkeypatch.setattr(triton_ops, "GEMV_PRELOAD_MIN_ROW_BYTES", 0 if preload else 1 << 62)

    for out_f, in_f in [(1000, 1024), (3072, 2048), (517, 512), (333, 1040), (255, 2600)]:
        linear = torch.nn.Linear(in_f, out_f, bias=bias, device=DEVICE, dtype=dtype)
        with torch.no_grad():
            linear.weight.normal_(0, 0.02)
            if bias:
                linear.bias.normal_(0, 0.1)
        assert gemv_suits(linear)
        gemv = GemvLinear(linear)
        x = torch.randn(1, in_f, device=DEVICE, dtype=dtype)
        want = torch.nn.functional.linear(
            x.double(), linear.weight.double(), None if not bias else linear.bias.double()
        )
        assert rel_err(gemv(x), want) < TOL[dtype], (out_f, in_f)
        rows = torch.randn(3, in_f, device=DEVICE, dtype=dtype)
        assert torch.equal(gemv(rows), linear(rows))
    model = torch.nn.Sequential(
        linear,
        torch.nn.Linear(in_f, 100, bias=False, device=DEVICE, dtype=dtype),
        torch.nn.Linear(100, 100, device=DEVICE, dtype=dtype),
    )
    assert use_gemv_for_single_rows(model) == 2  # the last's 100-long rows stay on cuBLAS
    assert isinstance(model[0], GemvLinear) and model[0].weight is linear.weight
    assert not isinstance(model[2], GemvLinear)


def test_gemv_prefetches_only_aligned_long_rows():
    """The L2 bulk prefetch faults on addresses that are not 16-byte aligned: a weight at an odd offset gets
    none, as do rows under 8 KB (where it measured slower) and the 512-wide tiling."""
    from reference_engine.kernels.triton_ops import gemv_tiling

    base = torch.empty(8 * 4096 + 8, dtype=torch.bfloat16)
    assert gemv_tiling(base[: 8 * 4096].view(8, 4096)) == (2, 1024, 2048)
    assert gemv_tiling(base[1 : 8 * 4096 + 1].view(8, 4096)) == (2, 1024, 0)
    assert gemv_tiling(torch.empty(8, 2048, dtype=torch.bfloat16)) == (2, 1024, 0)
    assert gemv_tiling(torch.empty(8, 11008, dtype=torch.bfloat16)) == (4, 512, 0)


@pytest.mark.parametrize("dtype", DTYPES)
# 2 x 1024 and 4 x 512 tilings (K masked)
@pytest.mark.parametrize("in_f,bias", [(1024, False), (1040, True)])
@pytest.mark.parametrize("preload", [False, True])
def test_gemv_epilogues_are_the_bits_of_the_unfused_ops(dtype, in_f, bias, preload, monkeypatch):
    """At one row the gate/up GEMV applies SiLU * up and the qkv GEMV rotary + cache write in their epilogues:
    the results must be the bits of the GEMV followed by the separate kernel (and near the torch reference),
    with the GEMVs' first tile loaded in their loop or ahead of it."""
    from reference_engine.kernels import triton_ops
    from reference_engine.kernels.triton_ops import GemvLinear

    monkeypatch.setattr(triton_ops, "GEMV_PRELOAD_MIN_ROW_BYTES", 0 if preload else 1 << 62)

    heads, kv_heads, head_dim, block_size, num_blocks, max_len = 6, 2, 32, 16, 4, 64
    qkv_proj = GemvLinear(
        torch.nn.Linear(in_f, (heads + 2 * kv_heads) * head_dim, bias=bias, device=DEVICE, dtype=dtype)
    )
    gate_up = GemvLinear(torch.nn.Linear(in_f, 2 * 300, bias=False, device=DEVICE, dtype=dtype))
    with torch.no_grad():
        for p in (*qkv_proj.parameters(), *gate_up.parameters()):
            p.normal_(0, 0.05)
    x = torch.randn(1, in_f, device=DEVICE, dtype=dtype)
    fused, separate, ref = TritonOps(), TritonOps(), TorchOps()
    got = fused.project_silu_and_mul(gate_up, x)
    assert torch.equal(got, separate.silu_and_mul(gate_up(x)))
    assert rel_err(got, ref.silu_and_mul(torch.nn.functional.linear(x, gate_up.weight))) < TOL[dtype]

    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), torch.rand(head_dim // 2))
    emb = torch.cat((freqs, freqs), dim=-1).to(DEVICE)
    cos, sin = emb.cos(), emb.sin()
    position = torch.randint(0, max_len, (1,), device=DEVICE)
    k_before = torch.randn(num_blocks, block_size, kv_heads, head_dim, device=DEVICE, dtype=dtype)
    v_before = torch.randn_like(k_before)
    for slot in (random.randrange(num_blocks * block_size), -1):  # -1: a padding row writes nowhere
        slots = torch.tensor([slot], device=DEVICE)
        caches = {}
        for name, ops in (("fused", fused), ("separate", separate), ("ref", ref)):
            k_cache, v_cache = k_before.clone(), v_before.clone()
            if name == "fused":
                q = ops.project_rope_and_write_kv(
                    qkv_proj, x, position, cos, sin, k_cache, v_cache, slots, heads, kv_heads
                )
            else:
                qkv = (
                    qkv_proj(x)
                    if name == "separate"
                    else torch.nn.functional.linear(x, qkv_proj.weight, qkv_proj.bias)
                )
                q = ops.rope_and_write_kv(
                    qkv, position, cos, sin, k_cache, v_cache, slots.clamp(min=0), heads, kv_heads
                )
                if slot < 0:
                    k_cache, v_cache = k_before, v_before
            caches[name] = (q, k_cache, v_cache)
        for a, b in zip(caches["fused"], caches["separate"], strict=True):
            assert torch.equal(a, b)
        for a, b in zip(caches["fused"], caches["ref"], strict=True):
            assert rel_err(a, b) < TOL[dtype]
        # the same slot written
        assert torch.equal(caches["fused"][1] != k_before, caches["ref"][1] != k_before)


def test_decode_attention_launched_for_a_shorter_context_bound_changes_no_bit(monkeypatch):
    """What a CUDA graph captured for a shorter context bound launches (fewer partitions, sized as for
    max_model_len) gives the bits of the launch for max_model_len, for contexts within the bound."""
    from reference_engine.kernels import triton_ops
    from reference_engine.kernels.attention import AttentionBatch

    monkeypatch.setattr(triton_ops, "DECODE_PARTITION", 16)
    seqs, heads, kv_heads, head_dim, block_size, max_model_len, bound = 3, 4, 2, 32, 16, 2048, 256
    lens = [random.randint(1, bound) for _ in range(seqs - 1)] + [bound]
    num_blocks = max_model_len // block_size
    tables = (
        torch.stack([torch.randperm(num_blocks)[: bound // block_size] for _ in range(seqs)])
        .to(torch.int32)
        .to(DEVICE)
    )
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(seqs, heads, head_dim, device=DEVICE)
    ctx = torch.tensor(lens, dtype=torch.int32, device=DEVICE)

    def attend(max_context: int, split_context: int = 0) -> torch.Tensor:
        batch = AttentionBatch(
            slot_mapping=torch.empty(0, dtype=torch.long, device=DEVICE),
            num_decode=seqs,
            decode_block_tables=tables,
            decode_context_lens=ctx,
            decode_max_context=max_context,
            decode_split_context=split_context,
        )
        return TritonOps().attend(q, k_cache, v_cache, batch, head_dim**-0.5)

    assert triton_ops.decode_partition(max_model_len) != triton_ops.decode_partition(bound)
    full = attend(max_model_len)
    assert torch.equal(attend(bound, split_context=max_model_len), full)
    assert rel_err(attend(bound), full) < 1e-5  # cut differently: close, not necessarily the same bits
