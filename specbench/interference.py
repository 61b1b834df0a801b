"""Interference detection: is a sample's timing spoiled by something else on the machine?

Interleaving AR and the method per sample cancels slow drift, not spikes. For each system (AR,
the method) the run keeps every step time of the samples it accepted, by kind of step (the
number of drafted tokens: a k-token verify and its drafting cost differ from a 1-token AR
step) it keeps each accepted sample's mean step time. A sample's *excess* for a system is its
summed step time over what the run's running medians of those means predict for the same
steps: sum(t_i) / sum(median[kind_i]). Means, not single steps, are compared because on a
loaded machine the scheduler's preemptions make single steps skewed in every sample alike; a
spike is a sample that is slow as a whole. Kinds with fewer than `min_samples` samples of
history are left out, so a run's first samples are not judged. A sample whose excess exceeds
`spike_factor` for either system is measured again, AR and method both (at most `max_retries`
times); the attempt with the smallest excess is kept and the record says how many attempts it
took and whether it is still spiked (`interference.spiked`: then it is flagged, not hidden).

Each record also carries the machine's load while it ran: the 1-minute load average and the
process's CPU time over wall time (well below the thread count: the process was waiting for
the CPU).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

from specbench.engine.timer import PhaseTimer
from specbench.metrics.steps import StepStats

SYSTEMS = ("ar", "method")


class StepHistory:
    """Per system and kind of step, the mean step time of each accepted sample (recent ones)."""

    def __init__(self, min_samples: int = 2, window: int = 200):
        self.min_samples = min_samples
        self.window = window  # recent samples only, so the medians follow slow drift
        self.means: dict[tuple[str, int], list[float]] = {}

    @staticmethod
    def kinds(sys_rec: dict) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {}
        for s, t in zip(sys_rec.get("steps") or [], sys_rec.get("step_times") or []):
            out.setdefault(StepStats.of(s).cost_tokens, []).append(float(t[0]))  # steps of one verify size
        return out

    def excess(self, system: str, sys_rec: dict) -> float | None:
        """Summed step time over what the run's medians predict for the same steps; None when
        no kind of step in it has enough history yet (the run's first samples)."""
        spent = expected = 0.0
        for kind, ts in self.kinds(sys_rec).items():
            hist = self.means.get((system, kind), [])
            if len(hist) >= self.min_samples:
                spent += sum(ts)
                expected += len(ts) * statistics.median(hist)
        return spent / expected if expected > 0 else None

    def add(self, rec: dict) -> None:
        for key in SYSTEMS:
            for kind, ts in self.kinds(rec[key]).items():
                hist = self.means.setdefault((key, kind), [])
                hist.append(statistics.fmean(ts))
                del hist[: -self.window]


def sample_excess(history: StepHistory, rec: dict) -> dict[str, float | None]:
    return {key: history.excess(key, rec[key]) for key in SYSTEMS}


def measure_load(fn: Callable[[], dict]) -> tuple[dict, dict]:
    """fn() and the load while it ran."""
    clock = PhaseTimer("cpu").now
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cpu0, t0 = time.process_time(), clock()
    rec = fn()
    cpu, wall = time.process_time() - cpu0, clock() - t0
    return rec, {"loadavg_1m": load, "cpu_s": round(cpu, 4), "wall_s": round(wall, 4),
                 "cpu_per_wall": round(cpu / wall, 3) if wall > 0 else None}


def run_checked(measure: Callable[[], dict], history: StepHistory, spike_factor: float = 1.5,
                max_retries: int = 2) -> dict:
    """Measure a sample, again while its steps look spiked; keep the cleanest attempt."""
    best = None
    attempts = []
    for attempt in range(max_retries + 1):
        rec, load = measure_load(measure)
        excess = sample_excess(history, rec)
        worst = max((v for v in excess.values() if v is not None), default=1.0)
        attempts.append({"excess": {k: None if v is None else round(v, 3) for k, v in excess.items()}, "load": load})
        if best is None or worst < best[0]:
            best = (worst, rec, load, excess)
        if worst <= spike_factor:
            break
    worst, rec, load, excess = best
    rec["load"] = load
    rec["interference"] = {
        "attempts": len(attempts),
        "spiked": worst > spike_factor,
        "excess": {k: None if v is None else round(v, 3) for k, v in excess.items()},
        "history": attempts if len(attempts) > 1 else None,
    }
    history.add(rec)  # flagged ones too: a lasting change of the machine's speed moves the medians
    return rec
