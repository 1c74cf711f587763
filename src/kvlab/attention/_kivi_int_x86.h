/* The AVX512 and AVX2 paths of _kivi_int.c's integer kernels (key-score dot products, value sums), written once.
 * _kivi_int.c includes this file once per path, having defined
 *   PATH         the path's name (avx512, avx2): every function here is <name>_<PATH> (dots_avx512, values_avx2)
 *   PATH_BITS    its vector width in bits (512, 256): __m<bits>i vectors, _mm<bits>_ intrinsics
 *   PATH_TARGET  its __attribute__((target))
 * and the path's own instructions, where the two differ: lanes_<PATH> (each 128-bit lane loaded from its own
 * address), lanes16_<PATH> (16 bytes a lane at a fixed step), dot_<PATH> (acc + the u8 x s8 byte products summed per
 * 4 bytes: dpbusd / maddubs + madd; dot4_<PATH> four of them), permute_<PATH> / permps_<PATH> (a's int32 / fp32 lanes picked by idx),
 * ldf_<PATH> (LANES fp32 from bf16 or fp32), bcast4_<PATH> (4 fp32 in every 128-bit lane), hmax_<PATH> / hsum_<PATH> (max / sum of the fp32 lanes), store8_<PATH>
 * (the low bytes of the int32 lanes), pack4_<PATH> / split4_<PATH> (four vectors' bytes at once).
 * The algorithms, bounds and layouts are described in _kivi_int.c. kvlab.attention.cpu_kernel hashes this file
 * into the kernel's build key. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(CAT(name, _), PATH)     /* FN(dots) -> dots_avx512 */
#define MM(op) CAT(CAT(_mm, PATH_BITS), op)  /* MM(_add_epi32) -> _mm512_add_epi32 */
#define MMSI(op) CAT(MM(op), PATH_BITS)      /* MMSI(_setzero_si) -> _mm512_setzero_si512 */
#define VI CAT(CAT(__m, PATH_BITS), i)       /* __m512i */
#define VF CAT(__m, PATH_BITS)               /* __m512 */
#define LANES (PATH_BITS / 32)               /* int32 (and float) lanes of a vector */
#define UNIT (PATH_BITS / 8)                 /* codes per unpacked vector: the unit width W of chan */

/* quantize_rows (_kivi_int.c) in this path's vectors, the transposed order: m = max s, s' = s / m (s in that order),
 * a[r] = a0[r] * m, x = round(qn * s') to nearest even (as quantize_rows), its high byte in qi[r], its low byte in
 * qi[M + r]; bias[r] = q . z. The group's maximum is taken once for all M rows. */
PATH_TARGET AI void FN(quantize_d)(const float *q, const float *qn, const float *a0, const void *ks, const void *kz,
                                   int bf16, int64_t j, int64_t M, const int64_t D, int order, int nb, int8_t *qi,
                                   float *a, float *bias) {
    const int64_t NV = D / LANES;
    float sn[D], sp[D];
    VF z[NV], s[NV], mx = MM(_setzero_ps)();
    const VF absm = CAT(MMSI(_castsi), _ps)(MM(_set1_epi32)(0x7fffffff));
    for (int64_t c = 0; c < NV; c++) {
        const VF x = FN(ldf)(ks, j * D + c * LANES, bf16);
        MM(_storeu_ps)(sn + c * LANES, x);
        mx = MM(_max_ps)(mx, MM(_and_ps)(x, absm));
        z[c] = FN(ldf)(kz, j * D + c * LANES, bf16);
    }
    to_order(sn, sp, D, order, nb);
    const float m = FN(hmax)(mx);
    const VF inv = MM(_set1_ps)(m > 0.0f ? 1.0f / m : 0.0f);
    for (int64_t c = 0; c < NV; c++) s[c] = MM(_mul_ps)(MM(_loadu_ps)(sp + c * LANES), inv);
    const VF zero = MM(_setzero_ps)();
    for (int64_t r = 0; r < M; r++) {
        VF b = zero, x[NV];
        for (int64_t c = 0; c < NV; c++) {
            b = MM(_fmadd_ps)(MM(_loadu_ps)(q + r * D + c * LANES), z[c], b);
            x[c] = MM(_mul_ps)(MM(_loadu_ps)(qn + r * D + c * LANES), s[c]);
        }
        bias[r] = FN(hsum)(b);
        a[r] = a0[r] * m;
        int64_t c = 0;
        for (; c + 4 <= NV; c += 4) {
            VI xi[4];
#pragma GCC unroll 8
            for (int k = 0; k < 4; k++) xi[k] = MM(_cvtps_epi32)(x[c + k]);
            if (DIGITS(nb) == 2)
                FN(split4)(xi, qi + r * D + c * LANES, qi + (M + r) * D + c * LANES);
            else
                FN(bytes4)(xi, qi + r * D + c * LANES);
        }
        for (; c < NV; c++) {
            const VI xi = MM(_cvtps_epi32)(x[c]);
            FN(store8)(qi + r * D + c * LANES, DIGITS(nb) == 2 ? MM(_srai_epi32)(xi, 8) : xi);
            if (DIGITS(nb) == 2) FN(store8)(qi + (M + r) * D + c * LANES, xi);
        }
    }
}

