"""The benchmark run: AR and a method on the same samples, in the same process, interleaved.

For every sample (and every turn of it) AR and the method generate from their own history;
which of the two goes first alternates per sample so slow drift of the machine (thermal, other
load) hits both alike. Each finished sample is appended to `samples.jsonl` and flushed at once;
re-running into the same directory skips finished samples, so a crash loses nothing done.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specbench.config import validate
from specbench.engine.sampling import SamplingConfig
from specbench.engine.timer import check_mode, synced_now
from specbench.errors import SpecBenchError
from specbench.methods import build_method
from specbench.methods.base import Generation, Method
from specbench.metrics import acceptance_metrics, eq14_speedup, position_acceptance, predicted_speedup
from specbench.metrics.acceptance import prefix_agreement
from specbench.metrics.costmodel import interp_cost
from specbench.models import ModelAdapter, load_model
from specbench.rundir import RunDir
from specbench.tasks import build_task
from specbench.tasks.base import Sample

def environment() -> dict:
    import transformers

    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "hostname": platform.node(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    return env


def profile_forward(target: ModelAdapter, ks: list[int], context: int = 200, reps: int = 3) -> dict[int, float]:
    """Median seconds of a full-model forward over k new tokens after `context` cached ones."""
    ids = [(7 * i + 3) % target.vocab_size for i in range(context + max(ks))]
    cache = target.new_cache()
    target.forward(ids[:context], cache, last_only=True)
    out = {}
    for k in ks:
        times = []
        for _ in range(reps + 1):  # first is a warm-up
            t0 = synced_now(target.device)
            target.forward(ids[context : context + k], cache)
            times.append(synced_now(target.device) - t0)
            cache.crop(context)
        out[k] = statistics.median(times[1:])
    return out


def check_context(samples: list[Sample], target: ModelAdapter, max_new: int) -> int:
    """max_new_tokens capped at the model's context; a first prompt that leaves no room for one
    new token is bad input (later turns are capped as they come, see run_generation)."""
    ctx = target.context_length
    if ctx is None:
        return max_new
    for s in samples:
        n = len(target.tokenizer.encode_chat(s.messages([])))
        if n >= ctx:
            raise SpecBenchError(f"sample {s.id!r}: the prompt has {n} tokens, the model's context {ctx}; shorten it")
    if max_new > ctx:
        print(f"note: max_new_tokens={max_new} capped at the model's context ({ctx})")
    return min(max_new, ctx)


def run_generation(method: Method, sample: Sample, tokenizer, max_new: int, seed: int) -> tuple[list[Generation], list[str]]:
    replies: list[str] = []
    gens: list[Generation] = []
    ctx = method.target.context_length
    for turn in range(len(sample.turns)):
        prompt = tokenizer.encode_chat(sample.messages(replies))
        if ctx is not None and len(prompt) >= ctx:
            raise SpecBenchError(f"sample {sample.id!r} turn {turn + 1}: the conversation has {len(prompt)} tokens, the model's context {ctx}")
        limit = min(max_new, ctx - len(prompt)) if ctx is not None else max_new
        g = method.generate(prompt, limit, tokenizer.eos_ids, seed + turn)
        g.extra["prompt_len"] = len(prompt)
        gens.append(g)
        replies.append(tokenizer.decode(g.tokens))
    return gens, replies


def summarize_system(gens: list[Generation]) -> dict:
    tokens = sum(len(g.tokens) for g in gens)
    times: dict[str, float] = {}
    for g in gens:
        for k, v in g.times.items():
            times[k] = times.get(k, 0.0) + v
    steps = [s for g in gens for s in g.steps]
    rec = {"new_tokens": tokens, "wall": times.get("wall", 0.0), "times": times}
    rec["tokens_per_s"] = tokens / rec["wall"] if rec["wall"] else None
    if steps:
        rec["acceptance"] = acceptance_metrics(steps, tokens, len(gens))
        rec["pos_drafted"], rec["pos_accepted"] = position_acceptance(steps)
    rec["steps"] = steps
    return rec


def run_sample(index: int, sample: Sample, ar: Method, method: Method, task, tokenizer, cfg, costs,
               base: Method | None = None, max_new: int | None = None) -> dict:
    """`base`: AR on the original weights, for methods that change them (SPACE): its quality
    shows what the fine-tuning cost; it takes no part in speedup or losslessness."""
    seed = int(cfg.seed) + index
    order = [("ar", ar), ("method", method)] if index % 2 == 0 else [("method", method), ("ar", ar)]
    if base is not None:
        order.append(("base", base))
    results = {}
    for key, m in order:
        gens, replies = run_generation(m, sample, tokenizer, max_new or int(cfg.max_new_tokens), seed)
        rec = summarize_system(gens)
        rec["tokens"] = [g.tokens for g in gens]
        rec["text"] = replies
        rec["quality"] = task.score(sample, replies)
        results[key] = rec
    a, m = results["ar"], results["method"]
    rec = {"id": sample.id, "index": index, "category": sample.category, "ar": a, "method": m}
    if "base" in results:
        rec["base"] = {k: results["base"][k] for k in ("new_tokens", "wall", "tokens_per_s", "quality", "text")}
        # how far the original weights' output follows the fine-tuned AR's (the behaviour the fine-tuning changed)
        rec["base"]["agree_tokens"], rec["base"]["agree_of"] = prefix_agreement(a["tokens"], results["base"]["tokens"])
    rec["matches_ar"] = a["tokens"] == m["tokens"]
    rec["speedup"] = m["tokens_per_s"] / a["tokens_per_s"] if a["tokens_per_s"] and m["tokens_per_s"] else None
    if costs and m.get("acceptance") and "draft" in m["times"]:  # timing=coarse: no draft time
        draft_cost = m["times"].get("draft", 0.0) / max(1, m["acceptance"]["drafted"])
        rec["predicted_speedup"] = predicted_speedup(m["steps"], m["new_tokens"], draft_cost, costs, len(m["tokens"]))
    return rec


def aggregate(records: list[dict], costs: dict[int, float] | None, per_category: bool = True) -> dict:
    """Pooled figures over samples: ratios of sums (the papers' way), plus per-sample spreads."""
    if not records:
        return {"samples": 0}
    out: dict = {"samples": len(records)}
    for key in ("ar", "method", "base"):
        if key == "base" and not all("base" in r for r in records):
            continue
        tok = sum(r[key]["new_tokens"] for r in records)
        wall = sum(r[key]["wall"] for r in records)
        times: dict[str, float] = {}
        for r in records:
            for k, v in r[key].get("times", {}).items():
                times[k] = times.get(k, 0.0) + v
        q: dict[str, list[float]] = {}
        for r in records:
            for k, v in (r[key].get("quality") or {}).items():
                q.setdefault(k, []).append(v)
        out[key] = {
            "new_tokens": tok,
            "wall": wall,
            "tokens_per_s": tok / wall if wall else None,
            "times": times,
            "time_share": {k: v / wall for k, v in times.items() if k != "wall"} if wall else {},
            "quality": {k: statistics.fmean(v) for k, v in q.items()},
        }
    if "base" in out:
        of = sum(r["base"].get("agree_of", 0) for r in records)
        out["base"]["agreement"] = sum(r["base"].get("agree_tokens", 0) for r in records) / of if of else None
    m = out["method"]
    out["speedup"] = m["tokens_per_s"] / out["ar"]["tokens_per_s"] if out["ar"]["tokens_per_s"] else None
    per = [r["speedup"] for r in records if r.get("speedup")]
    out["speedup_per_sample_mean"] = statistics.fmean(per) if per else None
    out["speedup_per_sample_std"] = statistics.stdev(per) if len(per) > 1 else None
    out["matches_ar"] = sum(bool(r["matches_ar"]) for r in records)
    steps = [s for r in records for s in r["method"].get("steps", [])]
    n_seq = sum(len(r["method"].get("tokens") or [None]) for r in records)  # one prefill token each
    if steps:
        acc = acceptance_metrics(steps, m["new_tokens"], n_seq)
        out["acceptance"] = acc
        out["pos_drafted"], out["pos_accepted"] = position_acceptance(steps)
        drafted = max(1, acc["drafted"])
        draft_cost = m["times"].get("draft", 0.0) / drafted
        if costs and "draft" in m["times"]:  # timing=coarse records the wall only
            out["predicted_speedup"] = predicted_speedup(steps, m["new_tokens"], draft_cost, costs, n_seq)
            out["alpha"] = draft_cost / interp_cost(costs, 1)
            out["eq14_speedup"] = eq14_speedup(acc["v_d"], acc["r_d"], out["alpha"])
    cats = sorted({r["category"] for r in records if r.get("category")}) if per_category else []
    if cats:
        out["per_category"] = {c: aggregate([r for r in records if r.get("category") == c], None, False) for c in cats}
        for c in cats:
            for k in ("pos_drafted", "pos_accepted"):
                out["per_category"][c].pop(k, None)
    return out


def _fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def print_summary(s: dict, meta: dict) -> str:
    lines = [
        f"\n== {meta['method']} vs AR | task {meta['task']} | model {meta['model']} | {s['samples']} samples ==",
        f"lossless by design: {meta['lossless']}   outputs identical to AR: {s.get('matches_ar', 0)}/{s['samples']}",
        "settings: " + ", ".join(f"{k}={v}" for k, v in meta["method_settings"].items() if k not in ("method", "lossless")),
    ]
    if meta["method_settings"].get("draft_trained") is False:
        lines.append("note: the draft is untrained (run `python -m specbench.train` to distil it); expect a slowdown")
    if s["samples"]:
        ar, m = s["ar"], s["method"]
        lines.append(f"{'':10}{'tokens':>8}{'wall s':>9}{'tok/s':>8}   quality")
        systems = [("AR", ar), (meta["method"], m)] + ([("AR base", s["base"])] if "base" in s else [])
        for name, d in systems:
            qual = ", ".join(f"{k}={v:.3f}" for k, v in d["quality"].items()) or "n/a"
            lines.append(f"{name[:10]:10}{d['new_tokens']:>8}{d['wall']:>9.2f}{_fmt(d['tokens_per_s'], '.2f'):>8}   {qual}")
        if "base" in s:
            lines.append(f"AR base = original weights; its output follows AR's (fine-tuned) for {_fmt(s['base'].get('agreement'))}"
                         " of AR's tokens (common prefix)")
        lines.append(
            f"speedup {_fmt(s['speedup'], '.3f')}x (per-sample mean {_fmt(s['speedup_per_sample_mean'], '.3f')}"
            f" ± {_fmt(s['speedup_per_sample_std'], '.3f')})   predicted {_fmt(s.get('predicted_speedup'), '.3f')}x"
            f"   eq.14 {_fmt(s.get('eq14_speedup'), '.3f')}x"
        )
        acc = s.get("acceptance")
        if acc:
            lines.append(
                f"v_d {_fmt(acc['v_d'])}  r_d {_fmt(acc['r_d'])}  HM {_fmt(acc['hm'], '.2f')}  tau {_fmt(acc['tau'], '.2f')}"
                f"  accepted/step {_fmt(acc['mean_accepted'], '.2f')}  drafted/step {_fmt(acc['mean_drafted'], '.2f')}"
            )
            rates = [a / d if d else 0 for d, a in zip(s["pos_drafted"], s["pos_accepted"])]
            lines.append("acceptance by draft position: " + " ".join(f"{r:.2f}" for r in rates[:12]))
        share = m["time_share"]
        lines.append(
            "time share (method): " + ("  ".join(f"{k} {100 * v:.1f}%" for k, v in share.items()) or "n/a (timing=coarse: wall clock only)")
        )
        if s.get("per_category"):
            lines.append("per category:")
        for c, cs in (s.get("per_category") or {}).items():
            tau = (cs.get("acceptance") or {}).get("tau")
            lines.append(f"  {c[:22]:22} {cs['samples']:>4} samples  speedup {_fmt(cs.get('speedup'), '.3f')}x  tau {_fmt(tau, '.2f')}")
    text = "\n".join(lines)
    print(text)
    return text


def run(cfg: DictConfig, target: ModelAdapter | None = None) -> dict:
    """One benchmark run. `target`: an already loaded model for cfg.model (benchmarks that run
    several methods load it once)."""
    torch.set_grad_enabled(False)
    validate(cfg)
    check_mode(str(cfg.get("timing", "fine")))
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg.threads))
    task = build_task(cfg.task)
    samples = task.load()
    target = target or load_model(cfg.model)
    sampling = SamplingConfig.from_cfg(cfg.sampling)
    ctx = {"control": cfg.get("control"), "cfg": cfg}
    method = build_method(cfg.method.name, target, cfg.method, sampling, ctx)
    # SPACE changes the weights: its lossless reference is AR on the fine-tuned model
    ar_target = method.finetuned_adapter if getattr(method, "baseline_weights", None) == "fine-tuned" else target
    ar = build_method("ar", ar_target, cfg.method, sampling, ctx)
    max_new = check_context(samples, target, int(cfg.max_new_tokens))
    # only now, with everything validated, is anything written to disk
    run_dir = RunDir(Path(cfg.run_dir), cfg, bool(cfg.get("overwrite", False)))
    meta = {
        "method": cfg.method.name,
        "controller": getattr(getattr(method, "controller", None), "name", None),
        "task": cfg.task.name,
        "model": cfg.model.name,
        "model_key": getattr(ar_target, "key", None),
        "baseline_weights": getattr(method, "baseline_weights", "base"),
        "dtype": str(target.dtype).replace("torch.", ""),
        "device": str(target.device),
        "lossless": method.lossless,
        "method_settings": method.describe(),
        "sampling": OmegaConf.to_container(cfg.sampling),
        "max_new_tokens": max_new,
        "env": environment(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    done = run_dir.done()
    todo = [(i, s) for i, s in enumerate(samples) if s.id not in done]

    costs = None
    if todo:
        # warm-up: first calls pay for allocation and kernel selection; not measured
        warm = samples[0]
        prompt = target.tokenizer.encode_chat(warm.messages([]))
        for m in (ar, method):
            m.generate(prompt, int(cfg.get("warmup_tokens", 8)), target.tokenizer.eos_ids, 0)
        if cfg.profile.enabled:
            costs = profile_forward(ar_target, list(cfg.profile.ks), int(cfg.profile.context), int(cfg.profile.reps))
            run_dir.write("forward_costs.json", json.dumps(costs))
    else:
        costs = run_dir.read_costs()
    meta["forward_costs"] = costs

    base_ar = build_method("ar", target, cfg.method, sampling, ctx) if ar_target is not target else None
    bar = tqdm(todo, desc=f"{cfg.method.name} vs ar on {cfg.task.name}", unit="sample", disable=not cfg.get("progress", True))
    for index, sample in bar:
        rec = run_sample(index, sample, ar, method, task, target.tokenizer, cfg, costs, base_ar, max_new)
        run_dir.append(rec)
        bar.set_postfix(speedup=_fmt(rec["speedup"], ".2f"), same=rec["matches_ar"])
    done = run_dir.done()
    records = [done[s.id] for s in samples if s.id in done]
    summary = aggregate(records, costs)
    summary["meta"] = meta
    run_dir.write("summary.json", json.dumps(summary, indent=2, default=str))
    run_dir.release()
    summary["printed"] = print_summary(summary, meta)
    print(f"results: {run_dir.path}")
    return summary
