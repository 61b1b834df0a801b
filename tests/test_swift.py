"""SWIFT (methods/swift.py, methods/swift_search.py): the layer-set search against re-statements of the
authors' functions (github.com/hemingkx/SWIFT, model/swift/utils.py) on the same inputs, the record of
what the search did, the dynamic tree, losslessness under sampling, state across samples and the
warm-up, the run's records and summary, and bad settings as one line. Greedy == AR for every
controller is tests/test_every_method.py's."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from helpers import GREEDY, ar_tokens, build, control, method_cfg, run_cli, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st
from test_medusa import E2E_SAMPLING, check_sampling_matches_target
from test_runner import make_cfg, records

import specbench.methods.swift as swift_module
from specbench.run import runner
from specbench.engine.tree import TokenTree
from specbench.core.errors import SpecBenchError
from specbench.methods import swift_search as S
from specbench.methods.swift import candidate_count, dynamic_tree
from specbench.models import LayerSkip
from specbench.run.warmup import warm_up

PROMPTS = [[5, 17, 99, 3, 42, 8], [40, 41, 42, 40, 41, 42, 40, 41]]


def swift(target=None, sampling=GREEDY, ctrl=None, **kw):
    cfg = method_cfg("swift", **kw)
    return build("swift", target or tiny_model(), cfg, sampling, ctrl or control("threshold", 25, gamma=0.8))


# -- re-statements of the authors' functions (model/swift/utils.py) -------------------------------------
def authors_update(statistics: dict, model: dict, candidate, score: float) -> None:
    """swift_optimization from `model.set_skip_layers(new set)` on, after the candidate's matchness."""
    origin = model["set"]
    model["set"] = candidate
    if score > statistics["origin_score"]:
        statistics["origin_score"] = score
        statistics["tolerance_iter"] = 0
        if score > statistics["max_score"]:
            statistics["optimization"] = False
    else:
        model["set"] = origin
        statistics["tolerance_iter"] += 1
    statistics["opt_iter"] += 1
    if statistics["tolerance_iter"] > statistics["max_tolerance_iter"]:
        statistics["optimization"] = False
    if statistics["opt_iter"] > statistics["max_opt_iter"]:
        statistics["optimization"] = False


def authors_random_sets(skip_layer_list, L):
    """layer_random_search after its np.random.choice draw."""
    attn = [i + 1 for i in range(L - 2) if i in skip_layer_list]
    mlp = [i - (L - 2) + 1 for i in range(L - 2, (L - 2) * 2) if i in skip_layer_list]
    return attn, mlp


def authors_point(attn, mlp, L):
    """get_next_point_to_probe."""
    return [1.0 if i + 1 in attn else 0.0 for i in range(L - 2)] + [1.0 if i - (L - 2) + 1 in mlp else 0.0
                                                                  for i in range(L - 2, (L - 2) * 2)]


def authors_bayes_sets(point, m, L):
    """layer_bayes_search after optimizer.suggest: the m largest coordinates."""
    items = sorted({f"x{i}": v for i, v in enumerate(point)}.items(), reverse=True, key=lambda kv: kv[1])
    keep = [k for k, _ in items[:m]]
    return ([i + 1 for i in range(L - 2) if f"x{i}" in keep],
            [i - (L - 2) + 1 for i in range(L - 2, (L - 2) * 2) if f"x{i}" in keep])


def authors_choices(prob_list, sampling: bool):
    """get_choices_list."""
    candidate_set = [1, 3, 5, 10] if sampling else [3, 5, 8, 10]
    out = []
    for idx, item in enumerate(prob_list):
        n = candidate_set[0] if item > 0.95 else candidate_set[1] if item > 0.8 else candidate_set[2] if item > 0.5 else candidate_set[3]
        out.extend([[0] * idx + [i] for i in range(n)])
    return out


# -- the layer-set update ------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(scores=st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.5, 0.75, 0.9, 0.94, 1.0]), min_size=1, max_size=40),
       max_score=st.sampled_from([0.5, 0.93, 0.95, 1.0]), tol=st.integers(0, 6), max_iter=st.integers(0, 30))
def test_layer_set_update_is_the_authors(scores, max_score, tol, max_iter):
    s = S.Settings(0.45, 4, 1, 25, max_iter, tol, max_score, True, True)
    L = 8
    state = S.SearchState(skip=S.unified_init(L))
    stats = {"origin_score": 0, "opt_iter": 0, "tolerance_iter": 0, "max_score": max_score,
             "max_tolerance_iter": tol, "max_opt_iter": max_iter, "optimization": True}
    model = {"set": S.unified_init(L)}
    rng = np.random.default_rng(0)
    for score in scores:
        if not stats["optimization"]:  # the authors' loop calls it only while optimising
            assert not state.active
            break
        cand = S.skip_of(rng.choice(12, 5, replace=False), L)
        S.update(state, s, cand, S.point_of(cand, L), score)
        authors_update(stats, model, cand, score)
        assert state.skip == model["set"]
        assert (state.best, state.iters, state.tolerance, state.active) == (
            stats["origin_score"], stats["opt_iter"], stats["tolerance_iter"], stats["optimization"])


