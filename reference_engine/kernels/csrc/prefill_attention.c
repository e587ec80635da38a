/* Causal prefill attention on the CPU, float32: a chunk of n query tokens of one sequence over its whole
 * context (cached prefix and the chunk itself, already written), read from the paged KV cache.
 *
 * Layouts: q rows [n] of num_heads * head_dim floats, q_stride floats apart (the rotated q inside the fused qkv
 * buffer); out [n, num_heads, head_dim] contiguous; caches [num_blocks, block_size, num_kv_heads, head_dim];
 * block_table [ceil(ctx / block_size)] int32. Query i sits at position ctx - n + i and sees keys 0..ctx - n + i.
 *
 * Why this shape of loop: per KV head, the keys are copied out of their blocks transposed (Kt[d][t]), so a
 * score tile of 32 keys for 8 queries is 16 vector accumulators fed by two key loads and eight broadcasts per
 * head_dim step: no horizontal sums, the FMA units busy. Softmax runs on whole rows with the exp of
 * vector_math.h (the loop vectorises; a libm call per score would cost more than the matmuls). Values are
 * copied out contiguous ([t][d]) and accumulated for 4 queries at once, 64 output dims per pass.
 * Vectors are GCC/Clang vector extensions: 16 floats, one AVX-512 register or two AVX2 ones.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

typedef float vf __attribute__((vector_size(64)));
typedef float vf_unaligned __attribute__((vector_size(64), aligned(4)));
#define VL 16
#define ROWS 8      /* queries per score tile (16 accumulators); values are summed 4 rows at a time */
#define PV_ROWS 4
#define KEY_TILE 32 /* keys per score tile: two vectors */

static inline vf load(const float *p) { return *(const vf_unaligned *)p; }
static inline void store(float *p, vf x) { *(vf_unaligned *)p = x; }

/* Attention weights below e^-30 of the largest are set to zero: their products with the values would run into
 * slow denormals, and even a million of them add less than float32 rounding to the sum. */
static inline float attention_weight(float x) { return x < -30.0f ? 0.0f : exp_nonpositive(x < -30.0f ? -30.0f : x); }

/* max of s[0 .. len), len >= 1: sixteen running maxima side by side, so the loop vectorises without a
 * reduction (a plain running max needs -ffast-math to vectorise, and is a 4-cycle dependency chain without). */
static inline float row_max(const float *s, int len) {
    float lanes[VL];
    for (int j = 0; j < VL; j++) lanes[j] = s[0];
    int t = 0;
    for (; t + VL <= len; t += VL)
        for (int j = 0; j < VL; j++) lanes[j] = s[t + j] > lanes[j] ? s[t + j] : lanes[j];
    float top = lanes[0];
    for (int j = 1; j < VL; j++) top = lanes[j] > top ? lanes[j] : top;
    for (; t < len; t++) top = s[t] > top ? s[t] : top;
    return top;
}

/* scores[r][t0 .. t0+32) = scale * q_r . k_t for ROWS queries; Kt rows are ctx_pad floats long. */
static inline void score_tile(const float *const qr[ROWS], const float *kt, int ctx_pad, int head_dim, int t0,
                              float scale, float *scores, int ctx_pad_scores) {
    vf acc[ROWS][2];
    for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = (vf){0};
    for (int d = 0; d < head_dim; d++) {
        const vf k0 = load(kt + (size_t)d * ctx_pad + t0), k1 = load(kt + (size_t)d * ctx_pad + t0 + VL);
        for (int r = 0; r < ROWS; r++) {
            const float qd = qr[r][d];
            acc[r][0] += qd * k0;
            acc[r][1] += qd * k1;
        }
    }
    for (int r = 0; r < ROWS; r++) {
        store(scores + (size_t)r * ctx_pad_scores + t0, acc[r][0] * scale);
        store(scores + (size_t)r * ctx_pad_scores + t0 + VL, acc[r][1] * scale);
    }
}

/* out_r[c0 .. c0 + VL * NV) = sum_t p_r[t] v_t for ROWS queries over keys [0, len). */
#define PV_TILE(NV)                                                                                           \
    static inline void pv_tile_##NV(const float *probs, int probs_stride, const float *v, int head_dim,     \
                                    int len, int c0, vf acc[PV_ROWS][4]) {                                   \
        for (int r = 0; r < PV_ROWS; r++)                                                                     \
            for (int j = 0; j < NV; j++) acc[r][j] = (vf){0};                                                \
        for (int t = 0; t < len; t++) {                                                                       \
            vf vt[NV];                                                                                        \
            for (int j = 0; j < NV; j++) vt[j] = load(v + (size_t)t * head_dim + c0 + j * VL);               \
            for (int r = 0; r < PV_ROWS; r++) {                                                               \
                const float p = probs[(size_t)r * probs_stride + t];                                          \
                for (int j = 0; j < NV; j++) acc[r][j] += p * vt[j];                                          \
            }                                                                                                 \
        }                                                                                                     \
    }
