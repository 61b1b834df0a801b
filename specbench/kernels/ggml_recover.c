/* The ggml blocks of a float32 weight that was dequantized from Q4_1 or Q8_0 (kernels/ggml.py `recover`).
 *
 * The torch reference (_recover_q4_1, _recover_q8_0) makes ~15 passes over the weight; this makes one, which is
 * most of what loading the embedded model with model.backend=ggml cost once the model itself is cached. It tries
 * the same candidate scales in the same order (the float16 nearest the block's scale, then one float16 below,
 * then one above) and keeps the first that reproduces the block, so it returns the reference's blocks (tests:
 * test_ggml_recover.py). A candidate reproduces a block when d*q (+ m), a float multiply then a float add as
 * the kernels dequantize (-ffp-contract=off), equals each of the block's 32 floats (float ==, as torch's).
 * Returns 1 when every block was found, 0 otherwise (the outputs are then partly written and unused).
 */
#include <math.h>
#include <stdint.h>

#define RBLOCK 32

/* float16 by hand, not the _Float16 type (GCC 12 on x86: GCC 11, Ubuntu 22.04's, would fail the whole build) */
static float from_half_bits(uint16_t h) {
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    float v = exp == 0 ? ldexpf((float)mant, -24) : exp == 31 ? (mant ? NAN : INFINITY) : ldexpf((float)(mant | 0x400), exp - 25);
    return (h & 0x8000) ? -v : v;
}

/* float16 bits of x, rounded to nearest, ties to even, as torch's .half() (F. Giesen's float_to_half_fast3_rtne);
 * exported for the tests */
uint16_t ggml_half_bits(float x) {
    union { float f; uint32_t u; } f = {.f = x}, denorm_magic = {.u = ((127 - 15) + (23 - 10) + 1) << 23};
    uint32_t sign = f.u & 0x80000000u;
    uint16_t o;
    f.u ^= sign;
    if (f.u >= (127u + 16) << 23) {  /* 65536 and up: infinity; NaN stays NaN */
        o = f.u > 255u << 23 ? 0x7e00 : 0x7c00;
    } else if (f.u < 113u << 23) {  /* a float16 subnormal or zero: the float add rounds */
        f.f += denorm_magic.f;
        o = (uint16_t)(f.u - denorm_magic.u);
    } else {
        uint32_t odd = (f.u >> 13) & 1;
        f.u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;  /* a carry into the exponent rounds up to it */
        o = (uint16_t)(f.u >> 13);
    }
    return o | (uint16_t)(sign >> 16);
}

/* torch: approx.clamp(-65504, 65504).half().view(int16) + i, viewed back as float16 (int16 arithmetic wraps) */
static void candidates(float approx, float out[3]) {
    float c = approx < -65504.0f ? -65504.0f : (approx > 65504.0f ? 65504.0f : approx);
    uint16_t h = ggml_half_bits(c);
    out[0] = from_half_bits(h);
    out[1] = from_half_bits((uint16_t)(h - 1));
    out[2] = from_half_bits((uint16_t)(h + 1));
}

/* q clamped to [lo, hi]; NaN stays NaN (torch.clamp), so the block then fails its comparison */
static inline float clampq(float q, float lo, float hi) { return q < lo ? lo : (q > hi ? hi : q); }

static int fits_q4_1(const float *b, float d, float m, float *q) {
    float safe = d == 0.0f ? 1.0f : d;
    for (int j = 0; j < RBLOCK; j++) {
        float qj = d == 0.0f ? 0.0f : clampq(nearbyintf((b[j] - m) / safe), 0.0f, 15.0f);
        if (!((d * qj) + m == b[j])) return 0;
        q[j] = qj;
    }
    return 1;
}

static int fits_q8_0(const float *b, float d, float *q) {
    float safe = d == 0.0f ? 1.0f : d;
    for (int j = 0; j < RBLOCK; j++) {
        float qj = d == 0.0f ? 0.0f : clampq(nearbyintf(b[j] / safe), -128.0f, 127.0f);
        if (!(d * qj == b[j])) return 0;
        q[j] = qj;
    }
    return 1;
}

/* w: nblocks x 32 floats; d, m: nblocks floats; qs: nblocks x 16 bytes (low nibble element j, high j+16) */
int ggml_recover_q4_1(const float *w, long nblocks, float *d, float *m, uint8_t *qs) {
    float q[RBLOCK], cand[3];
    for (long i = 0; i < nblocks; i++) {
        const float *b = w + i * RBLOCK;
        float lo = b[0], hi = b[0];
        for (int j = 0; j < RBLOCK; j++) {
            if (!isfinite(b[j])) return 0;
            lo = b[j] < lo ? b[j] : lo;
            hi = b[j] > hi ? b[j] : hi;
        }
        if (from_half_bits(ggml_half_bits(lo)) != lo) return 0;  /* the minimum is stored as a float16 */
        candidates((hi - lo) / 15.0f, cand);
        int c = 0;
        while (c < 3 && !fits_q4_1(b, cand[c], lo, q)) c++;
        if (c == 3) return 0;
        d[i] = cand[c];
        m[i] = lo;
        for (int j = 0; j < RBLOCK / 2; j++)
            qs[i * 16 + j] = (uint8_t)((int)q[j] | ((int)q[j + 16] << 4));
    }
    return 1;
}

/* w: nblocks x 32 floats; d: nblocks floats; qs: nblocks x 32 int8 */
int ggml_recover_q8_0(const float *w, long nblocks, float *d, int8_t *qs) {
    float q[RBLOCK], cand[3];
    for (long i = 0; i < nblocks; i++) {
        const float *b = w + i * RBLOCK;
        float amax = 0.0f;
        for (int j = 0; j < RBLOCK; j++) {
            if (!isfinite(b[j])) return 0;
            float a = fabsf(b[j]);
            amax = a > amax ? a : amax;
        }
        candidates(amax / 127.0f, cand);
        int c = 0;
        while (c < 3 && !fits_q8_0(b, cand[c], q)) c++;
        if (c == 3) return 0;
        d[i] = cand[c];
        for (int j = 0; j < RBLOCK; j++) qs[i * RBLOCK + j] = (int8_t)q[j];
    }
    return 1;
}
