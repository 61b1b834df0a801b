/* Batch-invariant attention for short queries (the `ggml*` backends; attention.py).
 *
 * PyTorch's CPU attention reduces differently for 1 query and for k queries, so a k-token verify
 * differs from k one-token steps in the last bits (~5e-7). With float32 activations that almost
 * never flips a greedy token; with int8 activations (model.backend=ggml_q8) it flips an activation's
 * rounding, and the difference grows to ~1e-1 in the logits. Here every (query, head) is computed
 * by the same operations whatever the number of queries and whichever keys the other queries see:
 *
 *   the keys the query may see, in cache order (a mask row, or all of them);
 *   s_t = (q . k_t) * scale           (16-lane fused multiply-adds over D, one fixed lane sum)
 *   p_t = exp(s_t - max s)            (one polynomial exp, lane by lane)
 *   out = (sum_t p_t v_t) / sum_t p_t (in key order; the sum in 16 lanes by position t)
 *
 * So a token's attention output depends only on its query and on the keys/values it sees, in
 * order: a token of a verified chain (or a tree node, whose mask row lists its ancestors) gets
 * the bits the same token gets when decoded alone. Needs D a multiple of 16, at most 256.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define L 16
#define MAXDL 16 /* head dimension up to 256 */
#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vf;
static inline vf vf_set(float a) { return _mm512_set1_ps(a); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf a) { _mm512_storeu_ps(p, a); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline float vf_sum(vf a) { return _mm512_reduce_add_ps(a); }
static inline vf vf_exp(vf x) { /* exp(x) for x <= 0: Cephes' expf polynomial */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const vf n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf a = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    a = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), a);
    vf p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, a, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, a, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, a, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, a, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, a, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(a, a), a), _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits)); /* 2^n, n in [-126, 0] */
}
/* s[0..16) = scale * (q . k_{idx[t]}) for 16 keys (cnt < 16: the rest are zero rows): per key
 * 16-lane fused multiply-adds over D, then the lanes summed by one transpose-and-add tree that
 * adds lane l to l+8, then l+4, l+2, l+1, for all 16 keys at once: the portable vf_sum's tree */
