"""The target's forward cost T(k), measured robustly, and refitted from a run's own verify steps.

`profile_forward` times a full-model forward over k new tokens after `context` cached ones:
one warm-up and `reps` timed repeats per k, the median kept. Interference on a shared machine
only ever adds time, and the cost of a forward can only grow with k up to noise, so a point
that lies above a later one by more than `tolerance` (T(k_i) > (1 + tolerance) * T(k_j) for
some k_j > k_i) is suspect: it is re-measured (at most `max_remeasure` rounds) and keeps the
lower of its medians. Real non-monotone costs exist on CPUs (NOTES: k=8 can be cheaper than
k=4); a point that stays non-monotone after re-measurement is kept and reported, not hidden.

`refit_costs` reads T(k) back from the run itself: every verify step of the method is a T(k)
sample at the real context length (k = drafted + 1) and every AR step a T(1) sample; the
median per k is the refitted profile. It includes what the start-up profile cannot see: the
real context lengths, methods whose verify is cheaper than a full forward (EESD), and cache
state. Both predictions are reported side by side.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from specbench.engine.timer import PhaseTimer
from specbench.metrics.steps import StepStats
from specbench.models import ModelAdapter


@dataclass
class Profile:
    costs: dict[int, float]                  # k -> median seconds
    spread: dict[int, float]                 # k -> (max - min) / median of the repeats kept
    remeasured: dict[int, int] = field(default_factory=dict)  # k -> extra rounds it took
    non_monotone: list[int] = field(default_factory=list)     # points still above a later one

    @property
    def max_spread(self) -> float:
        return max(self.spread.values(), default=0.0)

    def to_json(self) -> dict:
        d = asdict(self)
        d["max_spread"] = self.max_spread
        return d


def _spread(times: list[float]) -> float:
    med = statistics.median(times)
    return (max(times) - min(times)) / med if med > 0 else 0.0


def suspects(costs: dict[int, float], tolerance: float) -> list[int]:
    """Points that cost more than (1 + tolerance) times some later (larger k) point."""
    out = []
    later_min = float("inf")
    for k in sorted(costs, reverse=True):
        if costs[k] > (1 + tolerance) * later_min:
            out.append(k)
        later_min = min(later_min, costs[k])
    return sorted(out)


def _time_k(target: ModelAdapter, ids: list[int], cache, context: int, k: int, reps: int, now) -> list[float]:
    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        t0 = now()
        target.forward(ids[context : context + k], cache)
        times.append(now() - t0)
        cache.crop(context)
    return times[1:]


def profile_forward(target: ModelAdapter, ks: list[int], context: int = 200, reps: int = 5,
                    tolerance: float = 0.1, max_remeasure: int = 2) -> Profile:
    """Median seconds of a full-model forward over k new tokens after `context` cached ones."""
    now = PhaseTimer(target.device, devices=getattr(target, "devices", ())).now
    ids = [(7 * i + 3) % target.vocab_size for i in range(context + max(ks))]
    cache = target.new_cache()
    target.forward(ids[:context], cache, last_only=True)
    runs = {k: _time_k(target, ids, cache, context, k, reps, now) for k in ks}
    costs = {k: statistics.median(t) for k, t in runs.items()}
    remeasured: dict[int, int] = {}
    for _ in range(max_remeasure):
        bad = suspects(costs, tolerance)
        if not bad:
            break
        for k in bad:
            again = _time_k(target, ids, cache, context, k, reps, now)
            remeasured[k] = remeasured.get(k, 0) + 1
            if statistics.median(again) < costs[k]:  # interference only adds time
                runs[k], costs[k] = again, statistics.median(again)
    return Profile(costs, {k: _spread(t) for k, t in runs.items()}, remeasured, suspects(costs, tolerance))


def refit_costs(records: list[dict]) -> dict[int, float]:
    """T(k) as the median verify time per verified width k over the run's steps (AR steps give T(1))."""
    by_k: dict[int, list[float]] = {}
    for r in records:
        for key in ("ar", "method"):
            sys = r.get(key) or {}
            for step, times in zip(sys.get("steps") or [], sys.get("step_times") or []):
                by_k.setdefault(StepStats.of(step).cost_tokens, []).append(float(times[1]))
    return {k: statistics.median(v) for k, v in sorted(by_k.items()) if v}
