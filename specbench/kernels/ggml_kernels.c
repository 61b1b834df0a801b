/* Linear layers over weights kept in ggml's block formats (model.backend=ggml).
 *
 * y[r, n] = sum_k x[r, k] * W[n, k] (+ bias[n]) for r < M rows, where W is stored as
 *   Q4_1: per block of 32 weights a nibble q (0..15), a scale d and a minimum m: w = d*q + m
 *   Q8_0: per block of 32 weights an int8 q and a scale d:                      w = d*q
 *   F32:  the float32 weights themselves (any model; only the batch invariance is gained)
 * The weights are dequantized in registers exactly as gguf-py does (a float multiply, then a
 * float add, each rounded: no fused multiply-add), so they equal the model's float32 parameters
 * bit for bit; the Python side only uses a layer here after checking that.
 *
 * Batch invariance, on purpose: every output y[r, n] is computed by the same sequence of
 * operations whatever M is and whichever other rows share the call (one vector accumulator per
 * (r, n), fused multiply-adds half-block after half-block, then one fixed horizontal sum). A forward over k tokens therefore returns, row for row, the bits k one-token
 * forwards return, so greedy speculative decoding reproduces AR's tokens exactly.
 *
 * Bandwidth: Q4_1 carries 0.625 bytes per weight (float32: 4), Q8_0 1.0625; the one-row path
 * reads a striped copy with float32 scales (0.75 and 1.125, see STRIPE_TILE). The rows of W are
 * read once per call whatever M is (the x rows of one call are processed against a block of W
 * rows while those sit in L1), so a k-token forward costs little more memory traffic than a
 * one-token one; what grows with k is the multiply-adds, and from about two rows on those
 * dominate (bench/roofline.py prints this core's floors).
 *
 * Threads: OpenMP over output rows (the same libgomp torch loads; it shares its soname).
 */
#include <stdint.h>
#include <string.h>

#define BLOCK 32

#if defined(__AVX512F__)
#include <immintrin.h>

typedef __m512 vec;
static inline vec vzero(void) { return _mm512_setzero_ps(); }
static inline vec vload(const float *p) { return _mm512_loadu_ps(p); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vsum(vec a) { return _mm512_reduce_add_ps(a); }

static inline void dequant_q4_1(const uint8_t *q, float d, float m, vec *lo, vec *hi) {
    /* the block's 16 possible weights d*q + m (q = 0..15) fill one register; each weight is
     * then a lookup (vpermps reads only the low 4 bits of each index): same bits as computing
     * d*q + m per weight, fewer instructions */
    const vec iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    vec table = _mm512_fmadd_ps(iota, _mm512_set1_ps(d), _mm512_set1_ps(m)); /* d*q is exact in float32 (11-bit d, 4-bit q): one rounding either way */
    __m128i b = _mm_loadu_si128((const __m128i *)q);
    *lo = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(b), table);
    *hi = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_srli_epi16(b, 4)), table);
}

static inline void dequant_q8_0(const int8_t *q, float d, vec *lo, vec *hi) {
    vec vd = _mm512_set1_ps(d);
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), vd);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)))), vd);
}

#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 (e.g. AMD Zen 3, most Intel client CPUs): 16 lanes as two 8-lane registers. Every lane
 * does the portable build's operations (a multiply then an add to dequantize, fused multiply-
 * adds, the same pairwise horizontal sum), so this build returns the portable build's bits. */
#include <immintrin.h>

typedef struct { __m256 a, b; } vec; /* lanes 0-7, 8-15 */
static inline vec vzero(void) { vec r = {_mm256_setzero_ps(), _mm256_setzero_ps()}; return r; }
static inline vec vload(const float *p) { vec r = {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; return r; }
static inline vec vfma(vec a, vec b, vec c) {
    vec r = {_mm256_fmadd_ps(a.a, b.a, c.a), _mm256_fmadd_ps(a.b, b.b, c.b)};
    return r;
}
static inline float vsum(vec a) {
    /* the portable order: s[i] += s[i+8], then +4, +2, +1 */
    const __m256 s8 = _mm256_add_ps(a.a, a.b);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
static inline __m256 q_to_ps(__m128i q8) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q8)); }
static inline void dequant_q4_1(const uint8_t *q, float d, float m, vec *lo, vec *hi) {
    const __m128i b = _mm_loadu_si128((const __m128i *)q), mask = _mm_set1_epi8(0x0F);
    const __m128i l = _mm_and_si128(b, mask), h = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    /* a multiply, then an add (intrinsics are never contracted): gguf-py's float32 weights */
    lo->a = _mm256_add_ps(_mm256_mul_ps(q_to_ps(l), vd), vm);
    lo->b = _mm256_add_ps(_mm256_mul_ps(q_to_ps(_mm_srli_si128(l, 8)), vd), vm);
    hi->a = _mm256_add_ps(_mm256_mul_ps(q_to_ps(h), vd), vm);
    hi->b = _mm256_add_ps(_mm256_mul_ps(q_to_ps(_mm_srli_si128(h, 8)), vd), vm);
}
static inline __m256 q8_to_ps(const int8_t *q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}
static inline void dequant_q8_0(const int8_t *q, float d, vec *lo, vec *hi) {
    const __m256 vd = _mm256_set1_ps(d);
    lo->a = _mm256_mul_ps(q8_to_ps(q), vd);
    lo->b = _mm256_mul_ps(q8_to_ps(q + 8), vd);
    hi->a = _mm256_mul_ps(q8_to_ps(q + 16), vd);
    hi->b = _mm256_mul_ps(q8_to_ps(q + 24), vd);
}

