"""Metrics: EESD's v_d / r_d / HM, tau, per-position acceptance, and the cost models, by hand."""

import pytest

from specbench.metrics import (
    StepStats,
    acceptance_metrics,
    accepted_histogram,
    eq14_speedup,
    harmonic_mean,
    position_acceptance,
    position_rates,
    position_reached,
    position_stats,
    predicted_speedup,
)
from specbench.metrics.costmodel import interp_cost

# --- HM against EESD Table 10 ------------------------------------------------------------------
#
# The paper prints v_d and r_d rounded to two decimals but computes HM from the unrounded values,
# so HM recomputed from the printed pair is only close. HM is increasing in both arguments, so the
# printed HM must lie between HM at the low and the high ends of the rounding intervals
# (v_d +- 0.005, r_d +- 0.005): that is the exact check. For 0.25/0.50 that interval is wide
# ([32.78, 33.89]): the recomputed 33.33 is 0.42 below the printed 33.75, so a flat |diff| < 0.2
# tolerance would wrongly fail there; the interval check is what "within rounding" means.

TABLE10 = [(0.74, 0.88, 80.35), (0.90, 0.70, 78.64), (0.25, 0.50, 33.75)]


@pytest.mark.parametrize("v_d,r_d,paper_hm", TABLE10)
def test_hm_matches_eesd_table10_within_rounding(v_d, r_d, paper_hm):
    lo = harmonic_mean(v_d - 0.005, r_d - 0.005)
    hi = harmonic_mean(v_d + 0.005, r_d + 0.005)
    assert lo <= paper_hm <= hi
    assert lo <= harmonic_mean(v_d, r_d) <= hi


def test_hm_first_row_close():
    hm = harmonic_mean(0.74, 0.88)
    assert hm == pytest.approx(2 * 0.74 * 0.88 / 1.62 * 100)  # 80.395
    assert abs(hm - 80.35) < 0.1


def test_hm_other_rows_by_hand():
    assert harmonic_mean(0.90, 0.70) == pytest.approx(78.75)  # paper 78.64: |diff| 0.11, see above
    assert harmonic_mean(0.25, 0.50) == pytest.approx(100 / 3)  # paper 33.75: |diff| 0.42, see above
    assert harmonic_mean(0.5, 0.5) == pytest.approx(50.0)
    assert harmonic_mean(0.0, 0.0) == 0.0
    assert harmonic_mean(None, 0.5) is None and harmonic_mean(0.5, None) is None


# --- acceptance_metrics / position_acceptance ----------------------------------------------------


def test_acceptance_metrics_by_hand():
    # step 1: 4 drafted, 2 accepted (+ target token): 3 tokens
    # step 2: 4 drafted, 4 accepted (+ bonus): 5 tokens
    # step 3: 4 drafted, 4 accepted, but max_new_tokens kept only 1: 1 token
    steps = [(4, 2, 2), (4, 4, 4), (4, 4, 1)]
    n_tokens = 1 + 3 + 5 + 1  # the prefill's token first
    m = acceptance_metrics(steps, n_tokens)
    assert m["steps"] == 3
    assert m["drafted"] == 12
    assert m["accepted"] == 7  # accepted-but-cut tokens do not count
    assert m["v_d"] == pytest.approx(7 / 12)
    assert m["r_d"] == pytest.approx(7 / 10)
    assert m["hm"] == pytest.approx(harmonic_mean(7 / 12, 7 / 10))
    assert m["tau"] == pytest.approx(9 / 3)  # tokens per decoding step, prefill's token excluded
    assert m["mean_accepted"] == pytest.approx(7 / 3)
    assert m["mean_drafted"] == pytest.approx(4.0)


def test_acceptance_metrics_plain_steps_and_empty():
    m = acceptance_metrics([(0, 0, 0), (0, 0, 0)], 3)  # no draft at all (e.g. no lookup match)
    assert m["drafted"] == 0 and m["v_d"] is None and m["hm"] is None
    assert m["r_d"] == 0.0 and m["tau"] == 1.0
    m = acceptance_metrics([], 1)  # max_new_tokens=1: the prefill's token only
    assert m["steps"] == 0 and m["tau"] is None and m["mean_accepted"] is None and m["v_d"] is None
    m = acceptance_metrics([], 0)
    assert m["r_d"] is None