/* a software prefetch of packed codes, rows of P bytes: into L2 for rows of 64 bytes or more, into L1 for shorter
 * ones (from DRAM, 1 thread, Zen 4, 16k tokens: a Llama-3-8B layer's 4-bit codes, 64-byte rows, value sums 1.87 ->
 * 1.30 ms and key scores 1.58 -> 1.47 ms with the L2 hint; its 2-bit codes and SmolLM2-135M's, 16-32-byte rows, ran
 * the same or up to 15 % slower with it) */
PATH_TARGET AI void FN(prefetch_codes)(const char *p, const int64_t P) {
    if (P >= 64)
        __builtin_prefetch(p, 0, 2);
    else
        __builtin_prefetch(p, 0, 3);
}

/* head_dim 64 and 128 with constant trip counts */
PATH_TARGET AI void FN(quantize)(const float *q, const float *qn, const float *a0, const void *ks, const void *kz,
                                 int bf16, int64_t j, int64_t M, const int64_t D, int order, int nb, int8_t *qi,
                                 float *a, float *bias) {
    if (D == 128)
        FN(quantize_d)(q, qn, a0, ks, kz, bf16, j, M, 128, order, nb, qi, a, bias);
    else if (D == 64)
        FN(quantize_d)(q, qn, a0, ks, kz, bf16, j, M, 64, order, nb, qi, a, bias);
    else
        FN(quantize_d)(q, qn, a0, ks, kz, bf16, j, M, D, order, nb, qi, a, bias);
}

/* sc[r*total + t] for rows r0 .. r0 + RT - 1 of one block of LANES tokens (code vectors cv[NCV], the transposed
 * order of _kivi_int.c): with NDIG 2 digits 256 (h . codes) + (l . codes) per token lane (h = qi[r] signed, l =
 * qi[M + r] unsigned: the codes are dpbusd's unsigned operand against h, its signed one against l), with 1 digit
 * h . codes; then a[r] * that + bias[r]. RT rows at once: NDIG * RT independent dpbusd chains, each code vector
 * loaded once for all of them. */