PV_TILE(4)
PV_TILE(1)

int prefill_attention_f32(const float *q, int q_stride, const float *k_cache, const float *v_cache,
                          const int32_t *block_table, float *out, int n, int ctx, int num_heads, int num_kv_heads,
                          int head_dim, int block_size, float scale) {
    if (head_dim % VL != 0 || n < 1 || n > ctx) return -2;
    const int group = num_heads / num_kv_heads;
    const int ctx_pad = (ctx + KEY_TILE - 1) / KEY_TILE * KEY_TILE;
    const size_t row = (size_t)num_kv_heads * head_dim; /* floats per cached token */
    float *kt = calloc((size_t)head_dim * ctx_pad, sizeof(float));            /* [head_dim][ctx_pad] */
    float *vg = malloc(sizeof(float) * (size_t)ctx * head_dim);                /* [ctx][head_dim] */
    float *scores = malloc(sizeof(float) * (size_t)ROWS * ctx_pad);           /* [ROWS][ctx_pad] */
    if (!kt || !vg || !scores) {
        free(kt), free(vg), free(scores);
        return -1;
    }
    const int first_pos = ctx - n;
    for (int g = 0; g < num_kv_heads; g++) {
        for (int t = 0; t < ctx; t++) {
            const size_t slot = (size_t)block_table[t / block_size] * block_size + t % block_size;
            const float *k = k_cache + slot * row + (size_t)g * head_dim;
            for (int d = 0; d < head_dim; d++) kt[(size_t)d * ctx_pad + t] = k[d];
            memcpy(vg + (size_t)t * head_dim, v_cache + slot * row + (size_t)g * head_dim, sizeof(float) * head_dim);
        }
        for (int h = g * group; h < (g + 1) * group; h++) {
            for (int i0 = 0; i0 < n; i0 += ROWS) {
                const int rows = n - i0 < ROWS ? n - i0 : ROWS;
                const float *qr[ROWS];
                int len[ROWS];
                for (int r = 0; r < ROWS; r++) {
                    const int i = i0 + (r < rows ? r : rows - 1); /* short tiles repeat their last query */
                    qr[r] = q + (size_t)i * q_stride + (size_t)h * head_dim;
                    len[r] = first_pos + i + 1;
                }
                const int span = len[ROWS - 1]; /* the last query sees the most keys */
                for (int t0 = 0; t0 < span; t0 += KEY_TILE)
                    score_tile(qr, kt, ctx_pad, head_dim, t0, scale, scores, ctx_pad);
                float inv_sum[ROWS];
                for (int r = 0; r < ROWS; r++) {
                    float *s = scores + (size_t)r * ctx_pad;
                    const float top = row_max(s, len[r]);
                    float sum = 0.0f;
                    for (int t = 0; t < len[r]; t++) {
                        s[t] = attention_weight(s[t] - top);
                        sum += s[t];
                    }
                    for (int t = len[r]; t < span; t++) s[t] = 0.0f; /* keys after this query's position */
                    inv_sum[r] = 1.0f / sum;
                }
                vf acc[PV_ROWS][4];
                for (int r0 = 0; r0 < rows; r0 += PV_ROWS) {
                    const float *probs = scores + (size_t)r0 * ctx_pad;
                    const int pv_span = len[r0 + PV_ROWS - 1], pv_rows = rows - r0 < PV_ROWS ? rows - r0 : PV_ROWS;
                    int c0 = 0;
                    for (; c0 + 4 * VL <= head_dim; c0 += 4 * VL) {
                        pv_tile_4(probs, ctx_pad, vg, head_dim, pv_span, c0, acc);
                        for (int r = 0; r < pv_rows; r++)
                            for (int j = 0; j < 4; j++)
                                store(out + ((size_t)(i0 + r0 + r) * num_heads + h) * head_dim + c0 + j * VL,
                                      acc[r][j] * inv_sum[r0 + r]);
                    }
                    for (; c0 < head_dim; c0 += VL) {
                        pv_tile_1(probs, ctx_pad, vg, head_dim, pv_span, c0, acc);
                        for (int r = 0; r < pv_rows; r++)
                            store(out + ((size_t)(i0 + r0 + r) * num_heads + h) * head_dim + c0,
                                  acc[r][0] * inv_sum[r0 + r]);
                    }
                }
            }
        }
    }
    free(kt), free(vg), free(scores);
    return 0;
}
