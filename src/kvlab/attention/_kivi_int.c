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
 * rounded to 16 bits with one step per (query row, key group), a = max_c |q[c]| * max_c s[c] / 32766, a bound on
 * max |qs| / 32766: the row's maximum is taken once per call and the group's once for all rows, so a group costs no
 * per-row reduction (where q's and s's largest channels differ, x uses fewer of its 15 bits), x[c] = round(qs[c] / a),
 * and split into a signed high byte h = x >> 8 and an unsigned low byte l = x & 255 (x = 256 h + l). The first sum
 * becomes a * (256 (h . code) + (l . code)), two exact integer dot products over the same unpacked code lanes:
 * dpbusd (u8 x s8) takes the codes as its unsigned operand against h, and as its signed one (codes < 2^nbits < 128)
 * against l. (One int8 digit, |qs - a' qi| <= a' / 2 with a' = max |qs| / 127, cost the real model (SmolLM2-135M,
 * KIVI-4, 2k tokens) a KL to the exact path of 14 % of KIVI-4's own KL to the float cache.) 2-bit keys take that one
 * digit (a = max|q| max s / 126, one dpbusd per code vector, half the products): their own rounding, 4 levels a
 * channel, dwarfs it (KL to the exact path 1.9 % of KIVI-2's own on SmolLM2-135M, 2k tokens, against 0.02 % with
 * two digits; benchmarks/results/int8-kl-cpu.json), and it makes
 * 2-bit key scores cheaper than 4-bit ones, not only their bytes. The zero-point term
 * stays in fp32 (one dot per row and group). The only error is the query rounding, |qs[c] - a x[c]| <= a / 2, so
 *   |score_int[t] - score_exact[t]| <= a / 2 * sum_c code[t,c] <= a / 2 * D * (2^nbits - 1)
 * (plus fp32 rounding). This is llama.cpp's q8 dot product (ggml's quantize_row_q8 for the activation, then integer
 * dot products with maddubs / dpbusd against the 4-bit weights' unpacked nibbles), applied to KIVI's per-channel
 * key groups (arXiv:2402.02750, section 3.2: per-channel keys, per-token values). The AVX paths put one token in
 * each int32 lane (see tchan below), so no horizontal sums are needed.
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
/* the query's steps: two digits (4-bit keys): |x| <= 32766, one below int16's 32767 (fp32 rounding of the scaled
 * query stays inside), its high byte signed, its low byte unsigned; one digit (2-bit keys): |x| <= 126, one signed
 * byte. QSCALE(nb) is the bound; DIGITS(nb) the bytes */
#define DIGITS(nb) ((nb) == 2 ? 1 : 2)
#define QSCALE(nb) (DIGITS(nb) == 2 ? 32766.0f : 126.0f)
/* software prefetch distances: key blocks (LANES tokens), key groups, value blocks (VB tokens) */
#define PF_KEYS 4
#define PF_GROUPS 2
#define PF_VALUES 2

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
 * The AVX paths score LANES tokens at once (16 for AVX512, 8 for AVX2), one token per int32 lane: the block's packed
 * rows (R = D * nb / 32 dwords each) are transposed in registers (tokens to lanes, 4 x 4 dwords inside each 128-bit
 * lane), so dword d of every token sits in one vector; masking and shifting it gives K = 8 / nb code vectors, part
 * p holding in byte b the code of channel (4 d + b) K + p. Each dpbusd then multiplies one such vector by four query
 * bytes broadcast to every lane: no horizontal sums. The query is stored in that "transposed" order, index
 * idx = (d K + p) * 4 + b for channel tchan(idx); the permutation stays inside blocks of 16 channels. */
static int64_t tchan(int64_t idx, int nb) {
    const int64_t K = 8 / nb, v = idx / 4, b = idx % 4;
    return (4 * (v / K) + b) * K + v % K;
}

#if X86
/* ---- the AVX512 and AVX2 paths: each one's own instructions here; the kernels, written once for both, are in
 * _kivi_int_x86.h (included below, after the helpers they call) */

