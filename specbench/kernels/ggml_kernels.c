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
#include <stdlib.h>
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
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define AVX2_PATH 1
#else
#define AVX2_PATH 0
#endif
#if !AVX2_PATH /* the AVX2 build has its own, below */
STRIPE_TILE(q4_stripe, Q4_REC, dequant_q4_1(rec + 8, ((const float *)rec)[0], ((const float *)rec)[1], &wl[j], &wh[j]))
STRIPE_TILE(q8_stripe, Q8_REC, dequant_q8_0((const int8_t *)(rec + 4), ((const float *)rec)[0], &wl[j], &wh[j]))
#endif
/* float32 weights keep no stripes (4 bytes a weight: a copy would cost more than it saves) */
#define f32_stripe(x, nb, s, bias, y) ((void)0)
#define F32_REC 0


#define GROUP 8 /* rows of W per unit of work (per thread) */

#if AVX2_PATH
/* AVX2 has 16 ymm registers: the tiles above (two registers per accumulator, 2*NB registers of
 * dequantized weights) spill. The 16 lanes stay independent until vsum, so this build runs each
 * lane half (lanes 0-7, then 8-15) as a pass of its own: one register per accumulator, each
 * lane's operations unchanged (and so the bits). Per block and W row a pass dequantizes its
 * 8 + 8 weights (w = d*q + m as one fused multiply-add: d*q is exact) and uses them at once
 * against R rows of x, read from L1 as memory operands (Zen 3 and recent Intel cores load 2-3
 * vectors a cycle), so NB*R <= 12 accumulators and 2 weights fit in the registers. The rows of
 * W are read in order, which the hardware prefetcher follows (software prefetches measured slower). */
static inline void hdeq_q4_1(const uint8_t *q, const float *d, const float *m, int h, __m256 *lo, __m256 *hi) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * h)));
    const __m256 vd = _mm256_broadcast_ss(d), vm = _mm256_broadcast_ss(m);
    *lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15))), vd, vm);
    *hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), vd, vm);
}
static inline void hdeq_q8_0(const int8_t *q, const float *d, int h, __m256 *lo, __m256 *hi) {
    const __m256 vd = _mm256_broadcast_ss(d);
    *lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * h)))), vd);
    *hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 16 + 8 * h)))), vd);
}
static inline void hdeq_f32(const float *w, int h, __m256 *lo, __m256 *hi) {
    *lo = _mm256_loadu_ps(w + 8 * h);
    *hi = _mm256_loadu_ps(w + 16 + 8 * h);
}
static inline float vsum2(__m256 a, __m256 b) { vec v = {a, b}; return vsum(v); }

/* the one-row stripes, lane half after lane half (8 accumulators, not 16 + 16 weights) */
#define HSTRIPE(NAME, REC, HDEQ_S)                                                                  \
    static inline __attribute__((always_inline)) void NAME(                                     \
        const float *x, int nb, const uint8_t *s, const float *bias, float *y) {                \
        __m256 res[2][8];                                                                       \
        for (int h = 0; h < 2; h++) {                                                           \
            __m256 acc[8];                                                                      \
            for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();                           \
            for (int b = 0; b < nb; b++) {                                                      \
                const __m256 xl = _mm256_loadu_ps(x + (long)b * BLOCK + 8 * h);                 \
                const __m256 xh = _mm256_loadu_ps(x + (long)b * BLOCK + 16 + 8 * h);            \
                for (int j = 0; j < 8; j++) {                                                   \
                    const uint8_t *rec = s + ((long)b * 8 + j) * REC;                           \
                    __m256 wl, wh;                                                              \
                    HDEQ_S;                                                                     \
                    acc[j] = _mm256_fmadd_ps(wh, xh, _mm256_fmadd_ps(wl, xl, acc[j]));          \
                }                                                                               \
            }                                                                                   \
            for (int j = 0; j < 8; j++) res[h][j] = acc[j];                                     \
        }                                                                                       \
        for (int j = 0; j < 8; j++) y[j] = vsum2(res[0][j], res[1][j]) + (bias ? bias[j] : 0.0f); \
    }
HSTRIPE(q4_stripe, Q4_REC, hdeq_q4_1(rec + 8, (const float *)rec, (const float *)rec + 1, h, &wl, &wh))
HSTRIPE(q8_stripe, Q8_REC, hdeq_q8_0((const int8_t *)(rec + 4), (const float *)rec, h, &wl, &wh))

/* x is first copied (per call, once) into chunks of up to HRMAX rows, each laid out
 * [half][block][lo, hi][row][8 floats], so that a pass reads it sequentially at constant offsets
 * from one pointer (row pointers would take more general registers than x86 has) */
