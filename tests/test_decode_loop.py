"""One decode loop: every method proposes, `SpeculativeMethod.step` verifies and commits.

Invariants a plausible regression breaks: a method with a `step()` of its own (a second loop,
with its own verification and cache handling); a rollback of the target's cache outside the
loop; a method that reads a controller's name to wire it up; a tree step that records only its
depth, so the cost model charges T(depth + 1) for a forward over every node."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specbench.methods  # noqa: F401 - registration
from helpers import build, method_cfg, tiny_model
from specbench.control import CONTROLLERS
from specbench.metrics import StepStats, predicted_speedup
from specbench.methods.base import METHODS, ARMethod, SpeculativeMethod

METHODS_DIR = Path(specbench.methods.__file__).parent


def test_every_method_runs_the_one_loop():
    for name, cls in METHODS.items():
        if cls.external_loop or cls is ARMethod:
            continue
        assert issubclass(cls, SpeculativeMethod), f"{name} is not a proposer of the shared loop"
        assert cls.step is SpeculativeMethod.step, f"{name} overrides the decode loop (step)"


def test_only_the_loop_rolls_the_target_cache_back():
    for path in METHODS_DIR.glob("*.py"):
        if path.name == "base.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("crop", "keep"):
                owner = ast.unparse(node.value)
                assert owner != "self.cache", f"{path.name} rolls the target's cache back itself ({owner}.{node.attr})"


def test_no_method_reads_a_controller_name():
    names = set(CONTROLLERS)
    for path in METHODS_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in names, f"{path.name} names the controller {node.value!r}"


def test_cost_model_charges_the_verified_width():
    costs = {1: 1.0, 5: 1.2, 16: 1.5, 64: 3.0}
    tree_step = StepStats(drafted=4, accepted=2, kept=2, verified=64)
    # 10 steps of 3 tokens each: AR pays 30 * T(1); the tree pays T(64) per step, drafting free
    got = predicted_speedup([tree_step] * 10, 31, 0.0, costs)
    assert got == pytest.approx(30 * 1.0 / (10 * 3.0))
    assert StepStats.of([4, 2, 2]).cost_tokens == 5  # rows stored before `verified`: a chain


@pytest.mark.parametrize("name, extra, width", [
    ("medusa", {"tree_from_accuracies": None, "sizes": [2, 2, 1, 1]}, lambda m: len(m.tree)),
    ("space", {"k": 3}, lambda m: len(m.layout)),
    ("eagle", {"top_k": 3, "depth": 3, "num_nodes": 10}, None),
    ("vanilla_sd", {"draft": {"num_layers": 1, "checkpoint": None}}, None),
])
def test_steps_record_what_verification_ran_over(name, extra, width, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    m = build(name, tiny_model(), method_cfg(name, allow_untrained=True, **extra))
    g = m.generate([5, 17, 99, 3, 42, 8], 24, frozenset(), 0)
    assert g.steps
    for s in g.steps:
        if width is not None:
            assert s.verified == width(m)
        elif name == "eagle":
            assert s.drafted < s.verified <= m.num_nodes + 1  # the reranked tree, root included
        else:
            assert s.verified == s.drafted + 1  # a chain


def test_cost_terms_add_up_to_the_inverse_speedup():
    from specbench.metrics import cost_terms

    # AR: 100 tokens in 10 s (0.1 s/token); the method: 100 tokens in 12.5 s -> 0.8x
    t = cost_terms({"wall": 12.5, "draft": 4.0, "verify": 7.0, "prefill": 0.5}, 100, 0.1)
    assert t["draft"] == pytest.approx(0.4) and t["verify"] == pytest.approx(0.7)
    assert t["other"] == pytest.approx(0.1) and t["total"] == pytest.approx(1.25)
    assert sum(v for k, v in t.items() if k != "total") == pytest.approx(t["total"])
    assert list(t) == ["prefill", "draft", "verify", "other", "total"]
    assert cost_terms({"wall": 3.0}, 10, 0.1) is None  # timing=coarse: nothing to split


def test_the_step_line_says_what_a_verify_step_costs_and_commits():
    """issue 44: the summary says why a drafter loses, per step: the drafts' cost (count x each),
    the verify forward's width and cost, and tau, all in AR decoding steps: AR's time per token with
    its prefill left out (the unit that includes AR's prefill made a losing decode look like a win)."""
    from specbench.run.summary import step_line

    # AR: 2 sequences, 22 tokens, 20 decoding steps in 2.0 s (0.1 s each) after 3.0 s of prefill
    ar = {"new_tokens": 22, "wall": 5.0, "times": {"prefill": 3.0, "verify": 2.0}}
    m = {"new_tokens": 22, "wall": 7.0, "times": {"prefill": 3.6, "draft": 0.6, "verify": 1.8}}
    s = {"samples": 2, "sequences": 2, "ar": ar, "method": m,
         "acceptance": {"tau": 2.0, "steps": 10, "draft_tokens": 30}}  # 3 drafts a step, 20 tokens
    line = step_line(s)
    assert "3.00 draft tokens at 0.20 each = 0.60" in line and "over 4.00 rows = 1.80" in line
    assert "tau 2.00 tokens (draft + verify 2.40 >= tau 2.00); its prefill 1.20x AR's" in line
    # in AR's whole time per token (0.227 s, prefill included) the same step would read 0.24 + 0.72 < tau
    assert "< tau" in step_line(s | {"method": m | {"times": m["times"] | {"verify": 1.0}}})
    assert step_line(s | {"acceptance": None}) is None
    assert step_line(s | {"method": m | {"times": {"verify": 1.0}}}) is None
