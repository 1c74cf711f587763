/* One decode step of KIVI attention over packed codes, on the CPU (kvlab.attention.cpu_kernel builds and loads it).
 *
 * Per (batch row, KV head) item, with M query rows (GQA heads x query tokens, already scaled) of D channels:
 *   keys   (per-channel groups of G tokens, scale s_j / zero z_j per channel):
 *          score_t = (q * s_j) . code_t + q . z_j          -- the scale folds into the query once per key group
 *   softmax over quantized tokens + full-precision window (fp32, masked entries excluded, fully masked row -> 0)
 *   values (per-token groups of G channels, scale u / zero w per group):
 *          out += p_t * (u_t * code_t + w_t)              -- one token dequantized in registers, fp32
 * Codes: byte x holds k = 8 / nbits codes; code i of byte jb is channel jb * k + i at bits [i * nbits, (i+1) * nbits).
 * Codes are decoded "part-major" (all code 0 of every byte, then code 1, ...): contiguous, vectorizable loops; the
 * query and the value accumulator use the same channel order, so no shuffles are needed.
 * Items are split across OpenMP threads (the caller passes the thread count). Accumulation is fp32, IEEE (no
 * fast-math); reductions are vectorized with `omp simd` (a reordered sum, as any BLAS does).
 * Source: KIVI (arXiv:2402.02750) section 3.3 (dequantization fused into attention).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_kivi_simd.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define SEG_FIELDS 19
#define INT_KEYS_ONLY 256 /* added to an int_isa: integer key scores, exact fp32 value sums */
#define MAX_PARTS 8       /* parts (token ranges) one item may be split into (threads that would idle otherwise) */

/* integer key scores (_kivi_int.c, linked into the same library) */
int kivi_int_supported(int64_t isa, int64_t nb, int64_t D);
int kivi_int_key_scores(int64_t isa, int64_t nb, const uint8_t *kc, const void *ks, const void *kz, int64_t bf16,
                        int64_t tokens, int64_t G, const float *q, float *sc, int64_t total, int64_t M, int64_t D);
int kivi_int_values_supported(int64_t isa, int64_t nb, int64_t D, int64_t G);
int kivi_int_value_sums(int64_t isa, int64_t nb, const uint8_t *vc, const void *vs, const void *vz, int64_t bf16,
                        int64_t tokens, int64_t G, const float *p, int64_t total, int64_t M, int64_t D, float *acc);

