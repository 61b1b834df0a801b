"""The two execution regimes side by side: every method over the same prompts in eager mode and in
graphs mode (models/graphs.py), each against AR in its own mode, on one loaded model.

Used by `python -m specbench.tools.doctor` (make gpu-check) and `bench/gpu_regimes.py`. Per prompt, AR
runs once per mode and each method after it (their order rotates), so the AR baseline is shared by
the methods of a mode: the CLI instead interleaves AR with one method per run; here a table of
seven methods in two modes must fit a few minutes of a lent GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field

import torch

from specbench.config import schema, settings
from specbench.config.compose import compose
from specbench.engine.sampling import SamplingConfig
from specbench.models.graphs import precapture

# the issue's table: the authors' EAGLE-3 tree (top_k 10, depth 6, 59 nodes + root = 60 tokens)
METHODS = {"pld": {}, "suffix": {}, "eagle3": {"top_k": 10, "depth": 6, "num_nodes": 59}, "eagle": {}, "eesd": {},
           "medusa": {}}
TRAINED_KEYS = ("head_trained", "draft_trained", "exit_trained", "heads_trained", "trained")


@dataclass
class Tally:
    tokens: int = 0
    wall: float = 0.0
    steps: int = 0
    same: int = 0
    runs: int = 0
    note: str = ""
    captures: int = 0
    per_prompt: list = field(default_factory=list)  # (tokens, wall)

    def add(self, gen, equal: bool | None) -> None:
        self.tokens += len(gen.tokens)
        self.wall += gen.times["wall"]
        self.steps += len(gen.steps)
        self.same += bool(equal)
        self.runs += 1
        self.captures += gen.extra.get("graph_captures", 0)
        self.per_prompt.append((len(gen.tokens), gen.times["wall"]))

    @property
    def tok_s(self) -> float | None:
        return self.tokens / self.wall if self.wall else None

    @property
    def tau(self) -> float | None:
        return self.tokens / self.steps if self.steps else None


def method_config(name: str, overrides: dict):
    """conf/method/<name>.yaml's settings, an untrained part allowed where the method has one."""
    untrained = {"allow_untrained": True} if "allow_untrained" in schema.METHODS.get(name, {}) else {}
    return settings.shipped("method", name, untrained, overrides)


@functools.lru_cache(maxsize=None)
def _default_values() -> settings.RunValues:
    return settings.run_values(settings.of(compose(["control=fixed"])))


def run_values(target) -> settings.RunValues:
    """What the methods read of a run: conf/config.yaml's (control=fixed, K=10), for this model."""
    return dataclasses.replace(_default_values(), model_name=target.name)


def trained_note(m) -> str:
    d = m.describe()
    untrained = [k for k in TRAINED_KEYS if d.get(k) is False]
    return "untrained" if untrained else ""


def build_one(target, name: str, over: dict, untrained: dict | None = None):
    """(the method or None, a note): built with `over`, else with the untrained fallback overrides."""
    from specbench.methods import build_method

    note = ""
    for attempt in [over] + ([over | untrained[name]] if name in (untrained or {}) else []):
        try:
            m = build_method(name, target, method_config(name, attempt), SamplingConfig(), run_values(target))
            return m, trained_note(m)
        except Exception as e:  # noqa: BLE001 - one method's failure must not hide the others'
            note = f"not built: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    return None, note


def run_mode(target, mode: str, methods: dict, prompts: list[list[int]], max_new: int, log=print,
             max_width: int = 64, seconds: float | None = None, untrained: dict | None = None) -> dict[str, Tally]:
    """AR and every method of `methods` (name -> overrides) over `prompts` in one execution mode;
    `seconds`: no new prompt is started after that long (at least two are run); `untrained`: name ->
    overrides to build with when the default settings need a trained part that is missing."""
    from specbench.methods import build_method

    target.set_execution(mode, max_width)
    if mode == "graphs":
        target.static_capacity = -(-(max(map(len, prompts)) + max_new + 2 * max_width) // 64) * 64
        precapture(target)
    greedy, eos = SamplingConfig(), target.tokenizer.eos_ids
    built, out = {"ar": build_method("ar", target, method_config("ar", {}), greedy, run_values(target))}, {"ar": Tally()}
    for name, over in methods.items():
        m, note = build_one(target, name, over, untrained)
        out[name] = Tally(note=note)
        if m is not None:
            built[name] = m
    with torch.no_grad():
        for name, m in built.items():  # warm-up: kernels, allocator, this method's own graphs
            m.generate(prompts[0], 16, eos, 0)
        t0 = time.perf_counter()
        for i, prompt in enumerate(prompts):
            ar = built["ar"].generate(prompt, max_new, eos, i)
            out["ar"].add(ar, True)
            names = [n for n in built if n != "ar"]
            order = names[i % len(names):] + names[: i % len(names)] if names else []
            for name in order:
                gen = built[name].generate(prompt, max_new, eos, i)
                out[name].add(gen, gen.tokens == ar.tokens)
            log(f"  {mode}: prompt {i + 1}/{len(prompts)} done ({time.perf_counter() - t0:.0f} s)")
            if seconds is not None and i >= 1 and time.perf_counter() - t0 > seconds:
                log(f"  {mode}: time budget of {seconds:.0f} s spent after {i + 1} prompts")
                break
    return out


def speedup(t: Tally, ar: Tally) -> float | None:
    return t.tok_s / ar.tok_s if t.tok_s and ar.tok_s else None


def table(results: dict[str, dict[str, Tally]]) -> list[str]:
    """One row per method, the two modes side by side (markdown)."""
    eager, graphs = results.get("eager", {}), results.get("graphs", {})
    rows = ["| method | eager tok/s | eager speedup | graphs tok/s | graphs speedup | tau (graphs) | =AR eager | "
            "=AR graphs | captures in timed runs | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys([*eager, *graphs]):
        e, g = eager.get(name, Tally()), graphs.get(name, Tally())
        ea, ga = eager.get("ar", Tally()), graphs.get("ar", Tally())
        rows.append(f"| {name} | {_f(e.tok_s, '.1f')} | {_f(speedup(e, ea), '.2f')}x | {_f(g.tok_s, '.1f')} | "
                    f"{_f(speedup(g, ga), '.2f')}x | {_f(g.tau, '.2f')} | {e.same}/{e.runs} | {g.same}/{g.runs} | "
                    f"{e.captures + g.captures} | {e.note or g.note} |")
    return rows


def weight_bytes(target) -> int:
    """Bytes a forward reads at least: every parameter once (tied ones once)."""
    seen, n = set(), 0
    for p in target.model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            n += p.numel() * p.element_size()
    return n


def device_bandwidth(device, gib: float = 1.0, reps: int = 5) -> float:
    """Bytes per second of a device-to-device copy (read + write), the best of `reps`."""
    n = int(gib * 2**30) // 4
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    del a, b
    return 2 * n * 4 / best


def _f(x, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)
