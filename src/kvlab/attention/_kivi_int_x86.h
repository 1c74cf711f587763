/* The AVX512 and AVX2 paths of _kivi_int.c's integer kernels (key-score dot products, value sums), written once.
 * _kivi_int.c includes this file once per path, having defined
 *   PATH         the path's name (avx512, avx2): every function here is <name>_<PATH> (dots_avx512, values_avx2)
 *   PATH_BITS    its vector width in bits (512, 256): __m<bits>i vectors, _mm<bits>_ intrinsics
 *   PATH_TARGET  its __attribute__((target))
 * and the path's own instructions, where the two differ: unpack_<PATH> (UNIT codes, unit-part-major: see chan),
 * cross_<PATH> (the lane-crossing end of reduce), hsum_<PATH> (the sum of a vector's int32 lanes), dot_<PATH>
 * (acc + the u8 x s8 byte products summed per 4 bytes: dpbusd / maddubs + madd), permute_<PATH> (a's int32 lanes
 * picked by idx), wmask_<PATH> / wload_<PATH> (a masked load of a block's first KG int32 weights).
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

/* lane t of the result = the sum of the LANES lanes of a[t]: pairwise adds inside 128-bit lanes, then cross_<PATH> */
PATH_TARGET AI VI FN(reduce)(const VI *a) {
    VI b[LANES / 2], c[LANES / 4];
    for (int k = 0; k < LANES / 2; k++)
        b[k] = MM(_add_epi32)(MM(_unpacklo_epi32)(a[2 * k], a[2 * k + 1]), MM(_unpackhi_epi32)(a[2 * k], a[2 * k + 1]));
    for (int k = 0; k < LANES / 4; k++)
        c[k] = MM(_add_epi32)(MM(_unpacklo_epi64)(b[2 * k], b[2 * k + 1]), MM(_unpackhi_epi64)(b[2 * k], b[2 * k + 1]));
    return FN(cross)(c);
}

/* DIGIT * (qi[r] . codes) + (q2[r] . codes) as int32 lanes: the two int8 digits of query row r (qi, q2) against one
 * token's NU unpacked code vectors */
PATH_TARGET AI VI FN(two_digit_dot)(const VI *codes, const int8_t *qi, const int8_t *q2, const int64_t NU) {
    VI s = MMSI(_setzero_si)(), s2 = s;
    for (int64_t u = 0; u < NU; u++) {
        s = FN(dot)(s, codes[u], MMSI(_loadu_si)((const VI *)(qi + UNIT * u)));
        s2 = FN(dot)(s2, codes[u], MMSI(_loadu_si)((const VI *)(q2 + UNIT * u)));
    }
    return MM(_add_epi32)(MM(_mullo_epi32)(s, MM(_set1_epi32)(DIGIT)), s2);
}

/* sc[r*total + t] = a[r] * (qi[r] . codes[t]) + bias[r] for tokens [t0, t0 + n) of rows of P packed bytes */
PATH_TARGET AI void FN(dots_nb)(const uint8_t *kc, int64_t P, int64_t t0, int64_t n, const int nb, const int8_t *qi,
                                const float *a, const float *bias, float *sc, int64_t total, int64_t M,
                                const int64_t D) {
    const int64_t NU = D / UNIT, UB = UNIT * nb / 8;
    VI buf[LANES][NU], acc[LANES];
    int64_t t = t0;
    for (; t + LANES <= t0 + n; t += LANES) {
        for (int tt = 0; tt < LANES; tt++)
            for (int64_t u = 0; u < NU; u++) buf[tt][u] = FN(unpack)(kc + (t + tt) * P + u * UB, nb);
        for (int64_t r = 0; r < M; r++) {
            for (int tt = 0; tt < LANES; tt++) acc[tt] = FN(two_digit_dot)(buf[tt], qi + r * D, qi + (M + r) * D, NU);
            const VF f = MM(_fmadd_ps)(MM(_cvtepi32_ps)(FN(reduce)(acc)), MM(_set1_ps)(a[r]), MM(_set1_ps)(bias[r]));
            MM(_storeu_ps)(sc + r * total + t, f);
        }
    }
    for (; t < t0 + n; t++) {
        for (int64_t u = 0; u < NU; u++) buf[0][u] = FN(unpack)(kc + t * P + u * UB, nb);
        for (int64_t r = 0; r < M; r++) {
            const VI s = FN(two_digit_dot)(buf[0], qi + r * D, qi + (M + r) * D, NU);
            sc[r * total + t] = a[r] * (float)FN(hsum)(s) + bias[r];
        }
    }
}

/* one function per path: nbits 2/4 (a constant where INT_SCORES calls it) and head_dim 64/128 get constant trip
 * counts (unrolled loops) */
