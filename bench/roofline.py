"""This core's roofline, and what it implies for T(k)/T(1) of the embedded model's linear layers.

    taskset -c 0 python bench/roofline.py

Compiles two tiny C probes with the system compiler (as the ggml backend does) and prints:
- the single-core read bandwidth (a streaming sum over 1 GiB, best of 5);
- the single-core float32 multiply-add rate (12 independent AVX-512 or AVX2 FMA chains);
- for the embedded model's 211 linear layers in the ggml backend's formats (Q4_1 body, Q8_0
  head: bytes per weight from the block layouts), the time floor of one forward over M rows,
  max(bytes / bandwidth, 2 * M * weights / FMA rate), and the floors' ratio to M = 1.
Exact float32 arithmetic on 4-bit weights is compute-bound from a few rows on: this is the
bound on how flat T(k) can be on a given CPU, whatever the kernel (results/bench/ backends md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specbench.models.ggml import compiler  # after the path is set

BANDWIDTH_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
    long n = (1L << 30) / 8;
    double *a = aligned_alloc(64, n * 8), best = 1e9, s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (long i = 0; i < n; i++) a[i] = 1;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (long i = 0; i < n; i += 4) { s0 += a[i]; s1 += a[i + 1]; s2 += a[i + 2]; s3 += a[i + 3]; }
        double t = now() - t0;
        if (t < best) best = t;
    }
    printf("%.3f %g\n", n * 8 / best / 1e9, s0 + s1 + s2 + s3);
    return 0;
}
"""

FMA_C = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#if defined(__AVX512F__)
typedef __m512 v; enum { LANES = 16 };
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define STORE _mm512_storeu_ps
#else
typedef __m256 v; enum { LANES = 8 };
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define STORE _mm256_storeu_ps
#endif
int main(void) {
    v a[12], b = SET1(0.999f), c = SET1(1e-6f);
    for (int i = 0; i < 12; i++) a[i] = SET1((float)i);
    long n = 100000000;
    double t0 = now();
    for (long i = 0; i < n; i++)
        for (int j = 0; j < 12; j++) a[j] = FMA(a[j], b, c);
    double t = now() - t0;
    v s = a[0];
    for (int i = 1; i < 12; i++) s = ADD(s, a[i]);
    float out[16];
    STORE(out, s);
    printf("%.3f %d %g\n", 2.0 * n * 12 * LANES / t / 1e9, LANES, out[0]);
    return 0;
}
"""

# SmolLM2-135M: 30 layers of q, k, v, o, gate, up, down; the tied 49152-row head
LAYERS = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30
HEAD = (49152, 576)
Q4_1_BYTES, Q8_0_BYTES = 24 / 32, 36 / 32  # the kernel's records: float32 d (and m) + packed values


def probe(source: str, name: str) -> list[str]:
    cc = compiler()
    if cc is None:
        sys.exit("specbench: error: bench/roofline.py needs a C compiler (cc/gcc)")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / f"{name}.c", Path(tmp) / name
        src.write_text(source)
        subprocess.run([cc, "-O3", "-march=native", str(src), "-o", str(exe)], check=True)
        return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    args = ap.parse_args()
    gbs = float(probe(BANDWIDTH_C, "bandwidth")[0])
    gflops, lanes = (float(v) for v in probe(FMA_C, "fma")[:2])
    body = sum(n * k for n, k in LAYERS)
    head = HEAD[0] * HEAD[1]
    nbytes = body * Q4_1_BYTES + head * Q8_0_BYTES
    print(f"machine: {os.uname().machine}, {os.cpu_count()} CPUs; one core measured")
    print(f"read bandwidth: {gbs:.1f} GB/s; float32 FMA rate: {gflops:.0f} GFLOP/s ({int(lanes)}-lane vectors)")
    print(f"linear layers: {(body + head) / 1e6:.0f}M weights, {nbytes / 1e6:.0f} MB in the ggml formats "
          f"(float32: {4 * (body + head) / 1e6:.0f} MB, memory floor {4 * (body + head) / gbs / 1e6:.1f} ms whatever M up to "
          f"{4 * gflops / 2 / gbs:.0f} rows)")
    floor1 = None
    for m in args.rows:
        t_mem = nbytes / gbs / 1e6
        t_fma = 2 * m * (body + head) / gflops / 1e6
        floor = max(t_mem, t_fma)
        floor1 = floor1 or floor
        print(f"M={m:3d}: memory {t_mem:5.1f} ms, multiply-adds {t_fma:5.1f} ms -> floor {floor:5.1f} ms ({floor / floor1:.2f}x M=1)")


if __name__ == "__main__":
    main()
