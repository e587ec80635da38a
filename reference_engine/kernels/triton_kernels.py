"""Triton kernels for the decode hot path. Each is checked against the torch reference in `ops.py`.

- paged decode attention, split over the context (flash-decoding): one program per (sequence, kv head,
  context partition) handles every query head of its GQA group, then a second kernel merges the partitions by
  their log-sum-exp. A GQA group is padded to 16 query rows so that q.k and p.v run on the tensor cores
  (`tl.dot`); with one query head per KV head (MHA) there is nothing to share, and the kernel works on one
  query vector with plain reductions;
- paged prefill attention: every prefill chunk of a step in one launch, one program per (tile of a chunk's
  new tokens, kv head), its GQA group's heads stacked into the tile's rows, reading keys and values through
  the block table up to each query's own position (FlashAttention's online softmax, on the tensor cores);
- rotary embedding fused with the KV-cache write (q rotated in place, k rotated and v copied into their slots;
  slot -1 writes nowhere, which is how padded CUDA-graph rows stay out of the cache);
- RMSNorm, with the residual add fused in;
- SiLU(gate) * up;
- y = W x + b for a single row x (batch-1 decode): a plain GEMV, each program reading whole rows of W; two
  variants apply SiLU * up (gate/up projection) and rotary + KV-cache write (qkv projection) in their
  epilogue.

Programmatic dependent launch (PDL, Hopper and later; not for decode attention's partition kernel, which it
slowed, and for its merge only at batch 1 with GQA): with PDL set, a kernel may be launched while the kernel
before it in the stream is still running; it waits (`gdc_wait`) before it reads anything an earlier kernel
wrote or writes anything, then lets the next kernel launch (the partition kernel, if asked to use PDL, lets it
launch only at its end). The GEMV first asks the L2 for the start of its rows of W, which no kernel of the
step writes, and on long rows loads its first tile of W, so the next product's weights start streaming during
the tail of the kernel before it.

Elementwise kernels round exactly where torch's eager ops round, so a graph-captured step and an eager step
give bit-identical results and the norms match Hugging Face's arithmetic.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # Triton 3.4 and later
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_PDL = True
except ImportError:  # the PDL branches below are compiled out (PDL is a constexpr, and False then)
    gdc_launch_dependents = gdc_wait = None
    HAS_PDL = False


@triton.jit
def _wait_for_earlier_kernels(PDL: tl.constexpr):
    """With PDL: block until the kernels before this one have finished (their writes visible). A no-op
    without."""
    if PDL:
        gdc_wait()


@triton.jit
def _let_next_kernel_launch(PDL: tl.constexpr):
    """With PDL: the next kernel may launch now (it still waits for this one before it reads anything)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def _after_earlier_kernels(PDL: tl.constexpr):
    """Wait for the kernels before this one, then let the next one launch: for kernels whose programs are
    short enough that the next kernel's programs, resident early, take no room they need."""
    _wait_for_earlier_kernels(PDL)
    _let_next_kernel_launch(PDL)


