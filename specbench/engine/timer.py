"""Per-phase timing (prefill / draft / verify / control) that does not change what it measures.

Phases nest: time spent in an inner phase (a controller called from inside the draft loop) is
charged to the inner phase only. "other" is whatever of the wall time no phase claimed: the
harness's own overhead (cache bookkeeping, list appends, stop checks).

How the clock is read (`timing=` in the run config):
- `fine` (default): every phase boundary appends a mark to a timeline. On CPU a mark is
  `time.perf_counter()`. On CUDA it is a recorded `torch.cuda.Event`: recording is queued on the
  stream and never waits for the GPU, so the breakdown adds no host synchronisation; the
  timeline is resolved once, at `stop()`, after one wait on the last event. Synchronising at
  every boundary instead (what this module did before) serialises host and GPU, and per draft
  token that inflates exactly the shares it reports.
- `coarse`: wall clock only (`{"wall": s}`), no marks at all; for checking that the breakdown
  does not move the speedup (bench/timing_modes.py).
On CUDA both modes synchronise once at `start()` (earlier queued work is not billed to this
sample) and once at `stop()`: two waits per generation, none per decoding step. A model spread
over several GPUs (`model.device_map`) has every one of them synchronised at both points (one
device's wait says nothing about work queued on another), and the marks are recorded on the
stream of the timer's own device (where the logits are), not whichever device is current.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from specbench.core.errors import choice_error

PHASES = ("prefill", "draft", "verify", "control")
MODES = ("fine", "coarse")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise choice_error("timing", mode, MODES)
    return mode


def clock() -> float:
    """Host seconds: the one clock all harness timing reads (tests replace it with a fake one)."""
    return time.perf_counter()


def cuda_devices(*devices) -> list[torch.device]:
    """The CUDA devices among `devices` (each a device or a list of them), each once; none
    without a usable CUDA runtime."""
    flat = [d for x in devices for d in (x if isinstance(x, (list, tuple, set)) else [x]) if d is not None]
    out: list[torch.device] = []
    for d in map(torch.device, flat):
        if d.type == "cuda" and d not in out and not (d.index in (None, 0) and _current(out, d)):
            out.append(d)
    return out if out and torch.cuda.is_available() else []


def _current(seen: list[torch.device], d: torch.device) -> bool:
    """`cuda` and `cuda:0` already listed as one another (the usual single-GPU spelling of one device)."""
    return any(s.index in (None, 0) for s in seen)


def synchronize(devices: list[torch.device]) -> None:
    for d in devices:
        torch.cuda.synchronize(d)


def synced_now(device: torch.device | str = "cpu", devices=()) -> float:
    """Host clock after every device given has finished its queued work (profiling, not per phase)."""
    synchronize(cuda_devices(device, list(devices)))
    return clock()


class PhaseTimer:
    def __init__(self, device: torch.device | str = "cpu", mode: str = "fine", devices=()):
        """`devices`: every device the model computes on (ModelAdapter.devices), beside `device`."""
        self.device = device
        self.sync_devices = cuda_devices(device, list(devices))
        self.cuda = bool(self.sync_devices)
        # marks go on the stream of the device the logits are on (else the first GPU used)
        self.mark_device = torch.device(device) if torch.device(device).type == "cuda" else (self.sync_devices or [None])[0]
        self.fine = check_mode(mode) == "fine"
        self.totals = {p: 0.0 for p in PHASES} if self.fine else {}
        self._stack: list[str] = []
        # timeline: (mark, phase running from this mark to the next one; None: no phase)
        self._marks: list[tuple[object, str | None]] = []
        # step boundaries: (mark, index into _marks when it was taken); resolved at stop()
        self._steps: list[tuple[object, int]] = []
        self.step_times: list[tuple[float, float]] = []

    def now(self) -> float:
        """Seconds on the timer's clock, the device synchronised: for timing outside generation
        (profiling, calibration), never inside a decoding step."""
        synchronize(self.sync_devices)
        return clock()

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            # one GPU: its current stream, as always; several: the stream of the logits' device
            ev.record() if len(self.sync_devices) == 1 else ev.record(torch.cuda.current_stream(self.mark_device))
            return ev
        return clock()

    def _elapsed(self, a, b) -> float:
        return a.elapsed_time(b) / 1000.0 if self.cuda else b - a

    @contextmanager
    def phase(self, name: str):
        if not self.fine:
            yield
            return
        self._stack.append(name)
        self._marks.append((self._mark(), name))
        try:
            yield
        finally:
            self._stack.pop()
            self._marks.append((self._mark(), self._stack[-1] if self._stack else None))

    def start(self) -> None:
        synchronize(self.sync_devices)
        self._stack.clear()
        self._marks = [(self._mark(), None)]
        self._steps = []

    def step_mark(self) -> None:
        """A decoding step starts here and the previous one ends. Costs one mark (an event on
        CUDA, no wait); `step_times` holds (step seconds, verify seconds in it) after stop().
        timing=coarse takes no marks at all, so no step times (interference checks skip them)."""
        if self.fine:
            self._steps.append((self._mark(), len(self._marks)))

    def stop(self) -> dict[str, float]:
        end = self._mark()
        synchronize(self.sync_devices)  # the one wait (per device): every earlier mark has completed too
        marks = self._marks + [(end, None)]
        wall = self._elapsed(marks[0][0], end)
        out = dict(self.totals)
        if self.fine:
            for (a, name), (b, _) in zip(marks, marks[1:]):
                if name is not None:
                    out[name] = out.get(name, 0.0) + self._elapsed(a, b)
            out["other"] = max(0.0, wall - sum(out.values()))
        out["wall"] = wall
        self.step_times = self._resolve_steps(marks)
        return out

    def _resolve_steps(self, marks) -> list[tuple[float, float]]:
        out = []
        for (a, i), (b, j) in zip(self._steps, self._steps[1:]):
            verify = sum(self._elapsed(marks[x][0], marks[x + 1][0]) for x in range(i, j) if marks[x][1] == "verify")
            out.append((round(self._elapsed(a, b), 6), round(verify, 6)))
        return out