@settings(max_examples=100, deadline=None)
@given(L=st.integers(3, 14), data=st.data())
def test_candidate_index_maps_are_the_authors(L, data):
    n = 2 * (L - 2)
    coords = data.draw(st.lists(st.integers(0, n - 1), unique=True))
    attn, mlp = authors_random_sets(coords, L)
    skip = S.skip_of(coords, L)
    assert (sorted(skip.attn), sorted(skip.mlp)) == (attn, mlp)
    assert S.point_of(skip, L) == authors_point(attn, mlp, L)
    point = data.draw(st.lists(st.floats(0, 1), min_size=n, max_size=n, unique=True))
    m = data.draw(st.integers(0, n))
    got = S.skip_of(S.top_coords(point, m), L)
    assert (sorted(got.attn), sorted(got.mlp)) == authors_bayes_sets(point, m, L)
    assert S.num_skipped(L, 0.45) == int((L - 2) * 2 * 0.45)
    init = S.unified_init(L)  # np.arange(1, L - 1, 2) for both
    assert sorted(init.attn) == sorted(init.mlp) == list(range(1, L - 1, 2))


@pytest.mark.parametrize("interval", [1, 3, 25])
def test_bayesian_iterations_fall_where_the_authors_put_them(interval):
    s = S.Settings(0.45, 4, 1, interval, 1000, 1000, 1.0, True, True)
    state = S.SearchState(skip=S.unified_init(6), rng=np.random.default_rng(0))
    kinds = []
    for _ in range(2 * interval + 2):
        cand, point, kind = S.candidate(state, s, 6)
        assert len(cand.attn) + len(cand.mlp) == S.num_skipped(6, 0.45) and len(point) == 8
        kinds.append(kind)
        S.update(state, s, cand, point, 0.1)
    # (opt_iter + 1) % bayes_interval == 0, once there is an observation (bayes_opt's first suggestion is random)
    assert kinds == ["bayes" if (i + 1) % interval == 0 and i > 0 else "random" for i in range(len(kinds))]


def test_gp_suggests_near_the_best_observation():
    """The UCB step is an optimiser, not noise: with one good region observed, it suggests there."""
    rng = np.random.default_rng(0)
    x = rng.random((40, 6))
    y = -((x - 0.8) ** 2).sum(1)
    p = S.gp_ucb_point(x, y, np.random.default_rng(1))
    assert np.abs(p - 0.8).max() < 0.35


# -- what a generation does and records ----------------------------------------------------------------
def matchness(target, prompt, output, skip: LayerSkip, w: int) -> float:
    """The authors' parallel drafting: the skipped model over the output's first w + 1 tokens after the
    prompt's full-model cache, argmax against the next tokens."""
    cache = target.new_cache()
    target.forward(prompt, cache)
    logits, _ = target.forward(output[: w + 1], cache, skip=skip)
    pred = logits[:-1].argmax(-1).tolist()
    return sum(p == t for p, t in zip(pred, output[1 : w + 1])) / w


@torch.no_grad()
def test_each_iteration_scores_its_candidate_and_drafting_uses_the_recorded_set(monkeypatch):
    target, w = tiny_model(), 4
    m = swift(target, context_window=w, bayes_interval=3)
    used = []
    real = swift_module.skipped_draft
    monkeypatch.setattr(swift_module, "skipped_draft", lambda meth, skip, head=None: used.append(skip) or real(meth, skip, head))
    best = 0.0
    for prompt in PROMPTS:
        used.clear()
        g = m.generate(prompt, 40, frozenset(), 0)
        assert g.tokens == ar_tokens(target, prompt, 40)
        log = g.extra["swift"]
        assert log["iterations"], "the search never ran"
        for it in log["iterations"]:
            cand = LayerSkip(frozenset(it["attn"]), frozenset(it["mlp"]))
            assert it["score"] == pytest.approx(matchness(target, prompt, g.tokens, cand, w))
            assert it["adopted"] == (it["score"] > best)
            best = max(best, it["score"])
        # the layer set from each step on: the one in use at the start, then every adopted candidate
        assert log["layer_sets"][1:] == [[it["step"], it["attn"], it["mlp"]] for it in log["iterations"] if it["adopted"]]
        sets = {row[0]: LayerSkip(frozenset(row[1]), frozenset(row[2])) for row in log["layer_sets"]}
        in_use = None
        for step, skip in enumerate(used):  # the set drafting used at each step is the recorded one
            in_use = sets.get(step, in_use)
            assert skip == in_use, step
        assert log["search"]["best"] == best


def test_search_state_carries_over_samples_and_the_warm_up_leaves_it():
    m = swift(context_window=4)
    before = copy.deepcopy(m.search)
    warm_up([m], PROMPTS[1], 30, frozenset())
    assert m.search.iters == before.iters == 0 and m.search.rng is None and m.search.skip == before.skip
    first = m.generate(PROMPTS[0], 30, frozenset(), 0).extra["swift"]
    second = m.generate(PROMPTS[1], 30, frozenset(), 1).extra["swift"]
    assert second["layer_sets"][0][1:] == first["layer_sets"][-1][1:]  # the second sample starts where the first ended
    assert second["iterations"][0]["iter"] == first["search"]["iterations"] + 1