/* 128-bit lane L = the 16 bytes at p + off[L] (nb 4), or the 8 bytes there in its low half (nb 2; high half 0) */
T_AVX512 AI __m512i lanes_avx512(const uint8_t *p, const int64_t *off, const int nb) {
    __m128i l[4];
    for (int L = 0; L < 4; L++)
        l[L] = nb == 4 ? _mm_loadu_si128((const __m128i *)(p + off[L])) : _mm_loadl_epi64((const __m128i *)(p + off[L]));
    const __m512i x = _mm512_inserti32x4(_mm512_castsi128_si512(l[0]), l[1], 1);
    return _mm512_inserti32x4(_mm512_inserti32x4(x, l[2], 2), l[3], 3);
}

/* 128-bit lane L = the 16 bytes at p + L * step */
T_AVX512 AI __m512i lanes16_avx512(const uint8_t *p, int64_t step) {
    const int64_t off[4] = {0, step, 2 * step, 3 * step};
    return lanes_avx512(p, off, 4);
}

/* acc + the u8 (a) x s8 (b) byte products, summed per 4 bytes into int32 lanes: VNNI's dpbusd (in asm: with the
 * intrinsic GCC 12 copies every accumulator once per loop iteration) */
T_AVX512 AI __m512i dot_avx512(__m512i acc, __m512i a, __m512i b) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
    return acc;
}

/* acc + sum_k (a[k] . b[k]) per 4 bytes: four dpbusd */
T_AVX512 AI __m512i dot4_avx512(__m512i acc, const __m512i *a, const __m512i *b) {
    for (int k = 0; k < 4; k++) acc = dot_avx512(acc, a[k], b[k]);
    return acc;
}

T_AVX512 AI __m512i permute_avx512(__m512i a, __m512i idx) { return _mm512_permutexvar_epi32(idx, a); }

/* 16 fp32 from element i of p: bf16 (a shift) when bf16, else fp32 */
T_AVX512 AI __m512 ldf_avx512(const void *p, int64_t i, const int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)p + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
T_AVX512 AI __m512 permps_avx512(__m512 a, __m512i idx) { return _mm512_permutexvar_ps(idx, a); }
/* p[0..4) in every 128-bit lane (one load, no permute) */
T_AVX512 AI __m512 bcast4_avx512(const float *p) { return _mm512_broadcast_f32x4(_mm_loadu_ps(p)); }
/* p[0 .. min(n, 16)) and zeros (no access past them); n <= 0: zeros */
T_AVX512 AI __m512 ldn_avx512(const float *p, int64_t n) {
    if (n >= 16) return _mm512_loadu_ps(p);
    return _mm512_maskz_loadu_ps(n > 0 ? (__mmask16)((1u << n) - 1u) : 0, p);
}
T_AVX512 AI float hmax_avx512(__m512 v) { return _mm512_reduce_max_ps(v); }
T_AVX512 AI float hsum_avx512(__m512 v) { return _mm512_reduce_add_ps(v); }
/* the low bytes of x's 16 int32 lanes (values inside the byte's range) to dst */
T_AVX512 AI void store8_avx512(void *dst, __m512i x) { _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(x)); }

/* x[0..3] (64 int32 lanes in [0, 255]) as bytes to dst[0..64): two packs and a permute */
T_AVX512 AI void pack4_avx512(const __m512i *x, uint8_t *dst) {
    const __m512i fix = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(x[0], x[1]), _mm512_packus_epi32(x[2], x[3]));
    _mm512_storeu_si512(dst, _mm512_permutexvar_epi32(fix, b));
}

/* the 16-bit values of x[0..3] (64 int32 lanes in [-32767, 32767]): their high bytes (x >> 8, signed) to hi[0..64),
 * their low bytes (unsigned) to lo[0..64); packed to int16 first (exact), then split, one permute per 64 bytes */