@triton.jit
def _prefetch_to_l2(ptr, nbytes):
    """One thread of the program asks for `nbytes` (a multiple of 16) from `ptr` into L2 (Hopper's bulk
    prefetch)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 t; mov.u32 t, %tid.x; setp.eq.u32 p, t, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [ptr.to(tl.int64, bitcast=True), nbytes],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _attend_tokens(
    offs_n,
    end,
    q,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    head_offset,
    stride_cb,
    stride_ct,
    scale,
    m_i,
    l_i,
    acc,
    BLOCK_SIZE: tl.constexpr,
    offs_d,
    QUERY_ROWS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online-softmax update of (max, sum, weighted values) with one tile of context tokens."""
    n_mask = offs_n < end
    block = tl.load(table_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0)
    row = block.to(tl.int64) * stride_cb + (offs_n % BLOCK_SIZE) * stride_ct + head_offset
    k = tl.load(k_cache_ptr + row[:, None] + offs_d[None, :], mask=n_mask[:, None], other=0.0)
    v = tl.load(v_cache_ptr + row[:, None] + offs_d[None, :], mask=n_mask[:, None], other=0.0)
    if QUERY_ROWS == 1:  # MHA: q is one vector [HEAD_DIM]; m_i, l_i scalars, acc [HEAD_DIM]
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale
        s = tl.where(n_mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
    else:
        # GQA: q is [QUERY_ROWS >= 16, HEAD_DIM] in the cache dtype, both products on the tensor cores. p is
        # rounded to the cache dtype for p.v, as FlashAttention does; float32 caches use exact float32
        # products.
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
    return m_new, l_i, acc


# The block table's row stride and the partition-LSE buffer's strides change with the step (the longest
# context in an eager batch sets both), and the context lengths sit right after the block tables in one copy,
# so their address is 16-byte aligned or not with the tables' size: specialising on them (Triton does on 1,
# multiples of 16 and aligned pointers) compiled new variants at serving time. Only scalars are loaded through
# them.
@triton.jit(do_not_specialize=["block_tables_ptr", "context_lens_ptr", "stride_bt", "stride_lt", "stride_lh"])
def _decode_partition_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_bt,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    stride_yt,
    stride_yh,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    QUERY_ROWS: tl.constexpr,
    PARTITION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE: tl.constexpr,
    DYNAMIC_LOOP: tl.constexpr,
    PRECISION: tl.constexpr,
    HEADS_FIRST: tl.constexpr,
    PDL: tl.constexpr,
    MERGE_EARLY: tl.constexpr,
):
    # Attention's programs run long: with PDL it waits here but lets the next kernel launch only at its end,
    # so that the merge's programs do not sit on the SMs, waiting, while this kernel still has programs to
    # run. MERGE_EARLY (for a kernel launched without PDL, so never early itself): the merge may launch as
    # soon as every program of this kernel has started, and waits for its end; at most one wave of it is then
    # left.
    _wait_for_earlier_kernels(PDL)
    _let_next_kernel_launch(MERGE_EARLY)
    if HEADS_FIRST:  # neighbouring programs read the neighbouring heads of the same tokens
        kv_head = tl.program_id(0)
        seq = tl.program_id(1)
    else:
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
    part = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + seq)
    start = part * PARTITION
    if start < ctx:
        end = tl.minimum(start + PARTITION, ctx)
        offs_d = tl.arange(0, HEAD_DIM)
        if QUERY_ROWS == 1:  # MHA: this program's one query head
            heads = kv_head
            g_mask = True
            q = tl.load(q_ptr + seq * stride_qt + heads * stride_qh + offs_d).to(tl.float32)
            m_i = tl.full([], float("-inf"), tl.float32)
            l_i = tl.full([], 0.0, tl.float32)
            acc = tl.zeros([HEAD_DIM], tl.float32)
        else:  # the GQA group's query heads, padded to QUERY_ROWS rows (masked)
            offs_g = tl.arange(0, QUERY_ROWS)
            heads = kv_head * GROUP + offs_g
            g_mask = offs_g < GROUP
            q = tl.load(
                q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None],
                other=0.0,
            )
            m_i = tl.full([QUERY_ROWS], float("-inf"), tl.float32)
            l_i = tl.zeros([QUERY_ROWS], tl.float32)
            acc = tl.zeros([QUERY_ROWS, HEAD_DIM], tl.float32)
        table = block_tables_ptr + seq * stride_bt
        # Compiled, the loop stops at the context's end; Triton's interpreter cannot loop to a loaded value,
        # so there it runs the partition's full length and masks the tokens past `end`.
        if DYNAMIC_LOOP:
            for n0 in range(start, end, BLOCK_N):
                m_i, l_i, acc = _attend_tokens(
                    n0 + tl.arange(0, BLOCK_N),
                    end,
                    q,
                    k_cache_ptr,
                    v_cache_ptr,
                    table,
                    kv_head * stride_ch,
                    stride_cb,
                    stride_ct,
                    scale,
                    m_i,
                    l_i,
                    acc,
                    BLOCK_SIZE,
                    offs_d,
                    QUERY_ROWS,
                    PRECISION,
                )
        else:
            for n0 in range(0, PARTITION, BLOCK_N):
                m_i, l_i, acc = _attend_tokens(
                    start + n0 + tl.arange(0, BLOCK_N),
                    end,
                    q,
                    k_cache_ptr,
                    v_cache_ptr,
                    table,
                    kv_head * stride_ch,
                    stride_cb,
                    stride_ct,
                    scale,
                    m_i,
                    l_i,
                    acc,
                    BLOCK_SIZE,
                    offs_d,
                    QUERY_ROWS,
                    PRECISION,
                )
        if QUERY_ROWS == 1:
            out = acc / l_i
            o_rows = heads * stride_yh + offs_d
            p_rows = heads * stride_oh + offs_d
            o_mask = offs_d < HEAD_DIM
        else:
            out = acc / l_i[:, None]
            o_rows = heads[:, None] * stride_yh + offs_d[None, :]
            p_rows = heads[:, None] * stride_oh + offs_d[None, :]
            o_mask = g_mask[:, None]
        if SINGLE:  # one partition covers the context: this is the answer, no merge needed
            tl.store(out_ptr + seq * stride_yt + o_rows, out.to(out_ptr.dtype.element_ty), mask=o_mask)
        else:
            tl.store(part_out_ptr + seq * stride_ot + part * stride_os + p_rows, out, mask=o_mask)
            tl.store(
                part_lse_ptr + seq * stride_lt + heads * stride_lh + part, m_i + tl.log(l_i), mask=g_mask
            )
    _let_next_kernel_launch(PDL)