#define HRMAX 12
static inline int chunk_rows(int M, int r0, int c) { /* near-equal chunks: 16 rows -> 8 + 8 */
    const int chunks = (M + HRMAX - 1) / HRMAX;
    return (M - r0) / (chunks - c);
}
static float *pack_x(const float *x, int M, int K) {
    static _Thread_local float *buf;
    static _Thread_local size_t cap;
    const size_t need = ((size_t)M * K + 7) & ~(size_t)7;
    if (need > cap) {
        free(buf);
        buf = aligned_alloc(32, need * sizeof(float));
        cap = buf ? need : 0;
        if (!buf) return 0; /* the caller falls back to the tiles above */
    }
    const int nb = K / BLOCK;
    for (int c = 0, r0 = 0; r0 < M; r0 += chunk_rows(M, r0, c), c++) {
        const int R = chunk_rows(M, r0, c);
        float *o = buf + (long)r0 * K;
        for (int h = 0; h < 2; h++)
            for (int b = 0; b < nb; b++)
                for (int p = 0; p < 2; p++)
                    for (int r = 0; r < R; r++, o += 8)
                        memcpy(o, x + (long)(r0 + r) * K + b * BLOCK + p * 16 + h * 8, 8 * sizeof(float));
    }
    return buf;
}

/* lane half h of NB rows of W x R rows of x; xh: the packed chunk's half h; the accumulators go
 * to accm[j*R + r] until the other half is done (a stored and reloaded float keeps its bits) */
#define HTILE(NAME, NB, R, QTYPE, QB, HDEQ)                                                         \
    static inline __attribute__((always_inline)) void NAME(                                     \
        const float *xh, int nb, const QTYPE *qs, const float *d, const float *m, int h,       \
        __m256 *accm) {                                                                         \
        __m256 acc[NB][R];                                                                      \
        for (int j = 0; j < NB; j++)                                                            \
            for (int r = 0; r < R; r++) acc[j][r] = _mm256_setzero_ps();                    \
        for (int b = 0; b < nb; b++) {                                                          \
            const float *xb = xh + (long)b * 16 * R;                                            \
            for (int j = 0; j < NB; j++) {                                                      \
                const long i = (long)j * nb + b;                                                \
                __m256 wl, wh;                                                                  \
                HDEQ;                                                                           \
                for (int r = 0; r < R; r++) acc[j][r] = _mm256_fmadd_ps(wl, _mm256_load_ps(xb + 8 * r), acc[j][r]); \
                for (int r = 0; r < R; r++) acc[j][r] = _mm256_fmadd_ps(wh, _mm256_load_ps(xb + 8 * (R + r)), acc[j][r]); \
            }                                                                                   \
        }                                                                                       \
        for (int j = 0; j < NB; j++)                                                            \
            for (int r = 0; r < R; r++) accm[j * R + r] = acc[j][r];                            \
    }
#define HDEQ_Q4 hdeq_q4_1(qs + i * Q4_BYTES, d + i, m + i, h, &wl, &wh)
#define HDEQ_Q8 hdeq_q8_0(qs + i * Q8_BYTES, d + i, h, &wl, &wh)
#define HDEQ_F32 hdeq_f32(qs + i * F32_VALUES, h, &wl, &wh)

/* One group of <= GROUP rows of W against the M packed rows of x, chunk by chunk (x from L1 or
 * L2: splitting K so that a chunk of x stays in L1 measured no faster). NB*R <= 12 accumulators,
 * at least 8 where M allows (a multiply-add's latency hides behind 8 independent ones). */