#else /* portable: 16 float lanes as a struct; same operations, same order within this build */
typedef struct { float v[16]; } vec;
static inline vec vzero(void) { vec r; memset(&r, 0, sizeof r); return r; }
static inline vec vload(const float *p) { vec r; memcpy(r.v, p, sizeof r.v); return r; }
static inline vec vfma(vec a, vec b, vec c) {
    for (int i = 0; i < 16; i++) c.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]);
    return c;
}
static inline float vsum(vec a) {
    float s[16];
    for (int i = 0; i < 16; i++) s[i] = a.v[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) s[i] += s[i + w];
    return s[0];
}
static inline void dequant_q4_1(const uint8_t *q, float d, float m, vec *lo, vec *hi) {
    for (int i = 0; i < 16; i++) {
        lo->v[i] = (float)(q[i] & 0x0F) * d + m; /* -ffp-contract=off: a multiply, then an add */
        hi->v[i] = (float)(q[i] >> 4) * d + m;
    }
}
static inline void dequant_q8_0(const int8_t *q, float d, vec *lo, vec *hi) {
    for (int i = 0; i < 16; i++) {
        lo->v[i] = (float)q[i] * d;
        hi->v[i] = (float)q[i + 16] * d;
    }
}
#endif

/* One tile: NB rows of W (starting at n) against R rows of x (starting at x). NB and R are
 * compile-time constants at every call site, so the accumulators live in registers. One
 * accumulator per output: two fused multiply-adds per block (its first half, then its second),
 * the same sequence in every tile shape. */
#define TILE(NAME, NB, R, QTYPE, QB, DEQ)                                                           \
    static inline __attribute__((always_inline)) void NAME(                                     \
        const float *x, int ldx, int nb, const QTYPE *qs, const float *d, const float *m,      \
        const float *bias, float *y, int ldy) {                                                 \
        vec acc[NB][R];                                                                         \
        for (int j = 0; j < NB; j++)                                                            \
            for (int r = 0; r < R; r++) acc[j][r] = vzero();                                    \
        for (int b = 0; b < nb; b++) {                                                          \
            vec wl[NB], wh[NB];                                                                 \
            /* multi-row tiles: fetch the next tile's rows (it reads the same block next) */    \
            if (R > 1)                                                                          \
                for (int j = NB; j < 2 * NB; j++) {                                             \
                    __builtin_prefetch(qs + ((long)j * nb + b) * QB);                           \
                    if (d) __builtin_prefetch(d + (long)j * nb + b);                            \
                    if (m) __builtin_prefetch(m + (long)j * nb + b);                            \
                }                                                                               \
            for (int j = 0; j < NB; j++) DEQ;                                                   \
            for (int r = 0; r < R; r++) {                                                       \
                /* each x vector is loaded once and used against every W row of the tile */     \
                const float *xp = x + (long)r * ldx + (long)b * BLOCK;                          \
                const vec xl = vload(xp), xh = vload(xp + 16);                                  \
                for (int j = 0; j < NB; j++) acc[j][r] = vfma(wh[j], xh, vfma(wl[j], xl, acc[j][r])); \
            }                                                                                   \
        }                                                                                       \
        for (int j = 0; j < NB; j++)                                                            \
            for (int r = 0; r < R; r++)                                                         \
                y[(long)r * ldy + j] = vsum(acc[j][r]) + (bias ? bias[j] : 0.0f);               \
    }

#define DEQ_Q4 dequant_q4_1(qs + ((long)j * nb + b) * 16, d[(long)j * nb + b], m[(long)j * nb + b], &wl[j], &wh[j])
#define DEQ_Q8 dequant_q8_0(qs + ((long)j * nb + b) * 32, d[(long)j * nb + b], &wl[j], &wh[j])
#define DEQ_F32 (wl[j] = vload(qs + ((long)j * nb + b) * 32), wh[j] = vload(qs + ((long)j * nb + b) * 32 + 16))

