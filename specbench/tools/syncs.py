"""What a real GPU waits for: every synchronising call of a generation, per decoding step, by site.

`torch.cuda.set_sync_debug_mode("warn")` makes PyTorch warn at each call that blocks the host until
the device is done (a read of a device value, a copy in from pageable memory or with
non_blocking=False, nonzero and boolean indexing, a stream or device synchronize). Each warning is
charged to the decoding step running (or to "outside": prefill, the timer's start and stop) and to
the innermost specbench frame on the stack (file:line), which is what tests/test_sync_budget.py
counts on fake CUDA: the doctor prints both for the same cases.
"""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

PACKAGE = str(Path(__file__).resolve().parents[1])  # specbench/: a frame in any of its files is ours


@dataclass
class SyncCount:
    per_step: list[int] = field(default_factory=list)  # syncs inside each decoding step
    outside: int = 0  # prefill, set-up, the timer's start and stop
    sites: Counter = field(default_factory=Counter)  # "file:line" -> syncs (steps and outside)

    @property
    def steps(self) -> int:
        return len(self.per_step)

    def per_step_mean(self) -> float | None:
        return sum(self.per_step) / len(self.per_step) if self.per_step else None

    def top(self, n: int = 5) -> str:
        return ", ".join(f"{site} ({k})" for site, k in self.sites.most_common(n)) or "none"


def site() -> str:
    """The innermost frame of specbench on the current stack, as file:function:line."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename.startswith(PACKAGE) and not frame.filename.endswith("syncs.py"):
            return f"{frame.filename[len(PACKAGE) + 1 :]}:{frame.name}:{frame.lineno}"
    return "outside specbench"


def count_generation(method, prompt: list[int], max_new: int, eos_ids=frozenset(), seed: int = 0) -> tuple[SyncCount, object]:
    """Generate once with every synchronising call counted (CUDA only: a CPU never waits)."""
    if not torch.cuda.is_available():
        raise RuntimeError("counting synchronising calls needs a CUDA device")
    got, state = SyncCount(), {"step": None}
    step = method.step

    def counted_step(budget):
        state["step"] = len(got.per_step)
        got.per_step.append(0)
        try:
            return step(budget)
        finally:
            state["step"] = None

    def seen(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        got.sites[site()] += 1
        if state["step"] is None:
            got.outside += 1
        else:
            got.per_step[state["step"]] += 1

    method.step = counted_step
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = seen
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with torch.no_grad():
                gen = method.generate(prompt, max_new, eos_ids, seed)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            del method.step  # the instance attribute: the class's step again
    return got, gen
