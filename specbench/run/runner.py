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
import time
from pathlib import Path

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from specbench.config import settings
from specbench.config.bounds import check_widths
from specbench.config.validate import validate
from specbench.core.cpuinfo import cpuinfo_field
from specbench.engine.sampling import SamplingConfig
from specbench.engine.timer import check_mode
from specbench.core.errors import SpecBenchError
from specbench.run.firstuse import ensure_trained
from specbench.run.interference import StepHistory, measure_load, run_checked, shared_cores
from specbench.methods import build_method
from specbench.methods.base import Generation, Method
from specbench.metrics import acceptance_metrics, position_acceptance, predicted_speedup
from specbench.metrics.acceptance import prefix_agreement
from specbench.models import ModelAdapter, backend_of, load_model
from specbench.kernels import ggml
from specbench.kernels.backends import check_backend
from specbench.models.graphs import precapture
from specbench.run.profiling import profile_forward
from specbench.run.provenance import run_provenance
from specbench.config.identity import check_resumable, check_run_dir
from specbench.run.rundir import RunDir, check_same_samples
from specbench.run.summary import _fmt, aggregate, print_summary
from specbench.tasks import build_task
from specbench.tasks.base import Sample
from specbench.run.warmup import warm_up


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; else what the platform says), with its x86 family
    and model numbers where /proc/cpuinfo gives them: two hosts whose runs must not be pooled (an AVX2
    EPYC and an AMX Xeon: 1.10x vs 1.62x for the same method) have the same machine, processor, core
    count and hostname here, and a hypervisor shows one name, "AMD EPYC", for a Zen 2 (family 23,
    model 49) whose AR decoding ran at 15 tokens/s and for the machines of the earlier leaderboard
    cells, where it ran at 35 to 63 (docs/measurements.md, "One CPU name, two machines")."""
    name = cpuinfo_field("model name") or platform.processor() or platform.machine()
    family, model = cpuinfo_field("cpu family"), cpuinfo_field("model")
    return f"{name} (family {family}, model {model})" if family and model else name


def environment() -> dict:
    import transformers

    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "hostname": platform.node(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    if kernels := ggml.loaded_build():
        env["kernels"] = kernels
    return env


def check_context(samples: list[Sample], target: ModelAdapter, max_new: int) -> int:
    """max_new_tokens capped at the model's context; a turn that leaves no room for one new token
    even if every earlier reply were empty is bad input, refused before anything is decoded (what
    the real replies take is capped as it comes, see run_generation)."""
    ctx = target.context_length
    if ctx is None:
        return max_new
    for s in samples:
        for turn in range(len(s.turns)):
            n = len(target.tokenizer.encode_chat(s.messages([""] * turn)))
            if n >= ctx and turn == 0:
                raise SpecBenchError(f"sample {s.id!r}: the prompt has {n} tokens, the model's context {ctx}; shorten it")
            if n >= ctx:
                raise SpecBenchError(f"sample {s.id!r} turn {turn + 1}: the conversation has {n} tokens before any reply "
                                     f"(the earlier turns and this one), the model's context {ctx}; shorten it")
    if max_new > ctx:
        print(f"note: max_new_tokens={max_new} capped at the model's context ({ctx})")
    return min(max_new, ctx)


def size_static_caches(target: ModelAdapter, samples: list[Sample], max_new: int) -> None:
    """execution=graphs: static caches as long as the run's longest sequence (every turn's text with
    empty replies, plus max_new per turn, plus a padded verify), so none grows during a timed step."""
    if target.execution != "graphs":
        return
    longest = max(len(target.tokenizer.encode_chat(s.messages([""] * (len(s.turns) - 1)))) + len(s.turns) * max_new
                  for s in samples)
    width = target.graphs.max_width
    target.static_capacity = -(-(longest + 2 * width) // 64) * 64


def run_generation(method: Method, sample: Sample, tokenizer, max_new: int, seed: int) -> tuple[list[Generation], list[str]]:
    replies: list[str] = []
    gens: list[Generation] = []
    ctx = method.target.context_length
    # what the later turns add (their user text and template, one token of reply each): a reply may not
    # take the room they need, or a long first answer leaves the second turn no context at all
    skeleton = [len(tokenizer.encode_chat(sample.messages([""] * t))) for t in range(len(sample.turns))] if ctx is not None else []
    for turn in range(len(sample.turns)):
        prompt = tokenizer.encode_chat(sample.messages(replies))
        if ctx is not None and len(prompt) >= ctx:
            raise SpecBenchError(f"sample {sample.id!r} turn {turn + 1}: the conversation has {len(prompt)} tokens, the model's context {ctx}")
        later = skeleton[-1] - skeleton[turn] + (len(sample.turns) - 1 - turn) if ctx is not None else 0
        limit = max(1, min(max_new, ctx - len(prompt) - later)) if ctx is not None else max_new
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
    rec["steps"] = [s.row() for s in steps]
    if captures := sum(g.extra.get("graph_captures", 0) for g in gens):
        rec["graph_captures"] = captures
    sources = [src for g in gens for src in g.extra.get("draft_source", [])]
    if sources:  # which drafter proposed each step (SAM-Decoding), parallel to `steps`
        rec["draft_source"] = sources
    rec["step_times"] = [t for g in gens for t in g.step_times]
    # what a method records of itself per generation (SWIFT's layer sets over time), one entry per turn
    extra = [{k: v for k, v in g.extra.items() if k != "prompt_len"} for g in gens]
    if any(extra):
        rec["extra"] = extra
    return rec


def run_sample(index: int, sample: Sample, ar: Method, method: Method, task, tokenizer, rs, costs,
               base: Method | None = None, max_new: int | None = None) -> dict:
    """`rs`: the run's settings (its seed and max_new_tokens); `base`: AR on the original weights, for
    methods that change them (SPACE): its quality shows what the fine-tuning cost; it takes no part
    in speedup or losslessness."""
    seed = int(rs.seed) + index
    order = [("ar", ar), ("method", method)] if index % 2 == 0 else [("method", method), ("ar", ar)]
    if base is not None:
        order.append(("base", base))
    results = {}
    for key, m in order:
        generate = lambda: run_generation(m, sample, tokenizer, max_new or int(rs.max_new_tokens), seed)  # noqa: E731
        (gens, replies), load = measure_load(generate)
        rec = summarize_system(gens)
        rec["load"] = load  # per system: whether this system's time shared the cores (shared_cores)
        rec["tokens"] = [g.tokens for g in gens]
        rec["text"] = replies
        rec["quality"] = task.score(sample, replies)
        results[key] = rec
    a, m = results["ar"], results["method"]
    rec = {"id": sample.id, "index": index, "category": sample.category, "sample_digest": sample.digest(), "ar": a, "method": m}
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


@torch.no_grad()  # restores the caller's grad mode on return (in-process callers may train next)
def run(cfg: DictConfig, target: ModelAdapter | None = None) -> dict:
    """One benchmark run of the composed config `cfg` (validated here, then read as its typed
    settings, specbench/config/settings.py; `cfg` itself is only recorded: config.yaml, the fingerprint).
    `target`: an already loaded model for cfg.model (benchmarks that run several methods load it once)."""
    validate(cfg)
    rs = settings.of(cfg)
    check_mode(str(rs.timing))
    check_backend(rs.model.backend)  # before the run dir is written
    check_run_dir(rs.run_dir)  # a bad path is refused before the model is loaded (again when opened)
    check_resumable(rs.run_dir, cfg, bool(rs.overwrite))  # ... and another configuration's samples
    if rs.threads:
        torch.set_num_threads(int(rs.threads))
    task = build_task(rs.task)
    samples = task.load()
    check_same_samples(rs.run_dir, samples, bool(rs.overwrite))  # the task's data, against the finished samples'
    target = target or load_model(rs.model)
    # a prompt beyond the context is refused before a first-use training writes to the cache
    max_new = check_context(samples, target, int(rs.max_new_tokens))
    size_static_caches(target, samples, int(rs.max_new_tokens))  # execution=graphs: before any cache exists
    ensure_trained(rs, target)  # a missing trained part of a small model: train it once, now
    sampling = SamplingConfig.from_cfg(rs.sampling)
    values = settings.run_values(rs)
    method = build_method(rs.method.name, target, rs.method, sampling, values)
    # SPACE changes the weights: its lossless reference is AR on the fine-tuned model
    ar_target = method.finetuned_adapter or target
    ar = build_method("ar", ar_target, settings.shipped("method", "ar"), sampling, values)
    # the built method's own widths (a tree from a file, a template cut) within the loaded model's context
    check_widths(method.verify_widths(), rs.method.name, target.context_length,
                 int(rs.profile.context) if rs.profile.enabled else None)
    # the weights' and trained artifacts' hashes join the fingerprint: a resumption against others is refused
    provenance = run_provenance(rs, target, method)
    # only now, with everything validated, is anything written to disk
    run_dir = RunDir(Path(rs.run_dir), cfg, bool(rs.overwrite), provenance)
    meta = {
        "method": rs.method.name,
        "controller": getattr(getattr(method, "controller", None), "name", None),
        "task": rs.task.name,
        "task_notes": task.notes(),
        "model": rs.model.name,
        "model_key": getattr(ar_target, "key", None),
        "baseline_weights": method.baseline_weights,
        "dtype": str(target.dtype).replace("torch.", ""),
        "backend": backend_of(target.model),
        "device": str(target.device),
        "execution": target.execution,
        "lossless": method.lossless,
        "method_settings": method.describe(),
        "sampling": settings.record(rs.sampling),
        "max_new_tokens": max_new,
        "env": environment(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    try:  # the lock goes with this call, however it ends (in-process callers run again)
        done = run_dir.done()
        todo = [(i, s) for i, s in enumerate(samples) if s.id not in done]
        if outside := len(set(done) - {s.id for s in samples}):
            # a smaller task.num_samples, or a larger one whose draw does not hold the smaller (random.sample
            # changes algorithm with the size: docs/runs.md)
            print(f"note: {outside} finished sample(s) in {run_dir.path} are not in this selection of "
                  f"task.num_samples={len(samples)}: kept in samples.jsonl, not counted in this summary")

        costs = None
        if todo:
            # warm-up: first calls pay for allocation and kernel selection; not measured
            warm = samples[0]
            prompt = target.tokenizer.encode_chat(warm.messages([]))
            meta["graphs_precaptured"] = precapture(target) + (precapture(ar_target) if ar_target is not target else 0)
            warm_up([ar, method], prompt, int(rs.warmup_tokens), target.tokenizer.eos_ids)
            if rs.profile.enabled:
                p = rs.profile
                ks = sorted(set(p.ks) | set(method.verify_widths()))  # a tree's width is a T(k) it pays
                prof = profile_forward(ar_target, ks, int(p.context), int(p.reps), float(p.tolerance), int(p.max_remeasure))
                costs = prof.costs
                run_dir.write("forward_costs.json", json.dumps(costs))
                run_dir.write("profile.json", json.dumps(prof.to_json()))
        else:
            costs = run_dir.read_costs()
        meta["forward_costs"] = costs
        if costs and (profile := run_dir.read_profile()):
            meta["profile"] = profile

        base_ar = build_method("ar", target, ar.cfg, sampling, values) if ar_target is not target else None
        bar = tqdm(todo, desc=f"{rs.method.name} vs ar on {rs.task.name}", unit="sample", disable=not rs.progress)
        measure = rs.measure
        history = StepHistory(int(measure.min_samples))
        for r in done.values():  # a resumed run judges its next samples against the finished ones
            history.add(r)
        # a method that carries state from one sample to the next is measured once per sample (a spike
        # is flagged, not re-measured): a second attempt would draft from its own first one
        retries = 0 if method.carries_state() else int(measure.max_retries)
        for index, sample in bar:
            rec = run_checked(lambda: run_sample(index, sample, ar, method, task, target.tokenizer, rs, costs, base_ar, max_new),
                              history, float(measure.spike_factor), retries)
            run_dir.append(rec)
            bar.set_postfix(speedup=_fmt(rec["speedup"], ".2f"), same=rec["matches_ar"])
        done = run_dir.done()
        records = [done[s.id] for s in samples if s.id in done]
        summary = aggregate(records, costs, measure.ci)
        if target.execution == "graphs":  # a capture inside a timed generation costs its sample ~3 forwards
            summary["graph_captures_timed"] = sum(r[k].get("graph_captures", 0) for r in records for k in ("ar", "method"))
        if contention := shared_cores(records, measure, on_cpu=target.device.type == "cpu"):
            summary["shared_cores"] = contention
        summary["meta"] = meta
        run_dir.write("summary.json", json.dumps(summary, indent=2, default=str))
    except KeyboardInterrupt:  # Ctrl-C: every finished sample is on disk, whole (RunDir.append)
        raise run_dir.interrupted("samples") from None
    finally:
        run_dir.release()
    summary["printed"] = print_summary(summary, meta)
    print(f"results: {run_dir.path}")
    return summary