T_AVX512 AI void split4_avx512(const __m512i *x, int8_t *hi, int8_t *lo) {
    const __m512i fix = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), m = _mm512_set1_epi16(255);
    const __m512i w01 = _mm512_packs_epi32(x[0], x[1]), w23 = _mm512_packs_epi32(x[2], x[3]); /* exact: |x| < 2^15 */
    const __m512i h = _mm512_packs_epi16(_mm512_srai_epi16(w01, 8), _mm512_srai_epi16(w23, 8));
    const __m512i l = _mm512_packus_epi16(_mm512_and_si512(w01, m), _mm512_and_si512(w23, m));
    _mm512_storeu_si512(hi, _mm512_permutexvar_epi32(fix, h));
    _mm512_storeu_si512(lo, _mm512_permutexvar_epi32(fix, l));
}

/* the values of x[0..3] (64 int32 lanes in [-127, 127]) as signed bytes to dst[0..64): two packs and a permute */
T_AVX512 AI void bytes4_avx512(const __m512i *x, int8_t *dst) {
    const __m512i fix = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i b = _mm512_packs_epi16(_mm512_packs_epi32(x[0], x[1]), _mm512_packs_epi32(x[2], x[3]));
    _mm512_storeu_si512(dst, _mm512_permutexvar_epi32(fix, b));
}

T_AVX2 AI __m256i lanes_avx2(const uint8_t *p, const int64_t *off, const int nb) {
    const __m128i l0 = nb == 4 ? _mm_loadu_si128((const __m128i *)(p + off[0])) : _mm_loadl_epi64((const __m128i *)(p + off[0]));
    const __m128i l1 = nb == 4 ? _mm_loadu_si128((const __m128i *)(p + off[1])) : _mm_loadl_epi64((const __m128i *)(p + off[1]));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(l0), l1, 1);
}

T_AVX2 AI __m256i lanes16_avx2(const uint8_t *p, int64_t step) {
    const int64_t off[2] = {0, step};
    return lanes_avx2(p, off, 4);
}

/* acc + the u8 (a) x s8 (b) byte products summed per 4 bytes: 16 int16 pair sums (no saturation: 2 * 255 * 15 and
 * 2 * 15 * 127 < 32767), then pairs of those into 8 int32 */
T_AVX2 AI __m256i dot_avx2(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
}

/* acc + sum_k (a[k] . b[k]) per 4 bytes, the four maddubs summed in int16 before one madd: every caller's int16
 * lane stays below 32767 (4 * 2 * 255 * 15 for u8 weights or low query bytes against codes < 16, 4 * 2 * 15 * 128
 * for codes against the signed high query bytes) */
T_AVX2 AI __m256i dot4_avx2(__m256i acc, const __m256i *a, const __m256i *b) {
    const __m256i s01 = _mm256_add_epi16(_mm256_maddubs_epi16(a[0], b[0]), _mm256_maddubs_epi16(a[1], b[1]));
    const __m256i s23 = _mm256_add_epi16(_mm256_maddubs_epi16(a[2], b[2]), _mm256_maddubs_epi16(a[3], b[3]));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_add_epi16(s01, s23), _mm256_set1_epi16(1)));
}

T_AVX2 AI __m256i permute_avx2(__m256i a, __m256i idx) { return _mm256_permutevar8x32_epi32(a, idx); }

T_AVX2 AI __m256 ldf_avx2(const void *p, int64_t i, const int bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)p + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
T_AVX2 AI __m256 permps_avx2(__m256 a, __m256i idx) { return _mm256_permutevar8x32_ps(a, idx); }
T_AVX2 AI __m256 bcast4_avx2(const float *p) { return _mm256_broadcast_ps((const __m128 *)p); }
T_AVX2 AI __m256 ldn_avx2(const float *p, int64_t n) {
    if (n >= 8) return _mm256_loadu_ps(p);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n > 0 ? n : 0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(p, m);
}
T_AVX2 AI float hmax_avx2(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}
T_AVX2 AI float hsum_avx2(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}
T_AVX2 AI void pack4_avx2(const __m256i *x, uint8_t *dst) {
    const __m256i fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(x[0], x[1]), _mm256_packus_epi32(x[2], x[3]));
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(b, fix));
}

