"""The ggml backend's kernel on the embedded model's own layers (model.backend=ggml).

    taskset -c 1 python bench/ggml_kernel.py --threads 1

Prints, in one process:
- the 211 linear layers of one forward over M rows, F.linear (MKL, float32) vs the ggml kernel
  (Q4_1/Q8_0 blocks) vs the int8-activation kernel (model.backend=ggml_q8), medians of `--reps`:
  where the kernels win and where prefills should go to MKL (backends.GGML_MAX_ROWS);
- the kernel's cost per call on a tiny layer (ctypes + allocation);
- MKL's large-GEMM rate vs the kernel's multiply-add rate at 8 rows;
- batch invariance of a whole forward per backend: max |logits of one 8-token forward - logits
  of 8 one-token forwards| after a 50-token cache (0 means bit-identical);
- the batch-invariant attention kernel vs PyTorch's SDPA at the model's shapes (9 query heads,
  3 KV heads, 64 dims, 200 keys), and a 200-token prefill per ggml backend.
Written to results/bench/ggml_kernel.md with the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specbench.core.table import Column, markdown  # after the path is set

ROWS = [1, 2, 4, 8, 16, 32, 64, 128]


def median_ms(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def invariance_gap(target, backend: str) -> float:
    from specbench.models import apply_backend

    apply_backend(target.model, backend)
    ids = [(7 * i + 3) % target.vocab_size for i in range(58)]
    cache = target.new_cache()
    target.forward(ids[:50], cache, last_only=True)
    whole = target.forward(ids[50:58], cache)[0]
    cache.crop(50)
    rows = torch.cat([target.forward(ids[50 + i : 51 + i], cache)[0] for i in range(8)])
    return (whole.reshape(rows.shape) - rows).abs().max().item()


def attention_us(q: int, n: int, reps: int) -> tuple[float, float]:
    """Microseconds per call: attention.invariant_attention vs F.scaled_dot_product_attention."""
    from specbench.models.attention import invariant_attention

    class Attn:
        num_key_value_groups = 3

    query, key, value = torch.randn(1, 9, q, 64), torch.randn(1, 3, n, 64), torch.randn(1, 3, n, 64)
    mask = torch.ones(1, 1, q, n, dtype=torch.bool).tril(n - q)  # a verify chain's causal rows
    ours = median_ms(lambda: [invariant_attention(Attn(), query, key, value, mask, scaling=0.125) for _ in range(100)], reps)
    sdpa = median_ms(lambda: [F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.125, enable_gqa=True)
                              for _ in range(100)], reps)
    return 10 * ours, 10 * sdpa


def prefill_ms(target, backend: str, reps: int, tokens: int = 200) -> float:
    from specbench.models import apply_backend

    apply_backend(target.model, backend)
    ids = [(7 * i + 3) % target.vocab_size for i in range(tokens)]
    return median_ms(lambda: target.forward(ids, target.new_cache(), last_only=True), reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "results" / "bench" / "ggml_kernel.md"))
    args = ap.parse_args()

    from embedded import embedded_model

    from specbench.kernels import ggml, ggml_q8

    target = embedded_model(args.threads)
    layers = [m for m in target.model.modules() if isinstance(m, torch.nn.Linear)]
    blocks = [ggml.recover(m.weight) for m in layers]
    kinds = statistics.multimode(b.kind for b in blocks)
    q8 = [ggml_q8.pack(b) for b in blocks]

    cells = []
    for m_rows in ROWS:
        xs = [torch.randn(m_rows, lin.in_features) for lin in layers]
        mkl = median_ms(lambda xs=xs: [F.linear(x, lin.weight) for x, lin in zip(xs, layers)], args.reps)
        ker = median_ms(lambda xs=xs: [ggml.linear(x, b, None) for x, b in zip(xs, blocks)], args.reps)
        k8 = median_ms(lambda xs=xs: [ggml_q8.linear(x, q, None) if q else ggml.linear(x, b, None)
                                      for x, q, b in zip(xs, q8, blocks)], args.reps)
        cells.append([m_rows, mkl, ker, mkl / ker, k8])
        print(f"M={m_rows}: F.linear {mkl:.1f} ms, ggml {ker:.1f} ms, ggml_q8 {k8:.1f} ms", flush=True)
    # the one-row path with and without its striped copy of the weights, interleaved
    flat = [dataclasses.replace(b, stripes=None) for b in blocks]
    xs = [torch.randn(1, lin.in_features) for lin in layers]
    pairs = [(median_ms(lambda: [ggml.linear(x, b, None) for x, b in zip(xs, flat)], args.reps),
              median_ms(lambda: [ggml.linear(x, b, None) for x, b in zip(xs, blocks)], args.reps)) for _ in range(3)]
    no_stripes, with_stripes = (statistics.median(p) for p in zip(*pairs))
    macs = sum(lin.in_features * lin.out_features for lin in layers)

    tiny = ggml.recover(torch.zeros(4, 32))
    xt = torch.zeros(1, 32)
    per_call_us = 1e3 * median_ms(lambda: [ggml.linear(xt, tiny, None) for _ in range(1000)], args.reps) / 1000

    a, b = torch.randn(512, 576), torch.randn(576, 1536)
    gemm_ms = median_ms(lambda: torch.mm(a, b), args.reps * 4)
    mkl_gflops = 2 * 512 * 576 * 1536 / gemm_ms / 1e6
    ker8 = next(c[2] for c in cells if c[0] == 8)
    kernel_gflops = 2 * 8 * macs / ker8 / 1e6

    gaps = {be: invariance_gap(target, be) for be in ("eager", "hybrid", "ggml", "ggml_q8")}
    attn = {q: attention_us(q, 200, args.reps) for q in (1, 8)}
    prefill = {be: prefill_ms(target, be, args.reps) for be in ("ggml", "ggml_q8")}

    text = "\n".join([
        "# The ggml kernel on the embedded model's layers",
        "",
        f"- command: python {' '.join(sys.argv)}",
        (f"- date: {time.strftime('%Y-%m-%d %H:%M')}; {args.threads} torch thread(s); torch {torch.__version__}; "
         f"avx512 build: {bool(ggml.library().ggml_kernels_avx512())}"),
        (f"- {len(layers)} linear layers ({macs / 1e6:.0f}M weights), block formats: {sorted({b.kind for b in blocks})} "
         f"(most: {kinds}); medians of {args.reps} repetitions"),
        "",
        markdown(["rows M", Column("F.linear ms", spec=".1f"), Column("ggml ms", spec=".1f"),
                  Column("F.linear / ggml", spec=".2f"), Column("ggml_q8 ms", spec=".1f")], cells),
        "",
        (f"- kernel cost per call (1 row, a 4 x 32 layer): {per_call_us:.1f} us; x {len(layers)} layers = "
         f"{per_call_us * len(layers) / 1e3:.2f} ms per forward"),
        (f"- one row, the 211 layers: {no_stripes:.1f} ms reading the row-major blocks, {with_stripes:.1f} ms "
         "reading the stripes (the default; medians of 3 interleaved pairs)"),
        (f"- MKL fp32 GEMM 512x576 @ 576x1536: {mkl_gflops:.0f} GFLOP/s; the ggml kernel at 8 rows: "
         f"{kernel_gflops:.0f} GFLOP/s ({kernel_gflops / mkl_gflops:.0%} of MKL's)"),
        "- whole forward, max |8-token logits - 8 one-token logits| (0 = batch-invariant): "
        + ", ".join(f"{be} {g:.2e}" for be, g in gaps.items()),
        "- attention, 9 heads over 3 KV heads x 64 dims, 200 keys, us per call (invariant kernel vs SDPA): "
        + ", ".join(f"{q} quer{'y' if q == 1 else 'ies'} {o:.1f} vs {sd:.1f}" for q, (o, sd) in attn.items()),
        "- prefill of 200 tokens, one forward: " + ", ".join(f"{be} {ms:.0f} ms" for be, ms in prefill.items())
        + " (ggml: F.linear above 64 rows; ggml_q8: the int8 kernel at every size)",
        "",
    ])
    print("\n" + text)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
