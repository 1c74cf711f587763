/* What the two translation units of kvlab's CPU decode kernel share (_kivi_cpu.c and _kivi_int.c, linked into one
 * library; each includes this header once): bf16 <-> fp32, fp32 rows of bf16/fp32 arrays, an output row's store, GCC/Clang vector types
 * of 8 and 16 float lanes with their loads, stores and shuffles, and exp(x) for x <= 0, scalar and on those vectors.
 * kvlab.attention.cpu_kernel hashes this file into the kernel's build key: a change here rebuilds both. */
#ifndef KVLAB_KIVI_SIMD_H
#define KVLAB_KIVI_SIMD_H

#pragma GCC diagnostic ignored "-Wpsabi" /* 64-byte vectors pass between always_inline helpers only */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* element i of p as fp32: bf16 when bf16, else fp32 */
static inline float ld(const void *p, int64_t i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* fp32 -> bf16, rounded to nearest even */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* out[0..n) = p[off..off + n) as fp32 (a window token's channels, a scale/zero row): bf16 when bf16, else fp32 */
AI void row_f32(const void *p, int64_t off, int64_t n, int bf16, float *out) {
    if (bf16) {
        const uint16_t *h = (const uint16_t *)p + off;
#pragma omp simd
        for (int64_t c = 0; c < n; c++) out[c] = bf16_to_f32(h[c]);
    } else {
        memcpy(out, (const float *)p + off, n * sizeof(float));
    }
}

/* out[o..o + n) = row[0..n) * inv, the finished output row of one query: bf16 (rounded to nearest even) when bf16,
 * else fp32 */
AI void store_row(void *out, int64_t o, const float *row, float inv, int64_t n, int bf16) {
    if (bf16)
        for (int64_t c = 0; c < n; c++) ((uint16_t *)out)[o + c] = f32_to_bf16(row[c] * inv);
    else
        for (int64_t c = 0; c < n; c++) ((float *)out)[o + c] = row[c] * inv;
}

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
#if defined(__clang__)
#define SHUF8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#define SHUF16(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define SHUF8(a, b, ...) __builtin_shuffle(a, b, (v8i){__VA_ARGS__})
#define SHUF16(a, b, ...) __builtin_shuffle(a, b, (v16i){__VA_ARGS__})
#endif

AI v8f splat8(float x) { return (v8f){x, x, x, x, x, x, x, x}; }

AI v16f splat16(float x) { return (v16f){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

/* 8 / 16 floats from or to memory of any alignment */
#define LOAD_STORE(LOAD, STORE, VF)                                \
    AI VF LOAD(const float *p) {                                   \
        VF v;                                                      \
        memcpy(&v, p, sizeof v);                                   \
        return v;                                                  \
    }                                                              \
    AI void STORE(float *p, VF v) { memcpy(p, &v, sizeof v); }
LOAD_STORE(load8, store8, v8f)
LOAD_STORE(load16, store16, v16f)

/* exp(x) for x <= 0 (and -inf -> 0): Cephes expf polynomial, ~1 ulp, vectorizable */
static inline float exp_nonpos(float x) {
    float xc = x < -87.0f ? -87.0f : x;
    float fx = floorf(xc * 1.44269504088896341f + 0.5f);
    float r = xc - fx * 0.693359375f + fx * 2.12194440e-4f;
    float z = r * r;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * z + r + 1.0f;
    int32_t e = ((int32_t)fx + 127) << 23;
    float s;
    memcpy(&s, &e, 4);
    return x < -87.0f ? 0.0f : y * s;
}

/* exp(x) of every lane, x <= 0 or -inf (-> 0): exp_nonpos's polynomial, round-to-nearest by the 1.5 * 2^23 trick;
 * NAME takes and returns VF (float lanes), VI its int32 lanes, SPLAT broadcasts a float */
#define EXP_NONPOS(NAME, VF, VI, SPLAT)                                                                      \
    AI VF NAME(VF x) {                                                                                       \
        const VI low = x < SPLAT(-87.0f);                                                                    \
        const VF xc = (VF)(((VI)x & ~low) | ((VI)SPLAT(-87.0f) & low));                                      \
        const VF fx = (xc * SPLAT(1.44269504088896341f) + SPLAT(12582912.0f)) - SPLAT(12582912.0f);          \
        const VF r = xc - fx * SPLAT(0.693359375f) + fx * SPLAT(2.12194440e-4f);                             \
        const VF z = r * r;                                                                                  \
        VF y = SPLAT(1.9875691500e-4f);                                                                      \
        y = y * r + SPLAT(1.3981999507e-3f);                                                                 \
        y = y * r + SPLAT(8.3334519073e-3f);                                                                 \
        y = y * r + SPLAT(4.1665795894e-2f);                                                                 \
        y = y * r + SPLAT(1.6666665459e-1f);                                                                 \
        y = y * r + SPLAT(5.0000001201e-1f);                                                                 \
        y = y * z + r + SPLAT(1.0f);                                                                         \
        const VI e = (__builtin_convertvector(fx, VI) + 127) << 23;                                          \
        return (VF)((VI)(y * (VF)e) & ~low);                                                                 \
    }
EXP_NONPOS(exp8_nonpos, v8f, v8i, splat8)
EXP_NONPOS(exp16_nonpos, v16f, v16i, splat16)

#endif