T_AVX2 AI void split4_avx2(const __m256i *x, int8_t *hi, int8_t *lo) {
    const __m256i fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), m = _mm256_set1_epi16(255);
    const __m256i w01 = _mm256_packs_epi32(x[0], x[1]), w23 = _mm256_packs_epi32(x[2], x[3]); /* exact: |x| < 2^15 */
    const __m256i h = _mm256_packs_epi16(_mm256_srai_epi16(w01, 8), _mm256_srai_epi16(w23, 8));
    const __m256i l = _mm256_packus_epi16(_mm256_and_si256(w01, m), _mm256_and_si256(w23, m));
    _mm256_storeu_si256((__m256i *)hi, _mm256_permutevar8x32_epi32(h, fix));
    _mm256_storeu_si256((__m256i *)lo, _mm256_permutevar8x32_epi32(l, fix));
}

T_AVX2 AI void bytes4_avx2(const __m256i *x, int8_t *dst) {
    const __m256i fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(x[0], x[1]), _mm256_packs_epi32(x[2], x[3]));
    _mm256_storeu_si256((__m256i *)dst, _mm256_permutevar8x32_epi32(b, fix));
}

/* the low bytes of x's 8 int32 lanes (values inside the byte's range, signed or unsigned) to dst */
T_AVX2 AI void store8_avx2(void *dst, __m256i x) {
    const __m256i m = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i b = _mm256_shuffle_epi8(x, m);
    const int32_t lo = _mm256_extract_epi32(b, 0), hi = _mm256_extract_epi32(b, 4);
    memcpy(dst, &lo, 4);
    memcpy((char *)dst + 4, &hi, 4);
}
#endif

/* the integer dot products in portable C over tokens [t0, t0 + n): query index idx is channel perm[idx] (the
 * natural order for the scalar path; the AVX paths' remainder tokens use it with their transposed order) */
AI void dots_scalar(const uint8_t *kc, int64_t P, int64_t t0, int64_t n, const int nb, const int8_t *qi,
                    const float *a, const float *bias, float *sc, int64_t total, int64_t M, int64_t D,
                    const int64_t *perm) {
    const int K = 8 / nb;
    const unsigned mask = (1u << nb) - 1u;
    for (int64_t t = t0; t < t0 + n; t++) {
        const uint8_t *x = kc + t * P;
        for (int64_t r = 0; r < M; r++) {
            int32_t s = 0, s2 = 0;
            for (int64_t idx = 0; idx < D; idx++) {
                const int64_t c = perm[idx];
                const int32_t code = (int32_t)((x[c / K] >> (c % K * nb)) & mask);
                s += (int32_t)qi[r * D + idx] * code;
                if (DIGITS(nb) == 2) s2 += (int32_t)(uint8_t)qi[(M + r) * D + idx] * code;
            }
            s = DIGITS(nb) == 2 ? s * 256 + s2 : s;
            sc[r * total + t] = a[r] * (float)s + bias[r];
        }
    }
}

/* 1 when kivi_int_key_scores takes (isa, nbits, D): the AVX paths transpose rows of whole groups of 4 dwords */
int kivi_int_supported(int64_t isa, int64_t nb, int64_t D) {
    if (nb != 2 && nb != 4) return 0;
    if (isa < 0 || isa > ISA_AVX512 || isa > kvlab_isa_best()) return 0;
    return isa == ISA_SCALAR || (D * nb % 128 == 0 && D > 0);
}

