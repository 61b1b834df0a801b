"""The host-sync budget of every registered method and controller, counted on fake CUDA.

On a GPU each device-to-host read inside a decoding step drains the launch queue (the GPU idles
while Python launches the next kernels), and each host-to-device copy inside the layer loop is a
transfer per layer. A method that syncs more than it must runs slower on a GPU for reasons that
have nothing to do with the method, so the harness would rank methods wrongly there. Counted by
tests/fakecuda.py's `SyncCounter` per decoding step, greedy (Spec-Bench's setting):

- AR: one read per token (the next token);
- chain drafting: at most one read per drafted token (the draft token, its confidence riding
  along for the controller) plus one per verification;
- trees and laid-out candidates (Medusa, SPACE): at most two reads per step (the candidates,
  the verification; EAGLE-2 grows its tree on the device and reads the chosen nodes once);
- no host-to-device copy and no read inside the layer loop (a decoder layer, the per-layer
  loop, the cache's per-layer compaction).

Cases come from the registries, as in tests/test_every_method.py. `SPECBENCH_SYNC_REPORT=path`
writes the counts as JSON (python -m specbench.doctor reports them).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import test_every_method as every
from fakecuda import fake_cuda, fake_tiny_llama
from helpers import build

from specbench.engine.sampling import SamplingConfig
from specbench.methods.base import METHODS, SpeculativeMethod

pytestmark = pytest.mark.fake_cuda

LAYERS = 4  # test_every_method's configs are for the 4-layer tiny model
PROMPT = [1, 5, 6, 7, 5, 6, 7, 5]
NEW = 12
EXTERNAL = [m for m in sorted(METHODS) if METHODS[m].external_loop]  # transformers' loop: not ours to count
CASES = [(m, c) for m, c in every.CASES if m not in EXTERNAL]
_REPORT: dict = {}


def count(method: str, controller: str | None, sampling=SamplingConfig()):
    """(per-step rows, prefill events): each row = (kind of step, drafted, d2h, h2d, in-layer events)."""
    with fake_cuda(bool_value=True) as mode:
        t = fake_tiny_llama(num_layers=LAYERS)
        ctrl = every.control_config(controller) if controller else None
        m = build(method, t, every.method_config(method), sampling, ctrl)
        counter, steps = mode.counter, []
        start, step = m.start, m.step

        def counted_start(prompt):
            counter.step = "prefill"
            return start(prompt)

        def counted_step(budget):
            counter.step = len(steps)
            r = step(budget)
            steps.append(r)
            return r

        m.start, m.step = counted_start, counted_step
        m.generate(PROMPT, NEW, frozenset(), 0)
    ev = counter.events
    rows = [(s.n_drafted, counter.count("d2h", i), counter.count("h2d", i), [e for e in ev if e.step == i and e.in_layer])
            for i, s in enumerate(steps)]
    return m, rows, [e for e in ev if e.step == "prefill"]


def budget(m, drafted: int) -> int:
    if not isinstance(m, SpeculativeMethod):
        return 1
    return 1 + drafted if m.uses_controller else 2


def where(events) -> dict:
    return dict(Counter(f"{e.kind} {e.what} {e.where}" for e in events))


@pytest.mark.parametrize("method, controller", CASES, ids=[f"{m}-{c}" if c else m for m, c in CASES])
def test_greedy_step_within_budget(method, controller):
    m, rows, prefill = count(method, controller)
    d2h = [r[1] for r in rows]
    _REPORT[f"{method}-{controller}" if controller else method] = {
        "steps": len(rows), "drafted": [r[0] for r in rows], "d2h": d2h, "h2d": [r[2] for r in rows],
        "budget": [budget(m, r[0]) for r in rows],
        "prefill_d2h": sum(e.kind == "d2h" for e in prefill), "in_layer": sum(len(r[3]) for r in rows)}
    assert rows, "no decoding step ran"
    in_layer = [e for r in rows for e in r[3]] + [e for e in prefill if e.in_layer]
    assert not in_layer, f"syncs or copies inside the layer loop: {where(in_layer)}"
    over = [(i, r[1], budget(m, r[0])) for i, r in enumerate(rows) if r[1] > budget(m, r[0])]
    assert not over, f"{method}: (step, reads, budget) over budget: {over}"


def test_counter_sees_what_it_must():
    """Each kind of sync the budget relies on is counted, and a cpu index inside a layer is."""
    import torch

    with fake_cuda() as mode:
        x = torch.empty(4, 3, device="cuda")
        x[0, 0].item()
        x.argmax(-1).tolist()
        x.cpu()
        torch.tensor([1, 2], device="cuda")
        x[[0, 2]]
        x[0] = torch.zeros(3)
        int(x[0, 0].long())
        torch.zeros(2).item()  # host tensors never count
    got = Counter((e.kind, e.what) for e in mode.counter.events)
    assert got == Counter({("d2h", "item"): 1, ("d2h", "tolist"): 1, ("d2h", "to_cpu"): 1, ("h2d", "to_cuda"): 1,
                           ("h2d", "index"): 1, ("h2d", "setitem"): 1, ("d2h", "__int__"): 1})


def test_write_report():
    """Last in the file: the counts of this session for the doctor's report (when asked)."""
    path = os.environ.get("SPECBENCH_SYNC_REPORT")
    if path and _REPORT:
        with open(path, "w") as f:
            json.dump(_REPORT, f, indent=1, sort_keys=True)
