"""Linear-layer backends on the embedded model (model.backend), all measured in one process.

    python bench/backends.py                      # eager, mkldnn, hybrid, bf16, qint8
    python bench/backends.py --backends eager mkldnn --reps 7 --samples 8

Prints, per backend:
- T(k)/T(1) for k = 1..16: a forward over k new tokens after a 200-token cache, through the
  harness's own path (`ModelAdapter.forward`, logits for every new token, as verification needs);
  backends are interleaved round by round and the figures are medians over rounds, each round's
  ratio taken inside that round (the machine is shared: absolute times drift, ratios less so);
- AR tokens/s (greedy, real GSM8K prompts), relative to eager within the same sample;
- greedy `matches_ar`: how many samples a speculative method (default vanilla SD with an
  untrained truncated draft, K=4: every step verifies 5 tokens) returns exactly AR's tokens,
  both running the same backend.
`--profile` also prints torch.profiler's top operators of k=1 and k=8 forwards per backend.
The table is written to results/bench/backends.md (with the command) and .json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specbench.core.table import Column, markdown  # after the path is set

KS = list(range(1, 17))


def forward_costs(target, ks, context: int = 200, inner: int = 1) -> dict[int, float]:
    """Seconds of one forward over k new tokens (the fastest of `inner` tries) after `context`."""
    ids = [(7 * i + 3) % target.vocab_size for i in range(context + max(ks))]
    cache = target.new_cache()
    target.forward(ids[:context], cache, last_only=True)
    target.forward(ids[context : context + 4], cache)  # warm-up (and packing)
    cache.crop(context)
    out = {}
    for k in ks:
        best = float("inf")
        for _ in range(inner):
            t0 = time.perf_counter()
            target.forward(ids[context : context + k], cache)
            best = min(best, time.perf_counter() - t0)
            cache.crop(context)
        out[k] = best
    return out


def profile_table(target, k: int = 8, context: int = 200, rows: int = 12) -> str:
    from torch.profiler import ProfilerActivity, profile

    ids = [(7 * i + 3) % target.vocab_size for i in range(context + k)]
    cache = target.new_cache()
    target.forward(ids[:context], cache, last_only=True)
    target.forward(ids[context:], cache)
    cache.crop(context)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            target.forward(ids[context:], cache)
            cache.crop(context)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def method_cfg(args):
    from specbench.config.settings import shipped

    if args.method == "vanilla_sd":  # an untrained truncated draft
        return shipped("method", "vanilla_sd", {"draft": {"num_layers": 4, "checkpoint": None}})
    return shipped("method", args.method)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="*", default=["eager", "mkldnn", "hybrid", "bf16", "qint8"])
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds of the T(k) sweep")
    ap.add_argument("--samples", type=int, default=6, help="GSM8K prompts for AR tok/s and matches_ar")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--method", default="vanilla_sd", choices=["vanilla_sd", "pld"])
    ap.add_argument("--k", type=int, default=4, help="draft length of the speculative method")
    ap.add_argument("--inner", type=int, default=1, help="forwards per k per round (the fastest counts)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default=str(REPO / "results" / "bench"))
    args = ap.parse_args()

    from hydra import compose, initialize_config_dir

    from specbench.cli import CONF_DIR
    from specbench.engine.sampling import SamplingConfig
    from specbench.methods import build_method
    from specbench.models import apply_backend, load_model
    from specbench.config.settings import of, run_values, shipped
    from specbench.tasks import build_task

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["model.backend=eager", f"task.num_samples={args.samples}"])
    run = of(cfg)
    target = load_model(run.model)
    samples = build_task(run.task).load()
    tok = target.tokenizer
    prompts = [tok.encode_chat(s.messages([])) for s in samples]

    # -- T(k): interleaved rounds, backend order rotated every round --------------------------
    ratios = {b: {k: [] for k in KS} for b in args.backends}
    t1 = {b: [] for b in args.backends}
    for r in range(args.reps):
        order = args.backends[r % len(args.backends):] + args.backends[: r % len(args.backends)]
        for b in order:
            apply_backend(target.model, b)
            c = forward_costs(target, KS, inner=args.inner)
            t1[b].append(c[1])
            for k in KS:
                ratios[b][k].append(c[k] / c[1])
        print(f"round {r + 1}/{args.reps}: " + ", ".join(f"{b} T(1)={1e3 * t1[b][-1]:.0f}ms T(8)/T(1)={ratios[b][8][-1]:.2f}" for b in args.backends), flush=True)

    profiles = {}
    if args.profile:
        for b in args.backends:
            apply_backend(target.model, b)
            for k in (1, 8):
                profiles[f"{b}, k={k}"] = table = profile_table(target, k)
                print(f"\n## profile, backend {b}, one forward over k={k} after 200 cached tokens (x3)\n{table}", flush=True)

    # -- AR tokens/s and matches_ar on real prompts, backends interleaved per sample ----------
    greedy = SamplingConfig()
    ar_tps = {b: [] for b in args.backends}
    ar_rel = {b: [] for b in args.backends}
    same = {b: 0 for b in args.backends}
    eos = tok.eos_ids
    mcfg, ar_cfg = method_cfg(args), shipped("method", "ar")
    values = replace(run_values(run), control=shipped("control", "fixed", {"k": args.k}))
    for i, prompt in enumerate(prompts):
        eager_tps = None
        for b in args.backends:
            apply_backend(target.model, b)
            ar = build_method("ar", target, ar_cfg, greedy, values)
            sd = build_method(args.method, target, mcfg, greedy, values)
            ar.generate(prompt[:32], 4, eos, 0)  # warm-up: packing and allocation
            t0 = time.perf_counter()
            a = ar.generate(prompt, args.max_new_tokens, eos, i)
            tps = len(a.tokens) / (time.perf_counter() - t0)
            m = sd.generate(prompt, args.max_new_tokens, eos, i)
            ar_tps[b].append(tps)
            eager_tps = eager_tps or (tps if b == "eager" else None)
            if eager_tps:
                ar_rel[b].append(tps / eager_tps)
            same[b] += a.tokens == m.tokens
        print(f"sample {i + 1}/{len(prompts)}: " + ", ".join(f"{b} {ar_tps[b][-1]:.1f} tok/s" for b in args.backends), flush=True)

    rows = []
    for b in args.backends:
        med = {k: statistics.median(ratios[b][k]) for k in KS}
        rows.append({
            "backend": b, "T1_ms": 1e3 * statistics.median(t1[b]), "ratios": med,
            "ar_tok_s": statistics.median(ar_tps[b]),
            "ar_vs_eager": statistics.median(ar_rel[b]) if ar_rel[b] else None,
            "matches_ar": f"{same[b]}/{len(prompts)}",
        })
    text = report(args, rows, profiles)
    print("\n" + text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "backends.md").write_text(text)
    (out / "backends.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


def report(args, rows, profiles) -> str:
    import transformers

    columns = ["backend", Column("T(1) ms", spec=".1f"), *(Column(f"T({k})", spec=".2f") for k in KS),
               Column("AR tok/s", spec=".2f"), "AR vs eager", "=AR"]
    cells = [[r["backend"], r["T1_ms"], *(r["ratios"][k] for k in KS), r["ar_tok_s"],
              None if r["ar_vs_eager"] is None else f"{r['ar_vs_eager']:.2f}x", r["matches_ar"]] for r in rows]
    meta = [
        f"- command: python {' '.join(sys.argv)}",
        f"- date: {time.strftime('%Y-%m-%d %H:%M')}; {platform.processor() or platform.machine()}, {args.threads} torch threads; "
        f"torch {torch.__version__}, transformers {transformers.__version__}",
        f"- T(k)/T(1): medians over {args.reps} interleaved rounds (ratio inside each round); T(1) median ms; the machine "
        "was shared with other jobs, so absolute times are noisy",
        f"- AR tok/s: median over {args.samples} GSM8K prompts, {args.max_new_tokens} new tokens, greedy; 'AR vs eager' is "
        "the median per-sample ratio to eager measured back to back",
        f"- =AR: samples where {args.method} (K={args.k}) returned exactly AR's tokens, both on the same backend",
    ]
    body = ["# Linear-layer backends on the embedded model", "", *meta, "", markdown(columns, cells), ""]
    for b, table in profiles.items():
        body += [f"## profile: {b} after 200 cached tokens, 3 forwards", "", "```", table, "```", ""]
    return "\n".join(body)


if __name__ == "__main__":
    main()