def test_acceptance_metrics_no_acceptance():
    m = acceptance_metrics([(3, 0, 0), (3, 0, 0)], 3)
    assert m["v_d"] == 0.0 and m["r_d"] == 0.0 and m["hm"] == 0.0 and m["tau"] == 1.0


def test_position_acceptance_by_hand():
    steps = [(3, 2, 2), (1, 0, 0), (4, 4, 1), (0, 0, 0)]
    drafted, accepted = position_acceptance(steps)
    assert drafted == [3, 2, 2, 1]
    assert accepted == [2, 1, 0, 0]  # step 3: only its first (kept) token counts
    assert position_acceptance([]) == ([], [])
    # accepted at position j never exceeds accepted at j-1 (acceptance is a prefix)
    d, a = position_acceptance([(5, 3, 3), (5, 5, 5), (2, 1, 1)])
    assert a == [3, 2, 2, 1, 1] and d == [3, 3, 2, 2, 2]


def test_conditional_and_unconditional_position_rates_by_hand():
    # drafted, accepted, kept: 3 steps of 3 drafts (accepted 0, 1, 3) and one of 2 (accepted 2)
    steps = [(3, 0, 0), (3, 1, 1), (3, 3, 3), (2, 2, 2)]
    drafted, accepted = position_acceptance(steps)
    assert drafted == [4, 4, 3] and accepted == [3, 2, 1]
    reached = position_reached(steps)
    assert reached == [4, 3, 1]  # position 2: steps 2-4 accepted position 1; position 3: only step 3 drafted it past two accepts
    r = position_rates(drafted, accepted, reached)
    assert r["unconditional"] == pytest.approx([3 / 4, 2 / 4, 1 / 3])  # accepted at i per draft with a position i
    assert r["conditional"] == pytest.approx([3 / 4, 2 / 3, 1 / 1])  # accepted at i given i was reached
    assert position_rates([2, 0], [1, 0], [2, 0])["conditional"] == [0.5, None]  # never reached: no rate
    # a step cut by EOS after its first draft token: positions past the cut count as not accepted
    assert position_reached([(4, 4, 1)]) == [1, 1, 0, 0]


def test_accepted_histogram_by_hand():
    assert accepted_histogram([(3, 0, 0), (3, 1, 1), (3, 3, 3), (2, 2, 2), (4, 4, 1), (0, 0, 0)]) == [2, 2, 1, 1]
    assert accepted_histogram([]) == []
    stats = position_stats([(2, 1, 1)])
    assert stats == {"pos_drafted": [1, 1], "pos_accepted": [1, 0], "pos_reached": [1, 1], "accepted_hist": [0, 1]}


def test_v_d_per_drafted_token_for_trees():
    """v_d divides by the depth (`drafted`); appendix D's literal reading divides by tokens drafted:
    a tree's nodes. Chains: the two agree."""
    tree = [StepStats(drafted=4, accepted=2, kept=2, verified=16, candidates=15), StepStats(4, 1, 1, 16, 15)]
    m = acceptance_metrics(tree, 1 + 3 + 2)
    assert m["v_d"] == pytest.approx(3 / 8) and m["draft_tokens"] == 30 and m["v_d_tokens"] == pytest.approx(3 / 30)
    chain = acceptance_metrics([(4, 2, 2), (3, 3, 3)], 1 + 3 + 4)
    assert chain["v_d_tokens"] == chain["v_d"] == pytest.approx(5 / 7)
    # the stored row keeps the node count; rows stored before it: known for chains, unknown for trees
    assert StepStats.of(tree[0].row()) == tree[0]
    assert acceptance_metrics([[4, 2, 2, 16]], 4)["v_d_tokens"] is None
    assert acceptance_metrics([[4, 2, 2, 5]], 4)["v_d_tokens"] == pytest.approx(2 / 4)


