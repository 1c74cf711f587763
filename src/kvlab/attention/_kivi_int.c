/* Integer dot products over packed KIVI key codes, and a float (bf16/fp16/fp32) decode-attention baseline, on the
 * CPU, each in one of three instruction-set paths chosen at run time (kvlab.attention.cpu_kernel builds and loads
 * this file beside _kivi_cpu.c, without -march=native: every path carries its own __attribute__((target)), so one
 * build serves every x86-64 CPU and a lower path can be forced on a higher CPU):
 *   ISA_SCALAR  0: portable C (x86-64 baseline SSE2 or any other architecture)
 *   ISA_AVX2    1: AVX2 + FMA + F16C; integer dots with _mm256_maddubs_epi16 + _mm256_madd_epi16
 *   ISA_AVX512  2: AVX512 F/BW/VL + VNNI; integer dots with _mm512_dpbusd_epi32
 *
 * Integer key scores (KIVI keys are quantized per channel, groups of G tokens: k[t,c] = s[c] * code[t,c] + z[c]):
 *   score[t] = sum_c (q[c] s[c]) code[t,c] + sum_c q[c] z[c]
 * The scale folds into the query once per key group (as the exact kernel does); that folded query qs = q * s is then
 * quantized to int8 with one scale per (query row, key group), a = max_c |qs[c]| / 127, qi[c] = round(qs[c] / a),
 * and the first sum becomes a * (qi . code), an exact integer dot product of int8 query lanes with unsigned code
 * lanes (codes < 2^nbits). One int8 digit (|qs - a qi| <= a / 2) cost the real model (SmolLM2-135M, KIVI-4, 2k
 * tokens) a KL to the exact path of 14 % of KIVI-4's own KL to the float cache, so the query carries a second int8
 * digit, q2 = round((qs / a - qi) * DIGIT), and the dot is a / DIGIT * (DIGIT * (qi . code) + q2 . code): two
 * dpbusd per 64 codes over the same unpacked lanes, one multiply-add of the two int32 sums before the reduction.
 * The zero-point term stays in fp32 (one dot per row and group). The only error is the query rounding:
 * |qs[c] - a (qi[c] + q2[c] / DIGIT)| <= a / (2 DIGIT), so
 *   |score_int[t] - score_exact[t]| <= a / (2 DIGIT) * sum_c code[t,c] <= a / (2 DIGIT) * D * (2^nbits - 1)
 * (plus fp32 rounding). This is llama.cpp's q8 dot product (ggml's quantize_row_q8 for the activation, then integer
 * dot products with maddubs / dpbusd against the 4-bit weights' unpacked nibbles), applied to KIVI's per-channel
 * key groups (arXiv:2402.02750, section 3.2: per-channel keys, per-token values). 2- and 4-bit codes are unpacked
 * to 8-bit lanes with one broadcast load, one variable shift and one mask per 64 (AVX512) or 32 (AVX2) codes; the
 * query is stored in that unpacked order, so no byte shuffles are needed.
 *
 * Float baseline: decode attention of M query rows per KV head over K/V [T, D] stored as bf16, fp16 or fp32,
 * converted to fp32 in registers, fp32 FMAs, softmax in fp32 (no window, no mask: every token attended), the same
 * item structure as _kivi_cpu.c (one (batch row, KV head) per OpenMP work item, blocks of 16 keys).
 */
#pragma GCC diagnostic ignored "-Wpsabi" /* 64-byte vectors pass between always_inline helpers only */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_kivi_simd.h"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define X86 1
#else
#define X86 0
#endif

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
/* the second int8 digit of the query: qs / a ~ q1 + q2 / DIGIT, |q2| <= DIGIT / 2 <= 127 */
#define DIGIT 254

#if X86
#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#endif

/* the best path this CPU runs */
static int isa_best = -1;
int kvlab_isa_best(void) {
    if (isa_best >= 0) return isa_best;
#if X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni"))
        return isa_best = ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        return isa_best = ISA_AVX2;
#endif
    return isa_best = ISA_SCALAR;
}

/* ---- integer key scores ---------------------------------------------------------------------------------------
 * Unpacked order ("unit-part-major"): codes come in units of W codes (W = 64 for AVX512, 32 for AVX2 and scalar),
 * unit u covers packed bytes [u*UB, (u+1)*UB) with UB = W*nbits/8, and inside it part i (bits [i*nb, (i+1)*nb) of
 * each byte) precedes part i+1. Index idx of that order is channel chan(idx). */