static inline __attribute__((always_inline)) __m512 dot16(const __m512 *qr, const float *kv, const int DL) {
    __m512 acc = _mm512_mul_ps(qr[0], _mm512_loadu_ps(kv));
    for (int c = 1; c < DL; c++) acc = _mm512_fmadd_ps(qr[c], _mm512_loadu_ps(kv + c * L), acc);
    return acc;
}
static inline __attribute__((always_inline)) void scores16_dl(const float *qv, const float *kh, const int *idx, int cnt,
                                                              const int DL, float scale, float *s) {
    const int D = DL * L;
    __m512 qr[MAXDL], r[8], u[4], w[2];
    for (int c = 0; c < DL; c++) qr[c] = _mm512_loadu_ps(qv + c * L);
    for (int j = 0; j < 8; j++) { /* keys 2j, 2j+1 (zero rows past cnt), then l + l+8 in halves */
        const __m512 a0 = 2 * j < cnt ? dot16(qr, kh + (long)idx[2 * j] * D, DL) : _mm512_setzero_ps();
        const __m512 a1 = 2 * j + 1 < cnt ? dot16(qr, kh + (long)idx[2 * j + 1] * D, DL) : _mm512_setzero_ps();
        r[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
    }
    for (int j = 0; j < 4; j++) /* l + l+4: keys 4j..4j+3 in quarters */
        u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * j], r[2 * j + 1], 0x88), _mm512_shuffle_f32x4(r[2 * j], r[2 * j + 1], 0xDD));
    for (int j = 0; j < 2; j++) /* l + l+2 */
        w[j] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0x44), _mm512_shuffle_ps(u[2 * j], u[2 * j + 1], 0xEE));
    /* l + l+1: lane 4a+b holds key 4b+a */
    const __m512 sum = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(s, _mm512_mul_ps(_mm512_permutexvar_ps(order, sum), _mm512_set1_ps(scale)));
}
static inline void scores16(const float *qv, const float *kh, const int *idx, int cnt, int D, float scale, float *s) {
    switch (D / L) {
        case 4: scores16_dl(qv, kh, idx, cnt, 4, scale, s); break;
        case 8: scores16_dl(qv, kh, idx, cnt, 8, scale, s); break;
        case 2: scores16_dl(qv, kh, idx, cnt, 2, scale, s); break;
        case 1: scores16_dl(qv, kh, idx, cnt, 1, scale, s); break;
        default: scores16_dl(qv, kh, idx, cnt, D / L, scale, s);
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2 (AMD Zen 2/3, most Intel client CPUs): 16 lanes as two 8-lane registers, every lane doing
 * the portable build's operations in its order, so this build returns the portable build's bits
 * (tests/test_ggml_q8.py). Without it these hosts ran the portable code: ~250 us per layer for
 * one query over 200 keys, growing by ~200 us per extra query (docs/cpu-backends.md). */
#include <immintrin.h>
typedef struct { __m256 a, b; } vf; /* lanes 0-7, 8-15 */
static inline vf vf_make(__m256 a, __m256 b) { vf r = {a, b}; return r; }
static inline vf vf_set(float a) { return vf_make(_mm256_set1_ps(a), _mm256_set1_ps(a)); }
static inline vf vf_load(const float *p) { return vf_make(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
static inline void vf_store(float *p, vf a) { _mm256_storeu_ps(p, a.a); _mm256_storeu_ps(p + 8, a.b); }
static inline vf vf_fma(vf a, vf b, vf c) { return vf_make(_mm256_fmadd_ps(a.a, b.a, c.a), _mm256_fmadd_ps(a.b, b.b, c.b)); }
static inline vf vf_add(vf a, vf b) { return vf_make(_mm256_add_ps(a.a, b.a), _mm256_add_ps(a.b, b.b)); }
static inline vf vf_sub(vf a, vf b) { return vf_make(_mm256_sub_ps(a.a, b.a), _mm256_sub_ps(a.b, b.b)); }
static inline vf vf_mul(vf a, vf b) { return vf_make(_mm256_mul_ps(a.a, b.a), _mm256_mul_ps(a.b, b.b)); }
static inline vf vf_max(vf a, vf b) { /* the portable b > a ? b : a, lane by lane (no NaNs here) */
    return vf_make(_mm256_blendv_ps(a.a, b.a, _mm256_cmp_ps(b.a, a.a, _CMP_GT_OQ)),
                   _mm256_blendv_ps(a.b, b.b, _mm256_cmp_ps(b.b, a.b, _CMP_GT_OQ)));
}
static inline float vf_sum(vf a) { /* the portable tree: l + l+8, then +4, +2, +1 */
    const __m256 s8 = _mm256_add_ps(a.a, a.b);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
static inline __m256 exp8(__m256 x) { /* the portable vf_exp's operations on 8 lanes */
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 a = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
    a = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), a);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, a, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, a, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, a, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, a, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, a, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(a, a), a), _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
static inline vf vf_exp(vf x) { return vf_make(exp8(x.a), exp8(x.b)); }
/* s[0..8) = scale * (q . k_{idx[t]}) for 8 keys (t >= cnt: zero): per key 16-lane fused
 * multiply-adds over D and l + l+8, then the other steps of the portable tree (l + l+4, l+2,
 * l+1) for the 8 keys at once by transposing adds */
static inline __attribute__((always_inline)) __m256 half16(const vf *qr, const float *kv, const int DL) {
    __m256 a = _mm256_mul_ps(qr[0].a, _mm256_loadu_ps(kv)), b = _mm256_mul_ps(qr[0].b, _mm256_loadu_ps(kv + 8));
    for (int c = 1; c < DL; c++) {
        a = _mm256_fmadd_ps(qr[c].a, _mm256_loadu_ps(kv + c * L), a);
        b = _mm256_fmadd_ps(qr[c].b, _mm256_loadu_ps(kv + c * L + 8), b);
    }
    return _mm256_add_ps(a, b);
}
static inline __attribute__((always_inline)) void scores8_dl(const vf *qr, const float *kh, const int *idx, int cnt,
                                                             const int DL, float scale, float *s) {
    const long D = DL * L;
    __m256 h[8], u[4];
    for (int j = 0; j < 8; j++) h[j] = j < cnt ? half16(qr, kh + (long)idx[j] * D, DL) : _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) /* keys 2j (low 128 bits), 2j+1 (high): l + l+4 */
        u[j] = _mm256_add_ps(_mm256_permute2f128_ps(h[2 * j], h[2 * j + 1], 0x20), _mm256_permute2f128_ps(h[2 * j], h[2 * j + 1], 0x31));
    const __m256 w0 = _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], 0x44), _mm256_shuffle_ps(u[0], u[1], 0xEE)); /* l + l+2 */
    const __m256 w1 = _mm256_add_ps(_mm256_shuffle_ps(u[2], u[3], 0x44), _mm256_shuffle_ps(u[2], u[3], 0xEE));
    /* l + l+1: the low 128 bits hold keys 0, 2, 4, 6, the high ones 1, 3, 5, 7 */
    const __m256 sum = _mm256_add_ps(_mm256_shuffle_ps(w0, w1, 0x88), _mm256_shuffle_ps(w0, w1, 0xDD));
    const __m256 ordered = _mm256_permutevar8x32_ps(sum, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_ps(s, _mm256_mul_ps(ordered, _mm256_set1_ps(scale)));
}
static inline __attribute__((always_inline)) void scores16_dl(const float *qv, const float *kh, const int *idx, int cnt,
                                                              const int DL, float scale, float *s) {
    vf qr[MAXDL];
    for (int c = 0; c < DL; c++) qr[c] = vf_load(qv + c * L);
    scores8_dl(qr, kh, idx, cnt, DL, scale, s);
    scores8_dl(qr, kh, idx + 8, cnt - 8, DL, scale, s + 8);
}
static inline void scores16(const float *qv, const float *kh, const int *idx, int cnt, int D, float scale, float *s) {
    switch (D / L) {
        case 4: scores16_dl(qv, kh, idx, cnt, 4, scale, s); break;
        case 8: scores16_dl(qv, kh, idx, cnt, 8, scale, s); break;
        case 2: scores16_dl(qv, kh, idx, cnt, 2, scale, s); break;
        case 1: scores16_dl(qv, kh, idx, cnt, 1, scale, s); break;
        default: scores16_dl(qv, kh, idx, cnt, D / L, scale, s);
    }
}
#else /* portable: lane-wise loops (the compiler vectorizes them); deterministic within a build */
typedef struct { float v[L]; } vf;
static inline vf vf_set(float a) { vf r; for (int i = 0; i < L; i++) r.v[i] = a; return r; }
static inline vf vf_load(const float *p) { vf r; memcpy(r.v, p, sizeof r.v); return r; }
static inline void vf_store(float *p, vf a) { memcpy(p, a.v, sizeof a.v); }
static inline vf vf_fma(vf a, vf b, vf c) { for (int i = 0; i < L; i++) c.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]); return c; }
static inline vf vf_add(vf a, vf b) { for (int i = 0; i < L; i++) a.v[i] += b.v[i]; return a; }
static inline vf vf_sub(vf a, vf b) { for (int i = 0; i < L; i++) a.v[i] -= b.v[i]; return a; }
static inline vf vf_mul(vf a, vf b) { for (int i = 0; i < L; i++) a.v[i] *= b.v[i]; return a; }
static inline vf vf_max(vf a, vf b) { for (int i = 0; i < L; i++) a.v[i] = b.v[i] > a.v[i] ? b.v[i] : a.v[i]; return a; }
static inline float vf_sum(vf a) { /* a fixed tree: 8, 4, 2, 1 */
    for (int w = L / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) a.v[i] += a.v[i + w];
    return a.v[0];
}
static inline vf vf_exp(vf x) {
    vf r;
    for (int i = 0; i < L; i++) {
        float a = x.v[i] < -87.0f ? -87.0f : x.v[i];
        const float n = rintf(a * 1.44269504088896341f);
        a = __builtin_fmaf(n, -0.693359375f, a);
        a = __builtin_fmaf(n, 2.12194440e-4f, a);
        float p = 1.9875691500e-4f;
        p = __builtin_fmaf(p, a, 1.3981999507e-3f);
        p = __builtin_fmaf(p, a, 8.3334519073e-3f);
        p = __builtin_fmaf(p, a, 4.1665795894e-2f);
        p = __builtin_fmaf(p, a, 1.6666665459e-1f);
        p = __builtin_fmaf(p, a, 5.0000001201e-1f);
        p = __builtin_fmaf(p, a * a, a) + 1.0f;
        int32_t bits = ((int32_t)n + 127) << 23;
        float two_n;
        memcpy(&two_n, &bits, 4);
        r.v[i] = p * two_n;
    }
    return r;
}