PATH_TARGET AI void FN(dots)(const uint8_t *kc, int64_t P, int64_t t0, int64_t n, const int nb, const int8_t *qi,
                             const float *a, const float *bias, float *sc, int64_t total, int64_t M, int64_t D) {
    if (D == 128)
        FN(dots_nb)(kc, P, t0, n, nb, qi, a, bias, sc, total, M, 128);
    else if (D == 64)
        FN(dots_nb)(kc, P, t0, n, nb, qi, a, bias, sc, total, M, 64);
    else
        FN(dots_nb)(kc, P, t0, n, nb, qi, a, bias, sc, total, M, D);
}

/* the integer value sums of one segment (see kivi_int_value_sums), LANES channels per accumulator vector */
PATH_TARGET AI void FN(values_nb)(const uint8_t *vc, const void *vs, const void *vz, int bf16, int64_t tokens,
                                  int64_t G, const float *p, int64_t total, int64_t M, const int64_t D, float *acc,
                                  const int nb) {
    const int64_t P = D * nb / 8, UB = UNIT * nb / 8, NU = D / UNIT, NV = D / LANES, KG = D / G;
    float accL[M * D], wsum[M * KG], uf[VB * KG], wf[VB * KG], beta;
    uint8_t pq[(VB / 4) * KG * 4] __attribute__((aligned(UNIT)));
    VI codes[VB / 4][NV], gidx[NV];
    for (int64_t v = 0; v < NV; v++) {
        int32_t g[LANES];
        for (int l = 0; l < LANES; l++) g[l] = (int32_t)(vlane_chan(v, l, LANES, nb) / G);
        gidx[v] = MMSI(_loadu_si)((const VI *)g);
    }
    memset(accL, 0, sizeof accL);
    memset(wsum, 0, sizeof wsum);
    const FN(wmask_t) km = FN(wmask)(KG);
    for (int64_t t0 = 0; t0 < tokens; t0 += VB) {
        const int64_t nt = tokens - t0 < VB ? tokens - t0 : VB, nq = (nt + 3) / 4;
        value_meta(vs, vz, bf16, t0, nt, KG, uf, wf);
        for (int64_t qd = 0; qd < nq; qd++) /* 4 tokens' codes, interleaved: lane = channel, byte = token */
            for (int64_t u = 0; u < NU; u++) {
                VI x[4];
                for (int tt = 0; tt < 4; tt++) {
                    const int64_t t = t0 + 4 * qd + tt;
                    x[tt] = t < tokens ? FN(unpack)(vc + t * P + u * UB, nb) : MMSI(_setzero_si)();
                }
                const VI ab0 = MM(_unpacklo_epi8)(x[0], x[1]), ab1 = MM(_unpackhi_epi8)(x[0], x[1]);
                const VI cd0 = MM(_unpacklo_epi8)(x[2], x[3]), cd1 = MM(_unpackhi_epi8)(x[2], x[3]);
                codes[qd][4 * u + 0] = MM(_unpacklo_epi16)(ab0, cd0);
                codes[qd][4 * u + 1] = MM(_unpackhi_epi16)(ab0, cd0);
                codes[qd][4 * u + 2] = MM(_unpacklo_epi16)(ab1, cd1);
                codes[qd][4 * u + 3] = MM(_unpackhi_epi16)(ab1, cd1);
            }
        for (int64_t r = 0; r < M; r++) {
            value_weights(p + r * total + t0, uf, wf, nt, KG, pq, &beta, wsum + r * KG);
            VI ai[NV];
            for (int64_t v = 0; v < NV; v++) ai[v] = MMSI(_setzero_si)();
            for (int64_t qd = 0; qd < nq; qd++) {
                const VI w4 = FN(wload)(pq + qd * KG * 4, km);
                for (int64_t v = 0; v < NV; v++) ai[v] = FN(dot)(ai[v], FN(permute)(w4, gidx[v]), codes[qd][v]);
            }
            const VF b = MM(_set1_ps)(beta);
            for (int64_t v = 0; v < NV; v++) {
                float *o = accL + r * D + LANES * v;
                MM(_storeu_ps)(o, MM(_fmadd_ps)(MM(_cvtepi32_ps)(ai[v]), b, MM(_loadu_ps)(o)));
            }
        }
    }
    value_finish(accL, wsum, acc, M, D, G, LANES, nb);
}

/* one function per path: nbits 2/4 with head_dim 128 get constant trip counts (unrolled loops) */
PATH_TARGET static void FN(values)(const uint8_t *vc, const void *vs, const void *vz, int bf16, int64_t tokens,
                                   int64_t G, const float *p, int64_t total, int64_t M, int64_t D, float *acc,
                                   int nb) {
    if (nb == 4 && D == 128)
        FN(values_nb)(vc, vs, vz, bf16, tokens, G, p, total, M, 128, acc, 4);
    else if (nb == 2 && D == 128)
        FN(values_nb)(vc, vs, vz, bf16, tokens, G, p, total, M, 128, acc, 2);
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