@triton.jit(do_not_specialize=["context_lens_ptr", "stride_lt", "stride_lh"])
def _merge_partitions_kernel(
    part_out_ptr,
    part_lse_ptr,
    context_lens_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    stride_os,
    stride_lt,
    stride_lh,
    stride_yt,
    stride_yh,
    HEAD_DIM: tl.constexpr,
    PARTITION: tl.constexpr,
    MAX_PARTS: tl.constexpr,
    PDL: tl.constexpr,
    NEXT_EARLY: tl.constexpr,
):
    # With PDL it waits here, and lets the next kernel launch at its end, or with NEXT_EARLY at once.
    _wait_for_earlier_kernels(PDL)
    _let_next_kernel_launch(NEXT_EARLY)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    ctx = tl.load(context_lens_ptr + seq)
    n_parts = tl.cdiv(ctx, PARTITION)
    offs_p = tl.arange(0, MAX_PARTS)
    offs_d = tl.arange(0, HEAD_DIM)
    p_mask = offs_p < n_parts
    lse = tl.load(
        part_lse_ptr + seq * stride_lt + head * stride_lh + offs_p, mask=p_mask, other=float("-inf")
    )
    weight = tl.exp(lse - tl.max(lse, axis=0))
    weight = tl.where(p_mask, weight, 0.0)
    weight = weight / tl.sum(weight, axis=0)
    parts = tl.load(
        part_out_ptr + seq * stride_ot + head * stride_oh + offs_p[:, None] * stride_os + offs_d[None, :],
        mask=p_mask[:, None],
        other=0.0,
    )
    out = tl.sum(parts * weight[:, None], axis=0)
    tl.store(out_ptr + seq * stride_yt + head * stride_yh + offs_d, out.to(out_ptr.dtype.element_ty))
    _let_next_kernel_launch(PDL and not NEXT_EARLY)