static inline void scores16(const float *qv, const float *kh, const int *idx, int cnt, int D, float scale, float *s) {
    const int dl = D / L;
    for (int t = 0; t < 16; t++) {
        if (t >= cnt) { s[t] = 0.0f; continue; }
        const float *kv = kh + (long)idx[t] * D;
        vf acc = vf_mul(vf_load(qv), vf_load(kv));
        for (int c = 1; c < dl; c++) acc = vf_fma(vf_load(qv + c * L), vf_load(kv + c * L), acc);
        s[t] = vf_sum(acc) * scale;
    }
}
#endif

#define KB 64 /* keys per block: a block's K (then V) rows (16 KB at D = 64) stay in L1 while every
                    * query and head of the kv head uses them, so the cache is read from L2/L3 once per
                    * call, not per head (64 measured 5-10% faster than 32 at 1-64 queries, 200+ keys) */

/* acc[h] += p_{h,t} v_{idx[t]} for t in [t0, t1), for the H heads of one query (they see the
 * same keys): each V row is loaded once for all of them; each head's own operations (one
 * fused multiply-add per lane chunk and key, in key order) do not depend on H */
static inline __attribute__((always_inline)) void pv_run(const float *vh, const int *idx, const float *p, long ps, int t0,
                                                         int t1, const int DL, const int H, float *acc) {
    const int D = DL * L;
    vf a[3][MAXDL];
    for (int h = 0; h < H; h++)
        for (int c = 0; c < DL; c++) a[h][c] = vf_load(acc + h * D + c * L);
    for (int t = t0; t < t1; t++) {
        const float *v = vh + (long)idx[t] * D;
        vf vr[MAXDL];
        for (int c = 0; c < DL; c++) vr[c] = vf_load(v + c * L);
        for (int h = 0; h < H; h++) {
            const vf ph = vf_set(p[h * ps + t]);
            for (int c = 0; c < DL; c++) a[h][c] = vf_fma(ph, vr[c], a[h][c]);
        }
    }
    for (int h = 0; h < H; h++)
        for (int c = 0; c < DL; c++) vf_store(acc + h * D + c * L, a[h][c]);
}

