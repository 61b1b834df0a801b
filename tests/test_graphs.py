"""`model.execution=graphs` on the CPU: the static-buffer path that CUDA captures (models/graphs.py).

Nothing is captured here (no CUDA), but every forward runs the very function a capture records:
static KV buffers written through a device index, calls padded to a power of two, the attention
mask built from the length and the call's own mask. So on the tiny float64 model:
- every registered method and controller returns eager AR's tokens, greedy and sampled;
- a padded forward gives the values of the eager one and leaves the committed cache rows as the
  eager cache has them (padding changes no committed token), trees and wide masks included;
- rollback (a chain's crop, a tree path's keep) leaves the same rows as the eager cache;
- the buffers are allocated once: a second generation allocates none.
The capture itself (tests/test_cuda_device.py) and its sync-freedom (tests/test_sync_budget.py,
graphs cases) are checked elsewhere.
"""

from __future__ import annotations

import copy

import pytest
import test_every_method as every
import torch
from helpers import GREEDY, ar_tokens, build, tiny_model

from specbench.engine.cache import StaticKVCache
from specbench.engine.sampling import SamplingConfig
from specbench.core.errors import SpecBenchError
from specbench.models.graphs import bucket, pad_mask

SAMPLING = SamplingConfig(temperature=0.8, top_p=0.9)


def graphs_model(max_width: int = 16):
    g = copy.deepcopy(tiny_model())
    g.set_execution("graphs", max_width)
    return g


@pytest.fixture(scope="module")
def graphs_target():
    return graphs_model()


@pytest.mark.parametrize("method, controller", every.CASES, ids=[f"{m}-{c}" if c else m for m, c in every.CASES])
def test_every_method_in_graphs_mode_equals_eager_ar(method, controller, graphs_target, tmp_path, monkeypatch):
    """Greedy: AR's tokens; sampled: the tokens eager decoding draws with the same seed (the same
    logits up to float64 rounding, so the same draws)."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    if method == "hf_assisted":  # transformers' own loop: refused in graphs mode (below)
        pytest.skip("hf_assisted runs transformers' generate()")
    ctrl = every.control_config(controller) if controller else None
    for sampling in (GREEDY, SAMPLING):
        torch.manual_seed(0)  # untrained parts start from the same random weights in both
        m = build(method, graphs_target, every.method_config(method), sampling, ctrl)
        torch.manual_seed(0)
        e = build(method, tiny_model(), every.method_config(method), sampling, ctrl)
        ref = m.finetuned_adapter if m.baseline_weights == "fine-tuned" else tiny_model()
        for prompt in every.PROMPTS:
            got = m.generate(prompt, 24, frozenset(), 3).tokens
            if sampling.greedy:
                ref_ar = e.finetuned_adapter if m.baseline_weights == "fine-tuned" else ref
                assert got == ar_tokens(ref_ar, prompt, 24), f"{method}/{controller} (graphs) differs from eager AR"
            else:
                assert got == e.generate(prompt, 24, frozenset(), 3).tokens, f"{method}/{controller} sampled differently"


@pytest.mark.parametrize("method", sorted(m for m in every.METHODS if m != "hf_assisted"))
def test_every_model_a_method_decodes_with_runs_in_graphs_mode(method, graphs_target, tmp_path, monkeypatch):
    """On a CPU nothing is captured, so equal tokens cannot show a model left eager; an H200 did (SPACE's
    fine-tuned copy captured no graph, session 54): every adapter a method holds follows the target's mode."""
    from specbench.models import ModelAdapter

    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    m = build(method, graphs_target, every.method_config(method))
    held = {k: v for k, v in vars(m).items() if isinstance(v, ModelAdapter)}
    assert held, f"{method} holds no model"
    for k, v in held.items():
        assert v.execution == "graphs", f"{method}.{k} decodes in {v.execution} mode"


def test_hf_assisted_is_refused_in_graphs_mode(graphs_target):
    with pytest.raises(SpecBenchError, match="model.execution=eager"):
        build("hf_assisted", graphs_target, every.method_config("hf_assisted"))


def _pair(prompt):
    """An eager and a static cache holding the same prompt."""
    eager, g = tiny_model(), graphs_model(max_width=8)
    ce, cg = eager.new_cache(), g.new_cache()
    eager.forward(prompt, ce)
    g.forward(prompt, cg)
    return eager, g, ce, cg


def _same_rows(ce, cg, n):
    for i in range(ce.num_layers):
        assert ce.length(i) == cg.length(i) == n
        torch.testing.assert_close(cg.keys[i][..., :n, :], ce.keys[i][..., :n, :], rtol=0, atol=1e-12)
        torch.testing.assert_close(cg.values[i][..., :n, :], ce.values[i][..., :n, :], rtol=0, atol=1e-12)


@pytest.mark.parametrize("q", [1, 3, 5, 8, 11])
def test_a_padded_forward_is_the_eager_forward(q):
    """Chains of every width, padded to the next power of two (11 > max_width 8: run at its own
    width): the same logits, the same cache rows, and the cache's length moves by q, not by W."""
    prompt = [5, 17, 99, 3, 42, 8, 7]
    eager, g, ce, cg = _pair(prompt)
    feed = [(11 * i + 3) % 250 for i in range(q)]
    le, _ = eager.forward(feed, ce)
    lg, _ = g.forward(feed, cg)
    torch.testing.assert_close(lg, le, rtol=0, atol=1e-12)
    _same_rows(ce, cg, len(prompt) + q)


