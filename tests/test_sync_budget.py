"""The host-sync budget of every registered method and controller, counted on fake CUDA.

On a GPU each device-to-host read inside a decoding step drains the launch queue (the GPU idles
while Python launches the next kernels), and each host-to-device copy inside the layer loop is a
transfer per layer. A method that syncs more than it must runs slower on a GPU for reasons that
have nothing to do with the method, so the harness would rank methods wrongly there. Counted by
tests/fakecuda.py's `SyncCounter` per decoding step, greedy (Spec-Bench's setting) and sampling
(T = 0.7, top_p = 0.9):

- AR: one read per token (the next token; under sampling the row sampled from);
- chain drafting, any controller: at most one read per drafted token (none where the chain is
  the host's own lookup, PLD: an H200 counted its one read per step, session 54) (the draft token with its
  confidence and, for Cali-TS with a trained predictor, the predicted acceptance; under sampling
  the draft row, with both) plus one per verification (greedy: the target's choices; sampling:
  the first rejection and the row to sample from, chosen on the device, in one copy);
- SWIFT: a chain draft as above (its tree's top-10 candidates per depth come in the draft token's
  copy), the verification (a tree's rejection walk under sampling counted as below), plus one read
  per layer-set optimisation iteration (the skipped model's predictions over its context window);
- EAGLE-2/3 under greedy: one read per step (the tree stays on the device: engine/verify.py
  DeviceTree, verified by engine/tree.py verify_tree_greedy_device; checked exactly below);
- trees and laid-out candidates (Medusa, EAGLE-2/3 sampling, SPACE, Lookahead, Token Recycling, REST,
  SuffixDecoding): at most two reads per step (the candidates, the verification). Under sampling
  a tree's rejection walk (engine/tree.py verify_tree_sampling) reads one node distribution per
  depth it visits, accepted + 1, counted as such: which node comes next depends on the draw at the
  node before, made by the seeded generator on the host; a device-side walk would change the
  seeded streams, not done. Medusa's typical acceptance reads every node's test in one copy: 2;
- no host-to-device copy and no read inside the layer loop (a decoder layer, the per-layer
  loop, the cache's per-layer compaction).

Fake tensors have no values: reads return fixed dummies, so each case follows one path (a tree's
sampling walk stops at the root there; the accepted + 1 rule is read from the code, not seen).

Cases come from the registries, as in tests/test_every_method.py, plus EESD with Cali-TS holding a
trained-format predictor (the untrained case has none) and Medusa's typical acceptance.
`SPECBENCH_SYNC_REPORT=path` writes the counts as JSON (python -m specbench.tools.doctor reports them).
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import test_every_method as every
from fakecuda import fake_cuda, fake_tiny_llama
from helpers import build, controller_args

from specbench.control.cali_ts import CaliPredictor, CaliTS
from specbench.engine.sampling import SamplingConfig
from specbench.methods.base import METHODS, SpeculativeMethod
from specbench.config.settings import merge

pytestmark = pytest.mark.fake_cuda

LAYERS = 4  # test_every_method's configs are for the 4-layer tiny model
PROMPT = [1, 5, 6, 7, 5, 6, 7, 5]
NEW = 9  # the fewest that still reach SWIFT's layer-set search and SAM-Decoding's switch in the sampling cases
GREEDY, SAMPLING = SamplingConfig(), SamplingConfig(temperature=0.7, top_p=0.9)
PREDICTOR = "cali_ts+predictor"  # Cali-TS with a predictor of the trained format (fresh weights)
EXTERNAL = [m for m in sorted(METHODS) if METHODS[m].external_loop]  # transformers' loop: not ours to count
CASES = [(m, c, None) for m, c in every.CASES if m not in EXTERNAL]
CASES += [("eesd", PREDICTOR, None), ("medusa", None, {"acceptance": "typical"})]
_REPORT: dict = {}


def case_name(method, controller, overrides, sampling) -> str:
    name = "-".join([method] + ([controller] if controller else []) + [f"{k}={v}" for k, v in (overrides or {}).items()])
    return name + (" (sampling)" if not sampling.greedy else "")


def controller_config(controller: str | None):
    if controller == PREDICTOR:
        return every.control_config("cali_ts")
    return every.control_config(controller) if controller else None


def with_predictor(m, t) -> None:
    """Cali-TS with a predictor on the model's device (no config holds the object: set after the build)."""
    args = controller_args("cali_ts", k_max=every.K_MAX) | {"predictor": CaliPredictor(t.hidden_size).to(t.device)}
    m.controller = CaliTS(**args)