static int64_t chan(int64_t idx, int64_t W, int nb) {
    const int64_t K = 8 / nb, UB = W * nb / 8, u = idx / W, i = (idx % W) / UB, jb = (idx % W) % UB;
    return (u * UB + jb) * K + i;
}

#if X86
/* ---- the AVX512 and AVX2 paths: each one's own instructions here; the kernels, written once for both, are in
 * _kivi_int_x86.h (included below, after the helpers they call) */

/* 64 codes of UB = 8 * nb packed bytes, unit-part-major (see chan) */
T_AVX512 AI __m512i unpack_avx512(const uint8_t *p, const int nb) {
    if (nb == 4) {
        const __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
        return _mm512_and_si512(_mm512_srlv_epi64(x, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)), _mm512_set1_epi8(0x0F));
    }
    const __m512i x = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
    return _mm512_and_si512(_mm512_srlv_epi64(x, _mm512_set_epi64(6, 6, 4, 4, 2, 2, 0, 0)), _mm512_set1_epi8(0x03));
}

/* the end of reduce_avx512: c[k] holds 4 partial sums per 128-bit lane; lane t of the result = a[t]'s total */
T_AVX512 AI __m512i cross_avx512(const __m512i *c) {
    const __m512i e0 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[0], c[1], 0x88), _mm512_shuffle_i32x4(c[0], c[1], 0xDD));
    const __m512i e1 = _mm512_add_epi32(_mm512_shuffle_i32x4(c[2], c[3], 0x88), _mm512_shuffle_i32x4(c[2], c[3], 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(e0, e1, 0x88), _mm512_shuffle_i32x4(e0, e1, 0xDD));
}

T_AVX512 AI int32_t hsum_avx512(__m512i v) { return _mm512_reduce_add_epi32(v); }

/* acc + the u8 (a) x s8 (b) byte products, summed per 4 bytes into int32 lanes: VNNI's dpbusd */
T_AVX512 AI __m512i dot_avx512(__m512i acc, __m512i a, __m512i b) { return _mm512_dpbusd_epi32(acc, a, b); }

T_AVX512 AI __m512i permute_avx512(__m512i a, __m512i idx) { return _mm512_permutexvar_epi32(idx, a); }

typedef __mmask16 wmask_t_avx512;
T_AVX512 AI __mmask16 wmask_avx512(int64_t KG) { return (__mmask16)((1u << KG) - 1u); }
T_AVX512 AI __m512i wload_avx512(const uint8_t *p, __mmask16 km) { return _mm512_maskz_loadu_epi32(km, p); }

/* 32 codes of UB = 4 * nb packed bytes, unit-part-major */
T_AVX2 AI __m256i unpack_avx2(const uint8_t *p, const int nb) {
    if (nb == 4) {
        const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
        return _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F));
    }
    int64_t w;
    memcpy(&w, p, 8);
    const __m256i x = _mm256_set1_epi64x(w);
    return _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_set_epi64x(6, 4, 2, 0)), _mm256_set1_epi8(0x03));
}

/* the end of reduce_avx2: the two 128-bit halves of c[0] and c[1] added across */
T_AVX2 AI __m256i cross_avx2(const __m256i *c) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(c[0], c[1], 0x20), _mm256_permute2x128_si256(c[0], c[1], 0x31));
}

T_AVX2 AI int32_t hsum_avx2(__m256i v) {
    int32_t l[8];
    _mm256_storeu_si256((__m256i *)l, v);
    return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
}

/* acc + the u8 (a) x s8 (b) byte products summed per 4 bytes: 16 int16 pair sums (no saturation: 2 * 255 * 15 and
 * 2 * 15 * 127 < 32767), then pairs of those into 8 int32 */
T_AVX2 AI __m256i dot_avx2(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
}

T_AVX2 AI __m256i permute_avx2(__m256i a, __m256i idx) { return _mm256_permutevar8x32_epi32(a, idx); }

typedef __m256i wmask_t_avx2;
T_AVX2 AI __m256i wmask_avx2(int64_t KG) {
    int32_t lm[8];
    for (int l = 0; l < 8; l++) lm[l] = l < KG ? -1 : 0;
    return _mm256_loadu_si256((const __m256i *)lm);
}
T_AVX2 AI __m256i wload_avx2(const uint8_t *p, __m256i km) { return _mm256_maskload_epi32((const int *)p, km); }
#endif