#define HCASE(P, NB, R) case NB * 16 + R: P##_h##NB##x##R(xh, nb, q, dn, mn, h, a); break;
#define HGROUP(P, QTYPE, QB, HDEQ)                                                                  \
    HTILE(P##_h8x1, 8, 1, QTYPE, QB, HDEQ) HTILE(P##_h4x1, 4, 1, QTYPE, QB, HDEQ)                     \
    HTILE(P##_h4x2, 4, 2, QTYPE, QB, HDEQ) HTILE(P##_h4x3, 4, 3, QTYPE, QB, HDEQ)                     \
    HTILE(P##_h2x1, 2, 1, QTYPE, QB, HDEQ) HTILE(P##_h2x2, 2, 2, QTYPE, QB, HDEQ)                     \
    HTILE(P##_h2x3, 2, 3, QTYPE, QB, HDEQ)                                                          \
    HTILE(P##_h2x4, 2, 4, QTYPE, QB, HDEQ) HTILE(P##_h2x5, 2, 5, QTYPE, QB, HDEQ)                     \
    HTILE(P##_h2x6, 2, 6, QTYPE, QB, HDEQ) HTILE(P##_h1x1, 1, 1, QTYPE, QB, HDEQ)                     \
    HTILE(P##_h1x2, 1, 2, QTYPE, QB, HDEQ) HTILE(P##_h1x3, 1, 3, QTYPE, QB, HDEQ)                     \
    HTILE(P##_h1x4, 1, 4, QTYPE, QB, HDEQ) HTILE(P##_h1x5, 1, 5, QTYPE, QB, HDEQ)                     \
    HTILE(P##_h1x6, 1, 6, QTYPE, QB, HDEQ) HTILE(P##_h1x7, 1, 7, QTYPE, QB, HDEQ)                     \
    HTILE(P##_h1x8, 1, 8, QTYPE, QB, HDEQ) HTILE(P##_h1x9, 1, 9, QTYPE, QB, HDEQ)                     \
    HTILE(P##_h1x10, 1, 10, QTYPE, QB, HDEQ) HTILE(P##_h1x11, 1, 11, QTYPE, QB, HDEQ)                 \
    HTILE(P##_h1x12, 1, 12, QTYPE, QB, HDEQ)                                                        \
    static void P##_group(const float *xp, int M, int K, const QTYPE *qs, const float *d, const float *m, \
                          int rows, const float *bias, float *y, int ldy) {                         \
        const int nb = K / BLOCK;                                                                   \
        __m256 acc[2][GROUP * HRMAX];                                                               \
        for (int c = 0, r0 = 0; r0 < M; r0 += chunk_rows(M, r0, c), c++) {                         \
            const int R = chunk_rows(M, r0, c);                                                     \
            for (int h = 0; h < 2; h++) {                                                           \
                const float *xh = xp + (long)r0 * K + (long)h * nb * 16 * R;                        \
                for (int n = 0; n < rows;) {                                                        \
                    const int NB = R == 1 && rows - n >= 8 ? 8 : R <= 3 && rows - n >= 4 ? 4        \
                                 : R <= 6 && rows - n >= 2 ? 2 : 1;                                 \
                    const QTYPE *q = qs + (long)n * nb * QB;                                        \
                    const float *dn = d ? d + (long)n * nb : 0, *mn = m ? m + (long)n * nb : 0;     \
                    __m256 *a = acc[h] + n * R;                                                     \
                    switch (NB * 16 + R) {                                                          \
                        HCASE(P, 8, 1) HCASE(P, 4, 1) HCASE(P, 4, 2) HCASE(P, 4, 3)                 \
                        HCASE(P, 2, 1) HCASE(P, 2, 2) HCASE(P, 2, 3)                                \
                        HCASE(P, 2, 4) HCASE(P, 2, 5) HCASE(P, 2, 6) HCASE(P, 1, 1)                 \
                        HCASE(P, 1, 2) HCASE(P, 1, 3) HCASE(P, 1, 4) HCASE(P, 1, 5)                 \
                        HCASE(P, 1, 6) HCASE(P, 1, 7) HCASE(P, 1, 8) HCASE(P, 1, 9)                 \
                        HCASE(P, 1, 10) HCASE(P, 1, 11) HCASE(P, 1, 12)                             \
                    }                                                                               \
                    n += NB;                                                                        \
                }                                                                                   \
            }                                                                                       \
            for (int r = 0; r < R; r++)                                                             \
                for (int n = 0; n < rows; n++)                                                      \
                    y[(long)(r0 + r) * ldy + n] = vsum2(acc[0][n * R + r], acc[1][n * R + r]) + (bias ? bias[n] : 0.0f); \
        }                                                                                           \
    }
HGROUP(q4, uint8_t, Q4_BYTES, HDEQ_Q4)
HGROUP(q8, int8_t, Q8_BYTES, HDEQ_Q8)
HGROUP(f32, float, F32_VALUES, HDEQ_F32)
#else
#define pack_x(x, M, K) ((float *)0)
#define q4_group(...) ((void)0)
#define q8_group(...) ((void)0)
#define f32_group(...) ((void)0)
#endif

/* One call: output rows in groups of GROUP (the unit of work per thread). The AVX2 build runs a
 * group as above (P##_group, x packed once per call). The AVX-512 and portable builds: inside a
 * group, one row of x: 8 rows of W at once; else 4 rows of W (1 at a time for a tail) against
 * chunks of up to RMAX rows of x, so the x rows a tile reads stay in L1 and W's rows are read once
 * from memory. */
#define LINEAR(NAME, P, QTYPE, QB, REC, RMAX)                                                                \
    void NAME(const float *x, int M, int K, const QTYPE *qs, const float *d, const float *m, int N,     \
              const float *bias, float *y, const uint8_t *stripes, int nthreads) {                        \
        const int nb = K / BLOCK;                                                                         \
        const int groups = (N + GROUP - 1) / GROUP;                                                       \
        const float *xp = pack_x(x, M, K); /* AVX2 only, else 0 */                                        \
        _Pragma("omp parallel for schedule(static) num_threads(nthreads) if(nthreads > 1)")              \
        for (int g = 0; g < groups; g++) {                                                                \
            const int n0 = GROUP * g, n1 = n0 + GROUP < N ? n0 + GROUP : N;                               \
            if (REC > 0 && M == 1 && stripes && n1 - n0 == GROUP) {                                                  \
                P##_stripe(x, nb, stripes + (long)n0 * nb * REC, bias ? bias + n0 : 0, y + n0);           \
                continue;                                                                                 \
            }                                                                                             \
            if (xp) {                                                                                     \
                P##_group(xp, M, K, qs + (long)n0 * nb * QB, d ? d + (long)n0 * nb : 0,                    \
                          m ? m + (long)n0 * nb : 0, n1 - n0, bias ? bias + n0 : 0, y + n0, N);           \
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