PATH_TARGET AI void FN(rows_tile)(const VI *cv, const int64_t NCV, const int8_t *qi, const float *a,
                                  const float *bias, float *sc, int64_t total, int64_t M, int64_t D, int64_t r0,
                                  const int RT, const int NDIG) {
    VI s[4], s2[4];
#pragma GCC unroll 8
    for (int i = 0; i < RT; i++) s[i] = s2[i] = MMSI(_setzero_si)();
    for (int64_t v = 0; v < NCV; v += 4) { /* NCV is a multiple of 4 (R is) */
        const VI c[4] = {cv[v], cv[v + 1], cv[v + 2], cv[v + 3]};
#pragma GCC unroll 8
        for (int i = 0; i < RT; i++) {
            VI h[4], l[4];
#pragma GCC unroll 8
            for (int k = 0; k < 4; k++) {
                int32_t w1, w2 = 0;
                memcpy(&w1, qi + (r0 + i) * D + 4 * (v + k), 4);
                if (NDIG == 2) memcpy(&w2, qi + (M + r0 + i) * D + 4 * (v + k), 4);
                h[k] = MM(_set1_epi32)(w1);
                l[k] = MM(_set1_epi32)(w2);
            }
            s[i] = FN(dot4)(s[i], c, h);
            if (NDIG == 2) s2[i] = FN(dot4)(s2[i], l, c);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < RT; i++) {
        const VI x = NDIG == 2 ? MM(_add_epi32)(MM(_slli_epi32)(s[i], 8), s2[i]) : s[i];
        const VF f = MM(_fmadd_ps)(MM(_cvtepi32_ps)(x), MM(_set1_ps)(a[r0 + i]), MM(_set1_ps)(bias[r0 + i]));
        MM(_storeu_ps)(sc + (r0 + i) * total, f);
    }
}

/* sc[r*total + t] = a[r] * (qi[r] . codes[t]) + bias[r] for tokens [t0, t0 + n) of rows of P packed bytes (qi in the
 * transposed order, channel perm[idx] at idx): LANES tokens at a time, transposed into one lane each (see
 * _kivi_int.c); the tokens past the last whole block in portable C */
PATH_TARGET AI void FN(dots_nb)(const uint8_t *kc, int64_t P, int64_t t0, int64_t n, const int nb, const int8_t *qi,
                                const float *a, const float *bias, float *sc, int64_t total, int64_t M,
                                const int64_t D, const int64_t *perm) {
    const int64_t R = D * nb / 32, K = 8 / nb, NCV = R * K;
    const VI mask = MM(_set1_epi8)((char)((1 << nb) - 1));
    VI cv[NCV];
    int64_t t = t0;
    for (; t + LANES <= t0 + n; t += LANES) {
        /* the rows PF_KEYS blocks ahead (from DRAM, 8 heads x 16k tokens: 1.15 ms without, 0.72 ms with) */
        for (int64_t x = 0; x < LANES * P; x += 64) FN(prefetch_codes)((const char *)kc + (t + PF_KEYS * LANES) * P + x, P);
        for (int64_t jq = 0; jq < R / 4; jq++) {
            VI y[4];
#pragma GCC unroll 8
            for (int k = 0; k < 4; k++) y[k] = FN(lanes16)(kc + (t + k) * P + 16 * jq, 4 * P);
            const VI lo01 = MM(_unpacklo_epi32)(y[0], y[1]), hi01 = MM(_unpackhi_epi32)(y[0], y[1]);
            const VI lo23 = MM(_unpacklo_epi32)(y[2], y[3]), hi23 = MM(_unpackhi_epi32)(y[2], y[3]);
            const VI z[4] = {MM(_unpacklo_epi64)(lo01, lo23), MM(_unpackhi_epi64)(lo01, lo23),
                             MM(_unpacklo_epi64)(hi01, hi23), MM(_unpackhi_epi64)(hi01, hi23)};
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++)
                for (int64_t p = 0; p < K; p++)
                    cv[(4 * jq + i) * K + p] = MMSI(_and_si)(p ? MM(_srli_epi16)(z[i], (int)(p * nb)) : z[i], mask);
        }
        float *st = sc + t;
        int64_t r = 0;
        for (; r + 4 <= M; r += 4) FN(rows_tile)(cv, NCV, qi, a, bias, st, total, M, D, r, 4, DIGITS(nb));
        if (M - r == 3) FN(rows_tile)(cv, NCV, qi, a, bias, st, total, M, D, r, 3, DIGITS(nb));
        if (M - r == 2) FN(rows_tile)(cv, NCV, qi, a, bias, st, total, M, D, r, 2, DIGITS(nb));
        if (M - r == 1) FN(rows_tile)(cv, NCV, qi, a, bias, st, total, M, D, r, 1, DIGITS(nb));
    }
    if (t < t0 + n) dots_scalar(kc, P, t, t0 + n - t, nb, qi, a, bias, sc, total, M, D, perm);
}