/* sp = sn [D] (natural channel order) in the transposed order (see tchan; order 0: natural) */
AI void to_order(const float *sn, float *sp, int64_t D, int order, int nb) {
    if (!order) {
        memcpy(sp, sn, D * sizeof(float));
        return;
    }
    for (int64_t c = 0; c < D; c += 16) {
        const v16f x = load16(sn + c);
        store16(sp + c, nb == 4 ? SHUF16(x, x, 0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15)
                                : SHUF16(x, x, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
    }
}

/* the rows' query scaled once per call: qn = qp * qscale / max_c |q[r,c]| (qp: q in the path's order), a0[r] =
 * max_c |q[r,c]| / qscale (0 for a zero row). A key group then needs no per-row maximum: see quantize_rows. */
AI void scale_rows(const float *q, const float *qp, int64_t M, int64_t D, float qscale, float *qn, float *a0) {
    for (int64_t r = 0; r < M; r++) {
        float qmax = 0.0f;
        for (int64_t c = 0; c < D; c++) qmax = fmaxf(qmax, fabsf(q[r * D + c]));
        const float mul = qmax > 0.0f ? qscale / qmax : 0.0f;
        for (int64_t idx = 0; idx < D; idx++) qn[r * D + idx] = qp[r * D + idx] * mul;
        a0[r] = qmax / qscale;
    }
}

/* the 16-bit query of M rows for key group j: with m = max_c s[c] (the group's largest scale) and s' = s / m in the
 * path's order (order 1: transposed, see tchan), x = round(qn * s') (to nearest even, as the AVX paths), |x| <=
 * QSCALE, the step a[r] = a0[r] * m (scale_rows); x's high byte (signed) in qi[r], its low byte (unsigned) in
 * qi[M + r]; bias[r] = q . z */
AI void quantize_rows(const float *q, const float *qn, const float *a0, const void *ks, const void *kz, int bf16,
                      int64_t j, int64_t M, const int64_t D, int order, int nb, int8_t *qi, float *a, float *bias) {
    float sn[D], sp[D], zn[D];
    row_f32(ks, j * D, D, bf16, sn);
    float m = 0.0f;
    for (int64_t c = 0; c < D; c++) m = fmaxf(m, fabsf(sn[c]));
    const float inv = m > 0.0f ? 1.0f / m : 0.0f;
    for (int64_t c = 0; c < D; c++) sn[c] *= inv;
    to_order(sn, sp, D, order, nb);
    row_f32(kz, j * D, D, bf16, zn);
    for (int64_t r = 0; r < M; r++) {
        float b = 0.0f;
#pragma omp simd reduction(+ : b)
        for (int64_t c = 0; c < D; c++) b += q[r * D + c] * zn[c];
        bias[r] = b;
        a[r] = a0[r] * m;
#pragma omp simd
        for (int64_t idx = 0; idx < D; idx++) {
            const int32_t x = (int32_t)rintf(qn[r * D + idx] * sp[idx]); /* rounds as the AVX paths' cvtps2dq */
            qi[r * D + idx] = (int8_t)(DIGITS(nb) == 2 ? x >> 8 : x);
            if (DIGITS(nb) == 2) qi[(M + r) * D + idx] = (int8_t)(uint8_t)(x & 255);
        }
    }
}

/* every key group of one segment on one path (DOTS: that path's dot products) */
#define INT_SCORES(NAME, TARGET, DOTS, QUANT, ORDER)                                                                     \
    TARGET static void NAME(int64_t nb, const uint8_t *kc, const void *ks, const void *kz, int64_t bf16,           \
                            int64_t tokens, int64_t G, const float *q, float *sc, int64_t total, int64_t M,       \
                            int64_t D) {                                                                          \
        const int64_t P = D * nb / 8;                                                                             \
        int64_t perm[D];                                                                                          \
        float qp[M * D], qn[M * D], a0[M], a[M], bias[M];                                                         \
        int8_t qi[2 * M * D] __attribute__((aligned(64)));                                                        \
        for (int64_t idx = 0; idx < D; idx++) perm[idx] = (ORDER) ? tchan(idx, (int)nb) : idx;                    \
        for (int64_t r = 0; r < M; r++)                                                                           \
            for (int64_t idx = 0; idx < D; idx++) qp[r * D + idx] = q[r * D + perm[idx]];                         \
        scale_rows(q, qp, M, D, QSCALE(nb), qn, a0);                                                              \
        for (int64_t j = 0; j < tokens / G; j++) {                                                                \
            for (int64_t x = 0; x < D * (bf16 ? 2 : 4); x += 64) { /* the scale and zero rows PF_GROUPS ahead */ \
                __builtin_prefetch((const char *)ks + ((j + PF_GROUPS) * D) * (bf16 ? 2 : 4) + x);          \
                __builtin_prefetch((const char *)kz + ((j + PF_GROUPS) * D) * (bf16 ? 2 : 4) + x);          \
            }                                                                                                     \
            QUANT(q, qn, a0, ks, kz, (int)bf16, j, M, D, (ORDER), (int)nb, qi, a, bias);                          \
            if (nb == 4)                                                                                          \
                DOTS(kc, P, j * G, G, 4, qi, a, bias, sc, total, M, D, perm);                                     \
            else                                                                                                  \
                DOTS(kc, P, j * G, G, 2, qi, a, bias, sc, total, M, D, perm);                                     \
        }                                                                                                         \
    }
INT_SCORES(int_scores_scalar, , dots_scalar, quantize_rows, 0)
/* (the AVX512 and AVX2 instances, and kivi_int_key_scores, follow _kivi_int_x86.h below) */

/* ---- integer value sums -----------------------------------------------------------------------------------
 * KIVI values are quantized per token, groups of G channels: v[t,c] = u[t,g] * code[t,c] + w[t,g], g = c / G. So
 *   sum_t p[t] v[t,c] = sum_t (p[t] u[t,g]) code[t,c] + sum_t p[t] w[t,g]
 * The second sum is fp32 (KG = D / G numbers per row). In the first, the weights p'[t,g] = p[t] u[t,g] of a block
 * of VB = 32 tokens are quantized to 8 bits, one scale per (row, block): beta = max p' / 255, pq = round(p' / beta)
 * in [0, 255] (llama.cpp's q8_0 blocks of 32 for the activation side), and sum_t pq[t,g] code[t,c] is an exact
 * integer dot product over the block: 4 tokens per 32-bit lane (dpbusd: u8 weights x s8 codes; AVX2: maddubs + madd),
 * the lanes being channels. The AVX paths read each 128-bit lane of a code vector from 32 channels (16 bytes at
 * 4 bits, 8 at 2) of 4 tokens, interleaved (unpack8 / unpack16: 4 tokens' codes of one channel per int32 lane), so
 * that a lane's 32 channels lie in one value group (G a multiple of 32): the weights of a vector are then one
 * permute of 4 consecutive tokens' KG weight dwords per 4 tokens, shared by all its code vectors, and each code byte
 * is unpacked once per block for every query row. The error: |p' - beta pq| <= beta / 2 per weight, so per channel
 * at most
 *   sum over blocks of (beta_block / 2) * sum_t code[t,c]
 * (relative to the block's largest weight: a block's small weights lose their low bits, as in q8_0). */
#define VB 32

/* the channel of int32 lane l (128-bit lane l / 4) of code vector j of unit u in the AVX value sums: NC = D / 32
 * chunks of 32 channels per token, NLG 128-bit lanes per vector (a lane holds one chunk; with NC < NLG a vector
 * holds NLG / NC token sets, chunk L % NC in lane L) */
static int64_t vchan(int64_t u, int64_t j, int64_t l, int64_t NC, int64_t NLG, int nb) {
    const int64_t L = l / 4, i = l % 4, ch = NC >= NLG ? u * NLG + L : L % NC;
    if (nb == 4) return ch * 32 + 2 * (4 * (j / 2) + i) + j % 2;
    return ch * 32 + 4 * (4 * (j / 4) + i) + j % 4;
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
    for (int64_t x = 0; x < n; x++) pq[x] = (uint8_t)(int32_t)rintf(pp[x] * inv);
}

/* out[0..n) = p[off..off + n) as fp32, n a multiple of 16 (vector conversions: bf16 -> fp32 is a shift) */
AI void row_f32_16(const void *p, int64_t off, int64_t n, int bf16, float *out) {
    typedef uint16_t v16h_ __attribute__((vector_size(32)));
    typedef uint32_t v16u_ __attribute__((vector_size(64)));
    if (!bf16) {
        memcpy(out, (const float *)p + off, n * sizeof(float));
        return;
    }
    for (int64_t c = 0; c < n; c += 16) {
        v16h_ h;
        memcpy(&h, (const uint16_t *)p + off + c, sizeof h);
        const v16f f = (v16f)(__builtin_convertvector(h, v16u_) << 16);
        store16(out + c, f);
    }
}

/* per-token scales/zeros of tokens [t0, t0 + nt) as fp32 in value_weights' layout (0 past nt): a 4 x KG transpose
 * per 4 tokens, one shuffle per 16 floats where KG is 1, 2 or 4 */
AI void value_meta(const void *vs, const void *vz, int bf16, int64_t t0, int64_t nt, int64_t KG, float *uf, float *wf) {
    float un[VB * KG], wn[VB * KG];
    if (nt == VB && (KG == 1 || KG == 2 || KG == 4)) {
        row_f32_16(vs, t0 * KG, VB * KG, bf16, un);
        row_f32_16(vz, t0 * KG, VB * KG, bf16, wn);
        for (int64_t c = 0; c < VB * KG; c += 16) {
            const v16f x = load16(un + c), y = load16(wn + c);
            if (KG == 4) {
                store16(uf + c, SHUF16(x, x, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
                store16(wf + c, SHUF16(y, y, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
            } else if (KG == 2) {
                store16(uf + c, SHUF16(x, x, 0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
                store16(wf + c, SHUF16(y, y, 0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
            } else {
                store16(uf + c, x);
                store16(wf + c, y);
            }
        }
        return;
    }
    row_f32(vs, t0 * KG, nt * KG, bf16, un);
    row_f32(vz, t0 * KG, nt * KG, bf16, wn);
    for (int64_t q = 0; q < VB / 4; q++)
        for (int64_t g = 0; g < KG; g++)
            for (int tt = 0; tt < 4; tt++) {
                const int64_t t = 4 * q + tt, x = (q * KG + g) * 4 + tt;
                uf[x] = t < nt ? un[t * KG + g] : 0.0f;
                wf[x] = t < nt ? wn[t * KG + g] : 0.0f;
            }
}

/* the caller's part-major position of channel c: (c % K) * P + c / K (K = 8 / nb codes a byte, P = D / K) */
static inline int64_t part_pos(int64_t c, int64_t D, int nb) {
    const int64_t K = 8 / nb;
    return (c % K) * (D / K) + c / K;
}

/* acc (the caller's part-major order) += accL (NE lanes a row, lane e adding to position pos[e]; several lanes may
 * add to one channel) + the wsum of each channel's group */
static void value_finish(const float *accL, const int64_t *pos, int64_t NE, const float *wsum, float *acc,
                         int64_t M, int64_t D, int64_t G, int nb) {
    for (int64_t r = 0; r < M; r++) {
        float *ar = acc + r * D;
        for (int64_t e = 0; e < NE; e++) ar[pos[e]] += accL[r * NE + e];
        for (int64_t g = 0; g < D / G; g++)
            for (int64_t c = g * G; c < (g + 1) * G; c++) ar[part_pos(c, D, nb)] += wsum[r * (D / G) + g];
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

INT_SCORES(int_scores_avx2, T_AVX2, dots_avx2, quantize_avx2, 1)
INT_SCORES(int_scores_avx512, T_AVX512, dots_avx512, quantize_avx512, 1)
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

/* 1 when kivi_int_value_sums takes (isa, nb, D, G): on the AVX paths 32-channel chunks inside value groups, whole
 * vectors of them (or whole tokens in a vector) */
int kivi_int_values_supported(int64_t isa, int64_t nb, int64_t D, int64_t G) {
    if (!kivi_int_supported(isa, nb, D) || G < 1 || D % G) return 0;
    if (isa == ISA_SCALAR) return 1;
    const int64_t NC = D / 32, NLG = isa == ISA_AVX512 ? 4 : 2;
    return D % 32 == 0 && G % 32 == 0 && (NC % NLG == 0 || NLG % NC == 0) && D / G <= 4 * NLG;
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

/* SPEC: bf16 at head_dim 128 and 64 get constant trip counts (the vector paths; the portable one stays generic, a
 * third of the build's code otherwise) */
#define FLOAT_RUN(NAME, TARGET, SPEC)                                           \
    TARGET static void NAME(const fargs_t *a, int64_t it) {                     \
        if (SPEC && a->dt == 1 && a->D == 128)                                  \
            float_item(a, it, 128, 1);                                          \
        else if (SPEC && a->dt == 1 && a->D == 64)                              \
            float_item(a, it, 64, 1);                                           \
        else if (a->dt == 1)                                                    \
            float_item(a, it, a->D, 1);                                         \
        else if (a->dt == 2)                                                    \
            float_item(a, it, a->D, 2);                                         \
        else                                                                    \
            float_item(a, it, a->D, 0);                                         \
    }
FLOAT_RUN(float_run_scalar, , 0)
#if X86
FLOAT_RUN(float_run_avx2, T_AVX2, 1)
FLOAT_RUN(float_run_avx512, T_AVX512, 1)
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

/* ---- the integer roof -------------------------------------------------------------------------------------------
 * What the integer kernels' dot products could do with nothing else in the way: each of `threads` OpenMP threads runs
 * `rounds` rounds of 8 independent accumulator chains held in registers, one dot_<path> (AVX512: one dpbusd, 64 byte
 * products) or dot4_<path> (AVX2: four maddubs summed in int16 and one madd, 128 byte products) per chain and round:
 * the instruction mix of the kernels' inner loops, without their loads, unpacking and scaling. The caller times the
 * call (kvlab.attention.cpu_kernel.int_roof): byte products per second, the compute roof of a CPU roofline for these
 * kernels beside the copy bandwidth's memory roof (Williams, Waterman and Patterson, "Roofline", CACM 2009).
 * Returns the byte products done by all threads, or 0 where the path has no vector dot product (scalar, or a path
 * above this CPU's). */
#if X86
#define ROOF_CHAINS 8
static volatile int32_t roof_sink;
T_AVX512 static int64_t roof_avx512(int64_t rounds) {
    __m512i acc[ROOF_CHAINS], a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    for (int k = 0; k < ROOF_CHAINS; k++) acc[k] = _mm512_setzero_si512();
    for (int64_t i = 0; i < rounds; i++)
#pragma GCC unroll 8
        for (int k = 0; k < ROOF_CHAINS; k++) acc[k] = dot_avx512(acc[k], a, b);
    __m512i s = acc[0];
    for (int k = 1; k < ROOF_CHAINS; k++) s = _mm512_add_epi32(s, acc[k]);
    roof_sink = _mm512_reduce_add_epi32(s); /* the sums are used: no chain is dropped */
    return rounds * ROOF_CHAINS * 64;
}
T_AVX2 static int64_t roof_avx2(int64_t rounds) {
    __m256i acc[ROOF_CHAINS], a[4], b[4];
    for (int k = 0; k < 4; k++) a[k] = _mm256_set1_epi8(3), b[k] = _mm256_set1_epi8(-2);
    for (int k = 0; k < ROOF_CHAINS; k++) acc[k] = _mm256_setzero_si256();
    for (int64_t i = 0; i < rounds; i++)
#pragma GCC unroll 8
        for (int c = 0; c < ROOF_CHAINS; c++) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) __asm__("" : "+x"(a[k])); /* the operands "change": no product is shared */
            acc[c] = dot4_avx2(acc[c], a, b);
        }
    __m256i s = acc[0];
    for (int k = 1; k < ROOF_CHAINS; k++) s = _mm256_add_epi32(s, acc[k]);
    roof_sink = _mm256_extract_epi32(s, 0);
    return rounds * ROOF_CHAINS * 128;
}
#endif

int64_t kvlab_int_roof(int64_t isa, int64_t rounds, int64_t threads) {
    if (isa < ISA_AVX2 || isa > kvlab_isa_best() || rounds < 1 || threads < 1) return 0;
    int64_t done = 0;
#if X86
#pragma omp parallel num_threads((int)threads) reduction(+ : done)
    done += isa == ISA_AVX512 ? roof_avx512(rounds) : roof_avx2(rounds);
#endif
    return done;
}