/* the integer dot products in portable C, natural channel order (qi[c] for channel c) */
AI void dots_scalar(const uint8_t *kc, int64_t P, int64_t t0, int64_t n, const int nb, const int8_t *qi,
                        const float *a, const float *bias, float *sc, int64_t total, int64_t M, int64_t D) {
    const int K = 8 / nb;
    const unsigned mask = (1u << nb) - 1u;
    for (int64_t t = t0; t < t0 + n; t++) {
        const uint8_t *x = kc + t * P;
        for (int64_t r = 0; r < M; r++) {
            int32_t s = 0, s2 = 0;
            for (int64_t c = 0; c < D; c++) {
                const int32_t code = (int32_t)((x[c / K] >> (c % K * nb)) & mask);
                s += (int32_t)qi[r * D + c] * code;
                s2 += (int32_t)qi[(M + r) * D + c] * code;
            }
            s = s * DIGIT + s2;
            sc[r * total + t] = a[r] * (float)s + bias[r];
        }
    }
}

/* the unit width of a path's unpacked order (0: the path cannot take head_dim D) */
static int64_t unit_width(int isa, int64_t D) {
    if (isa == ISA_AVX512) return D % 64 ? 0 : 64;
    if (isa == ISA_AVX2) return D % 32 ? 0 : 32;
    return D;
}

/* 1 when kivi_int_key_scores takes (isa, nbits, D) */
int kivi_int_supported(int64_t isa, int64_t nb, int64_t D) {
    if (nb != 2 && nb != 4) return 0;
    if (isa < 0 || isa > ISA_AVX512 || isa > kvlab_isa_best()) return 0;
    return unit_width((int)isa, D) != 0;
}