/* one function per path: nbits 2/4 (a constant where INT_SCORES calls it) and head_dim 64/128 get constant trip
 * counts (unrolled loops) */
PATH_TARGET AI void FN(dots)(const uint8_t *kc, int64_t P, int64_t t0, int64_t n, const int nb, const int8_t *qi,
                             const float *a, const float *bias, float *sc, int64_t total, int64_t M, int64_t D,
                             const int64_t *perm) {
    if (D == 128)
        FN(dots_nb)(kc, P, t0, n, nb, qi, a, bias, sc, total, M, 128, perm);
    else if (D == 64)
        FN(dots_nb)(kc, P, t0, n, nb, qi, a, bias, sc, total, M, 64, perm);
    else
        FN(dots_nb)(kc, P, t0, n, nb, qi, a, bias, sc, total, M, D, perm);
}

/* the 8 code vectors of unit u of 4 tokens' rows x[0..3] (each 128-bit lane: one 32-channel chunk of one token):
 * int32 lane = one channel, byte k = token k (see vchan for the channels) */
PATH_TARGET AI void FN(interleave4)(const VI *x, VI *out, const int nb) {
    const VI ab0 = MM(_unpacklo_epi8)(x[0], x[1]), cd0 = MM(_unpacklo_epi8)(x[2], x[3]);
    if (nb == 4) {
        const VI ab1 = MM(_unpackhi_epi8)(x[0], x[1]), cd1 = MM(_unpackhi_epi8)(x[2], x[3]);
        const VI y[4] = {MM(_unpacklo_epi16)(ab0, cd0), MM(_unpackhi_epi16)(ab0, cd0), MM(_unpacklo_epi16)(ab1, cd1),
                         MM(_unpackhi_epi16)(ab1, cd1)};
        const VI m = MM(_set1_epi8)(0x0F);
        for (int jj = 0; jj < 4; jj++) {
            out[2 * jj] = MMSI(_and_si)(y[jj], m);
            out[2 * jj + 1] = MMSI(_and_si)(MM(_srli_epi16)(y[jj], 4), m);
        }
    } else {
        const VI y[2] = {MM(_unpacklo_epi16)(ab0, cd0), MM(_unpackhi_epi16)(ab0, cd0)};
        const VI m = MM(_set1_epi8)(0x03);
        for (int jj = 0; jj < 2; jj++)
#pragma GCC unroll 8
            for (int k = 0; k < 4; k++) out[4 * jj + k] = MMSI(_and_si)(k ? MM(_srli_epi16)(y[jj], 2 * k) : y[jj], m);
    }
}

/* value_weights (_kivi_int.c) in this path's vectors for one row and block: pe = the block's nt probabilities pr
 * (0 past them) in the [quad][g][tt] layout, one permute a vector (pidx), pp = pe * uf, beta = max pp / 255,
 * pq = round(pp / beta) (nearest even); wacc[c % per] += pe * wf (the zero-point sums, reduced per group by the
 * caller). The probabilities are read in place (a copy's stores would not forward to the wider loads). */
PATH_TARGET AI void FN(weights)(const float *pr, const int64_t nt, const float *uf, const float *wf,
                                const int64_t NCH, const int64_t KG, const VI *pidx, uint8_t *pq, float *beta,
                                VF *wacc, const int64_t per) {
    VF pp[NCH], mx = MM(_setzero_ps)(), wl[4];
#pragma GCC unroll 8
    for (int k = 0; k < 4; k++) wl[k] = wacc[k];
    for (int64_t c0 = 0; c0 < NCH; c0 += per)
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) { /* chunk c0 + k adds to wl[k]: constant indices, registers */
            if (k >= per) break;
            const int64_t c = c0 + k;
            const int64_t pb = 4 * (c * LANES / (4 * KG)); /* the chunk's first token */
            /* KG 4 (head_dim 4 * G): a chunk is one quad's 4 probabilities in each 128-bit lane, a broadcast load
             * (a Llama-3-8B layer, 16k tokens, 1 thread, Zen 4: value sums 1.24-1.27 -> 1.12-1.17 ms, 4 bits) */
            const VF pe = KG == 4 && nt == VB ? FN(bcast4)(pr + pb) : FN(permps)(FN(ldn)(pr + pb, nt - pb), pidx[c]);
            pp[c] = MM(_mul_ps)(pe, MM(_loadu_ps)(uf + c * LANES));
            mx = MM(_max_ps)(mx, pp[c]);
            wl[k] = MM(_fmadd_ps)(pe, MM(_loadu_ps)(wf + c * LANES), wl[k]);
        }