/* heads per V-row load: what fits in the vector registers with the row (32 with AVX-512: 3 heads
 * at D = 64; AVX2's 16 hold one head's 8 accumulators at D = 64) */
#if defined(__AVX2__) && !defined(__AVX512F__)
static inline int pv_heads(int DL) { return DL <= 1 ? 3 : DL <= 2 ? 2 : 1; }
#else
static inline int pv_heads(int DL) { return DL <= 4 ? 3 : DL <= 8 ? 2 : 1; }
#endif

static inline void pv(const float *vh, const int *idx, const float *p, long ps, int t0, int t1, int DL, int H, float *acc) {
#define PV_CASE(dl, h) \
    if (DL == dl && H == h) { pv_run(vh, idx, p, ps, t0, t1, dl, h, acc); return; }
    PV_CASE(4, 3) PV_CASE(4, 2) PV_CASE(4, 1) PV_CASE(8, 2) PV_CASE(8, 1) PV_CASE(2, 3) PV_CASE(2, 2) PV_CASE(2, 1)
    PV_CASE(1, 3) PV_CASE(1, 2) PV_CASE(1, 1)
#undef PV_CASE
    for (int h = 0; h < H; h++) pv_run(vh, idx, p + h * ps, ps, t0, t1, DL, 1, acc + (long)h * DL * L);
}

