"""The EESD trainer with the target-feature cache off and on (`train.feature_cache`), timed.

    python bench/eesd_feature_cache.py [--kinds null float16] [--full-budget] [overrides ...]

Each setting trains EESD's exit layer and Cali-TS predictor on the embedded model (the first-use
budget `train.first_use.train` unless --full-budget) in a private, fresh cache directory, so no
shared artifact is touched and every float16 run pays its prefill. The self-distilled data and the
teacher labels are copied in from the user's cache when there (neither is timed then); the ggml
kernels are linked, not rebuilt. Prints, per setting, the trainer's wall time (prefill included),
the held-out loss and agreement before -> after and the Cali-TS held-out accuracy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from specbench.core.cachedir import cache_dir
from specbench.config.compose import compose
from specbench.models import load_model
from specbench.config.settings import merge, of
from specbench.train.session import train_model


def private_cache(user: Path) -> Path:
    d = Path(tempfile.mkdtemp(prefix="eesd-feature-cache-"))
    if (user / "distill").is_dir():
        shutil.copytree(user / "distill", d / "distill", ignore=shutil.ignore_patterns("*.journal.jsonl"))
    if (user / "kernels").is_dir():
        (d / "kernels").symlink_to(user / "kernels")
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", nargs="+", default=["null", "float16"])
    ap.add_argument("--full-budget", action="store_true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    user = cache_dir()
    cfg = of(compose(["method=eesd", "control=cali_ts", *args.overrides]))
    if not args.full_budget:
        cfg = merge(cfg, {"train": cfg.train.first_use.train})
    target = load_model(cfg.model)
    rows = []
    for kind in args.kinds:
        os.environ["SPECBENCH_CACHE_DIR"] = str(private_cache(user))
        run = merge(cfg, {"train": {"feature_cache": None if kind == "null" else kind}})
        t0 = time.monotonic()
        out = train_model(run, target)
        rows.append((kind, time.monotonic() - t0, out))
        shutil.rmtree(os.environ["SPECBENCH_CACHE_DIR"])
    print(f"\nEESD trainer, {cfg.model.name}, n_layers={cfg.method.n_layers}, "
          f"{'full' if args.full_budget else 'first-use'} budget (max_steps={cfg.train.max_steps}, "
          f"max_sequences={cfg.train.max_sequences}, max_len={cfg.train.max_len}), torch threads 1")
    print("| train.feature_cache | trainer wall time (s) | held-out loss before -> after | agreement before -> after | Cali-TS held-out accuracy |")
    print("|---|---|---|---|---|")
    for kind, secs, o in rows:
        (lb, la), (ab, aa) = o["held_out_loss"], o["held_out_agreement"]
        print(f"| {kind} | {secs:.1f} | {lb:.4f} -> {la:.4f} | {ab:.3f} -> {aa:.3f} | {o.get('cali_held_out_accuracy', float('nan')):.3f} |")


if __name__ == "__main__":
    main()