/* even and odd elements of src[0..n) (n a multiple of 16) */
AI void deint2(const float *src, int64_t n, float *even, float *odd) {
    for (int64_t i = 0; i < n / 16; i++) {
        v8f a, b;
        memcpy(&a, src + 16 * i, 32);
        memcpy(&b, src + 16 * i + 8, 32);
        const v8f e = SHUF8(a, b, 0, 2, 4, 6, 8, 10, 12, 14), o = SHUF8(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
        memcpy(even + 8 * i, &e, 32);
        memcpy(odd + 8 * i, &o, 32);
    }
}

/* sp = sn [D] (natural channel order) in the unpacked order of unit width W (see chan; W = 0: natural) */
AI void to_unit_order(const float *sn, float *sp, int64_t D, int64_t W, int nb) {
    if (!W) {
        memcpy(sp, sn, D * sizeof(float));
        return;
    }
    float e[W / 2], o[W / 2];
    for (int64_t u = 0; u < D / W; u++) {
        const float *x = sn + u * W;
        float *y = sp + u * W;
        if (nb == 4) {
            deint2(x, W, y, y + W / 2);
        } else { /* parts 0..3: channels = 0, 1, 2, 3 mod 4 */
            deint2(x, W, e, o);
            deint2(e, W / 2, y, y + W / 2);
            deint2(o, W / 2, y + W / 4, y + 3 * W / 4);
        }
    }
}

/* the int8 query of M rows for key group j: qs = q * s in the path's unpacked order of unit width W (qp: q in that
 * order), a[r] = max |qs| / 127, qi = round(qs / a[r]) (to nearest: the 1.5 * 2^23 trick); bias[r] = q . z */
AI void quantize_rows(const float *q, const float *qp, const void *ks, const void *kz, int bf16, int64_t j,
                      int64_t M, const int64_t D, int64_t W, int nb, int8_t *qi, float *a, float *bias) {
    float sn[D], sp[D], zn[D], qs[D];
    row_f32(ks, j * D, D, bf16, sn);
    to_unit_order(sn, sp, D, W, nb);
    row_f32(kz, j * D, D, bf16, zn);
    for (int64_t r = 0; r < M; r++) {
        float b = 0.0f, amax = 0.0f;
#pragma omp simd reduction(+ : b)
        for (int64_t c = 0; c < D; c++) b += q[r * D + c] * zn[c];
#pragma omp simd reduction(max : amax)
        for (int64_t idx = 0; idx < D; idx++) {
            qs[idx] = qp[r * D + idx] * sp[idx];
            const float m = fabsf(qs[idx]);
            amax = m > amax ? m : amax;
        }
        bias[r] = b;
        a[r] = amax / (127.0f * DIGIT);
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
#pragma omp simd
        for (int64_t idx = 0; idx < D; idx++) {
            const float x = qs[idx] * inv, hi = (x + 12582912.0f) - 12582912.0f;
            qi[r * D + idx] = (int8_t)(int32_t)hi;
            qi[(M + r) * D + idx] = (int8_t)(int32_t)(((x - hi) * DIGIT + 12582912.0f) - 12582912.0f);
        }
    }
}

/* every key group of one segment on one path (DOTS: that path's dot products) */
#define INT_SCORES(NAME, TARGET, DOTS, W)                                                                           \
    TARGET static void NAME(int64_t nb, const uint8_t *kc, const void *ks, const void *kz, int64_t bf16,           \
                            int64_t tokens, int64_t G, const float *q, float *sc, int64_t total, int64_t M,       \
                            int64_t D) {                                                                          \
        const int64_t P = D * nb / 8;                                                                             \
        int64_t perm[D];                                                                                          \
        float qp[M * D], a[M], bias[M];                                                                           \
        int8_t qi[2 * M * D] __attribute__((aligned(64)));                                                        \
        for (int64_t idx = 0; idx < D; idx++) perm[idx] = (W) ? chan(idx, (W), (int)nb) : idx;                   \
        for (int64_t r = 0; r < M; r++)                                                                           \
            for (int64_t idx = 0; idx < D; idx++) qp[r * D + idx] = q[r * D + perm[idx]];                         \
        for (int64_t j = 0; j < tokens / G; j++) {                                                                \
            quantize_rows(q, qp, ks, kz, (int)bf16, j, M, D, (W), (int)nb, qi, a, bias);                                  \
            if (nb == 4)                                                                                          \
                DOTS(kc, P, j * G, G, 4, qi, a, bias, sc, total, M, D);                                           \
            else                                                                                                  \
                DOTS(kc, P, j * G, G, 2, qi, a, bias, sc, total, M, D);                                           \
        }                                                                                                         \
    }
INT_SCORES(int_scores_scalar, , dots_scalar, 0)
/* (the AVX512 and AVX2 instances, and kivi_int_key_scores, follow _kivi_int_x86.h below) */

/* ---- integer value sums -----------------------------------------------------------------------------------
 * KIVI values are quantized per token, groups of G channels: v[t,c] = u[t,g] * code[t,c] + w[t,g], g = c / G. So
 *   sum_t p[t] v[t,c] = sum_t (p[t] u[t,g]) code[t,c] + sum_t p[t] w[t,g]
 * The second sum is fp32 (KG = D / G numbers per row). In the first, the weights p'[t,g] = p[t] u[t,g] of a block
 * of VB = 32 tokens are quantized to 8 bits, one scale per (row, block): beta = max p' / 255, pq = round(p' / beta)
 * in [0, 255] (llama.cpp's q8_0 blocks of 32 for the activation side), and sum_t pq[t,g] code[t,c] is an exact
 * integer dot product over the block: 4 tokens per 32-bit lane (dpbusd: u8 weights x s8 codes; AVX2: maddubs + madd),
 * the lanes being channels, so the codes of 4 tokens are interleaved (unpack8 / unpack16) after the unpacking of
 * the key path. A lane's group is fixed by its position, so each vector's weights are one permute of the 4 tokens'
 * KG bytes. The error: |p' - beta pq| <= beta / 2 per weight, so per channel at most
 *   sum over blocks of (beta_block / 2) * sum_t code[t,c]
 * (relative to the block's largest weight: a block's small weights lose their low bits, as in q8_0). */
#define VB 32

/* lane l of accumulator vector v (lanes per vector NL = 16 or 8, unit width W = 4 * NL) -> channel */
static int64_t vlane_chan(int64_t v, int64_t l, int64_t NL, int nb) {
    const int64_t W = 4 * NL, u = v / 4, x = v % 4, k = l / 4, j = l % 4;
    return chan(u * W + 16 * k + 4 * x + j, W, nb);
}

/* the block's 8-bit weights pq[(quad * KG + g) * 4 + t % 4] (t < nt; 0 beyond), beta per row; wsum[g] += p w.
 * uf/wf: the block's scales/zeros in that layout (value_meta) */
AI void value_weights(const float *p, const float *uf, const float *wf, int64_t nt, int64_t KG, uint8_t *pq,
                      float *beta, float *wsum) {
    const int64_t nq = (nt + 3) / 4, n = nq * KG * 4;
    float pe[VB * KG], pp[VB * KG], wa[4 * KG], mx = 0.0f;
    for (int64_t q = 0; q < nq; q++) {
        float p4[4];
        for (int tt = 0; tt < 4; tt++) p4[tt] = 4 * q + tt < nt ? p[4 * q + tt] : 0.0f;
        for (int64_t g = 0; g < KG; g++)
            for (int tt = 0; tt < 4; tt++) pe[(q * KG + g) * 4 + tt] = p4[tt];
    }
#pragma omp simd reduction(max : mx)
    for (int64_t x = 0; x < n; x++) {
        pp[x] = pe[x] * uf[x];
        mx = pp[x] > mx ? pp[x] : mx;
    }
    memset(wa, 0, sizeof wa);
    for (int64_t q = 0; q < nq; q++)
#pragma omp simd
        for (int64_t x = 0; x < 4 * KG; x++) wa[x] += pe[q * 4 * KG + x] * wf[q * 4 * KG + x];
    for (int64_t g = 0; g < KG; g++) wsum[g] += (wa[4 * g] + wa[4 * g + 1]) + (wa[4 * g + 2] + wa[4 * g + 3]);
    *beta = mx / 255.0f;
    const float inv = mx > 0.0f ? 255.0f / mx : 0.0f;
#pragma omp simd
    for (int64_t x = 0; x < n; x++) pq[x] = (uint8_t)(int32_t)((pp[x] * inv + 12582912.0f) - 12582912.0f);
}

/* per-token scales/zeros of tokens [t0, t0 + nt) as fp32 in value_weights' layout (0 past nt) */
AI void value_meta(const void *vs, const void *vz, int bf16, int64_t t0, int64_t nt, int64_t KG, float *uf, float *wf) {
    float un[VB * KG], wn[VB * KG];
    row_f32(vs, t0 * KG, nt * KG, bf16, un);
    row_f32(vz, t0 * KG, nt * KG, bf16, wn);
    for (int64_t q = 0; q < (nt + 3) / 4; q++)
        for (int64_t g = 0; g < KG; g++)
            for (int tt = 0; tt < 4; tt++) {
                const int64_t t = 4 * q + tt, x = (q * KG + g) * 4 + tt;
                uf[x] = t < nt ? un[t * KG + g] : 0.0f;
                wf[x] = t < nt ? wn[t * KG + g] : 0.0f;
            }
}

/* acc (the caller's part-major order: channel c at (c % K) * P + c / K) += accL (lane order) + wsum of c's group */
static void value_finish(const float *accL, const float *wsum, float *acc, int64_t M, int64_t D, int64_t G,
                         int64_t NL, int nb) {
    const int64_t K = 8 / nb, P = D / K;
    for (int64_t v = 0; v < D / NL; v++)
        for (int64_t l = 0; l < NL; l++) {
            const int64_t c = NL ? vlane_chan(v, l, NL, nb) : 0, pos = (c % K) * P + c / K;
            for (int64_t r = 0; r < M; r++) acc[r * D + pos] += accL[r * D + v * NL + l] + wsum[r * (D / G) + c / G];
        }
}

/* ---- the AVX512 and AVX2 kernels: key-score dots and value sums, _kivi_int_x86.h once per path ---------------- */
#if X86
#define PATH avx512
#define PATH_BITS 512
#define PATH_TARGET T_AVX512
#include "_kivi_int_x86.h"
#undef PATH
#undef PATH_BITS
#undef PATH_TARGET

#define PATH avx2
#define PATH_BITS 256
#define PATH_TARGET T_AVX2
#include "_kivi_int_x86.h"
#undef PATH
#undef PATH_BITS
#undef PATH_TARGET

INT_SCORES(int_scores_avx2, T_AVX2, dots_avx2, 32)
INT_SCORES(int_scores_avx512, T_AVX512, dots_avx512, 64)
#endif

/* Scores of M query rows q [M, D] (fp32, scaled, natural channel order) against one segment's keys: codes kc
 * [tokens, D*nb/8], per-group scale/zero rows ks/kz [tokens/G, D] (bf16 when bf16, else fp32); writes
 * sc[r*total + t] for t < tokens. Returns 0, or 1 when (isa, nb, D) is not supported (kivi_int_supported). */
int kivi_int_key_scores(int64_t isa, int64_t nb, const uint8_t *kc, const void *ks, const void *kz, int64_t bf16,
                        int64_t tokens, int64_t G, const float *q, float *sc, int64_t total, int64_t M, int64_t D) {
    if (!kivi_int_supported(isa, nb, D) || G < 1 || tokens % G) return 1;
#if X86
    if (isa == ISA_AVX512) {
        int_scores_avx512(nb, kc, ks, kz, bf16, tokens, G, q, sc, total, M, D);
        return 0;
    }
    if (isa == ISA_AVX2) {
        int_scores_avx2(nb, kc, ks, kz, bf16, tokens, G, q, sc, total, M, D);
        return 0;
    }
#endif
    int_scores_scalar(nb, kc, ks, kz, bf16, tokens, G, q, sc, total, M, D);
    return 0;
}

/* the integer value sums in portable C (same weights and blocks; natural channel order) */
static void values_scalar(const uint8_t *vc, const void *vs, const void *vz, int bf16, int64_t tokens, int64_t G,
                          const float *p, int64_t total, int64_t M, int64_t D, float *acc, int nb) {
    const int64_t P = D * nb / 8, K = 8 / nb, KG = D / G;
    const unsigned mask = (1u << nb) - 1u;
    float uf[VB * KG], wf[VB * KG], wsum[KG], beta;
    uint8_t pq[(VB / 4) * KG * 4];
    int32_t ai[D];
    for (int64_t r = 0; r < M; r++) {
        memset(wsum, 0, sizeof wsum);
        for (int64_t t0 = 0; t0 < tokens; t0 += VB) {
            const int64_t nt = tokens - t0 < VB ? tokens - t0 : VB;
            value_meta(vs, vz, bf16, t0, nt, KG, uf, wf);
            value_weights(p + r * total + t0, uf, wf, nt, KG, pq, &beta, wsum);
            memset(ai, 0, sizeof ai);
            for (int64_t t = 0; t < nt; t++) {
                const uint8_t *x = vc + (t0 + t) * P;
                for (int64_t c = 0; c < D; c++)
                    ai[c] += (int32_t)pq[((t / 4) * KG + c / G) * 4 + t % 4] * (int32_t)((x[c / K] >> (c % K * nb)) & mask);
            }
            for (int64_t c = 0; c < D; c++) acc[r * D + (c % K) * P + c / K] += beta * (float)ai[c];
        }
        for (int64_t c = 0; c < D; c++) acc[r * D + (c % K) * P + c / K] += wsum[c / G];
    }
}

/* 1 when kivi_int_value_sums takes (isa, nb, D, G) */
int kivi_int_values_supported(int64_t isa, int64_t nb, int64_t D, int64_t G) {
    if (!kivi_int_supported(isa, nb, D) || G < 1 || D % G) return 0;
    if (isa == ISA_AVX512) return D / G <= 16;
    if (isa == ISA_AVX2) return D / G <= 8;
    return 1;
}

/* acc [M, D] (part-major channel order, as _kivi_cpu.c's value sums) += sum_t p[r*total + t] * v[t] over one
 * segment's value codes vc [tokens, D*nb/8] with per-token scale/zero vs/vz [tokens, D/G] (bf16 when bf16, else
 * fp32), the weights in 8-bit blocks (see above). Returns 0, or 1 when the path does not take the problem. */
int kivi_int_value_sums(int64_t isa, int64_t nb, const uint8_t *vc, const void *vs, const void *vz, int64_t bf16,
                        int64_t tokens, int64_t G, const float *p, int64_t total, int64_t M, int64_t D, float *acc) {
    if (!kivi_int_values_supported(isa, nb, D, G)) return 1;
#if X86
    if (isa == ISA_AVX512) {
        values_avx512(vc, vs, vz, (int)bf16, tokens, G, p, total, M, D, acc, (int)nb);
        return 0;
    }
    if (isa == ISA_AVX2) {
        values_avx2(vc, vs, vz, (int)bf16, tokens, G, p, total, M, D, acc, (int)nb);
        return 0;
    }
#endif
    values_scalar(vc, vs, vz, (int)bf16, tokens, G, p, total, M, D, acc, (int)nb);
    return 0;
}

/* ---- float baseline ----------------------------------------------------------------------------------------- */
/* v16f, v16i, SHUF16, splat16, load16, store16 and exp16_nonpos: _kivi_simd.h */
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

/* 16 elements of a K/V row as fp32: dt 0 fp32, 1 bf16 (exact: a shift), 2 fp16 (F16C where the path has it) */
AI v16f row16(const void *p, const int dt) {
    if (dt == 0) return load16((const float *)p);
    v16h h;
    memcpy(&h, p, sizeof h);
    if (dt == 1) return (v16f)(__builtin_convertvector(h, v16u) << 16);
    v16f f;
#if defined(__F16C__)
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p + 1));
    memcpy(&f, &lo, 32);
    memcpy((char *)&f + 32, &hi, 32);