/* softmax of one (query, head)'s scores over its compact key list, in place: s[t] <- p_t;
 * returns 1 / sum p */
static float softmax(float *s, int n) {
    for (int t = n; t < n + L; t++) s[t] = -INFINITY;
    vf vm = vf_set(-INFINITY);
    for (int t = 0; t < n; t += L) vm = vf_max(vm, vf_load(s + t)); /* exact in any order */
    float mx = -INFINITY;
    for (int l = 0; l < L; l++) mx = ((float *)&vm)[l] > mx ? ((float *)&vm)[l] : mx;
    vf lsum = vf_set(0.0f);
    const vf vmx = vf_set(mx);
    for (int t = 0; t < n; t += L) {
        vf_store(s + t, vf_exp(vf_sub(vf_load(s + t), vmx)));
        for (int l = n - t; l < L; l++) s[t + l] = 0.0f; /* the last chunk's unused lanes */
        lsum = vf_add(lsum, vf_load(s + t));
    }
    return 1.0f / vf_sum(lsum);
}

/* the end of the compact positions [t, n) whose keys lie below `limit` (ip sorted) */
static inline int block_end(const int *ip, int n, int t, int limit) {
    if (n && ip[n - 1] == n - 1) return n < limit ? n : limit; /* a prefix: position = key */
    while (t < n && ip[t] < limit) t++;
    return t;
}

/* queries [0, Q) (pointers already offset to the first) of kv head g; idx/cnt: each query's
 * compact key list (stride apart). Pair p = i * groups + h: query i, head g * groups + h. */
static void kv_head(int g, const float *q, long qsh, long qsi, int Q, int H, int D, const float *k, long ksh,
                    const float *v, long vsh, int N, int Hkv, const int *idx, const int *cnt, long stride, float scale,
                    float *out) {
    const int groups = H / Hkv, dl = D / L, P = Q * groups;
    const float *kh = k + (long)g * ksh, *vh = v + (long)g * vsh;
    float *S = malloc(sizeof(float) * P * stride), *A = calloc((size_t)P * D, sizeof(float));
    float *inv = malloc(sizeof(float) * P);
    int *cur = calloc(Q, sizeof(int)); /* per query: the next compact position (its heads see the same keys) */
    /* scores of the keys a query sees only, in compact order (a key's score does not depend on
     * which others are scored), block by block so a block's K rows serve every pair from L1 */
    for (int jb = 0; jb < N; jb += KB)
        for (int i = 0; i < Q; i++) {
            const int *ip = idx + (long)i * stride, t0 = cur[i], t1 = block_end(ip, cnt[i], t0, jb + KB);
            for (int h = 0; h < groups; h++) {
                const float *qv = q + (long)(g * groups + h) * qsh + (long)i * qsi;
                float *sp = S + (long)(i * groups + h) * stride;
                for (int t = t0; t < t1; t += L) /* a last partial chunk writes zeros past t1: the next block overwrites them */
                    scores16(qv, kh, ip + t, t1 - t < L ? t1 - t : L, D, scale, sp + t);
            }
            cur[i] = t1;
        }
    for (int p = 0; p < P; p++) inv[p] = softmax(S + (long)p * stride, cnt[p / groups]);
    /* the same walk over V, the heads of a query together (each V row loaded once for them) */
    const int hb = pv_heads(dl);
    memset(cur, 0, sizeof(int) * Q);
    for (int jb = 0; jb < N; jb += KB)
        for (int i = 0; i < Q; i++) {
            const int *ip = idx + (long)i * stride, p0 = i * groups, t1 = block_end(ip, cnt[i], cur[i], jb + KB);
            for (int h = 0; h < groups; h += hb)
                pv(vh, ip, S + (long)(p0 + h) * stride, stride, cur[i], t1, dl, groups - h < hb ? groups - h : hb,
                   A + (long)(p0 + h) * D);
            cur[i] = t1;
        }
    for (int p = 0; p < P; p++) {
        const float *a = A + (long)p * D;
        float *o = out + ((long)(p / groups) * H + g * groups + p % groups) * D;
        const vf iv = vf_set(inv[p]);
        for (int c = 0; c < dl; c++) vf_store(o + c * L, vf_mul(vf_load(a + c * L), iv));
    }
    free(S);
    free(A);
    free(inv);
    free(cur);
}