def test_a_tree_and_a_mask_over_cached_rows_are_the_eager_ones():
    """A token tree (custom mask and positions), then a call whose mask also covers the last
    cached rows (how EAGLE grows its draft tree one level per call): same values as eager."""
    prompt = [40, 41, 42, 40, 41, 42]
    eager, g, ce, cg = _pair(prompt)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    pos = torch.tensor([6, 7, 7, 8])
    le, _ = eager.forward([1, 2, 3, 4], ce, positions=pos, tree_mask=tree)
    lg, _ = g.forward([1, 2, 3, 4], cg, positions=pos, tree_mask=tree)
    torch.testing.assert_close(lg, le, rtol=0, atol=1e-12)
    wide = torch.tensor([[1, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 1]], dtype=torch.bool)  # 4 cached rows + 2 new
    le, _ = eager.forward([9, 10], ce, positions=torch.tensor([9, 9]), tree_mask=wide)
    lg, _ = g.forward([9, 10], cg, positions=torch.tensor([9, 9]), tree_mask=wide)
    torch.testing.assert_close(lg, le, rtol=0, atol=1e-12)


def test_rollback_leaves_the_eager_rows():
    """A chain's rejected suffix is a length (no copy); a tree's accepted path is moved on the
    device: both leave the rows the eager cache keeps, and the next forward sees the same."""
    prompt = [5, 17, 99, 3, 42, 8, 7]
    eager, g, ce, cg = _pair(prompt)
    for c, m in ((ce, eager), (cg, g)):
        m.forward([1, 2, 3, 4, 5], c)
        c.crop(len(prompt) + 2)
        tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        m.forward([6, 7, 8], c, positions=torch.tensor([9, 10, 10]), tree_mask=tree)
        c.keep(len(prompt) + 2, [0, 2])
    _same_rows(ce, cg, len(prompt) + 4)
    le, _ = eager.forward([3], ce)
    lg, _ = g.forward([3], cg)
    torch.testing.assert_close(lg, le, rtol=0, atol=1e-12)


def test_padding_rows_see_themselves_and_no_real_row_sees_them():
    m = pad_mask(None, 3, 4, 0, 0)
    assert m.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]]
    wide = pad_mask(torch.tensor([[1, 0, 1], [0, 1, 1]], dtype=torch.bool), 2, 2, 1, 2)
    # 2 columns of cached rows (1 padding, visible; 1 covered by the mask), 2 new rows
    assert wide.tolist() == [[1, 1, 0, 1], [1, 0, 1, 1]]
    assert [bucket(n) for n in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, 32]


def test_buffers_are_allocated_once(graphs_target):
    """A second generation of the same prompt allocates no static buffer: not the cache's, not a
    padded call's (their count would grow by one per step if a step allocated)."""
    for name in ("ar", "eagle", "eesd", "pld"):
        m = build(name, graphs_target, every.method_config(name))
        m.generate(every.PROMPTS[0], 24, frozenset(), 0)
        caches = list(graphs_target._static_caches.values())
        before = (graphs_target.graphs.buffers, [c.allocations for c in caches])
        m.generate(every.PROMPTS[0], 24, frozenset(), 0)
        assert (graphs_target.graphs.buffers, [c.allocations for c in caches]) == before, name


def test_a_static_cache_grows_when_a_sequence_outruns_it():
    """A sequence longer than the run was sized for: the buffers grow (contents kept, graphs on
    the old ones dropped: a new epoch) and decoding goes on exactly."""
    g = graphs_model()
    g.static_capacity = 16
    prompt = [5, 17, 99, 3, 42, 8]
    got = build("ar", g, every.method_config("ar")).generate(prompt, 40, frozenset(), 0).tokens
    assert got == ar_tokens(tiny_model(), prompt, 40)
    cache = g._static_caches[("target", 4)]
    assert isinstance(cache, StaticKVCache) and cache.capacity >= 46 and cache.epoch >= 1


def test_the_report_tells_the_modes_apart_and_eager_from_older_runs():
    """A graphs run is another model in the report (never pooled with eager); an eager run is the
    same model as a run recorded before model.execution existed."""
    from specbench.report.load import model_identity

    old = {"model.name": "m", "model.dtype": "float32"}
    eager = old | {"model.execution": "eager", "model.graph_max_width": 64}
    graphs = old | {"model.execution": "graphs", "model.graph_max_width": 64}
    assert model_identity(eager, "m") == model_identity(old, "m") != model_identity(graphs, "m")


def test_the_execution_mode_is_not_part_of_a_models_key():
    """Trained parts are found by the model's key: a graphs run uses what an eager run trained."""
    from helpers import tiny_settings
    from specbench.models import load_model

    keys = {load_model(tiny_settings(**extra)).key
            for extra in ({}, {"execution": "eager", "graph_max_width": 64}, {"execution": "graphs", "graph_max_width": 8})}
    assert len(keys) == 1