# Which chunk a program works on, the chunks' rows and contexts, and their block tables come from one copy per
# step whose pieces' sizes (and so alignment) change with the step, as does the tables' row stride; the
# longest context only bounds the interpreter's loop. Specialising on any of them would compile new variants
# mid-traffic.
@triton.jit(do_not_specialize=["tables_ptr", "chunks_ptr", "tiles_ptr", "stride_bt", "max_context"])
def _prefill_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    tables_ptr,
    chunks_ptr,
    tiles_ptr,
    scale,
    max_context,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_bt,
    stride_yt,
    stride_yh,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_ROWS: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DYNAMIC_LOOP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # One program: TILE_TOKENS consecutive new tokens of one prefill chunk, times the GQA group's query heads
    # of one KV head (GROUP padded to GROUP_ROWS), as the rows of one query tile, so that every row reads the
    # same keys and both products run on the tensor cores. Keys come from the paged cache (the chunk's own
    # tokens were written there before), up to the tile's last query position: causal, cached prefix included.
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    chunk = tl.load(tiles_ptr + 2 * tile)
    first = tl.load(tiles_ptr + 2 * tile + 1)  # the tile's first token, counted within the chunk
    row0 = tl.load(chunks_ptr + 3 * chunk)  # the chunk's first row in the flat batch
    new = tl.load(chunks_ptr + 3 * chunk + 1)
    ctx = tl.load(chunks_ptr + 3 * chunk + 2)  # context after the chunk: its query i sits at ctx - new + i
    offs_m = tl.arange(0, TILE_TOKENS * GROUP_ROWS)
    token = first + offs_m // GROUP_ROWS
    g = offs_m % GROUP_ROWS
    heads = kv_head * GROUP + g
    m_mask = (token < new) & (g < GROUP)
    position = ctx - new + token
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = (row0 + token).to(tl.int64) * stride_qt + heads * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=m_mask[:, None], other=0.0)
    m_i = tl.full([TILE_TOKENS * GROUP_ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([TILE_TOKENS * GROUP_ROWS], tl.float32)
    acc = tl.zeros([TILE_TOKENS * GROUP_ROWS, HEAD_DIM], tl.float32)
    end = tl.minimum(ctx, ctx - new + first + TILE_TOKENS)  # past the tile's last query: nothing it may see
    table = tables_ptr + chunk * stride_bt
    # Compiled, the loop stops at the tile's last key; the interpreter cannot loop to a loaded value, so there
    # it runs to the batch's longest context and masks the rest. Key 0 is in every row's first tile, so no
    # row's running maximum stays -inf after it.
    for n0 in range(0, end if DYNAMIC_LOOP else max_context, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        block = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0)
        kv_rows = block.to(tl.int64) * stride_cb + (offs_n % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
        k = tl.load(k_cache_ptr + kv_rows[:, None] + offs_d[None, :], mask=n_mask[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_rows[:, None] + offs_d[None, :], mask=n_mask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(n_mask[None, :] & (offs_n[None, :] <= position[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    y_rows = (row0 + token).to(tl.int64) * stride_yt + heads * stride_yh
    tl.store(
        out_ptr + y_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None]
    )


@triton.jit
def _rotary(x, partner, cos, sin):
    """x * cos + partner * sin, partner being rotate_half's signed element (-x[d + half] in the first half of
    a head, x[d - half] in the second): each product and the sum rounded to x's dtype, as torch's ops
    round."""
    dtype = x.dtype
    return ((x * cos).to(dtype) + (partner * sin).to(dtype)).to(dtype)


@triton.jit
def _slot_offset(slot, BLOCK_SIZE: tl.constexpr, stride_cb, stride_ct):
    """Offset of a cache slot (block * BLOCK_SIZE + position in the block) in a [blocks, block_size, ...]
    cache."""
    return (slot // BLOCK_SIZE).to(tl.int64) * stride_cb + (slot % BLOCK_SIZE) * stride_ct


@triton.jit
def _rope_write_kv_kernel(
    qkv_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    stride_qkv,
    stride_cos,
    stride_qt,
    stride_qh,
    stride_cb,
    stride_ct,
    stride_ch,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_P2: tl.constexpr,
    KV_HEADS_P2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    _after_earlier_kernels(PDL)
    t = tl.program_id(0)
    half: tl.constexpr = HEAD_DIM // 2
    pos = tl.load(positions_ptr + t)
    offs_d = tl.arange(0, HEAD_DIM)
    rot_d = (offs_d + half) % HEAD_DIM  # partner of each element in rotate_half
    sign = tl.where(offs_d < half, -1.0, 1.0)
    row = qkv_ptr + t * stride_qkv
    dtype = q_out_ptr.dtype.element_ty
    cos = tl.load(cos_ptr + pos * stride_cos + offs_d).to(dtype)
    sin = tl.load(sin_ptr + pos * stride_cos + offs_d).to(dtype)
    # q: rotated, written out. Products and sum round like torch's bf16 ops: x*cos, rot*sin, then the add.
    offs_h = tl.arange(0, HEADS_P2)
    h_mask = offs_h[:, None] < NUM_HEADS
    q = tl.load(row + offs_h[:, None] * HEAD_DIM + offs_d[None, :], mask=h_mask, other=0.0)
    q_rot = tl.load(row + offs_h[:, None] * HEAD_DIM + rot_d[None, :], mask=h_mask, other=0.0)
    q_new = _rotary(q, (q_rot * sign[None, :]).to(dtype), cos[None, :], sin[None, :])
    tl.store(q_out_ptr + t * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :], q_new, mask=h_mask)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        dest = _slot_offset(slot, BLOCK_SIZE, stride_cb, stride_ct)
        offs_k = tl.arange(0, KV_HEADS_P2)
        k_mask = offs_k[:, None] < NUM_KV_HEADS
        k_base = row + NUM_HEADS * HEAD_DIM
        k = tl.load(k_base + offs_k[:, None] * HEAD_DIM + offs_d[None, :], mask=k_mask, other=0.0)
        k_rot = tl.load(k_base + offs_k[:, None] * HEAD_DIM + rot_d[None, :], mask=k_mask, other=0.0)
        k_new = _rotary(k, (k_rot * sign[None, :]).to(dtype), cos[None, :], sin[None, :])
        cache_off = dest + offs_k[:, None] * stride_ch + offs_d[None, :]
        tl.store(k_cache_ptr + cache_off, k_new, mask=k_mask)
        v = tl.load(
            k_base + (NUM_KV_HEADS + offs_k[:, None]) * HEAD_DIM + offs_d[None, :], mask=k_mask, other=0.0
        )
        tl.store(v_cache_ptr + cache_off, v, mask=k_mask)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    stride_x,
    stride_r,
    stride_o,
    n_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    _after_earlier_kernels(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
        # the add rounds to the activation dtype, as torch's
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(residual_ptr + row * stride_r + offs, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / n_cols
    normed = (xf * tl.rsqrt(var + eps)).to(dtype)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_o + offs, (w.to(tl.float32) * normed.to(tl.float32)).to(dtype), mask=mask)


@triton.jit
def _silu_times(gate, up):
    """SiLU(gate) * up in the inputs' dtype, rounded where torch's eager F.silu(gate) * up rounds."""
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr):
    _after_earlier_kernels(PDL)
    row = tl.program_id(0)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < n_cols
    gate = tl.load(x_ptr + row * stride_x + col, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + n_cols + col, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_o + col, _silu_times(gate, up), mask=mask)


# Single-row linears (batch-1 decode): y = W x (+ b) as a GEMV, each program reading whole rows of W (n, K),
# BLOCK_K columns a step, float32 sums. With PREFETCH > 0 the first PREFETCH bytes of each of the program's
# rows (16-byte aligned; a multiple of 16, at most a row) are asked into L2 before it waits for the kernel
# that writes x (whole rows thrash the L2: every resident program asks at once). Two variants fold the op that
# follows the product into its epilogue, so that at batch 1 that op costs no kernel of its own: SiLU(gate) *
# up after the gate/up projection, and rotary embedding + KV-cache write after the qkv projection. Each pairs
# the rows its epilogue combines (gate row i with up row i; rotary element d with d + head_dim / 2) in one
# program, and rounds the product to the activation dtype first, so the result is the bits of the product
# followed by the op's own kernel.


@triton.jit
def _prefetch_rows(w_ptr, first, n, stride_w, ROWS: tl.constexpr, PREFETCH: tl.constexpr):
    """Ask L2 for the first PREFETCH bytes of rows first .. first + ROWS - 1 (those below n) of W."""
    if PREFETCH > 0:
        for r in tl.static_range(ROWS):
            if first + r < n:
                _prefetch_to_l2(w_ptr + (first + r).to(tl.int64) * stride_w, PREFETCH)


@triton.jit
def _gemv_load_w(w_rows, row_mask, k0, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """W[rows, k0:k0 + BLOCK_K] (columns past K masked)."""
    cols = k0 + tl.arange(0, BLOCK_K)
    if K % BLOCK_K == 0:
        return tl.load(w_rows + cols[None, :], mask=row_mask[:, None], other=0.0)
    return tl.load(w_rows + cols[None, :], mask=row_mask[:, None] & (cols[None, :] < K), other=0.0)


@triton.jit
def _gemv_add(w, x_ptr, k0, acc, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc += w * x[k0:k0 + BLOCK_K], w a loaded tile of W."""
    cols = k0 + tl.arange(0, BLOCK_K)
    xk = tl.load(x_ptr + cols) if K % BLOCK_K == 0 else tl.load(x_ptr + cols, mask=cols < K, other=0.0)
    return acc + w.to(tl.float32) * xk.to(tl.float32)[None, :]


@triton.jit
def _gemv_rows(
    w_ptr,
    x_ptr,
    rows,
    row_mask,
    stride_w,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    """sum_k W[rows, k] * x[k] in float32, for a vector of BLOCK_N row indices (masked rows give 0), once the
    kernels before this one have finished (they write x). PRELOAD loads the first step's tile of W before that
    wait (no kernel writes W), so that its memory latency overlaps the previous kernel's tail; the sums are
    the same in the same order."""
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    first_step: tl.constexpr = BLOCK_K if PRELOAD else 0
    if PRELOAD:
        w = _gemv_load_w(w_rows, row_mask, 0, K, BLOCK_K)
    _after_earlier_kernels(PDL)
    if PRELOAD:
        acc = _gemv_add(w, x_ptr, 0, acc, K, BLOCK_K)
    for k0 in range(first_step, K, BLOCK_K):
        acc = _gemv_add(_gemv_load_w(w_rows, row_mask, k0, K, BLOCK_K), x_ptr, k0, acc, K, BLOCK_K)
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_kernel(
    w_ptr,
    x_ptr,
    bias_ptr,
    y_ptr,
    n,
    stride_w,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    """y = W x (+ b): BLOCK_N rows of W per program."""
    first = tl.program_id(0) * BLOCK_N
    rows = first + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    _prefetch_rows(w_ptr, first, n, stride_w, BLOCK_N, PREFETCH)
    y = _gemv_rows(w_ptr, x_ptr, rows, row_mask, stride_w, K, BLOCK_N, BLOCK_K, PDL, PRELOAD)
    if HAS_BIAS:  # added before the one rounding, as cuBLAS's epilogue does
        y += tl.load(bias_ptr + rows, mask=row_mask).to(tl.float32)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _gemv_silu_and_mul_kernel(
    w_ptr,
    x_ptr,
    y_ptr,
    n,
    stride_w,
    K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    """y = SiLU(W[:n] x) * (W[n:] x) for the gate/up weight W (2n, K): each program takes BLOCK_N gate rows
    and the BLOCK_N up rows that pair with them."""
    first = tl.program_id(0) * BLOCK_N
    offs = tl.arange(0, 2 * BLOCK_N)
    out_rows = first + offs // 2
    rows = out_rows + (offs % 2) * n  # gate row i, up row i, gate row i + 1, ...
    _prefetch_rows(w_ptr, first, n, stride_w, BLOCK_N, PREFETCH)
    _prefetch_rows(w_ptr, n + first, 2 * n, stride_w, BLOCK_N, PREFETCH)
    y = _gemv_rows(w_ptr, x_ptr, rows, out_rows < n, stride_w, K, 2 * BLOCK_N, BLOCK_K, PDL, PRELOAD)
    gate, up = tl.split(tl.reshape(y.to(y_ptr.dtype.element_ty), [BLOCK_N, 2]))
    mine = first + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + mine, _silu_times(gate, up), mask=mine < n)


@triton.jit
def _gemv_rope_write_kv_kernel(
    w_ptr,
    x_ptr,
    bias_ptr,
    positions_ptr,
    cos_ptr,
    sin_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    stride_w,
    stride_cos,
    stride_qh,
    stride_cb,
    stride_ct,
    stride_ch,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PAIRS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    PRELOAD: tl.constexpr,
):
    """The qkv projection of one token, then what `_rope_write_kv_kernel` does with it: each program takes
    elements d .. d + PAIRS - 1 of one head and their rotary partners d + HEAD_DIM / 2 .., rotates q and k,
    writes q out and k and v into the token's cache slot (slot -1: nowhere)."""
    half: tl.constexpr = HEAD_DIM // 2
    per_head: tl.constexpr = half // PAIRS
    head = tl.program_id(0) // per_head
    d0 = (tl.program_id(0) % per_head) * PAIRS
    first = head * HEAD_DIM + d0
    offs = tl.arange(0, 2 * PAIRS)
    rows = first + offs // 2 + (offs % 2) * half  # element d, its partner, d + 1, ...
    n = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    _prefetch_rows(w_ptr, first, n, stride_w, PAIRS, PREFETCH)
    _prefetch_rows(w_ptr, first + half, n, stride_w, PAIRS, PREFETCH)
    y = _gemv_rows(w_ptr, x_ptr, rows, rows < n, stride_w, K, 2 * PAIRS, BLOCK_K, PDL, PRELOAD)
    if HAS_BIAS:
        y += tl.load(bias_ptr + rows).to(tl.float32)
    dtype = q_out_ptr.dtype.element_ty
    lo, hi = tl.split(tl.reshape(y.to(dtype), [PAIRS, 2]))  # elements d (first half) and d + half
    d = d0 + tl.arange(0, PAIRS)
    if head < NUM_HEADS + NUM_KV_HEADS:  # q or k: rotate, rounding as `_rope_write_kv_kernel` does
        pos = tl.load(positions_ptr)
        cos_lo = tl.load(cos_ptr + pos * stride_cos + d).to(dtype)
        sin_lo = tl.load(sin_ptr + pos * stride_cos + d).to(dtype)
        cos_hi = tl.load(cos_ptr + pos * stride_cos + half + d).to(dtype)
        sin_hi = tl.load(sin_ptr + pos * stride_cos + half + d).to(dtype)
        lo, hi = _rotary(lo, -hi, cos_lo, sin_lo), _rotary(hi, lo, cos_hi, sin_hi)
    if head < NUM_HEADS:
        tl.store(q_out_ptr + head * stride_qh + d, lo)
        tl.store(q_out_ptr + head * stride_qh + half + d, hi)
    else:
        slot = tl.load(slots_ptr)
        if slot >= 0:
            dest = _slot_offset(slot, BLOCK_SIZE, stride_cb, stride_ct)
            if head < NUM_HEADS + NUM_KV_HEADS:
                at = k_cache_ptr + dest + (head - NUM_HEADS) * stride_ch
            else:
                at = v_cache_ptr + dest + (head - NUM_HEADS - NUM_KV_HEADS) * stride_ch
            tl.store(at + d, lo)
            tl.store(at + half + d, hi)
