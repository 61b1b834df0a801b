"""python -m specbench.tools.calibrate [--repeats N] [--max-cv X] [model=<name>] [method=<name>] [profile.ks=[..]] ...

Measures, once per model and backend, what the cost model needs and whether the machine is
quiet enough to benchmark, and saves it as JSON beside the checkpoint cache
(`<cache dir>/calibration/<model key>-<device>-<dtype>.json`, the cache dir as in `specbench.models.artifacts`):

  * T(k): the target's forward cost over k new tokens (specbench/run/profiling.py: repeats, median,
    monotonicity check with re-measurement, spread), at `profile.ks` / `profile.context`;
  * the draft cost per drafted token of `method` (its draft phase over a short greedy
    generation; methods that need an untrained-but-missing checkpoint are skipped with the
    reason) and alpha = draft cost / T(1);
  * repeatability: a fixed workload (`--workload` one-token forwards at the profile context)
    timed `--repeats` times; the coefficient of variation of those times decides "quiet"
    (CV <= `--max-cv`). A CV of 0.02 means speedups differing by a few percent are
    resolvable; at 0.2 only large effects are.

The rest of the arguments are the benchmark's own Hydra overrides (conf/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from specbench.config import settings
from specbench.models.artifacts import cache_dir
from specbench.config.compose import check_choices, compose, fail, validate
from specbench.engine.sampling import SamplingConfig
from specbench.engine.timer import PhaseTimer
from specbench.core.errors import SpecBenchError, check_output_file
from specbench.methods import build_method
from specbench.models import ModelAdapter, load_model
from specbench.run.profiling import profile_forward
from specbench.run.runner import environment


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m specbench.tools.calibrate", description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7, help="timings of the fixed workload (>= 2)")
    p.add_argument("--workload", type=int, default=10, help="one-token forwards per timing (>= 1)")
    p.add_argument("--max-cv", type=float, default=0.05, help="coefficient of variation still called quiet")
    p.add_argument("--draft-tokens", type=int, default=32, help="tokens generated to time the draft")
    p.add_argument("--out", default=None, help="JSON path (default: the calibration cache)")
    args, overrides = p.parse_known_args(argv)
    for name in ("repeats", "workload", "draft_tokens"):
        low = 2 if name == "repeats" else 1
        if getattr(args, name) < low:
            fail(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    if not args.max_cv > 0:  # also nan
        fail(f"--max-cv must be > 0, got {args.max_cv}")
    if args.out:
        try:
            check_output_file(args.out, "--out")
        except SpecBenchError as e:
            fail(str(e))
    return args, overrides


def repeatability(target: ModelAdapter, context: int, workload: int, repeats: int) -> dict:
    """Times of the same `workload` one-token forwards, `repeats` times; their CV."""
    now = PhaseTimer(target.device, devices=getattr(target, "devices", ())).now
    ids = [(7 * i + 3) % target.vocab_size for i in range(context + 1)]
    cache = target.new_cache()
    target.forward(ids[:context], cache, last_only=True)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        t0 = now()
        for _ in range(workload):
            target.forward(ids[context:], cache)
            cache.crop(context)
        times.append(now() - t0)
    times = times[1:]
    mean = statistics.fmean(times)
    return {"times": times, "cv": statistics.stdev(times) / mean if mean > 0 else None,
            "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def draft_cost(target: ModelAdapter, cfg, t1: float, tokens: int) -> dict:
    """The method's draft seconds per drafted token over a short greedy generation (median of 3);
    `cfg`: the run's settings."""
    try:
        method = build_method(cfg.method.name, target, cfg.method, SamplingConfig(), settings.run_values(cfg))
    except SpecBenchError as e:
        return {"method": cfg.method.name, "skipped": str(e)}
    prompt = [(5 * i + 1) % target.vocab_size for i in range(int(cfg.profile.context))]
    per = []
    for seed in range(4):  # the first is a warm-up
        g = method.generate(prompt, tokens, frozenset(), seed)
        drafted = sum(s.drafted for s in g.steps)
        if drafted and seed:
            per.append(g.times.get("draft", 0.0) / drafted)
    cost = statistics.median(per) if per else None
    return {"method": cfg.method.name, "settings": method.describe(), "cost_per_token": cost,
            "alpha": cost / t1 if cost is not None and t1 else None}


def calibrate(cfg, args) -> tuple[dict, Path]:
    """`cfg`: the composed config, validated here and read as its settings."""
    validate(cfg)
    cfg = settings.of(cfg)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    torch.set_grad_enabled(False)
    target = load_model(cfg.model)
    p = cfg.profile
    prof = profile_forward(target, list(p.ks), int(p.context), int(p.reps), float(p.tolerance), int(p.max_remeasure))
    quiet = repeatability(target, int(p.context), args.workload, args.repeats)
    quiet |= {"max_cv": args.max_cv, "quiet": quiet["cv"] is not None and quiet["cv"] <= args.max_cv}
    dtype, device = str(target.dtype).replace("torch.", ""), str(target.device)
    out = {
        "model": cfg.model.name, "model_key": getattr(target, "key", None), "dtype": dtype, "device": device,
        "threads": torch.get_num_threads(), "context": int(p.context), "env": environment(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "profile": prof.to_json(),
        "draft": draft_cost(target, cfg, prof.costs[min(prof.costs)], args.draft_tokens), "repeatability": quiet,
    }
    path = Path(args.out) if args.out else cache_dir() / "calibration" / f"{out['model_key'] or cfg.model.name}-{device}-{dtype}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=str))
    return out, path


def render(out: dict, path: Path) -> str:
    prof, q, d = out["profile"], out["repeatability"], out["draft"]
    t1 = prof["costs"][min(prof["costs"])]
    lines = [f"calibration of {out['model']} ({out['dtype']}, {out['device']}, {out['threads']} threads), context {out['context']}"]
    lines.append("T(k)/T(1): " + "  ".join(f"{k}:{v / t1:.2f}" for k, v in prof["costs"].items()) + f"   T(1) = {1e3 * t1:.2f} ms")
    lines.append(f"profile spread up to {100 * prof['max_spread']:.0f}%"
                 + (f"; re-measured k={sorted(prof['remeasured'])}" if prof["remeasured"] else "")
                 + (f"; non-monotone at k={prof['non_monotone']} (kept: re-measured and still so)" if prof["non_monotone"] else ""))
    if "skipped" in d:
        lines.append(f"draft cost ({d['method']}): skipped: {d['skipped']}")
    elif d["cost_per_token"] is None:
        lines.append(f"draft cost ({d['method']}): nothing was drafted")
    else:
        lines.append(f"draft cost ({d['method']}): {1e3 * d['cost_per_token']:.2f} ms per drafted token, alpha {d['alpha']:.3f}")
    verdict = "quiet enough to benchmark" if q["quiet"] else "NOT quiet enough to benchmark: expect wide confidence intervals"
    cv = "-" if q["cv"] is None else f"{100 * q['cv']:.1f}%"
    lines.append(f"repeatability: CV {cv} over {len(q['times'])} timings (limit {100 * q['max_cv']:.0f}%), "
                 f"load avg {q['loadavg_1m']:.2f}: {verdict}")
    lines.append(f"saved: {path}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    args, overrides = parse(argv)
    check_choices(overrides)
    try:
        cfg = compose(overrides)  # an unknown key: the schema's line with the nearest known one, as the CLI's
        print(render(*calibrate(cfg, args)))
    except SpecBenchError as e:
        fail(str(e))


if __name__ == "__main__":
    main(sys.argv[1:])