/* a . b with 16 partial sums and a tree at the end (vector registers, no serial lane-by-lane sum) */
static inline __attribute__((always_inline)) float dot(const float *a, const float *b, int64_t n) {
    float acc[16] = {0.0f};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (int w = 8; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    for (; i < n; i++) acc[0] += a[i] * b[i];
    return acc[0];
}

/* codes of one token, part-major: cf[i * P + jb] = code i of byte jb */
static inline __attribute__((always_inline)) void decode(const uint8_t *x, float *cf, int64_t P, const int NB) {
    const int K = 8 / NB;
    const unsigned MASK = (1u << NB) - 1u;
    for (int i = 0; i < K; i++) {
        float *c = cf + i * P;
#pragma omp simd
        for (int64_t jb = 0; jb < P; jb++) c[jb] = (float)(((unsigned)x[jb] >> (i * NB)) & MASK);
    }
}

/* ---- vector path (GCC/Clang vector extensions: 8 floats, lowered to whatever SIMD the CPU has) ----------------
 * used when every 8 bytes of codes stay within one value group and key groups hold whole blocks of 8 tokens
 * (head_dim * nbits and group_size * nbits multiples of 64, group_size a multiple of 8); the scalar loops above
 * serve the other shapes (v8f, v8i, SHUF8, splat8, load8, store8 and exp8_nonpos: _kivi_simd.h). */
typedef uint8_t v8b __attribute__((vector_size(8)));

/* [sum(a[0]), ..., sum(a[7])]: a transposing tree of shuffles and adds */
AI v8f sum8(const v8f *a) {
    v8f s[4], t[2];
    for (int k = 0; k < 4; k++)
        s[k] = SHUF8(a[2 * k], a[2 * k + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               SHUF8(a[2 * k], a[2 * k + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int k = 0; k < 2; k++)
        t[k] = SHUF8(s[2 * k], s[2 * k + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               SHUF8(s[2 * k], s[2 * k + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return SHUF8(t[0], t[1], 0, 1, 2, 3, 8, 9, 10, 11) + SHUF8(t[0], t[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

/* 8 bytes -> 8 int32 (one instruction with AVX2; gcc's generic conversion goes lane by lane) */
AI v8i widen8(const uint8_t *x) {
#if defined(__AVX2__)
    return (v8i)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)x));
#else
    v8b b;
    memcpy(&b, x, 8);
    return __builtin_convertvector(b, v8i);
#endif
}

/* the scores of the M query rows qs [M, D] against 8 tokens decoded in cf[8][NV] (8 channels a vector, in the rows'
 * channel order), plus bias[r] where bias is not NULL: sc[r * total + tt] for tt < 8 */
AI void scores8(const int64_t NV, v8f cf[][NV], const float *qs, const float *bias, float *sc, int64_t total,
                int64_t M, const int64_t D) {
    v8f acc[8];
    for (int64_t r = 0; r < M; r++) {
        const float *qr = qs + r * D;
        for (int tt = 0; tt < 8; tt++) {
            v8f a = cf[tt][0] * load8(qr);
            for (int64_t v = 1; v < NV; v++) a += cf[tt][v] * load8(qr + 8 * v);
            acc[tt] = a;
        }
        store8(sc + r * total, bias ? sum8(acc) + splat8(bias[r]) : sum8(acc));
    }
}

/* the codes of one token as D/8 vectors, part-major (vector i * P/8 + c: code i of bytes 8c..8c+7) */
AI void decode_v(const uint8_t *x, v8f *cf, const int64_t P, const int NB) {
    const int K = 8 / NB;
    const int64_t NV = P / 8;
    for (int64_t c = 0; c < NV; c++) {
        v8i w = widen8(x + 8 * c);
        for (int i = 0; i < K - 1; i++) cf[i * NV + c] = __builtin_convertvector((w >> (i * NB)) & ((1 << NB) - 1), v8f);
        cf[(K - 1) * NV + c] = __builtin_convertvector(w >> ((K - 1) * NB), v8f); /* the top code needs no mask */
    }
}

typedef struct {
    const uint8_t *kc, *vc;
    const void *ks, *kz, *vs, *vz;
    int64_t tokens;
} seg_item;

static seg_item seg_at(const int64_t *a, int64_t b, int64_t h, int bf16) {
    int64_t es = bf16 ? 2 : 4; /* metadata element size */
    seg_item s;
    s.kc = (const uint8_t *)(intptr_t)a[0] + b * a[1] + h * a[2];
    s.ks = (const char *)(intptr_t)a[3] + (b * a[4] + h * a[5]) * es;
    s.kz = (const char *)(intptr_t)a[6] + (b * a[7] + h * a[8]) * es;
    s.vc = (const uint8_t *)(intptr_t)a[9] + b * a[10] + h * a[11];
    s.vs = (const char *)(intptr_t)a[12] + (b * a[13] + h * a[14]) * es;
    s.vz = (const char *)(intptr_t)a[15] + (b * a[16] + h * a[17]) * es;
    s.tokens = a[18];
    return s;
}

/* scores of the M rows against one segment's keys: sc[r * total + t] (t from 0 in the segment) */
static inline __attribute__((always_inline)) void key_scores(const seg_item *s, const float *q, const float *qp,
                                                             float *sc, int64_t total, int64_t M, int64_t D,
                                                             int64_t G, int bf16, float *wk, const int NB) {
    const int64_t K = 8 / NB, P = D / K, ng = s->tokens / G;
    float *sp = wk, *qs = wk + D, *cf = qs + M * D, *bias = cf + D;
    for (int64_t j = 0; j < ng; j++) {
        const int64_t row = j * D;
        for (int64_t i = 0; i < K; i++)
            for (int64_t jb = 0; jb < P; jb++) sp[i * P + jb] = ld(s->ks, row + jb * K + i, bf16);
        for (int64_t r = 0; r < M; r++) {
            float b = 0.0f;
            for (int64_t c = 0; c < D; c++) b += q[r * D + c] * ld(s->kz, row + c, bf16);
            bias[r] = b;
#pragma omp simd
            for (int64_t c = 0; c < D; c++) qs[r * D + c] = qp[r * D + c] * sp[c];
        }
        for (int64_t t = j * G; t < (j + 1) * G; t++) {
            decode(s->kc + t * P, cf, P, NB);
            for (int64_t r = 0; r < M; r++) sc[r * total + t] = bias[r] + dot(qs + r * D, cf, D);
        }
    }
}

/* the scores of key_scores, 8 tokens at a time: no horizontal sum per token */
AI void key_scores_v(const seg_item *s, const float *q, const float *qp, float *sc, int64_t total, int64_t M,
                     const int64_t D, int64_t G, int bf16, float *wk, const int NB) {
    const int64_t K = 8 / NB, P = D / K, ng = s->tokens / G, NV = D / 8;
    float *sp = wk, *qs = wk + D, *bias = qs + M * D;
    float sn[D], zn[D];
    v8f cf[8][NV];
    for (int64_t j = 0; j < ng; j++) {
        const int64_t row = j * D;
        row_f32(s->ks, row, D, bf16, sn); /* the group's scale and zero rows as fp32 */
        row_f32(s->kz, row, D, bf16, zn);
        for (int64_t i = 0; i < K; i++)
            for (int64_t jb = 0; jb < P; jb++) sp[i * P + jb] = sn[jb * K + i];
        for (int64_t r = 0; r < M; r++) {
            v8f b = load8(q + r * D) * load8(zn);
            for (int64_t v = 1; v < NV; v++) b += load8(q + r * D + 8 * v) * load8(zn + 8 * v);
            bias[r] = b[0] + b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + b[7];
            for (int64_t v = 0; v < NV; v++) store8(qs + r * D + 8 * v, load8(qp + r * D + 8 * v) * load8(sp + 8 * v));
        }
        for (int64_t t0 = j * G; t0 < (j + 1) * G; t0 += 8) {
            for (int tt = 0; tt < 8; tt++) decode_v(s->kc + (t0 + tt) * P, cf[tt], P, NB);
            scores8(NV, cf, qs, bias, sc + t0, total, M, D);
        }
    }
}

/* value_sums with vectors: a block of VB tokens is dequantized once into `buf` (8 channels a vector), then each row
 * adds p_t * value_t with its accumulator in registers */
#define VB 16
AI void value_sums_v(const seg_item *s, const float *p, float *acc, int64_t total, int64_t M, const int64_t D,
                     int64_t G, int bf16, const int NB) {
    const int64_t K = 8 / NB, P = D / K, KG = D / G, GB = G / K, NV = P / 8;
    v8f buf[VB][D / 8], a[D / 8];
    int64_t gidx[NV];
    float u[KG], w[KG];
    for (int64_t c = 0; c < NV; c++) gidx[c] = 8 * c / GB;
    for (int64_t t0 = 0; t0 < s->tokens; t0 += VB) {
        const int64_t nt = s->tokens - t0 < VB ? s->tokens - t0 : VB;
        for (int64_t tt = 0; tt < nt; tt++) {
            const int64_t t = t0 + tt;
            for (int64_t g = 0; g < KG; g++) {
                u[g] = ld(s->vs, t * KG + g, bf16);
                w[g] = ld(s->vz, t * KG + g, bf16);
            }
            for (int64_t c = 0; c < NV; c++) { /* decode and dequantize 8 bytes: one store per vector */
                const v8f uc = splat8(u[gidx[c]]), wc = splat8(w[gidx[c]]);
                const v8i x = widen8(s->vc + t * P + 8 * c);
                for (int i = 0; i < K - 1; i++)
                    buf[tt][i * NV + c] = __builtin_convertvector((x >> (i * NB)) & ((1 << NB) - 1), v8f) * uc + wc;
                buf[tt][(K - 1) * NV + c] = __builtin_convertvector(x >> ((K - 1) * NB), v8f) * uc + wc;
            }
        }
        for (int64_t r = 0; r < M; r++) {
            const float *pr = p + r * total + t0;
            float *ar = acc + r * D;
            for (int64_t v = 0; v < D / 8; v++) a[v] = load8(ar + 8 * v);
            for (int64_t tt = 0; tt < nt; tt++) {
                const v8f pt = splat8(pr[tt]);
                for (int64_t v = 0; v < D / 8; v++) a[v] += pt * buf[tt][v];
            }
            for (int64_t v = 0; v < D / 8; v++) store8(ar + 8 * v, a[v]);
        }
    }
}

/* acc[r] (part-major channels) += p[r, t] * value_t over one segment's tokens */
static inline __attribute__((always_inline)) void value_sums(const seg_item *s, const float *p, float *acc,
                                                             int64_t total, int64_t M, int64_t D, int64_t G,
                                                             int bf16, float *wk, const int NB) {
    const int64_t K = 8 / NB, P = D / K, KG = D / G, GB = G / K;
    float *cf = wk;
    for (int64_t t = 0; t < s->tokens; t++) {
        int any = 0;
        for (int64_t r = 0; r < M; r++) any |= p[r * total + t] != 0.0f;
        if (!any) continue;
        decode(s->vc + t * P, cf, P, NB);
        for (int64_t g = 0; g < KG; g++) {
            const float u = ld(s->vs, t * KG + g, bf16), w = ld(s->vz, t * KG + g, bf16);
            for (int64_t i = 0; i < K; i++) {
                float *c = cf + i * P + g * GB;
#pragma omp simd
                for (int64_t jb = 0; jb < GB; jb++) c[jb] = c[jb] * u + w;
            }
        }
        for (int64_t r = 0; r < M; r++) {
            const float pr = p[r * total + t];
            float *a = acc + r * D;
#pragma omp simd
            for (int64_t c = 0; c < D; c++) a[c] += pr * cf[c];
        }
    }
}

typedef struct {
    const void *q; /* [B, H, M, D] query rows, fp32 or bf16 (q_bf16), multiplied by `scale` here */
    int64_t q_bf16;
    float scale;
    int64_t B, H, M, D, nbits, G, nseg;
    const int64_t *segs;
    int64_t meta_bf16;
    const void *kw, *vw;
    int64_t w, kw_sb, kw_sh, kw_st, vw_sb, vw_sh, vw_st, win_bf16;
    const uint8_t *valid;
    int64_t valid_sb, valid_sq, q_len, offset;
    float *scores, *work;
    void *out; /* [B, H, M, D], fp32 or bf16 (out_bf16, rounded to nearest even) */
    int64_t out_bf16, work_floats;
    int64_t int_isa; /* -1: exact fp32; else the _kivi_int.c path (its code; + INT_KEYS_ONLY: exact value sums) */
} args_t;

/* the window's scores (quantized tokens first: columns [Q, Q + w)) */
static inline __attribute__((always_inline)) void window_scores(const args_t *a, int64_t b, int64_t h, const float *q,
                                                                float *sc, int64_t Q, int64_t total, float *buf,
                                                                const int64_t D) {
    const int64_t M = a->M;
    const void *kw = (const char *)a->kw + (b * a->kw_sb + h * a->kw_sh) * (a->win_bf16 ? 2 : 4);
    int64_t j = 0;
    if (D % 8 == 0) { /* 8 window keys at a time, as in key_scores_v */
        float rows[8][D];
        v8f acc[8];
        for (; j + 8 <= a->w; j += 8) {
            for (int tt = 0; tt < 8; tt++) row_f32(kw, (j + tt) * a->kw_st, D, (int)a->win_bf16, rows[tt]);
            for (int64_t r = 0; r < M; r++) {
                for (int tt = 0; tt < 8; tt++) {
                    v8f x = load8(rows[tt]) * load8(q + r * D);
                    for (int64_t v = 1; v < D / 8; v++) x += load8(rows[tt] + 8 * v) * load8(q + r * D + 8 * v);
                    acc[tt] = x;
                }
                store8(sc + r * total + Q + j, sum8(acc));
            }
        }
    }
    for (; j < a->w; j++) {
        row_f32(kw, j * a->kw_st, D, (int)a->win_bf16, buf);
        for (int64_t r = 0; r < M; r++) sc[r * total + Q + j] = dot(q + r * D, buf, D);
    }
}

/* the masks over columns [c0, c1) of every row: the caller's `valid`, else causal inside the window (column Q + j
 * is seen by query i when j <= i + offset) */
static void mask_cols(const args_t *a, int64_t b, float *sc, int64_t Q, int64_t total, int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < a->M; r++) {
        const int64_t qi = r % a->q_len;
        float *row = sc + r * total;
        if (a->valid) {
            const uint8_t *v = a->valid + b * a->valid_sb + qi * a->valid_sq;
            for (int64_t t = c0; t < c1; t++)
                if (!v[t]) row[t] = -INFINITY;
        } else {
            const int64_t j0 = qi + a->offset + 1 > c0 - Q ? qi + a->offset + 1 : c0 - Q;
            for (int64_t j = j0; Q + j < c1; j++) row[Q + j] = -INFINITY;
        }
    }
}

/* the masks of the whole row (columns [0, total)) after the window's scores: FP8 */
static inline __attribute__((always_inline)) void window_and_mask(const args_t *a, int64_t b, int64_t h, const float *q,
                                                                  float *sc, int64_t Q, int64_t total, float *buf,
                                                                  const int64_t D) {
    window_scores(a, b, h, q, sc, Q, total, buf, D);
    mask_cols(a, b, sc, Q, total, 0, total);
}

/* softmax of each row in place (unnormalised: exp(s - max)); returns 1 / sum in inv[r] (0 for a masked row) */
static void softmax_rows(float *sc, int64_t M, int64_t total, float *inv) {
    for (int64_t r = 0; r < M; r++) {
        float *row = sc + r * total;
        const int64_t nv = total / 8 * 8;
        v8f m8 = splat8(-INFINITY);
        for (int64_t t = 0; t < nv; t += 8) {
            const v8f x = load8(row + t);
            const v8i gt = x > m8;
            m8 = (v8f)(((v8i)x & gt) | ((v8i)m8 & ~gt));
        }
        float mx = -INFINITY;
        for (int l = 0; l < 8; l++) mx = m8[l] > mx ? m8[l] : mx;
        for (int64_t t = nv; t < total; t++) mx = row[t] > mx ? row[t] : mx;
        if (mx == -INFINITY) {
            memset(row, 0, total * sizeof(float));
            inv[r] = 0.0f;
            continue;
        }
        v8f l8 = splat8(0.0f);
        for (int64_t t = 0; t < nv; t += 8) {
            const v8f e = exp8_nonpos(load8(row + t) - splat8(mx));
            store8(row + t, e);
            l8 += e;
        }
        float l = 0.0f;
        for (int k = 0; k < 8; k++) l += l8[k];
        for (int64_t t = nv; t < total; t++) {
            row[t] = exp_nonpos(row[t] - mx);
            l += row[t];
        }
        inv[r] = 1.0f / l;
    }
}

/* orow += the window's values of item (b, h) weighted by its probabilities pw[0..w) (fp32, channel order) */
AI void window_values(const args_t *a, int64_t b, int64_t h, const float *pw, float *orow, float *tmp,
                      const int64_t D) {
    const void *vw = (const char *)a->vw + (b * a->vw_sb + h * a->vw_sh) * (a->win_bf16 ? 2 : 4);
    for (int64_t j = 0; j < a->w; j++) {
        const float pr = pw[j];
        if (pr == 0.0f) continue;
        row_f32(vw, j * a->vw_st, D, (int)a->win_bf16, tmp);
#pragma omp simd
        for (int64_t c = 0; c < D; c++) orow[c] += pr * tmp[c];
    }
}

/* row r of item (b, h): add the window's values weighted by its probabilities pw[0..w) to orow (the quantized
 * history's sum, fp32, channel order), then write orow * inv to the output (fp32, or bf16 rounded to nearest even) */
AI void finish_row(const args_t *a, int64_t b, int64_t h, int64_t r, const float *pw, float *orow, float inv,
                   float *tmp, const int64_t D) {
    window_values(a, b, h, pw, orow, tmp, D);
    store_row(a->out, ((b * a->H + h) * a->M + r) * D, orow, inv, D, (int)a->out_bf16);
}

/* exp(x - m) in place over columns [c0, c1) and [w0, w1) of each row, m its maximum there (-inf: every column
 * masked, then zeros); mx[r] = m, l[r] = the sum */
static void softmax_parts(float *sc, int64_t M, int64_t total, int64_t c0, int64_t c1, int64_t w0, int64_t w1,
                          float *mx, float *l) {
    for (int64_t r = 0; r < M; r++) {
        float *row = sc + r * total, m = -INFINITY, sum = 0.0f;
        const int64_t lo[2] = {c0, w0}, hi[2] = {c1, w1};
        for (int k = 0; k < 2; k++) {
            int64_t t = lo[k];
            v16f m16 = splat16(-INFINITY);
            for (; t + 16 <= hi[k]; t += 16) {
                const v16f x = load16(row + t);
                const v16i gt = x > m16;
                m16 = (v16f)(((v16i)x & gt) | ((v16i)m16 & ~gt));
            }
            for (int q = 0; q < 16; q++) m = m16[q] > m ? m16[q] : m;
            for (; t < hi[k]; t++) m = row[t] > m ? row[t] : m;
        }
        mx[r] = m;
        if (m == -INFINITY) {
            for (int k = 0; k < 2; k++) memset(row + lo[k], 0, (hi[k] - lo[k]) * sizeof(float));
            l[r] = 0.0f;
            continue;
        }
        for (int k = 0; k < 2; k++) {
            int64_t t = lo[k];
            v16f l16 = splat16(0.0f);
            for (; t + 16 <= hi[k]; t += 16) {
                const v16f e = exp16_nonpos(load16(row + t) - splat16(m));
                store16(row + t, e);
                l16 += e;
            }
            for (int q = 0; q < 16; q++) sum += l16[q];
            for (; t < hi[k]; t++) {
                row[t] = exp_nonpos(row[t] - m);
                sum += row[t];
            }
        }
        l[r] = sum;
    }
}

/* tokens [t0, t0 + n) of segment s (t0 a multiple of G; P bytes of codes a token) */
static seg_item seg_part(const seg_item *s, int64_t t0, int64_t n, int64_t P, int64_t D, int64_t G, int bf16) {
    const int64_t es = bf16 ? 2 : 4, KG = D / G;
    seg_item x = *s;
    x.kc += t0 * P;
    x.vc += t0 * P;
    x.ks = (const char *)s->ks + t0 / G * D * es;
    x.kz = (const char *)s->kz + t0 / G * D * es;
    x.vs = (const char *)s->vs + t0 * KG * es;
    x.vz = (const char *)s->vz + t0 * KG * es;
    x.tokens = n;
    return x;
}

/* the floats of one part's work area (see part) */
static int64_t part_floats(int64_t M, int64_t D) { return 3 * M * D + 2 * M + D + (2 + M) * D + M + 16; }

/* part s of S of item (b, h), flash-decoding style (Dao et al., FlashDecoding: the keys split, partial softmax
 * states merged): the quantized tokens [lo, hi) (whole key groups) and, in the last part, the window. Leaves in the
 * part's work area the rows' maxima mx, sums l of exp(score - mx) and acc, the unnormalised sums of values (channel
 * order); item_finish merges the parts. */
static inline __attribute__((always_inline)) void part(const args_t *a, int64_t b, int64_t h, int64_t s, int64_t S,
                                                       const int NB, const int64_t D) {
    const int64_t M = a->M, K = 8 / NB, P = D / K, it = b * a->H + h, G = a->G;
    const int bf16 = (int)a->meta_bf16;
    const int vec = D * NB % 64 == 0 && G * NB % 64 == 0 && G % 8 == 0;
    float *wk = a->work + it * a->work_floats + s * part_floats(M, D);
    float *qf = wk, *qp = qf + M * D, *acc = qp + M * D, *mx = acc + M * D, *l = mx + M, *orow = l + M;
    float *tmp = orow + D;
    for (int64_t x = 0; x < M * D; x++) qf[x] = ld(a->q, it * M * D + x, (int)a->q_bf16) * a->scale;
    const float *q = qf;
    int64_t Q = 0;
    for (int64_t n = 0; n < a->nseg; n++) Q += a->segs[n * SEG_FIELDS + 18];
    const int64_t total = Q + a->w, ng = Q / G, last = s == S - 1;
    const int64_t lo = ng * s / S * G, hi = last ? Q : ng * (s + 1) / S * G;
    float *sc = a->scores + it * M * total;
    for (int64_t r = 0; r < M; r++)
        for (int64_t i = 0; i < K; i++)
            for (int64_t jb = 0; jb < P; jb++) qp[r * D + i * P + jb] = q[r * D + jb * K + i];
    const int64_t isa = a->int_isa % INT_KEYS_ONLY;
    const int integer = a->int_isa >= 0 && kivi_int_supported(isa, NB, D);
    const int int_values = integer && a->int_isa < INT_KEYS_ONLY && kivi_int_values_supported(isa, NB, D, G);
    for (int pass = 0; pass < 2; pass++) { /* keys, then (after the softmax) values, over the part's sub-segments */
        if (pass == 1) {
            if (last) {
                window_scores(a, b, h, q, sc, Q, total, tmp, D);
                mask_cols(a, b, sc, Q, total, Q, total);
            }
            mask_cols(a, b, sc, Q, total, lo, hi);
            softmax_parts(sc, M, total, lo, hi, last ? Q : 0, last ? total : 0, mx, l);
            memset(acc, 0, M * D * sizeof(float));
        }
        int64_t start = 0;
        for (int64_t n = 0; n < a->nseg; n++) {
            const seg_item whole = seg_at(a->segs + n * SEG_FIELDS, b, h, bf16);
            const int64_t x0 = lo > start ? lo : start, x1 = hi < start + whole.tokens ? hi : start + whole.tokens;
            start += whole.tokens;
            if (x0 >= x1) continue;
            const seg_item sg = seg_part(&whole, x0 - (start - whole.tokens), x1 - x0, P, D, G, bf16);
            float *c = sc + x0;
            if (pass == 0) {
                if (integer && kivi_int_key_scores(isa, NB, sg.kc, sg.ks, sg.kz, bf16, sg.tokens, G, q, c, total, M, D) == 0)
                    ; /* the integer path took the segment (it refuses one of tokens not a multiple of G) */
                else if (vec)
                    key_scores_v(&sg, q, qp, c, total, M, D, G, bf16, tmp, NB);
                else
                    key_scores(&sg, q, qp, c, total, M, D, G, bf16, tmp, NB);
            } else if (int_values) {
                kivi_int_value_sums(isa, NB, sg.vc, sg.vs, sg.vz, bf16, sg.tokens, G, c, total, M, D, acc);
            } else if (vec) {
                value_sums_v(&sg, c, acc, total, M, D, G, bf16, NB);
            } else {
                value_sums(&sg, c, acc, total, M, D, G, bf16, tmp, NB);
            }
        }
    }
    for (int64_t r = 0; r < M; r++) { /* channel order, and the window's values */
        for (int64_t i = 0; i < K; i++)
            for (int64_t jb = 0; jb < P; jb++) orow[jb * K + i] = acc[r * D + i * P + jb];
        if (last) window_values(a, b, h, sc + r * total + Q, orow, tmp, D);
        memcpy(acc + r * D, orow, D * sizeof(float));
    }
}

/* the output rows of item `it` from its S parts: m = max of the parts' maxima, out = sum_s e^(mx_s - m) acc_s /
 * sum_s e^(mx_s - m) l_s (0 for a row with every key masked) */
static void item_finish(const args_t *a, int64_t it, int64_t S) {
    const int64_t M = a->M, D = a->D, pf = part_floats(M, D);
    const float *wk = a->work + it * a->work_floats;
    float *o = a->work + it * a->work_floats + S * pf; /* past the parts' areas: D floats */
    for (int64_t r = 0; r < M; r++) {
        float m = -INFINITY, L = 0.0f;
        for (int64_t s = 0; s < S; s++) {
            const float x = wk[s * pf + 3 * M * D + r];
            m = x > m ? x : m;
        }
        memset(o, 0, D * sizeof(float));
        if (m != -INFINITY)
            for (int64_t s = 0; s < S; s++) {
                const float *p = wk + s * pf, ms = p[3 * M * D + r];
                if (ms == -INFINITY) continue;
                const float e = S == 1 ? 1.0f : exp_nonpos(ms - m);
                L += e * p[3 * M * D + M + r];
                for (int64_t c = 0; c < D; c++) o[c] += e * p[2 * M * D + r * D + c];
            }
        store_row(a->out, (it * M + r) * D, o, L > 0.0f ? 1.0f / L : 0.0f, D, (int)a->out_bf16);
    }
}

static void run_part(const args_t *a, int64_t unit, int64_t S) {
    const int64_t idx = unit / S, s = unit % S, b = idx / a->H, h = idx % a->H;
    /* head_dim 64 and 128 get their own code for 2 and 4 bits (constant trip counts: unrolled, no loop set-up per
     * token) */
#define KIVI_DISPATCH(NB)                               \
    if (a->D == 64)                                     \
        part(a, b, h, s, S, NB, 64);                    \
    else if (a->D == 128)                               \
        part(a, b, h, s, S, NB, 128);                   \
    else                                                \
        part(a, b, h, s, S, NB, a->D);
    switch (a->nbits) { /* 8-bit codes (rare) share one instantiation: fewer copies to compile */
        case 2: KIVI_DISPATCH(2) break;
        case 4: KIVI_DISPATCH(4) break;
        default: part(a, b, h, s, S, 8, a->D); break;
    }
#undef KIVI_DISPATCH
}

/* parts per item: 1, or (threads that would idle otherwise: items not a multiple of the threads) the fewest that
 * make items * parts a multiple of the threads, at most MAX_PARTS and one key group each */
static int64_t parts_for(int64_t items, int64_t nt, int64_t groups) {
    if (nt <= 1 || items % nt == 0) return 1;
    int64_t S = 2;
    while (S < MAX_PARTS && items * S % nt) S++;
    return S < groups ? S : (groups > 1 ? groups : 1);
}

/* floats of `work` one item needs: MAX_PARTS parts, then D for item_finish (the FP8 kernel uses the start) */
int64_t kivi_work_floats(int64_t M, int64_t D) { return MAX_PARTS * part_floats(M, D) + D; }

int kivi_decode_step(const void *q, int64_t q_bf16, double scale, int64_t B, int64_t H, int64_t M, int64_t D, int64_t nbits, int64_t G,
                     int64_t nseg, const int64_t *segs, int64_t meta_bf16, const void *kw, const void *vw, int64_t w,
                     int64_t kw_sb, int64_t kw_sh, int64_t kw_st, int64_t vw_sb, int64_t vw_sh, int64_t vw_st,
                     int64_t win_bf16, const uint8_t *valid, int64_t valid_sb, int64_t valid_sq, int64_t q_len,
                     int64_t offset, float *scores, float *work, void *out, int64_t out_bf16, int64_t nthreads,
                     int64_t int_isa) {
    if (nbits != 2 && nbits != 4 && nbits != 8) return 1;
    if (D % G || G * nbits % 8 || D * nbits % 8 || q_len < 1 || M % q_len) return 2;
    args_t a = {q,      q_bf16, (float)scale, B,        H,        M,      D,        nbits,  G,
                nseg,   segs,   meta_bf16,    kw,       vw,       w,      kw_sb,    kw_sh,  kw_st,
                vw_sb,  vw_sh,  vw_st,        win_bf16, valid,    valid_sb, valid_sq, q_len, offset,
                scores, work,   out,          out_bf16, kivi_work_floats(M, D), int_isa};
    int64_t Q = 0;
    for (int64_t n = 0; n < nseg; n++) Q += segs[n * SEG_FIELDS + 18];
    const int64_t items = B * H, S = parts_for(items, nthreads, Q / G), units = items * S;
    if (nthreads > 1 && units > 1) {
        const int nt = (int)(nthreads < units ? nthreads : units);
#pragma omp parallel num_threads(nt)
        {
#pragma omp for schedule(dynamic, 1) /* equal units; a thread the OS starts late leaves its share to the others */
            for (int64_t u = 0; u < units; u++) run_part(&a, u, S);
#pragma omp for schedule(static)
            for (int64_t i = 0; i < items; i++) item_finish(&a, i, S);
        }
    } else {
        for (int64_t u = 0; u < units; u++) run_part(&a, u, S);
        for (int64_t i = 0; i < items; i++) item_finish(&a, i, S);
    }
    return 0;
}

/* ---- FP8 (e4m3 / e5m2) decode step: the same item structure over float8 codes ----------------------------------
 * Keys and values [B, H, T, D] are float8 codes with one fp32 scale per (batch row, KV head) (stride 0 for a
 * per-tensor or absent scale). A code becomes fp32 exactly with integer ops: its 7 magnitude bits shifted into the
 * fp32 exponent/mantissa fields (e4m3: << 20, e5m2: << 21) read as a float equal the code's value times 2^-120
 * (e4m3) or 2^-112 (e5m2), subnormal codes included (they land on fp32 subnormals), and the sign bit moved to bit
 * 31; the power of two is folded into the key scale (scores) and the value scale (output). Scores and output in
 * fp32; softmax, window and masks as for KIVI. Source: vLLM's fp8 KV cache (scaled float8 K/V dequantized inside
 * the attention kernel), Micikevicius et al., "FP8 Formats for Deep Learning" (arXiv:2209.05433) for the formats. */

AI v8f fp8x8(const uint8_t *x, const int E5) {
    const v8i w = widen8(x);
    return (v8f)(((w & 0x7F) << (E5 ? 21 : 20)) | ((w & 0x80) << 24));
}

typedef struct {
    const uint8_t *kc, *vc;
    int64_t T, k_sb, k_sh, k_st, v_sb, v_sh, v_st;
    const float *ks, *vs;
    int64_t ks_sb, ks_sh, vs_sb, vs_sh, e5;
} fp8_t;

/* scores of the M rows (already multiplied by the key scale) against the T codes: sc[r * total + t] */
AI void fp8_key_scores(const uint8_t *kc, int64_t T, int64_t st, const float *qs, float *sc, int64_t total,
                       int64_t M, const int64_t D, const int E5) {
    const int64_t NV = D / 8;
    v8f cf[8][NV];
    int64_t t0 = 0;
    for (; t0 + 8 <= T; t0 += 8) {
        for (int tt = 0; tt < 8; tt++)
            for (int64_t v = 0; v < NV; v++) cf[tt][v] = fp8x8(kc + (t0 + tt) * st + 8 * v, E5);
        scores8(NV, cf, qs, NULL, sc + t0, total, M, D);
    }
    for (; t0 < T; t0++) {
        for (int64_t v = 0; v < NV; v++) cf[0][v] = fp8x8(kc + t0 * st + 8 * v, E5);
        for (int64_t r = 0; r < M; r++) {
            v8f x = cf[0][0] * load8(qs + r * D);
            for (int64_t v = 1; v < NV; v++) x += cf[0][v] * load8(qs + r * D + 8 * v);
            sc[r * total + t0] = x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6] + x[7];
        }
    }
}

/* acc[r] += sum_t p[r, t] * code_t over the T value codes (unscaled: the caller multiplies by the value scale) */
AI void fp8_value_sums(const uint8_t *vc, int64_t T, int64_t st, const float *p, float *acc, int64_t total,
                       int64_t M, const int64_t D, const int E5) {
    const int64_t NV = D / 8;
    v8f buf[VB][NV], a[NV];
    for (int64_t t0 = 0; t0 < T; t0 += VB) {
        const int64_t nt = T - t0 < VB ? T - t0 : VB;
        for (int64_t tt = 0; tt < nt; tt++)
            for (int64_t v = 0; v < NV; v++) buf[tt][v] = fp8x8(vc + (t0 + tt) * st + 8 * v, E5);
        for (int64_t r = 0; r < M; r++) {
            const float *pr = p + r * total + t0;
            float *ar = acc + r * D;
            for (int64_t v = 0; v < NV; v++) a[v] = load8(ar + 8 * v);
            for (int64_t tt = 0; tt < nt; tt++) {
                const v8f pt = splat8(pr[tt]);
                for (int64_t v = 0; v < NV; v++) a[v] += pt * buf[tt][v];
            }
            for (int64_t v = 0; v < NV; v++) store8(ar + 8 * v, a[v]);
        }
    }
}

AI void fp8_item(const args_t *a, const fp8_t *f, int64_t b, int64_t h, const int64_t D, const int E5) {
    const int64_t M = a->M, it = b * a->H + h, T = f->T, total = T + a->w;
    const float pw = E5 ? 0x1p112f : 0x1p120f; /* the power of two the bit move leaves out */
    const float ks = f->ks[b * f->ks_sb + h * f->ks_sh] * pw, vs = f->vs[b * f->vs_sb + h * f->vs_sh] * pw;
    float *wk = a->work + it * a->work_floats;
    float *qf = wk, *qs = qf + M * D, *acc = qs + M * D, *inv = acc + M * D, *orow = inv + M, *tmp = orow + D;
    for (int64_t x = 0; x < M * D; x++) {
        qf[x] = ld(a->q, it * M * D + x, (int)a->q_bf16) * a->scale;
        qs[x] = qf[x] * ks;
    }
    float *sc = a->scores + it * M * total;
    fp8_key_scores(f->kc + b * f->k_sb + h * f->k_sh, T, f->k_st, qs, sc, total, M, D, E5);
    window_and_mask(a, b, h, qf, sc, T, total, tmp, D);
    softmax_rows(sc, M, total, inv);
    memset(acc, 0, M * D * sizeof(float));
    fp8_value_sums(f->vc + b * f->v_sb + h * f->v_sh, T, f->v_st, sc, acc, total, M, D, E5);
    for (int64_t r = 0; r < M; r++) {
        for (int64_t c = 0; c < D; c++) orow[c] = acc[r * D + c] * vs;
        finish_row(a, b, h, r, sc + r * total + T, orow, inv[r], tmp, D);
    }
}

static void fp8_run_item(const args_t *a, const fp8_t *f, int64_t idx) {
    const int64_t b = idx / a->H, h = idx % a->H;
#define FP8_DISPATCH(E5)                    \
    if (a->D == 64)                         \
        fp8_item(a, f, b, h, 64, E5);       \
    else if (a->D == 128)                   \
        fp8_item(a, f, b, h, 128, E5);      \
    else                                    \
        fp8_item(a, f, b, h, a->D, E5);
    if (f->e5) {
        FP8_DISPATCH(1)
    } else {
        FP8_DISPATCH(0)
    }
#undef FP8_DISPATCH
}

/* codes: k/v pointers and cs = their (batch, head, token) strides in bytes (K then V); scales: fp32 pointers and
 * ss = their (batch, head) strides in elements (K then V; 0 broadcasts); the window, mask and outputs as kivi_decode_step. Returns 0, or 2 for sizes it does not
 * take (head_dim not a multiple of 8, q_len < 1 or not dividing M). */
int fp8_decode_step(const void *q, int64_t q_bf16, double scale, int64_t B, int64_t H, int64_t M, int64_t D,
                    int64_t e5, const uint8_t *kc, const uint8_t *vc, int64_t T, const int64_t *cs,
                    const float *ks, const float *vs, const int64_t *ss, const void *kw, const void *vw,
                    int64_t w, int64_t kw_sb, int64_t kw_sh, int64_t kw_st, int64_t vw_sb, int64_t vw_sh,
                    int64_t vw_st, int64_t win_bf16, const uint8_t *valid, int64_t valid_sb, int64_t valid_sq,
                    int64_t q_len, int64_t offset, float *scores, float *work, void *out, int64_t out_bf16,
                    int64_t nthreads) {
    if (D % 8 || D < 8 || q_len < 1 || M % q_len) return 2;
    args_t a = {q,      q_bf16, (float)scale, B,        H,        M,      D,        8,      8,
                0,      NULL,   0,            kw,       vw,       w,      kw_sb,    kw_sh,  kw_st,
                vw_sb,  vw_sh,  vw_st,        win_bf16, valid,    valid_sb, valid_sq, q_len, offset,
                scores, work,   out,          out_bf16, kivi_work_floats(M, D), -1};
    fp8_t f = {kc, vc, T, cs[0], cs[1], cs[2], cs[3], cs[4], cs[5], ks, vs, ss[0], ss[1], ss[2], ss[3], e5};
    const int64_t items = B * H;
    if (nthreads > 1 && items > 1) {
        int nt = (int)(nthreads < items ? nthreads : items);
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t i = 0; i < items; i++) fp8_run_item(&a, &f, i);
    } else {
        for (int64_t i = 0; i < items; i++) fp8_run_item(&a, &f, i);
    }
    return 0;
}