#pragma GCC unroll 8
    for (int k = 0; k < 4; k++) wacc[k] = wl[k];
    const float m = FN(hmax)(mx);
    *beta = m / 255.0f;
    const VF inv = MM(_set1_ps)(m > 0.0f ? 255.0f / m : 0.0f);
    int64_t c = 0;
    for (; c + 4 <= NCH; c += 4) {
        VI x[4];
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) x[k] = MM(_cvtps_epi32)(MM(_mul_ps)(pp[c + k], inv));
        FN(pack4)(x, pq + c * LANES);
    }
    for (; c < NCH; c++) FN(store8)(pq + c * LANES, MM(_cvtps_epi32)(MM(_mul_ps)(pp[c], inv)));
}

/* accL[r] += beta[r] * (the block's weights pq[r] . codes) for rows r0 .. r0 + RT - 1: each code vector loaded once
 * for the RT rows, 8 * RT independent dpbusd chains (codes[sq][u][j], NSQ sets of 4 * TS tokens, NU units) */
PATH_TARGET AI void FN(vrows)(const VI *codes, const int64_t NSQ, const int64_t NU, const int64_t TS, const int64_t KG,
                              const int64_t *wbase, const VI *widx, const uint8_t *pq, const int64_t PQ,
                              const float *beta, float *accL, const int64_t NE, int64_t r0, const int RT) {
    for (int64_t u = 0; u < NU; u++) {
        VI ai[2][8];
#pragma GCC unroll 8
        for (int i = 0; i < RT; i++)
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) ai[i][j] = MMSI(_setzero_si)();
        int64_t sq = 0;
        for (; sq + 4 <= NSQ; sq += 4) { /* four sets of 4 tokens a dot4 */
            VI w4[2][4];
#pragma GCC unroll 8
            for (int i = 0; i < RT; i++)
#pragma GCC unroll 8
                for (int k = 0; k < 4; k++)
                    w4[i][k] = FN(permute)(
                        MMSI(_loadu_si)((const VI *)(pq + (r0 + i) * PQ + 4 * ((sq + k) * TS * KG + wbase[u]))), widx[u]);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                VI c[4];
#pragma GCC unroll 8
                for (int k = 0; k < 4; k++) c[k] = codes[((sq + k) * NU + u) * 8 + j];
#pragma GCC unroll 8
                for (int i = 0; i < RT; i++) ai[i][j] = FN(dot4)(ai[i][j], w4[i], c);
            }
        }
        for (; sq < NSQ; sq++) {
            VI w4[2];
#pragma GCC unroll 8
            for (int i = 0; i < RT; i++)
                w4[i] = FN(permute)(MMSI(_loadu_si)((const VI *)(pq + (r0 + i) * PQ + 4 * (sq * TS * KG + wbase[u]))), widx[u]);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const VI c = codes[(sq * NU + u) * 8 + j];
#pragma GCC unroll 8
                for (int i = 0; i < RT; i++) ai[i][j] = FN(dot)(ai[i][j], w4[i], c);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < RT; i++) {
            const VF b = MM(_set1_ps)(beta[r0 + i]);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                float *o = accL + (r0 + i) * NE + (u * 8 + j) * LANES;
                MM(_storeu_ps)(o, MM(_fmadd_ps)(MM(_cvtepi32_ps)(ai[i][j]), b, MM(_loadu_ps)(o)));
            }
        }
    }
}