def count(method: str, controller: str | None, sampling=GREEDY, overrides=None, execution: str = "eager"):
    """(method, per-step rows, prefill events): each row = (drafted, accepted, syncs (reads and
    blocking copies in), queued copies in, in-layer events, whether the step verified a tree,
    where its syncs came from)."""
    with fake_cuda(bool_value=True) as mode:
        t = fake_tiny_llama(num_layers=LAYERS)
        t.set_execution(execution, 16)
        cfg = merge(every.method_config(method), overrides or {})
        m = build(method, t, cfg, sampling, controller_config(controller))
        if controller == PREDICTOR:
            with_predictor(m, t)
        counter, steps, trees, device_trees = mode.counter, [], set(), set()
        start, step = m.start, m.step
        draft = getattr(m, "draft_candidates", None)

        def counted_start(prompt):
            counter.step = "prefill"
            return start(prompt)

        def counted_step(budget):
            counter.step = len(steps)
            r = step(budget)
            steps.append(r)
            return r

        def counted_draft(k_max):
            prop = draft(k_max)
            if prop.tree is not None:
                trees.add(counter.step)
            if prop.dtree is not None:  # verified on the device: no read of the candidates
                device_trees.add(counter.step)
            return prop

        m.start, m.step = counted_start, counted_step
        if draft is not None:
            m.draft_candidates = counted_draft
        m.generate(PROMPT, NEW, frozenset(), 0)
    ev = counter.events
    rows = [(s.n_drafted, s.n_accepted, counter.syncs(i), counter.count("h2d_async", i),
             [e for e in ev if e.step == i and e.in_layer], i in trees,
             where(e for e in ev if e.step == i and e.kind in ("d2h", "h2d")), i in device_trees) for i, s in enumerate(steps)]
    return m, rows, [e for e in ev if e.step == "prefill"]


def budget(m, row, sampling: SamplingConfig, step: int | None = None) -> int:
    drafted, accepted, tree = row[0], row[1], row[5]
    if not isinstance(m, SpeculativeMethod) or (len(row) > 7 and row[7]):
        return 1  # AR; a tree left on the device (EAGLE-2/3, greedy): its verification's one read
    walk = tree and not sampling.greedy and m.verifier.acceptance != "typical"
    verify = 1 + accepted if walk else 1  # a tree's rejection walk: one distribution per visited node
    if m.uses_controller:  # one read per drafted token (SWIFT's tree: its candidates in the same copy), none for PLD's
        return (drafted if m.drafts_on_device else 0) + verify + search_reads(m, step)
    return 1 + verify  # the candidates, the verification


def search_reads(m, step: int | None) -> int:
    """SWIFT: one read per layer-set optimisation iteration (its predictions), logged with its step."""
    log = getattr(m, "log", None) if step is not None else None
    return sum(it["step"] == step for it in log["iterations"]) if log else 0


def where(events) -> dict:
    return dict(Counter(f"{e.kind} {e.what} {e.where}" for e in events))


@pytest.mark.ci  # CI only (docs/testing.md): the most CPU of any test (every op through the fake device)
@pytest.mark.parametrize("execution", ["eager", "graphs"])
@pytest.mark.parametrize("sampling", [GREEDY, SAMPLING], ids=["greedy", "sampling"])
@pytest.mark.parametrize("method, controller, overrides", CASES, ids=[case_name(*c, GREEDY) for c in CASES])
def test_step_within_budget(method, controller, overrides, sampling, execution):
    m, rows, prefill = count(method, controller, sampling, overrides, execution)
    if controller == PREDICTOR:
        assert m.controller.predictor is not None and m.controller.needs_hidden
    d2h = [r[2] for r in rows]
    _REPORT[case_name(method, controller, overrides, sampling) + f" [{execution}]"] = {
        "steps": len(rows), "drafted": [r[0] for r in rows], "syncs": d2h, "h2d_queued": [r[3] for r in rows],
        "budget": [budget(m, r, sampling, i) for i, r in enumerate(rows)],
        "prefill_syncs": sum(e.kind in ("d2h", "h2d") for e in prefill), "in_layer": sum(len(r[4]) for r in rows)}
    assert rows, "no decoding step ran"
    in_layer = [e for r in rows for e in r[4]] + [e for e in prefill if e.in_layer]
    assert not in_layer, f"syncs or copies inside the layer loop: {where(in_layer)}"
    over = [(i, r[2], budget(m, r, sampling, i), r[6]) for i, r in enumerate(rows) if r[2] > budget(m, r, sampling, i)]
    assert not over, f"{method}: (step, reads, budget, where) over budget: {over}"


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


@pytest.mark.ci  # with the budget test: through the fake device
@pytest.mark.parametrize("execution", ["eager", "graphs"])
@pytest.mark.parametrize("method", ["eagle", "eagle3", "medusa", "hydra"])
def test_device_trees_read_once_per_step_under_greedy(method, execution):
    """EAGLE-2/3, Medusa and Hydra leave their tree on the device (engine/verify.py DeviceTree): no
    read between draft and verify, the verification's one read per step (the budget would allow 2)."""
    m, rows, _ = count(method, None, GREEDY, None, execution)
    assert rows and all(r[7] for r in rows), "a step proposed a host tree"
    assert [r[2] for r in rows] == [1] * len(rows), [(r[2], r[6]) for r in rows]