def test_summary_prints_both_position_rates_with_their_definitions():
    from specbench.run.summary import acceptance_lines

    steps = [(3, 0, 0), (3, 1, 1), (3, 3, 3), (2, 2, 2)]
    s = {"acceptance": acceptance_metrics(steps, 1 + 1 + 2 + 4 + 3)} | position_stats(steps)
    text = "\n".join(acceptance_lines(s))
    assert "unconditional (accepted at i / drafts with a position i): 0.75 0.50 0.33" in text
    assert "conditional (accepted at i / drafts that reached i, i.e. accepted 1..i-1): 0.75 0.67 1.00" in text
    assert "steps by draft tokens accepted: 0: 1  1: 1  2: 1  3: 1" in text
    assert "a tree's depth" in text and "per token drafted" in text
    old = {"acceptance": s["acceptance"], "pos_drafted": [4, 4, 3], "pos_accepted": [3, 2, 1]}  # a summary before pos_reached
    assert "unconditional" in "\n".join(acceptance_lines(old))


# --- cost models ---------------------------------------------------------------------------------


def test_interp_cost():
    costs = {1: 1.0, 2: 1.5, 4: 2.0, 8: 4.0}
    assert interp_cost(costs, 2) == 1.5  # exact
    assert interp_cost(costs, 3) == pytest.approx(1.75)  # linear between 2 and 4
    assert interp_cost(costs, 6) == pytest.approx(3.0)
    assert interp_cost(costs, 0) == 1.0  # clamped below
    # above the profile: linear in the last two points (4 -> 8 has slope 0.5)
    assert interp_cost(costs, 10) == pytest.approx(5.0)
    assert interp_cost({3: 2.0}, 1) == 2.0 and interp_cost({3: 2.0}, 9) == 2.0  # one point: constant


def test_predicted_speedup_by_hand():
    costs = {1: 0.010, 2: 0.015, 4: 0.020}
    steps = [(3, 2, 2), (1, 0, 0)]
    n_tokens = 1 + 3 + 1
    draft_cost = 0.002
    # method: (3 * 0.002 + T(4)) + (1 * 0.002 + T(2)) = 0.026 + 0.017; AR: 4 * T(1)
    expected = 4 * 0.010 / (0.026 + 0.017)
    assert predicted_speedup(steps, n_tokens, draft_cost, costs) == pytest.approx(expected)
    # T(3) interpolated for a step drafting 2
    assert predicted_speedup([(2, 2, 2)], 4, 0.0, costs) == pytest.approx(3 * 0.010 / 0.0175)
    # a plain step (no draft) costs T(1): speedup 1
    assert predicted_speedup([(0, 0, 0)] * 5, 6, 0.1, costs) == pytest.approx(1.0)


def test_predicted_speedup_undefined():
    assert predicted_speedup([], 5, 0.1, {1: 1.0}) is None
    assert predicted_speedup([(1, 1, 1)], 1, 0.1, {1: 1.0}) is None
    assert predicted_speedup([(1, 1, 1)], 3, 0.1, {}) is None


def test_eq14_by_hand():
    # v_d 0.74, r_d 0.88, alpha 0.1: 0.74 / ((0.1 - 0.74) * 0.88 + 0.74) = 0.74 / 0.1768
    assert eq14_speedup(0.74, 0.88, 0.1) == pytest.approx(0.74 / 0.1768)
    assert eq14_speedup(0.74, 0.88, None) is None and eq14_speedup(None, 0.5, 0.1) is None
    assert eq14_speedup(0.0, 0.0, 0.5) is None  # denominator 0


@pytest.mark.parametrize("k,a,alpha", [(10, 7, 0.05), (4, 4, 0.2), (5, 1, 0.3), (3, 0, 0.1)])
def test_eq14_equals_step_model(k, a, alpha):
    """Every round drafts k and accepts a (vanilla SD with fixed K): v_d = a/k, r_d = a/(a+1); with a
    verify costing one target token, a round costs k*alpha*T + T for a+1 tokens, AR (a+1)*T, so
    speedup = (a+1)/(k*alpha + 1). eq. 14 must give the same, and so must predicted_speedup with a
    flat forward-cost profile."""
    direct = (a + 1) / (k * alpha + 1)
    if a > 0:
        assert eq14_speedup(a / k, a / (a + 1), alpha) == pytest.approx(direct)
    rounds = 6
    steps = [(k, a, a)] * rounds
    n_tokens = 1 + rounds * (a + 1)
    flat = {1: 1.0, 2: 1.0, 16: 1.0}
    assert predicted_speedup(steps, n_tokens, alpha * 1.0, flat) == pytest.approx(direct)