#else
    _Float16 x[16];
    memcpy(x, p, sizeof x);
    for (int l = 0; l < 16; l++) f[l] = (float)x[l];
#endif
    return f;
}

/* [sum(a[0]), ..., sum(a[15])]: a transposing tree of shuffles and adds */
AI v16f sum16(const v16f *a) {
    v16f s[8], t[4], u[2];
    for (int k = 0; k < 8; k++)
        s[k] = SHUF16(a[2 * k], a[2 * k + 1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
               SHUF16(a[2 * k], a[2 * k + 1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    for (int k = 0; k < 4; k++)
        t[k] = SHUF16(s[2 * k], s[2 * k + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
               SHUF16(s[2 * k], s[2 * k + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    for (int k = 0; k < 2; k++)
        u[k] = SHUF16(t[2 * k], t[2 * k + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
               SHUF16(t[2 * k], t[2 * k + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    return SHUF16(u[0], u[1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           SHUF16(u[0], u[1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
}

typedef struct {
    const void *q; /* [B, H, M, D], fp32 or bf16 (q_bf16) */
    int64_t q_bf16;
    float scale;
    int64_t B, H, M, D, T, dt;
    const void *k, *v;                     /* [B, H, T, D] of dtype dt; channels contiguous */
    int64_t k_sb, k_sh, k_st, v_sb, v_sh, v_st; /* element strides */
    float *scores;                         /* B * H * M * T */
    float *work;                           /* B * H * 2 * M * D */
    void *out;                             /* [B, H, M, D] fp32 or bf16 (out_bf16) */
    int64_t out_bf16;
} fargs_t;

/* softmax of each row in place (exp(s - max)); 1 / sum in inv[r] */
AI void softmax16(float *sc, int64_t M, int64_t T, float *inv) {
    const int64_t nv = T / 16 * 16;
    for (int64_t r = 0; r < M; r++) {
        float *row = sc + r * T, mx = -INFINITY, l = 0.0f;
        v16f m16 = splat16(-INFINITY), l16 = splat16(0.0f);
        for (int64_t t = 0; t < nv; t += 16) {
            const v16f x = load16(row + t);
            const v16i gt = x > m16;
            m16 = (v16f)(((v16i)x & gt) | ((v16i)m16 & ~gt));
        }
        for (int k = 0; k < 16; k++) mx = m16[k] > mx ? m16[k] : mx;
        for (int64_t t = nv; t < T; t++) mx = row[t] > mx ? row[t] : mx;
        for (int64_t t = 0; t < nv; t += 16) {
            const v16f e = exp16_nonpos(load16(row + t) - splat16(mx));
            store16(row + t, e);
            l16 += e;
        }
        for (int k = 0; k < 16; k++) l += l16[k];
        for (int64_t t = nv; t < T; t++) {
            row[t] = expf(row[t] - mx);
            l += row[t];
        }
        inv[r] = 1.0f / l;
    }
}

AI void float_item(const fargs_t *a, int64_t it, const int64_t D, const int dt) {
    const int64_t M = a->M, T = a->T, NV = D / 16, b = it / a->H, h = it % a->H;
    const int64_t es = dt == 0 ? 4 : 2;
    const char *k = (const char *)a->k + (b * a->k_sb + h * a->k_sh) * es;
    const char *v = (const char *)a->v + (b * a->v_sb + h * a->v_sh) * es;
    float *qf = a->work + it * 2 * M * D, *acc = qf + M * D, *sc = a->scores + it * M * T, inv[M];
    for (int64_t x = 0; x < M * D; x++)
        qf[x] = ld(a->q, it * M * D + x, (int)a->q_bf16) * a->scale;
    v16f buf[16][NV], s[16];
    int64_t t0 = 0;
    for (; t0 < T; t0 += 16) {
        const int64_t nt = T - t0 < 16 ? T - t0 : 16;
        for (int64_t tt = 0; tt < nt; tt++)
            for (int64_t c = 0; c < NV; c++) buf[tt][c] = row16(k + ((t0 + tt) * a->k_st + 16 * c) * es, dt);
        for (int64_t r = 0; r < M; r++) {
            const float *qr = qf + r * D;
            for (int64_t tt = 0; tt < nt; tt++) {
                v16f x = buf[tt][0] * load16(qr);
                for (int64_t c = 1; c < NV; c++) x += buf[tt][c] * load16(qr + 16 * c);
                s[tt] = x;
            }
            if (nt == 16) {
                store16(sc + r * T + t0, sum16(s));
            } else {
                for (int64_t tt = 0; tt < nt; tt++) {
                    float y = 0.0f;
                    for (int l = 0; l < 16; l++) y += s[tt][l];
                    sc[r * T + t0 + tt] = y;
                }
            }
        }
    }
    softmax16(sc, M, T, inv);
    memset(acc, 0, M * D * sizeof(float));
    v16f av[NV];
    for (t0 = 0; t0 < T; t0 += 16) {
        const int64_t nt = T - t0 < 16 ? T - t0 : 16;
        for (int64_t tt = 0; tt < nt; tt++)
            for (int64_t c = 0; c < NV; c++) buf[tt][c] = row16(v + ((t0 + tt) * a->v_st + 16 * c) * es, dt);
        for (int64_t r = 0; r < M; r++) {
            const float *pr = sc + r * T + t0;
            for (int64_t c = 0; c < NV; c++) av[c] = load16(acc + r * D + 16 * c);
            for (int64_t tt = 0; tt < nt; tt++) {
                const v16f p = splat16(pr[tt]);
                for (int64_t c = 0; c < NV; c++) av[c] += p * buf[tt][c];
            }
            for (int64_t c = 0; c < NV; c++) store16(acc + r * D + 16 * c, av[c]);
        }
    }
    for (int64_t r = 0; r < M; r++) store_row(a->out, (it * M + r) * D, acc + r * D, inv[r], D, (int)a->out_bf16);
}

#define FLOAT_RUN(NAME, TARGET)                                                 \
    TARGET static void NAME(const fargs_t *a, int64_t it) {                     \
        if (a->dt == 1 && a->D == 128)                                          \
            float_item(a, it, 128, 1);                                          \
        else if (a->dt == 1 && a->D == 64)                                      \
            float_item(a, it, 64, 1);                                           \
        else if (a->dt == 1)                                                    \
            float_item(a, it, a->D, 1);                                         \
        else if (a->dt == 2)                                                    \
            float_item(a, it, a->D, 2);                                         \
        else                                                                    \
            float_item(a, it, a->D, 0);                                         \
    }
FLOAT_RUN(float_run_scalar, )
#if X86
FLOAT_RUN(float_run_avx2, T_AVX2)
FLOAT_RUN(float_run_avx512, T_AVX512)
#endif

/* Float decode attention (the baseline): q [B, H, M, D] (fp32 or bf16 when q_bf16, times `scale`) over K/V
 * [B, H, T, D] (dt 0 fp32, 1 bf16, 2 fp16; element strides per batch row, head and token; channels contiguous),
 * every token attended; out [B, H, M, D] fp32 or bf16 (out_bf16). scores: B*H*M*T floats, work: B*H*2*M*D floats.
 * Returns 0, 1 for an unknown or unavailable isa or dtype, 2 when D is not a multiple of 16 or T < 1. */
int float_decode_step(int64_t isa, const void *q, int64_t q_bf16, double scale, int64_t B, int64_t H, int64_t M,
                      int64_t D, const void *k, const void *v, int64_t T, int64_t dt, const int64_t *strides,
                      float *scores, float *work, void *out, int64_t out_bf16, int64_t nthreads) {
    if (isa < 0 || isa > kvlab_isa_best() || dt < 0 || dt > 2) return 1;
    if (D % 16 || D < 16 || T < 1) return 2;
    fargs_t a = {q, q_bf16, (float)scale, B, H, M, D, T, dt, k, v, strides[0], strides[1], strides[2],
                 strides[3], strides[4], strides[5], scores, work, out, out_bf16};
    void (*run)(const fargs_t *, int64_t) = float_run_scalar;
#if X86
    if (isa == ISA_AVX512) run = float_run_avx512;
    if (isa == ISA_AVX2) run = float_run_avx2;
#endif
    const int64_t items = B * H;
    const int nt = (int)(nthreads < items ? nthreads : items);
    if (nt > 1) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < items; i++) run(&a, i);
    } else {
        for (int64_t i = 0; i < items; i++) run(&a, i);
    }
    return 0;
}