def test_dynamic_tree_is_the_authors_choices():
    for greedy in (True, False):
        for confs in ([0.99, 0.96, 0.95], [0.9, 0.81, 0.8, 0.5, 0.51], [0.2], [0.97, 0.85, 0.6, 0.1]):
            ranked = [[100 * d + r for r in range(10)] for d in range(len(confs))]
            tree, nodes = dynamic_tree(ranked, confs, greedy)
            assert tree.paths == TokenTree.from_paths(authors_choices(confs, not greedy)).paths
            assert nodes == [ranked[len(p) - 1][p[-1]] for p in tree.paths[1:]]
    assert [candidate_count(c, True) for c in (0.951, 0.95, 0.81, 0.8, 0.51, 0.5)] == [3, 5, 5, 8, 8, 10]


@torch.no_grad()
def test_first_draft_depth_holds_the_skipped_models_top_tokens():
    target, prompt = tiny_model(), PROMPTS[0]
    m = swift(target, optimize=False)
    got = []
    real = m.draft_candidates
    m.draft_candidates = lambda k: got.append(real(k)) or got[-1]
    m.generate(prompt, 3, frozenset(), 0)
    cache = target.new_cache()
    target.forward(prompt, cache)
    x = ar_tokens(target, prompt, 1)[0]
    p = torch.softmax(target.forward([x], cache, skip=S.unified_init(4))[0][-1], -1)
    prop = got[0]
    depth1 = [prop.tokens[i - 1] for i in prop.tree.children[0]]
    assert depth1 == p.topk(10).indices.tolist()[: candidate_count(float(p.max()), True)]


def test_tree_verification_accepts_siblings():
    """Dynamic verification matters: some steps accept a token of rank > 0 at a depth."""
    m = swift(optimize=False)
    ranks = []
    verify = m.verifier

    def spy(prop, pending, logits, sampling, gen):
        path, tok = verify(prop, pending, logits, sampling, gen)
        ranks.extend(prop.tree.paths[j][-1] for j in path[1:])
        return path, tok

    m.verifier = spy
    for prompt in PROMPTS:
        m.generate(prompt, 40, frozenset(), 0)
    assert any(r > 0 for r in ranks) and any(r == 0 for r in ranks)


@pytest.mark.parametrize("verification", ["tree", "chain"])
def test_sampling_is_lossless_end_to_end(verification):
    target = tiny_model(init_std=0.1, num_layers=4)
    m = swift(target, sampling=E2E_SAMPLING, verification=verification, optimize=False)
    assert check_sampling_matches_target(m, target) > 100


def test_optimisation_time_is_its_own_phase():
    """Every iteration's time is charged to `optimize`, none of it to drafting (phases nest)."""
    import time

    m = swift(context_window=4)
    real = m.matchness
    m.matchness = lambda skip: time.sleep(0.05) or real(skip)
    g = m.generate(PROMPTS[0], 30, frozenset(), 0)
    n = len(g.extra["swift"]["iterations"])
    assert n >= 3 and g.times["optimize"] >= 0.05 * n and g.times["draft"] < 0.05 * n


# -- the run: records, summary -------------------------------------------------------------------------
def test_run_records_layer_sets_and_times_the_optimisation(tmp_path, data_dir):
    cfg = make_cfg(tmp_path / "run", data_dir, "method=swift", "method.context_window=4")
    s = runner.run(cfg)
    recs = sorted(records(tmp_path / "run"), key=lambda r: r["index"])
    assert s["matches_ar"] == len(recs) and all("extra" not in r["ar"] for r in recs)
    logs = [r["method"]["extra"][0]["swift"] for r in recs]
    assert any(log["iterations"] for log in logs)
    for a, b in itertools.pairwise(logs):  # each sample starts with the set the one before ended with
        assert b["layer_sets"][0][1:] == a["layer_sets"][-1][1:]
    assert s["method"]["times"]["optimize"] > 0 and "optimize" in s["printed"]


# -- bad settings ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, words", [
    ({"skip_ratio": 1.5}, "method.skip_ratio=1.5 is not allowed"), ({"context_window": 0}, "method.context_window=0"),
    ({"verification": "dag"}, "unknown method.verification 'dag'; allowed: chain, tree"),
    ({"bayes": "yes"}, "method.bayes='yes' is not allowed; expected true or false"), ({"max_opt_iter": 2.5}, "method.max_opt_iter=2.5"),
])
def test_bad_settings_are_one_line_errors(kw, words):
    with pytest.raises(SpecBenchError, match=words):
        swift(**kw)


def test_a_two_layer_model_is_refused():
    with pytest.raises(SpecBenchError, match="needs >= 3 layers"):
        swift(tiny_model(num_layers=2))


@pytest.mark.slow
def test_bad_setting_on_the_command_line(tmp_path, data_dir):
    r = run_cli(["method=swift", "method.verification=dag", "model=tiny-llama", "task.num_samples=1",
                 f"run_dir={tmp_path}/run"], data_dir)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "method.verification" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()