/* q: query i of head h at q + h*qsh + i*qsi (D contiguous floats); kv head g's N rows of D floats
 * at k + g*ksh, v + g*vsh (a cache buffer's prefix: no copy); allowed [Q, N] bytes or NULL (every
 * key), out [Q, H, D]; head h reads kv head h / (H / Hkv). Work items: (kv head, a share of the
 * queries), so that two threads split 3 kv heads evenly when there are several queries; a
 * query's operations are the same whichever item computes it and whatever else the item holds. */
static void attention_chunk(const float *q, long qsh, long qsi, int Q, int H, int D, const float *k, long ksh,
                            const float *v, long vsh, int N, int Hkv, const uint8_t *allowed, float scale, float *out,
                            int nthreads) {
    const long stride = N + 2 * L; /* per pair: scores (padded for the 16-key chunks) */
    int *idx = malloc(sizeof(int) * (long)Q * stride), *cnt = malloc(sizeof(int) * Q);
    for (int i = 0; i < Q; i++) {
        cnt[i] = 0;
        for (int j = 0; j < N; j++)
            if (!allowed || allowed[(long)i * N + j]) idx[(long)i * stride + cnt[i]++] = j;
    }
    const int parts = nthreads > 1 && Hkv % nthreads ? (Q < nthreads ? Q : nthreads) : 1;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int w = 0; w < Hkv * parts; w++) {
        const int g = w / parts, i0 = (int)((long)Q * (w % parts) / parts), i1 = (int)((long)Q * (w % parts + 1) / parts);
        kv_head(g, q + (long)i0 * qsi, qsh, qsi, i1 - i0, H, D, k, ksh, v, vsh, N, Hkv, idx + (long)i0 * stride, cnt + i0,
                stride, scale, out + (long)i0 * H * D);
    }
    free(idx);
    free(cnt);
}

#define QCHUNK 64 /* queries per pass (a prompt): the scratch stays ~64 x keys floats per kv head */

/* the chunks of a long query (each query's result does not depend on the others) */
void invariant_attention(const float *q, long qsh, long qsi, int Q, int H, int D, const float *k, long ksh, const float *v,
                         long vsh, int N, int Hkv, const uint8_t *allowed, float scale, float *out, int nthreads) {
    for (int i = 0; i < Q; i += QCHUNK)
        attention_chunk(q + (long)i * qsi, qsh, qsi, Q - i < QCHUNK ? Q - i : QCHUNK, H, D, k, ksh, v, vsh, N, Hkv,
                        allowed ? allowed + (long)i * N : NULL, scale, out + (long)i * H * D, nthreads);
}

/* which path this build compiled: 2 AVX-512, 1 AVX2, 0 portable */
int attention_kernels_path(void) {
#if defined(__AVX512F__)
    return 2;
#elif defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}
