/* Linear layers with int8 activations over ggml block weights (model.backend=ggml_q8).
 *
 * llama.cpp's CPU path multiplies Q4_1 / Q8_0 weights by activations quantized to 8 bits per
 * block of 32 (its Q8_1 / Q8_0): the products are integers, and only one float scale per block
 * remains. This file does the same, with a layout that makes the integer part cheap:
 *
 *   x row r, block b:  qx = rint(x / dx) in [-127, 127], dx = max|x| / 127 (per row, per block:
 *                      a row's rounding never depends on the other rows of the call)
 *   y[r, n] = sum_b ( dw[n,b] * dx[r,b] ) * isum[r,n,b]      isum = sum_j qw[n,b,j] * qx[r,b,j]
 *           (+ m[n,b] * sx[r,b] for Q4_1, sx = dx * sum_j qx)  (+ bias[n])
 *
 * Packing (ggml_q8.py): per group of 16 output rows and block b one record; each 64-byte chunk
 * holds 4 consecutive k of all 16 rows (byte 4*row + t), so one vpdpbusd against 4 bytes of x
 * broadcast adds 4 products to each of 16 rows' sums, and one float epilogue per block serves 16
 * outputs (the fp32 kernel needs 32 fused multiply-adds per 16 outputs and block).
 *   Q4_1: {float d[16], float m[16], 4 chunks: low nibble k = 4c+t, high nibble k = 16+4c+t}
 *   Q8_0: {float d[16], 8 chunks of q+128 as uint8} (sum (q+128) qx - 128 sum qx = sum q qx)
 *
 * Batch invariance: the integer sums are exact, and every output's float operations (one
 * multiply for the scale, one or two fused multiply-adds per block in block order, one add of
 * the bias) are the same whatever M is, in the AVX-512 VNNI path and in the portable one alike.
 * So a k-token verify returns, row for row, the bits of k one-token forwards.
 *
 * This is not the float32 model: activation rounding changes the outputs (~1e-3 relative),
 * a different but self-consistent model, as llama.cpp's is.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32
#define LANES 16
#define RMAX 8
#define Q4_REC (LANES * 4 * 2 + LANES * 16)
#define Q8_REC (LANES * 4 + LANES * 32)

/* per row r and block b: qx, dx and (for the Q4_1 minimum and the Q8_0 offset) sum qx. A block
 * whose largest |x| is below TINY counts as zero (so 1/dx is finite and nothing is NaN). */
#define TINY 1e-30f
static inline float block_scale(float amax, float *id) {
    const float d = amax < TINY ? 0.0f : amax / 127.0f;
    *id = d != 0.0f ? 1.0f / d : 0.0f;
    return d;
}
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>

static void quantize_rows(const float *x, int M, int K, int8_t *qx, float *dx, float *sx, int32_t *sq) {
    const int nb = K / BLOCK;
    const __m512 lim = _mm512_set1_ps(127.0f), nlim = _mm512_set1_ps(-127.0f);
    for (long i = 0; i < (long)M * nb; i++) {
        const float *v = x + i * BLOCK;
        const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
        float id;
        const float d = block_scale(_mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b))), &id);
        const __m512 vid = _mm512_set1_ps(id);
        /* rint (to nearest even), then the clamp, in float: the portable path's operations */
        const int r = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        __m512 qa = _mm512_roundscale_ps(_mm512_mul_ps(a, vid), r), qb = _mm512_roundscale_ps(_mm512_mul_ps(b, vid), r);
        qa = _mm512_max_ps(_mm512_min_ps(qa, lim), nlim);
        qb = _mm512_max_ps(_mm512_min_ps(qb, lim), nlim);
        const __m512i ia = _mm512_cvtps_epi32(qa), ib = _mm512_cvtps_epi32(qb);
        _mm_storeu_si128((__m128i *)(qx + i * BLOCK), _mm512_cvtepi32_epi8(ia));
        _mm_storeu_si128((__m128i *)(qx + i * BLOCK + 16), _mm512_cvtepi32_epi8(ib));
        const int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(ia, ib));
        dx[i] = d;
        sq[i] = s;
        sx[i] = d * (float)s;
    }
}