/* the integer value sums of one segment (see kivi_int_value_sums and _kivi_int.c): blocks of VB tokens; each block's
 * codes unpacked once (NSQ sets of 4 * TS tokens, NU units of 8 vectors), then for every row its 8-bit weights and
 * one dpbusd per code vector with a weight vector per 4 tokens */
PATH_TARGET AI void FN(values_nb)(const uint8_t *vc, const void *vs, const void *vz, int bf16, int64_t tokens,
                                  const int64_t G, const float *p, int64_t total, int64_t M, const int64_t D,
                                  float *acc, const int nb) {
    const int64_t P = D * nb / 8, NLG = PATH_BITS / 128, NC = D / 32, KG = D / G, CB = 4 * nb;
    const int64_t TS = NC >= NLG ? 1 : NLG / NC, NU = NC >= NLG ? NC / NLG : 1, NSQ = VB / (4 * TS);
    const int64_t NE = NU * 8 * LANES;
    int64_t off[NU][NLG], wbase[NU], pos[NE];
    VI widx[NU];
    for (int64_t u = 0; u < NU; u++) {
        int32_t w[LANES];
        for (int64_t L = 0; L < NLG; L++) {
            const int64_t ts = TS > 1 ? L / NC : 0, ch = TS > 1 ? L % NC : u * NLG + L;
            off[u][L] = ts * 4 * P + ch * CB;
#pragma GCC unroll 8
            for (int i = 0; i < 4; i++) w[4 * L + i] = (int32_t)(ts * KG + ch * 32 / G);
        }
        wbase[u] = w[0];
        for (int l = 0; l < LANES; l++) w[l] -= (int32_t)wbase[u];
        widx[u] = MMSI(_loadu_si)((const VI *)w);
        for (int64_t j = 0; j < 8; j++)
            for (int64_t l = 0; l < LANES; l++) pos[(u * 8 + j) * LANES + l] = part_pos(vchan(u, j, l, NC, NLG, nb), D, nb);
    }
    /* the weights' layout: chunk c of LANES weights repeats the probabilities of tokens pb + pidx[c][l], pb its
     * first (see weights) */
    const int64_t NCH = VB * KG / LANES, per = 4 * KG > LANES ? 4 * KG / LANES : 1;
    VI pidx[NCH];
    for (int64_t c = 0; c < NCH; c++) {
        int32_t w[LANES];
        for (int64_t l = 0; l < LANES; l++) {
            const int64_t x = c * LANES + l;
            w[l] = (int32_t)(4 * (x / (4 * KG)) + x % 4 - 4 * (c * LANES / (4 * KG)));
        }
        pidx[c] = MMSI(_loadu_si)((const VI *)w);
    }
    const int64_t PQ = VB * KG + 64; /* bytes of a row's weights, padded for the 64-byte window loads */
    float accL[M * NE], wsum[M * KG], uf[VB * KG], wf[VB * KG], beta[M];
    uint8_t pq[M * PQ] __attribute__((aligned(64))), tail[VB * P];
    VI codes[NSQ][NU][8];
    VF wacc[M][4];
    memset(accL, 0, sizeof accL);
    memset(wsum, 0, sizeof wsum);
    memset(pq, 0, sizeof pq);
    for (int64_t r = 0; r < M; r++)
#pragma GCC unroll 8
        for (int k = 0; k < 4; k++) wacc[r][k] = MM(_setzero_ps)();
    for (int64_t t0 = 0; t0 < tokens; t0 += VB) {
        const int64_t nt = tokens - t0 < VB ? tokens - t0 : VB;
        const uint8_t *blk = vc + t0 * P;
        if (nt < VB) { /* the last block: zero codes past the segment's end */
            memset(tail, 0, sizeof tail);
            memcpy(tail, blk, nt * P);
            blk = tail;
        }
        /* PF_VALUES blocks ahead: their codes and per-token scales / zeros */
        for (int64_t x = 0; x < VB * P; x += 64) FN(prefetch_codes)((const char *)vc + (t0 + PF_VALUES * VB) * P + x, P);
        for (int64_t x = 0; x < VB * KG * (bf16 ? 2 : 4); x += 64) {
            __builtin_prefetch((const char *)vs + (t0 + PF_VALUES * VB) * KG * (bf16 ? 2 : 4) + x);
            __builtin_prefetch((const char *)vz + (t0 + PF_VALUES * VB) * KG * (bf16 ? 2 : 4) + x);
        }
        value_meta(vs, vz, bf16, t0, nt, KG, uf, wf);
        for (int64_t sq = 0; sq < NSQ; sq++)
            for (int64_t u = 0; u < NU; u++) {
                VI x[4];
#pragma GCC unroll 8
                for (int k = 0; k < 4; k++) {
                    const uint8_t *row = blk + (sq * 4 * TS + k) * P;
                    x[k] = nb == 4 && TS == 1 ? MMSI(_loadu_si)((const VI *)(row + u * NLG * CB))
                                              : FN(lanes)(row, off[u], nb);
                }
                FN(interleave4)(x, codes[sq][u], nb);
            }
        for (int64_t r = 0; r < M; r++) /* every row's weights first: their stores retire before the loads below */
            if (nt == VB) /* constant: the loads' lengths fold */
                FN(weights)(p + r * total + t0, VB, uf, wf, NCH, KG, pidx, pq + r * PQ, beta + r, wacc[r], per);
            else
                FN(weights)(p + r * total + t0, nt, uf, wf, NCH, KG, pidx, pq + r * PQ, beta + r, wacc[r], per);
        int64_t r = 0;
        for (; r + 2 <= M; r += 2) FN(vrows)(&codes[0][0][0], NSQ, NU, TS, KG, wbase, widx, pq, PQ, beta, accL, NE, r, 2);
        if (r < M) FN(vrows)(&codes[0][0][0], NSQ, NU, TS, KG, wbase, widx, pq, PQ, beta, accL, NE, r, 1);
    }
    for (int64_t r = 0; r < M; r++)
        for (int64_t k = 0; k < per; k++) {
            float w[LANES];
            MM(_storeu_ps)(w, wacc[r][k]);
            for (int64_t l = 0; l < LANES; l++) wsum[r * KG + (k * LANES + l) / 4 % KG] += w[l];
        }
    value_finish(accL, pos, NE, wsum, acc, M, D, G, nb);
}

