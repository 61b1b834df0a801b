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
the CPU), for the sample and for each system (AR, the method) alone.

Spikes against the run's own medians cannot see a run that was loaded from start to end: its
medians are slow too. `shared_cores` judges the whole run from those load figures instead: a
median load average above `max_load_per_core` x the usable cores, or a system's median CPU/wall
below `min_cpu_per_thread` x torch's threads (CPU runs only: a GPU run's host thread waits for
the device), says other work shared the run's cores; the summary and the report flag it.

The load average counts the whole machine: a run pinned to one core (taskset) is "shared" by
its rule whenever another core is busy. Where /proc/stat exists the whole-run check therefore
uses the CPUs of the process's affinity instead: their busy time over each system's generation,
minus this process's own CPU time, is time other work took from our cores (`foreign_s`); a run
whose pooled foreign time exceeds `max_foreign_share` of wall x our CPUs is flagged. The load
average then is recorded but judges only runs recorded without /proc/stat figures.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from specbench.engine.timer import PhaseTimer
from specbench.metrics.steps import StepStats

SYSTEMS = ("ar", "method")
T = TypeVar("T")


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


def affinity() -> list[int] | None:
    """The CPUs this process may run on (a container or taskset can allow fewer than the machine has)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return None


def usable_cores() -> int:
    return len(affinity() or ()) or os.cpu_count() or 1


PROC_STAT = "/proc/stat"
# /proc/stat's per-CPU fields: user nice system idle iowait irq softirq steal (guest is inside user).
# Busy is all but idle and iowait; steal counts too: the hypervisor gave our core to someone else.
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def read_cpu_busy(path: str | None = None) -> dict[int, float] | None:
    """Seconds each CPU has been busy since boot, from /proc/stat; None where it cannot be read."""
    try:
        lines = open(path or PROC_STAT).read().splitlines()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            busy[int(name[3:])] = sum(int(fields[i]) for i in BUSY_FIELDS if i < len(fields)) / tick
    return busy or None


def foreign_cpu(before: dict[int, float] | None, after: dict[int, float] | None, cpus: list[int] | None,
                own_cpu_s: float) -> float | None:
    """Busy time of exactly our CPUs over the interval that was not this process's own: time other
    work took from our cores. None without both readings or with a CPU missing from them."""
    if before is None or after is None or not cpus or any(c not in before or c not in after for c in cpus):
        return None
    busy = sum(after[c] - before[c] for c in cpus)
    return max(0.0, busy - own_cpu_s)  # tick accounting vs the process's exact time: never below 0


def measure_load(fn: Callable[[], T]) -> tuple[T, dict]:
    """fn() and the load while it ran (the load average is read at the end: it trails by ~1 min)."""
    clock = PhaseTimer("cpu").now
    cpus = affinity()
    busy0 = read_cpu_busy()
    cpu0, t0 = time.process_time(), clock()
    rec = fn()
    cpu, wall = time.process_time() - cpu0, clock() - t0
    foreign = foreign_cpu(busy0, read_cpu_busy(), cpus, cpu)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return rec, {"loadavg_1m": load, "cpu_s": round(cpu, 4), "wall_s": round(wall, 4),
                 "cpu_per_wall": round(cpu / wall, 3) if wall > 0 else None,
                 "cores": usable_cores(), "threads": torch.get_num_threads(),
                 "cpus": cpus, "foreign_s": None if foreign is None else round(foreign, 4)}


# thresholds of the whole-run check, keys of conf/config.yaml's measure group
THRESHOLDS = ("max_load_per_core", "min_cpu_per_thread", "max_foreign_share")


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def shared_cores(records: list[dict], measure, on_cpu: bool = True) -> dict | None:
    """Did other work share this run's cores? From the per-system load of every sample (None:
    the records carry none, e.g. runs recorded before it was kept); `measure`: the run's measure settings."""
    c = {k: getattr(measure, k) for k in THRESHOLDS}
    loads = {key: [r[key]["load"] for r in records if (r.get(key) or {}).get("load")] for key in SYSTEMS}
    every = loads["ar"] + loads["method"]
    if not every:
        return None
    load = _median(x["loadavg_1m"] for x in every)
    cores, threads = min(x["cores"] for x in every), max(x["threads"] for x in every)
    cpu = {key: _median(x["cpu_per_wall"] for x in ls) for key, ls in loads.items()}
    share = foreign_share(every)
    reasons = []
    if share is not None:  # /proc/stat: exactly our CPUs
        if share > float(c["max_foreign_share"]):
            reasons.append(f"others took {100 * share:.1f}% of CPUs {_cpu_list(every)} "
                           f"> {100 * float(c['max_foreign_share']):g}%")
    elif load is not None and load > float(c["max_load_per_core"]) * cores:  # fallback: the whole machine
        reasons.append(f"load average {load:.2f} > {float(c['max_load_per_core']):g} x {cores} usable cores")
    for key in SYSTEMS if on_cpu else ():
        floor = float(c["min_cpu_per_thread"]) * threads
        if cpu[key] is not None and cpu[key] < floor:
            reasons.append(f"{'AR' if key == 'ar' else 'method'} CPU/wall {cpu[key]:.3f} < {floor:.2f} "
                           f"({threads} thread{'' if threads == 1 else 's'})")
    return {"shared": bool(reasons), "reasons": reasons, "loadavg_1m_median": load, "cores": cores,
            "threads": threads, "cpu_per_wall_median": cpu, "foreign_share": share,
            "judged_by": "proc_stat" if share is not None else "loadavg",
            "thresholds": c, "checked_cpu": on_cpu}


def foreign_share(loads: list[dict]) -> float | None:
    """Pooled time others took from our CPUs over the wall time those CPUs offered (None: no
    system was measured with /proc/stat, e.g. not Linux or runs recorded before it was kept)."""
    known = [x for x in loads if x.get("foreign_s") is not None and x.get("cpus")]
    offered = sum(x["wall_s"] * len(x["cpus"]) for x in known)
    return round(sum(x["foreign_s"] for x in known) / offered, 4) if offered > 0 else None


def _cpu_list(loads: list[dict]) -> str:
    return ",".join(str(c) for c in sorted({c for x in loads for c in x.get("cpus") or []}))


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
