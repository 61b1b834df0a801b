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
#else /* portable: lane-wise loops (the compiler vectorizes them); deterministic within a build */
typedef struct { float v[L]; } vf;
static inline vf vf_set(float a) { vf r; for (int i = 0; i < L; i++) r.v[i] = a; return r; }
static inline vf vf_load(const float *p) { vf r; memcpy(r.v, p, sizeof r.v); return r; }
static inline void vf_store(float *p, vf a) { memcpy(p, a.v, sizeof a.v); }
static inline vf vf_fma(vf a, vf b, vf c) { for (int i = 0; i < L; i++) c.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]); return c; }
static inline vf vf_add(vf a, vf b) { for (int i = 0; i < L; i++) a.v[i] += b.v[i]; return a; }
static inline vf vf_sub(vf a, vf b) { for (int i = 0; i < L; i++) a.v[i] -= b.v[i]; return a; }
static inline vf vf_mul(vf a, vf b) { for (int i = 0; i < L; i++) a.v[i] *= b.v[i]; return a; }
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
#endif

/* q [H, Q, D], k/v [Hkv, N, D] (contiguous), allowed [Q, N] bytes or NULL (every key),
 * out [Q, H, D]; head h reads kv head h / (H / Hkv) */
void invariant_attention(const float *q, int Q, int H, int D, const float *k, const float *v, int N, int Hkv,
                         const uint8_t *allowed, float scale, float *out, int nthreads) {
    const int groups = H / Hkv, dl = D / L;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        int *idx = malloc(sizeof(int) * (N + L));
        float *s = malloc(sizeof(float) * (N + L));
#pragma omp for schedule(static)
        for (int qh = 0; qh < Q * H; qh++) {
            const int i = qh / H, h = qh % H;
            const float *qv = q + ((long)h * Q + i) * D;
            const float *kh = k + (long)(h / groups) * N * D, *vh = v + (long)(h / groups) * N * D;
            int n = 0;
            for (int j = 0; j < N; j++)
                if (!allowed || allowed[(long)i * N + j]) idx[n++] = j;
            float mx = -INFINITY;
            for (int t = 0; t < n; t++) {
                const float *kv = kh + (long)idx[t] * D;
                vf acc = vf_mul(vf_load(qv), vf_load(kv));
                for (int c = 1; c < dl; c++) acc = vf_fma(vf_load(qv + c * L), vf_load(kv + c * L), acc);
                s[t] = vf_sum(acc) * scale;
                mx = s[t] > mx ? s[t] : mx;
            }
            for (int t = n; t < n + L; t++) s[t] = -INFINITY;
            vf lsum = vf_set(0.0f);
            const vf vmx = vf_set(mx);
            for (int t = 0; t < n; t += L) {
                vf p = vf_exp(vf_sub(vf_load(s + t), vmx));
                vf_store(s + t, p);
                for (int l = n - t; l < L; l++) s[t + l] = 0.0f; /* the last chunk's unused lanes */
                lsum = vf_add(lsum, vf_load(s + t));
            }
            const float inv = 1.0f / vf_sum(lsum);
            float *o = out + ((long)i * H + h) * D;
            vf acc[MAXDL];
            for (int c = 0; c < dl; c++) acc[c] = vf_set(0.0f);
            for (int t = 0; t < n; t++) {
                const vf p = vf_set(s[t]);
                const float *vv = vh + (long)idx[t] * D;
                for (int c = 0; c < dl; c++) acc[c] = vf_fma(p, vf_load(vv + c * L), acc[c]);
            }
            for (int c = 0; c < dl; c++) vf_store(o + c * L, vf_mul(acc[c], vf_set(inv)));
        }
        free(idx);
        free(s);
    }
}
