"""This core's roofline, and what it implies for T(k)/T(1) of the embedded model's linear layers.

    taskset -c 0 python bench/roofline.py

Compiles two tiny C probes with the system compiler (as the ggml backend does) and prints:
- the single-core read bandwidth (a streaming sum over 1 GiB, best of 5);
- the single-core float32 multiply-add rate (12 independent AVX-512 or AVX2 FMA chains);
- with AVX-512 VNNI, the single-core `vpdpbusd` rate (10 independent chains; 64 int8
  multiply-adds each): the ggml_q8 kernel's arithmetic;
- the FMA (and VNNI) probe run on two CPUs at once: each should keep its alone rate; about
  half means the two vCPUs share one core's vector units (SMT siblings on the host) or the host
  is busy, and a compute-bound job on one then slows the other (measured here 2026-11-24: 2.0x,
  independent; one earlier manual try the same hour got half each, so run it twice);
- for the embedded model's 211 linear layers in the ggml backend's formats (Q4_1 body, Q8_0
  head: bytes per weight from the block layouts), the time floor of one forward over M rows,
  max(bytes / bandwidth, 2 * M * weights / FMA rate), and the floors' ratio to M = 1; with
  VNNI also the int8 floor max(bytes / bandwidth, M * weights / (64 * vpdpbusd rate)), which
  leaves out the per-block float epilogue (ggml_q8_kernels.c), so the kernel cannot reach it.
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

from specbench.kernels.ggml import compiler  # after the path is set

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

VNNI_C = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
#if defined(__AVX512VNNI__)
    /* ten named chains (an array would be stored and reloaded every iteration) */
    const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(1);
    __m512i a0 = _mm512_set1_epi32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0;
#define D(a) a = _mm512_dpbusd_epi32(a, w, x);
    long n = 100000000;
    double t0 = now();
    for (long i = 0; i < n; i++) {
        D(a0) D(a1) D(a2) D(a3) D(a4) D(a5) D(a6) D(a7) D(a8) D(a9)
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9));
    }
    double t = now() - t0;
    __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                 _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
    s = _mm512_add_epi32(s, _mm512_add_epi32(a8, a9));
    printf("%.3f %d\\n", 10.0 * n / t / 1e9, _mm512_reduce_add_epi32(s));
#else
    printf("0 0\\n");
#endif
    return 0;
}
"""

# SmolLM2-135M: 30 layers of q, k, v, o, gate, up, down; the tied 49152-row head
LAYERS = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)] * 30
HEAD = (49152, 576)
Q4_1_BYTES, Q8_0_BYTES = 24 / 32, 36 / 32  # the kernel's records: float32 d (and m) + packed values


def compile_probe(source: str, name: str, tmp: str) -> Path:
    cc = compiler()
    if cc is None:
        sys.exit("specbench: error: bench/roofline.py needs a C compiler (cc/gcc)")
    src, exe = Path(tmp) / f"{name}.c", Path(tmp) / name
    src.write_text(source)
    subprocess.run([cc, "-O3", "-march=native", str(src), "-o", str(exe)], check=True)
    return exe


def run_on(exes: list[Path], cpus: list[int]) -> list[list[str]]:
    """Run exes[i] pinned to cpus[i], all at once; their outputs split into words."""
    procs = [subprocess.Popen(["taskset", "-c", str(c), str(e)], stdout=subprocess.PIPE, text=True) for e, c in zip(exes, cpus)]
    return [p.communicate()[0].split() for p in procs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        bw, fma, vnni = (compile_probe(src, name, tmp) for src, name in ((BANDWIDTH_C, "bandwidth"), (FMA_C, "fma"), (VNNI_C, "vnni")))
        gbs = float(run_on([bw], cpus[:1])[0][0])
        gflops, lanes = (float(v) for v in run_on([fma], cpus[:1])[0][:2])
        dpbusd = float(run_on([vnni], cpus[:1])[0][0])  # G instructions/s (0: no VNNI)
        shared = None
        if len(cpus) > 1:  # the same probes on two CPUs at once
            shared = [float(x[0]) for x in run_on([fma, fma], cpus[:2])], [float(x[0]) for x in run_on([vnni, vnni], cpus[:2])]
    body = sum(n * k for n, k in LAYERS)
    head = HEAD[0] * HEAD[1]
    nbytes = body * Q4_1_BYTES + head * Q8_0_BYTES
    print(f"machine: {os.uname().machine}, {os.cpu_count()} CPUs; one core measured")
    print(f"read bandwidth: {gbs:.1f} GB/s; float32 FMA rate: {gflops:.0f} GFLOP/s ({int(lanes)}-lane vectors)"
          + (f"; vpdpbusd: {dpbusd:.2f} G/s ({64 * dpbusd:.0f} G int8 multiply-adds/s)" if dpbusd else "; no AVX-512 VNNI"))
    if shared:
        (f0, f1), (v0, v1) = shared
        print(f"on CPUs {cpus[0]} and {cpus[1]} at once: FMA {f0:.0f} + {f1:.0f} GFLOP/s ({(f0 + f1) / gflops:.2f}x one alone)"
              + (f"; vpdpbusd {v0:.2f} + {v1:.2f} G/s ({(v0 + v1) / dpbusd:.2f}x)" if dpbusd else "")
              + ("  -> not independent now (shared vector units or a busy host)" if (f0 + f1) / gflops < 1.4 else ""))
    print(f"linear layers: {(body + head) / 1e6:.0f}M weights, {nbytes / 1e6:.0f} MB in the ggml formats "
          f"(float32: {4 * (body + head) / 1e6:.0f} MB, memory floor {4 * (body + head) / gbs / 1e6:.1f} ms whatever M up to "
          f"{4 * gflops / 2 / gbs:.0f} rows)")
    floor1 = int8_1 = None
    for m in args.rows:
        t_mem = nbytes / gbs / 1e6
        t_fma = 2 * m * (body + head) / gflops / 1e6
        floor = max(t_mem, t_fma)
        floor1 = floor1 or floor
        line = f"M={m:3d}: memory {t_mem:5.1f} ms, multiply-adds {t_fma:5.1f} ms -> floor {floor:5.1f} ms ({floor / floor1:.2f}x M=1)"
        if dpbusd:
            t_int8 = m * (body + head) / (64 * dpbusd) / 1e6
            int8_floor = max(t_mem, t_int8)
            int8_1 = int8_1 or int8_floor
            line += f"; int8 (ggml_q8) vpdpbusd {t_int8:4.1f} ms -> floor {int8_floor:4.1f} ms ({int8_floor / int8_1:.2f}x)"
        print(line)


if __name__ == "__main__":
    main()
