/* Elementwise math written as plain arithmetic, so that loops over arrays of it vectorise (a libm call per
 * element would not, without -ffast-math). */
#ifndef REFERENCE_ENGINE_VECTOR_MATH_H
#define REFERENCE_ENGINE_VECTOR_MATH_H

#include <stdint.h>
#include <string.h>

/* e^x for x <= 0, x >= -87 (callers clamp): x = k ln2 + r with |r| <= ln2 / 2 (Cody-Waite split of ln2), a
 * degree-6 Taylor polynomial for e^r (relative error ~1e-7, float32 rounding), times 2^k built in the exponent
 * bits. */
static inline float exp_nonpositive(float x) {
    const float k = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    const float r = x - k * 0.693145751953125f - k * 1.42860682030941723e-6f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}

#endif