/* the 8 weight registers (k = 4c..4c+3 of 16 rows) of one block */
static inline void weights_q4(const uint8_t *rec, __m512i w[8]) {
    const __m512i lo = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_loadu_si512(rec + LANES * 8 + 64 * c);
        w[c] = _mm512_and_si512(v, lo);
        w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo);
    }
}
static inline void weights_q8(const uint8_t *rec, __m512i w[8]) {
    for (int c = 0; c < 8; c++) w[c] = _mm512_loadu_si512(rec + LANES * 4 + 64 * c);
}

/* one group of 16 output rows against R rows of x (R a constant at each call site) */
static inline __attribute__((always_inline)) void tile(int q4, int R, int nb, const uint8_t *recs, const int8_t *qx,
                                                       const float *dx, const float *sx, const int32_t *sq,
                                                       const float *bias, float *y, int ldy) {
    __m512 acc[RMAX];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const long rec_size = q4 ? Q4_REC : Q8_REC;
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = recs + b * rec_size;
        __m512i w[8];
        /* at 4+ rows the loop is compute-bound and the hardware prefetcher falls behind: fetch
         * the weights ~3 KB ahead (8 rows: 2.1x -> 1.7x the one-row time over the 211 layers);
         * below that the stream is memory-bound and extra prefetches only cost */
        if (R >= 4)
            for (int l = 0; l < rec_size; l += 64) _mm_prefetch((const char *)rec + 3072 + l, _MM_HINT_T0);
        if (q4) weights_q4(rec, w);
        else weights_q8(rec, w);
        const __m512 dw = _mm512_loadu_ps((const float *)rec);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const int32_t *xq = (const int32_t *)(qx + ((long)r * nb + b) * BLOCK);
            /* four short dependency chains instead of one of eight (integer sums: same result) */
            __m512i p[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) p[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[c], _mm512_set1_epi32(xq[c]));
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) p[c] = _mm512_dpbusd_epi32(p[c], w[c + 4], _mm512_set1_epi32(xq[c + 4]));
            __m512i is = _mm512_add_epi32(_mm512_add_epi32(p[0], p[1]), _mm512_add_epi32(p[2], p[3]));
            if (!q4) is = _mm512_sub_epi32(is, _mm512_set1_epi32(128 * sq[(long)r * nb + b]));
            const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(dx[(long)r * nb + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), s, acc[r]);
            if (q4) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps((const float *)rec + LANES), _mm512_set1_ps(sx[(long)r * nb + b]), acc[r]);
        }
    }
    const __m512 bv = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + (long)r * ldy, _mm512_add_ps(acc[r], bv));
}

#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 (no VNNI, e.g. AMD Zen 3, most Intel client CPUs): vpmaddubsw multiplies unsigned by
 * signed bytes into saturating 16-bit pair sums, so the weight side must stay below 128 in
 * magnitude: Q8_0's stored q+128 is turned back into q (xor 0x80) and llama.cpp's sign trick
 * moves q's sign onto x (|q| * sign(q)x: |q| <= 128, |x| <= 127, a pair sum <= 32512, exact);
 * Q4_1's nibbles (0..15) are unsigned already. vpmaddwd then adds pairs into 32-bit sums: the
 * same exact integers as the VNNI path, and the same float epilogue, so the same bits. */
#include <immintrin.h>