#define TILES(P, QTYPE, QB, DEQ)        \
    TILE(P##_8x1, 8, 1, QTYPE, QB, DEQ) \
    TILE(P##_4x1, 4, 1, QTYPE, QB, DEQ) \
    TILE(P##_4x2, 4, 2, QTYPE, QB, DEQ) \
    TILE(P##_4x3, 4, 3, QTYPE, QB, DEQ) \
    TILE(P##_4x4, 4, 4, QTYPE, QB, DEQ) \
    TILE(P##_2x5, 2, 5, QTYPE, QB, DEQ) \
    TILE(P##_2x6, 2, 6, QTYPE, QB, DEQ) \
    TILE(P##_2x7, 2, 7, QTYPE, QB, DEQ) \
    TILE(P##_2x8, 2, 8, QTYPE, QB, DEQ) \
    TILE(P##_1x5, 1, 5, QTYPE, QB, DEQ) \
    TILE(P##_1x6, 1, 6, QTYPE, QB, DEQ) \
    TILE(P##_1x7, 1, 7, QTYPE, QB, DEQ) \
    TILE(P##_1x8, 1, 8, QTYPE, QB, DEQ) \
    TILE(P##_1x1, 1, 1, QTYPE, QB, DEQ) \
    TILE(P##_1x2, 1, 2, QTYPE, QB, DEQ) \
    TILE(P##_1x3, 1, 3, QTYPE, QB, DEQ) \
    TILE(P##_1x4, 1, 4, QTYPE, QB, DEQ)

/* bytes of quantized data per block row entry */
#define Q4_BYTES 16
#define Q8_BYTES 32
#define F32_VALUES 32

TILES(q4, uint8_t, Q4_BYTES, DEQ_Q4)
TILES(q8, int8_t, Q8_BYTES, DEQ_Q8)
TILES(f32, float, F32_VALUES, DEQ_F32)

/* The one-row (decode) path reads a second copy of the weight, "stripes": per group of 8 output
 * rows, block b of all 8 rows side by side (records {float d, float m, 16 nibble bytes} for
 * Q4_1, {float d, 32 int8} for Q8_0). A decode step then reads one sequential stream per group
 * instead of 24 (qs, d, m of 8 rows), which the hardware prefetcher keeps up with: measured on
 * an AMD EPYC (Zen 4), one forward's 211 linear layers at one row: 16.4 -> 9.8 ms (bench/
 * ggml_kernel.py). The values and the operations are those of the 8x1 tile, so the bits are too. */
#define Q4_REC 24
#define Q8_REC 36
#define STRIPE_TILE(NAME, REC, DEQ)                                                             \
    static inline __attribute__((always_inline)) void NAME(                                     \
        const float *x, int nb, const uint8_t *s, const float *bias, float *y) {                \
        vec acc[8];                                                                             \
        for (int j = 0; j < 8; j++) acc[j] = vzero();                                           \
        for (int b = 0; b < nb; b++) {                                                          \
            vec wl[8], wh[8];                                                                   \
            for (int j = 0; j < 8; j++) {                                                       \
                const uint8_t *rec = s + ((long)b * 8 + j) * REC;                               \
                DEQ;                                                                            \
            }                                                                                   \
            const vec xl = vload(x + (long)b * BLOCK), xh = vload(x + (long)b * BLOCK + 16);    \
            for (int j = 0; j < 8; j++) acc[j] = vfma(wh[j], xh, vfma(wl[j], xl, acc[j]));      \
        }                                                                                       \
        for (int j = 0; j < 8; j++) y[j] = vsum(acc[j]) + (bias ? bias[j] : 0.0f);               \
    }
STRIPE_TILE(q4_stripe, Q4_REC, dequant_q4_1(rec + 8, ((const float *)rec)[0], ((const float *)rec)[1], &wl[j], &wh[j]))
STRIPE_TILE(q8_stripe, Q8_REC, dequant_q8_0((const int8_t *)(rec + 4), ((const float *)rec)[0], &wl[j], &wh[j]))
/* float32 weights keep no stripes (4 bytes a weight: a copy would cost more than it saves) */
#define f32_stripe(x, nb, s, bias, y) ((void)0)
#define F32_REC 0


/* One call: output rows in groups of GROUP (the unit of work per thread); inside a group, one
 * row of x: 8 rows of W at once; else 4 rows of W (1 at a time for a tail) against chunks of up
 * to RMAX rows of x, so the x rows a tile reads stay in L1 and W's rows are read once from
 * memory. */
#define GROUP 8
#define LINEAR(NAME, P, QTYPE, QB, REC, RMAX)                                                                \
    void NAME(const float *x, int M, int K, const QTYPE *qs, const float *d, const float *m, int N,     \
              const float *bias, float *y, const uint8_t *stripes, int nthreads) {                        \
        const int nb = K / BLOCK;                                                                         \
        const int groups = (N + GROUP - 1) / GROUP;                                                       \
        _Pragma("omp parallel for schedule(static) num_threads(nthreads) if(nthreads > 1)")              \
        for (int g = 0; g < groups; g++) {                                                                \
            const int n0 = GROUP * g, n1 = n0 + GROUP < N ? n0 + GROUP : N;                               \
            if (REC > 0 && M == 1 && stripes && n1 - n0 == GROUP) {                                                  \
                P##_stripe(x, nb, stripes + (long)n0 * nb * REC, bias ? bias + n0 : 0, y + n0);           \
                continue;                                                                                 \
            }                                                                                             \
            for (int n = n0; n < n1;) {                                                                   \
                const int nbk = M == 1 && n1 - n == 8 ? 8 : n1 - n >= 4 ? 4 : 1;                          \
                const QTYPE *q = qs + (long)n * nb * QB;                                                  \
                const float *dn = d ? d + (long)n * nb : 0, *mn = m ? m + (long)n * nb : 0;              \
                const float *bn = bias ? bias + n : 0;                                                    \
                for (int r0 = 0; r0 < M; r0 += RMAX) {                                                    \
                    const float *xr = x + (long)r0 * K;                                                   \
                    float *yr = y + (long)r0 * N + n;                                                     \
                    const int R = M - r0 < RMAX ? M - r0 : RMAX;                                          \
                    if (nbk == 8) P##_8x1(xr, K, nb, q, dn, mn, bn, yr, N);                               \
                    else if (nbk == 4 && R > 4) {                                                         \
                        for (int h = 0; h < 4; h += 2) {                                                  \
                            const QTYPE *qh = q + (long)h * nb * QB;                                      \
                            const float *dh = dn ? dn + (long)h * nb : 0, *mh = mn ? mn + (long)h * nb : 0; \
                            const float *bh = bn ? bn + h : 0;                                            \
                            if (R == 5) P##_2x5(xr, K, nb, qh, dh, mh, bh, yr + h, N);                    \
                            else if (R == 6) P##_2x6(xr, K, nb, qh, dh, mh, bh, yr + h, N);               \
                            else if (R == 7) P##_2x7(xr, K, nb, qh, dh, mh, bh, yr + h, N);               \
                            else P##_2x8(xr, K, nb, qh, dh, mh, bh, yr + h, N);                           \
                        }                                                                                 \
                    } else if (nbk == 4) {                                                                \
                        if (R == 1) P##_4x1(xr, K, nb, q, dn, mn, bn, yr, N);                             \
                        else if (R == 2) P##_4x2(xr, K, nb, q, dn, mn, bn, yr, N);                        \
                        else if (R == 3) P##_4x3(xr, K, nb, q, dn, mn, bn, yr, N);                        \
                        else P##_4x4(xr, K, nb, q, dn, mn, bn, yr, N);                                    \
                    } else {                                                                              \
                        if (R == 1) P##_1x1(xr, K, nb, q, dn, mn, bn, yr, N);                             \
                        else if (R == 2) P##_1x2(xr, K, nb, q, dn, mn, bn, yr, N);                        \
                        else if (R == 3) P##_1x3(xr, K, nb, q, dn, mn, bn, yr, N);                        \
                        else if (R == 4) P##_1x4(xr, K, nb, q, dn, mn, bn, yr, N);                        \
                        else if (R == 5) P##_1x5(xr, K, nb, q, dn, mn, bn, yr, N);                        \
                        else if (R == 6) P##_1x6(xr, K, nb, q, dn, mn, bn, yr, N);                        \
                        else if (R == 7) P##_1x7(xr, K, nb, q, dn, mn, bn, yr, N);                        \
                        else P##_1x8(xr, K, nb, q, dn, mn, bn, yr, N);                                    \
                    }                                                                                     \
                }                                                                                         \
                n += nbk;                                                                                 \
            }                                                                                             \
        }                                                                                                 \
    }

/* quantized formats take up to 8 rows of x per tile (2 rows of W): each block is dequantized
 * once for all of them; float32 takes 4 (4 rows of W): nothing to dequantize, fewer loads per
 * multiply-add (measured on the embedded shapes, results/bench/backends.md) */
LINEAR(ggml_linear_q4_1, q4, uint8_t, Q4_BYTES, Q4_REC, 8)
LINEAR(ggml_linear_q8_0, q8, int8_t, Q8_BYTES, Q8_REC, 8)
LINEAR(ggml_linear_f32, f32, float, F32_VALUES, F32_REC, 4)

/* which path this build compiled: 2 AVX-512, 1 AVX2, 0 portable */
int ggml_kernels_path(void) {
#if defined(__AVX512F__)
    return 2;
#elif defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

int ggml_kernels_avx512(void) {
#if defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}
