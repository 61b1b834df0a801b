"""Grouped attention (specbench/models/attention.py) against transformers' sdpa, one process.

    python bench/attention.py --reps 5 --threads 1

The same model and backend, only `config._attn_implementation` switched between transformers'
`sdpa` (a masked multi-token query repeats K/V per layer) and the adapter's `specbench_sdpa`
(query heads folded per KV head), interleaved round by round. Prints the median T(k) in ms of a
forward over k new tokens after a 200-token cache, through `ModelAdapter.forward`, and the
median per-round ratio grouped / sdpa (below 1: the grouped path is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from backends import forward_costs  # noqa: E402  (bench/backends.py: the same T(k) measurement)

KS = [1, 2, 4, 8, 16]
IMPLS = ["sdpa", "specbench_sdpa"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="hybrid")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    from hydra import compose, initialize_config_dir

    from specbench.cli import CONF_DIR
    from specbench.models import load_model

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"model.backend={args.backend}"])
    target = load_model(cfg.model)
    times = {i: {k: [] for k in KS} for i in IMPLS}
    rel = {k: [] for k in KS}
    for r in range(args.reps):
        for impl in IMPLS if r % 2 == 0 else IMPLS[::-1]:
            target.config._attn_implementation = impl
            c = forward_costs(target, KS, context=args.context)
            for k in KS:
                times[impl][k].append(c[k])
        for k in KS:
            rel[k].append(times["specbench_sdpa"][k][-1] / times["sdpa"][k][-1])
        print(f"round {r + 1}/{args.reps}: T(8) sdpa {1e3 * times['sdpa'][8][-1]:.1f} ms, "
              f"grouped {1e3 * times['specbench_sdpa'][8][-1]:.1f} ms", flush=True)
    print(f"\nbackend {args.backend}, {args.threads} threads, context {args.context}, medians of {args.reps} rounds")
    print("| attention | " + " | ".join(f"T({k}) ms" for k in KS) + " |")
    print("|---|" + "---|" * len(KS))
    for impl in IMPLS:
        print(f"| {impl} | " + " | ".join(f"{1e3 * statistics.median(times[impl][k]):.1f}" for k in KS) + " |")
    print("| grouped / sdpa | " + " | ".join(f"{statistics.median(rel[k]):.3f}" for k in KS) + " |")


if __name__ == "__main__":
    main()