/* one group of 16 output rows (two halves of 8) against R rows of x */
static inline __attribute__((always_inline)) void tile(int q4, int R, int nb, const uint8_t *recs, const int8_t *qx,
                                                       const float *dx, const float *sx, const int32_t *sq,
                                                       const float *bias, float *y, int ldy) {
    (void)sq; /* the sign trick needs no offset correction */
    __m256 acc[RMAX][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const long rec_size = q4 ? Q4_REC : Q8_REC;
    const __m256i ones = _mm256_set1_epi16(1), lo = _mm256_set1_epi8(0x0F), off = _mm256_set1_epi8((char)0x80);
    for (int b = 0; b < nb; b++) {
        const uint8_t *rec = recs + b * rec_size;
        if (R >= 4)
            for (int l = 0; l < rec_size; l += 64) _mm_prefetch((const char *)rec + 3072 + l, _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            __m256i w[8], ws[8]; /* w: the unsigned operand; ws: the sign donor (Q8_0 only) */
            for (int c = 0; c < 8; c++) {
                if (q4) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + LANES * 8 + 64 * (c & 3) + 32 * h));
                    w[c] = c < 4 ? _mm256_and_si256(v, lo) : _mm256_and_si256(_mm256_srli_epi16(v, 4), lo);
                } else {
                    ws[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rec + LANES * 4 + 64 * c + 32 * h)), off);
                    w[c] = _mm256_sign_epi8(ws[c], ws[c]);
                }
            }
            const __m256 dw = _mm256_loadu_ps((const float *)rec + 8 * h);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const int32_t *xq = (const int32_t *)(qx + ((long)r * nb + b) * BLOCK);
                __m256i is = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) {
                    __m256i xv = _mm256_set1_epi32(xq[c]);
                    if (!q4) xv = _mm256_sign_epi8(xv, ws[c]);
                    is = _mm256_add_epi32(is, _mm256_madd_epi16(_mm256_maddubs_epi16(w[c], xv), ones));
                }
                const __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(dx[(long)r * nb + b]));
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), s, acc[r][h]);
                if (q4)
                    acc[r][h] = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)rec + LANES + 8 * h),
                                                _mm256_set1_ps(sx[(long)r * nb + b]), acc[r][h]);
            }
        }
    }
    for (int h = 0; h < 2; h++) {
        const __m256 bv = bias ? _mm256_loadu_ps(bias + 8 * h) : _mm256_setzero_ps();
        for (int r = 0; r < R; r++) _mm256_storeu_ps(y + (long)r * ldy + 8 * h, _mm256_add_ps(acc[r][h], bv));
    }
}

#else /* portable: the same integers and the same float operations, one lane at a time */

static inline void tile(int q4, int R, int nb, const uint8_t *recs, const int8_t *qx, const float *dx,
                        const float *sx, const int32_t *sq, const float *bias, float *y, int ldy) {
    const long rec_size = q4 ? Q4_REC : Q8_REC;
    for (int r = 0; r < R; r++)
        for (int l = 0; l < LANES; l++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *rec = recs + b * rec_size;
                const int8_t *xq = qx + ((long)r * nb + b) * BLOCK;
                int32_t is = 0;
                for (int c = 0; c < 8; c++)
                    for (int t = 0; t < 4; t++) {
                        int wq;
                        if (q4) {
                            const uint8_t v = rec[LANES * 8 + 64 * (c & 3) + 4 * l + t];
                            wq = c < 4 ? v & 0x0F : v >> 4;
                        } else {
                            wq = rec[LANES * 4 + 64 * c + 4 * l + t];
                        }
                        is += wq * xq[4 * c + t];
                    }
                if (!q4) is -= 128 * sq[(long)r * nb + b];
                float dw, m;
                memcpy(&dw, rec + 4 * l, 4);
                const float s = dw * dx[(long)r * nb + b];
                acc = __builtin_fmaf((float)is, s, acc);
                if (q4) {
                    memcpy(&m, rec + LANES * 4 + 4 * l, 4);
                    acc = __builtin_fmaf(m, sx[(long)r * nb + b], acc);
                }
            }
            y[(long)r * ldy + l] = acc + (bias ? bias[l] : 0.0f);
        }
}
#endif

