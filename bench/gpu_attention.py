"""On a GPU: the verification call's attention with grouped K/V heads and a boolean mask, two ways.

    python bench/gpu_attention.py [--reps 200]

The adapter (specbench/models/attention.py) passes a masked grouped query to SDPA with
`enable_gqa=True`; on CUDA, PyTorch's fused kernels (memory-efficient, flash, cuDNN) refuse grouped
heads for dense input, so that call runs the math kernel. The other way repeats K/V to the query's
head count first (transformers' `repeat_kv`) and lets the memory-efficient kernel take it. Both on
the embedded model's shapes (9 query heads, 3 KV heads, head dim 64, float32; bfloat16 beside),
per call, timed with CUDA events after a warm-up; prints which kernels are eligible and the median
microseconds of each way over q new tokens after n cached ones.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def ways(q, k, v, mask):
    rep = q.shape[1] // k.shape[1]
    return {
        "enable_gqa (math)": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
        "K/V repeated (fused)": lambda: F.scaled_dot_product_attention(
            q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask),
    }


def eligible(q, k, v, mask) -> dict:
    out = {}
    rep = q.shape[1] // k.shape[1]
    for name, backend in (("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)):
        for label, args in (("gqa", (k, v, True)), ("repeated", (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), False))):
            try:
                with sdpa_kernel(backend):
                    F.scaled_dot_product_attention(q, args[0], args[1], attn_mask=mask, enable_gqa=args[2])
                out[f"{name}/{label}"] = "ok"
            except RuntimeError:
                out[f"{name}/{label}"] = "refused"
    return out


def time_us(fn, reps: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print("| dtype | q | n | enable_gqa (math), us | K/V repeated (fused), us | ratio |\n|---|---:|---:|---:|---:|---:|")
    shown = False
    for dtype in (torch.float32, torch.bfloat16):
        for n in (256, 1024):
            for qn in (1, 8, 64):
                q = torch.randn(1, 9, qn, 64, device="cuda", dtype=dtype)
                k = torch.randn(1, 3, n, 64, device="cuda", dtype=dtype)
                v = torch.randn(1, 3, n, 64, device="cuda", dtype=dtype)
                mask = torch.ones(1, 1, qn, n, dtype=torch.bool, device="cuda").tril(n - qn)
                if not shown:
                    print("eligible:", eligible(q, k, v, mask))
                    shown = True
                t = {name: time_us(fn, args.reps) for name, fn in ways(q, k, v, mask).items()}
                a, b = t.values()
                print(f"| {str(dtype).split('.')[-1]} | {qn} | {n} | {a:.1f} | {b:.1f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
