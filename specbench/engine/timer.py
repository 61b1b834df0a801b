"""Per-phase wall-clock timing (draft / verify / control / prefill), CUDA-synchronised.

Phases nest: time spent in an inner phase (a controller called from inside the draft loop) is
charged to the inner phase only. "other" is whatever of the wall time no phase claimed: the
harness's own overhead (cache bookkeeping, list appends, stop checks).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

PHASES = ("prefill", "draft", "verify", "control")


def clock() -> float:
    """Host seconds: the one clock all harness timing reads (tests replace it with a fake one)."""
    return time.perf_counter()


class PhaseTimer:
    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self.totals = {p: 0.0 for p in PHASES}
        self._stack: list[tuple[str, float]] = []

    def now(self) -> float:
        """Seconds on the timer's clock, the device synchronised: for timing outside phases."""
        if self.cuda:
            torch.cuda.synchronize()
        return clock()

    _now = now

    @contextmanager
    def phase(self, name: str):
        now = self._now()
        if self._stack:  # pause the enclosing phase
            outer, since = self._stack[-1]
            self.totals[outer] += now - since
        self._stack.append((name, now))
        try:
            yield
        finally:
            end = self._now()
            _, since = self._stack.pop()
            self.totals[name] = self.totals.get(name, 0.0) + end - since
            if self._stack:
                outer, _ = self._stack[-1]
                self._stack[-1] = (outer, end)

    def start(self) -> None:
        self.t0 = self._now()

    def stop(self) -> dict[str, float]:
        wall = self._now() - self.t0
        out = dict(self.totals)
        out["other"] = max(0.0, wall - sum(self.totals.values()))
        out["wall"] = wall
        return out
