"""Grouped attention (specbench/models/attention.py) against transformers' sdpa, one process.

    python bench/attention.py --reps 5 --threads 1

The same model and backend, only `config._attn_implementation` switched between transformers'
`sdpa` (a masked multi-token query repeats K/V per layer), the adapter's `specbench_sdpa`
(`enable_gqa=True` with the mask) and, for comparison, the query heads folded per KV head
(`bench_folded`, registered here only), interleaved round by round. Prints the median T(k) in ms of a
forward over k new tokens after a 200-token cache, through `ModelAdapter.forward`, and the
median per-round ratio to sdpa (below 1: faster).
First it times the attention call alone on the embedded model's shapes (9 query heads, 3 KV
heads, head dim 64, 200 cached tokens, explicit mask): K/V repeated as transformers does,
`enable_gqa=True` (the adapter), and the folded query.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from backends import forward_costs  # bench/backends.py: the same T(k) measurement

KS = [1, 2, 4, 8, 16]


def kernel_costs(q: int, context: int = 200, heads: int = 9, kv_heads: int = 3, dim: int = 64, calls: int = 300) -> dict[str, float]:
    """Microseconds per masked attention call (best of 3 batches of `calls`) for each variant."""
    g, n = heads // kv_heads, context + q
    query = torch.randn(1, heads, q, dim)
    key, value = torch.randn(2, 1, kv_heads, n, dim)
    allowed = torch.ones(q, n, dtype=torch.bool)
    allowed[:, context:] = torch.ones(q, q, dtype=torch.bool).tril()
    mask = torch.zeros(q, n).masked_fill(~allowed, torch.finfo(torch.float32).min).view(1, 1, q, n)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def rep(x):
        return x[:, :, None].expand(1, kv_heads, g, n, dim).reshape(1, heads, n, dim)

    variants = {
        "repeat_kv (transformers)": lambda: sdpa(query, rep(key), rep(value), attn_mask=mask),
        "enable_gqa=True (adapter)": lambda: sdpa(query, key, value, attn_mask=mask, enable_gqa=True),
        "folded": lambda: sdpa(query.reshape(1, kv_heads, g * q, dim), key, value, attn_mask=mask.repeat(1, 1, g, 1)),
    }
    best = {}
    for _ in range(3):
        for name, f in variants.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            best[name] = min(best.get(name, float("inf")), (time.perf_counter() - t0) / calls * 1e6)
    return best


IMPLS = ["sdpa", "specbench_sdpa", "bench_folded"]


def folded_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """The alternative to `enable_gqa`: the query heads sharing a KV head stacked along the query
    axis ([B, H, q, D] -> [B, H_kv, g*q, D], mask tiled g times), one plain sdpa call."""
    g = module.num_key_value_groups
    if attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    b, h, q, d = query.shape
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, h // g, g * q, d), key, value, attn_mask=attention_mask.repeat(1, 1, g, 1), dropout_p=dropout, scale=scaling
    )
    return out.reshape(b, h, q, -1).transpose(1, 2).contiguous(), None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="hybrid")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    AttentionInterface.register("bench_folded", folded_attention)
    AttentionMaskInterface.register("bench_folded", sdpa_mask)

    from hydra import compose, initialize_config_dir

    from specbench.cli import CONF_DIR
    from specbench.models import load_model
    from specbench.config.settings import of

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    for q in (1, 8):
        costs = kernel_costs(q, args.context)
        print(f"attention call alone, q={q}: " + ", ".join(f"{k} {v:.0f} us" for k, v in costs.items()), flush=True)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"model.backend={args.backend}"])
    target = load_model(of(cfg).model)
    times = {i: {k: [] for k in KS} for i in IMPLS}
    rel = {i: {k: [] for k in KS} for i in IMPLS[1:]}
    for r in range(args.reps):
        for impl in IMPLS[r % len(IMPLS):] + IMPLS[: r % len(IMPLS)]:
            target.config._attn_implementation = impl
            c = forward_costs(target, KS, context=args.context)
            for k in KS:
                times[impl][k].append(c[k])
        for impl in IMPLS[1:]:
            for k in KS:
                rel[impl][k].append(times[impl][k][-1] / times["sdpa"][k][-1])
        print(f"round {r + 1}/{args.reps}: T(8) " + ", ".join(f"{i} {1e3 * times[i][8][-1]:.1f} ms" for i in IMPLS), flush=True)
    print(f"\nbackend {args.backend}, {args.threads} threads, context {args.context}, medians of {args.reps} rounds")
    print("| attention | " + " | ".join(f"T({k}) ms" for k in KS) + " |")
    print("|---|" + "---|" * len(KS))
    for impl in IMPLS:
        print(f"| {impl} | " + " | ".join(f"{1e3 * statistics.median(times[impl][k]):.1f}" for k in KS) + " |")
    for impl in IMPLS[1:]:
        print(f"| {impl} / sdpa | " + " | ".join(f"{statistics.median(rel[impl][k]):.3f}" for k in KS) + " |")


if __name__ == "__main__":
    main()