/* one function per path: nbits 2/4 with head_dim 64 and 128 and group size 32 (KIVI's default) get constant trip
 * counts (unrolled loops, the weights' layout known); other shapes share a generic instance per nbits */
PATH_TARGET static void FN(values)(const uint8_t *vc, const void *vs, const void *vz, int bf16, int64_t tokens,
                                   int64_t G, const float *p, int64_t total, int64_t M, int64_t D, float *acc,
                                   int nb) {
    if (nb == 4 && D == 128 && G == 32)
        FN(values_nb)(vc, vs, vz, bf16, tokens, 32, p, total, M, 128, acc, 4);
    else if (nb == 2 && D == 128 && G == 32)
        FN(values_nb)(vc, vs, vz, bf16, tokens, 32, p, total, M, 128, acc, 2);
    else if (nb == 4 && D == 64 && G == 32)
        FN(values_nb)(vc, vs, vz, bf16, tokens, 32, p, total, M, 64, acc, 4);
    else if (nb == 2 && D == 64 && G == 32)
        FN(values_nb)(vc, vs, vz, bf16, tokens, 32, p, total, M, 64, acc, 2);
    else if (nb == 4)
        FN(values_nb)(vc, vs, vz, bf16, tokens, G, p, total, M, D, acc, 4);
    else
        FN(values_nb)(vc, vs, vz, bf16, tokens, G, p, total, M, D, acc, 2);
}

#undef UNIT
#undef LANES
#undef VF
#undef VI
#undef MMSI
#undef MM
#undef FN
#undef CAT
#undef CAT_