#if !(defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__))
/* the activations' quantization, one lane at a time (the AVX2 and portable builds) */
static void quantize_rows(const float *x, int M, int K, int8_t *qx, float *dx, float *sx, int32_t *sq) {
    const int nb = K / BLOCK;
    for (long i = 0; i < (long)M * nb; i++) {
        const float *v = x + i * BLOCK;
        float amax = 0.0f, id;
        for (int j = 0; j < BLOCK; j++) amax = fmaxf(amax, fabsf(v[j]));
        const float d = block_scale(amax, &id);
        int32_t s = 0;
        for (int j = 0; j < BLOCK; j++) {
            float q = rintf(v[j] * id);
            q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
            qx[i * BLOCK + j] = (int8_t)q;
            s += (int32_t)q;
        }
        dx[i] = d;
        sq[i] = s;
        sx[i] = d * (float)s;
    }
}
#endif

#define TILE_R(q4, R, ...) \
    case R: tile(q4, R, __VA_ARGS__); break;

static inline __attribute__((always_inline)) void group(int q4, int R, int nb, const uint8_t *recs, const int8_t *qx,
                                                        const float *dx, const float *sx, const int32_t *sq,
                                                        const float *bias, float *y, int ldy) {
    switch (R) {
        TILE_R(q4, 1, nb, recs, qx, dx, sx, sq, bias, y, ldy)
        TILE_R(q4, 2, nb, recs, qx, dx, sx, sq, bias, y, ldy)
        TILE_R(q4, 3, nb, recs, qx, dx, sx, sq, bias, y, ldy)
        TILE_R(q4, 4, nb, recs, qx, dx, sx, sq, bias, y, ldy)
        TILE_R(q4, 5, nb, recs, qx, dx, sx, sq, bias, y, ldy)
        TILE_R(q4, 6, nb, recs, qx, dx, sx, sq, bias, y, ldy)
        TILE_R(q4, 7, nb, recs, qx, dx, sx, sq, bias, y, ldy)
        default: tile(q4, RMAX, nb, recs, qx, dx, sx, sq, bias, y, ldy);
    }
}

/* y [M, N] = x [M, K] @ W.T (+ bias); N a multiple of 16 (the packing pads), K of 32 */
static void linear(int q4, const float *x, int M, int K, const uint8_t *packed, int N, const float *bias, float *y,
                   int nthreads) {
    const int nb = K / BLOCK, groups = N / LANES;
    int8_t *qx = malloc((size_t)M * K);
    float *dx = malloc(sizeof(float) * M * nb * 2);
    int32_t *sq = malloc(sizeof(int32_t) * M * nb);
    float *sx = dx + (long)M * nb;
    quantize_rows(x, M, K, qx, dx, sx, sq);
    const long group_size = (long)nb * (q4 ? Q4_REC : Q8_REC);
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int g = 0; g < groups; g++)
        for (int r0 = 0; r0 < M; r0 += RMAX) {
            const int R = M - r0 < RMAX ? M - r0 : RMAX;
            const long o = (long)r0 * nb;
            if (q4)
                group(1, R, nb, packed + g * group_size, qx + o * BLOCK, dx + o, sx + o, sq + o,
                      bias ? bias + g * LANES : 0, y + (long)r0 * N + g * LANES, N);
            else
                group(0, R, nb, packed + g * group_size, qx + o * BLOCK, dx + o, sx + o, sq + o,
                      bias ? bias + g * LANES : 0, y + (long)r0 * N + g * LANES, N);
        }
    free(qx);
    free(dx);
    free(sq);
}

void ggml_q8_linear_q4_1(const float *x, int M, int K, const uint8_t *packed, int N, const float *bias, float *y,
                         int nthreads) {
    linear(1, x, M, K, packed, N, bias, y, nthreads);
}

void ggml_q8_linear_q8_0(const float *x, int M, int K, const uint8_t *packed, int N, const float *bias, float *y,
                         int nthreads) {
    linear(0, x, M, K, packed, N, bias, y, nthreads);
}

/* which path this build compiled: 2 AVX-512 VNNI, 1 AVX2, 0 portable */
int ggml_q8_kernels_path(void) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 2;
#elif defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}

int ggml_q8_kernels_vnni(void) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 1;
#else
    return 0;
#endif
}
