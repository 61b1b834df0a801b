"""Token Recycling and Lookahead decoding (methods/token_recycling.py, methods/lookahead.py): lossless
under greedy (random prompts and settings) and sampling (exact marginals), and the invariants a
plausible bug breaks: the recycled matrix rows, the tree expansion, Lookahead's mask and positions."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import ar_tokens, build, method_cfg, run_cli, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lossless import SETTINGS, TARGETS, check_lossless, prompts
from test_medusa import E2E_PROMPT, E2E_SAMPLING, check_sampling_matches_target

from specbench.engine.sampling import probs
from specbench.engine.verify import verification_input
from specbench.core.errors import SpecBenchError
from specbench.methods.lookahead import pool_trie, window_layout

REPETITIVE = [40, 41, 42, 40, 41, 42, 40, 41, 7, 40, 41]


# -- greedy: AR's tokens, whatever the settings -------------------------------------------------
@settings(max_examples=40, **SETTINGS)
@given(target_name=st.sampled_from(list(TARGETS)), max_nodes=st.sampled_from([None, 1, 5, 30]), reset=st.booleans(),
       prompt=prompts, seed=st.integers(0, 2**31 - 1), max_new=st.integers(1, 40),
       eos_at=st.one_of(st.none(), st.integers(0, 39)))
def test_token_recycling_greedy_equals_ar(target_name, max_nodes, reset, prompt, seed, max_new, eos_at):
    target = tiny_model(**TARGETS[target_name])
    m = build("token_recycling", target, method_cfg("token_recycling", max_nodes=max_nodes, reset_per_sequence=reset))
    m.generate(REPETITIVE, 12, frozenset(), 0)  # a matrix that has seen something (kept unless reset)
    check_lossless(target, m, prompt, max_new, seed, eos_at, m.tree.max_depth)


@settings(max_examples=40, **SETTINGS)
@given(target_name=st.sampled_from(list(TARGETS)), window=st.integers(1, 5), ngram=st.integers(3, 5),
       guess=st.integers(1, 4), from_prompt=st.booleans(), bonus=st.booleans(), prompt=prompts, seed=st.integers(0, 2**31 - 1),
       max_new=st.integers(1, 40), eos_at=st.one_of(st.none(), st.integers(0, 39)))
def test_lookahead_greedy_equals_ar(target_name, window, ngram, guess, from_prompt, bonus, prompt, seed, max_new, eos_at):
    target = tiny_model(**TARGETS[target_name])
    m = build("lookahead", target, method_cfg("lookahead", window=window, ngram=ngram, guess=guess, pool_from_prompt=from_prompt,
                                              full_match_bonus=bonus))
    check_lossless(target, m, prompt, max_new, seed, eos_at, ngram - 1)


@pytest.mark.parametrize("name, kw", [("token_recycling", {}), ("token_recycling", {"max_nodes": 8}),
                                      ("lookahead", {}), ("lookahead", {"window": 4, "ngram": 3, "guess": 4})])
def test_acceptance_is_exercised(name, kw):
    target = tiny_model(init_std=0.1)
    m = build(name, target, method_cfg(name, **kw))
    accepted = 0
    for i, prompt in enumerate([REPETITIVE, [3 + b for b in b"Question: 2+2=? Answer:"]]):
        g = m.generate(prompt, 40, frozenset(), i)
        assert g.tokens == ar_tokens(target, prompt, 40)
        accepted += sum(s.accepted for s in g.steps)
    assert accepted >= 20


# -- sampling: the target's exact marginals (deterministic drafts, one-hot q) -------------------
def test_token_recycling_sampling_is_lossless_end_to_end():
    target = tiny_model(init_std=0.1, num_layers=2)
    m = build("token_recycling", target, method_cfg("token_recycling", max_nodes=30), sampling=E2E_SAMPLING)
    assert check_sampling_matches_target(m, target) > 20  # drafts were accepted often enough to matter


def top5(target, ids: list[int]) -> list[int]:
    logits, _ = target.forward(ids, target.new_cache(), last_only=True)
    return torch.nonzero(probs(logits[-1], E2E_SAMPLING)).view(-1).tolist()


def test_lookahead_sampling_is_lossless_end_to_end():
    """The pool is seeded, for every possible first token, with every 2-token continuation the target
    can sample (top-5), so the shared-prefix candidates are accepted or rejected at every step."""
    target = tiny_model(init_std=0.1, num_layers=2)
    m = build("lookahead", target, method_cfg("lookahead", window=3, ngram=3, guess=25), sampling=E2E_SAMPLING)
    seeded = {a: [(b, c) for b in top5(target, E2E_PROMPT + [a]) for c in top5(target, E2E_PROMPT + [a, b])]
              for a in top5(target, E2E_PROMPT)}
    prefill_draft = m.prefill_draft

    def with_seeded_pool(prompt):
        prefill_draft(prompt)
        m.pool.update({a: list(grams) for a, grams in seeded.items()})

    m.prefill_draft = with_seeded_pool
    assert check_sampling_matches_target(m, target) > 100


# -- Token Recycling's invariants ----------------------------------------------------------------
def test_token_recycling_expands_from_the_matrix_and_recycles_every_verified_row():
    target = tiny_model(init_std=0.1)
    m = build("token_recycling", target, method_cfg("token_recycling"))
    m.generate(REPETITIVE, 16, frozenset(), 0)
    seen = {}
    verify = m.verify_forward

    def spy(prop, feed, mask, positions):
        seen["adj"], seen["feed"] = m.adj.clone(), list(feed)
        seen["logits"], hidden = verify(prop, feed, mask, positions)
        return seen["logits"], hidden

    m.verify_forward = spy
    m.step(30)
    feed, adj = seen["feed"], seen["adj"]
    # node (r1..rd) = rank rd among its parent *token's* successors
    for i, path in enumerate(m.tree.paths[1:], 1):
        assert feed[i] == int(adj[feed[m.tree.parents[i]], path[-1]])
    # every fed row, on the accepted path or not, became its token's successor list (last row wins)
    last = {tok: i for i, tok in enumerate(feed)}
    assert len(last) > m.tree.max_depth + 1  # more tokens than any accepted path: rejected rows count too
    for tok, i in last.items():
        assert m.adj[tok].tolist() == torch.topk(seen["logits"][i], m.topk).indices.tolist(), tok


def test_token_recycling_keeps_or_resets_the_matrix_between_prompts():
    target = tiny_model(init_std=0.1)
    for reset in (False, True):
        m = build("token_recycling", target, method_cfg("token_recycling", reset_per_sequence=reset))
        m.generate(REPETITIVE, 8, frozenset(), 0)
        before = m.adj.clone()
        m.start([5, 6])  # the next prompt's prefill
        assert torch.equal(m.adj, torch.zeros_like(before) if reset else before)


# -- Lookahead's invariants ----------------------------------------------------------------------
def test_window_rows_see_one_token_per_position_along_their_jacobi_trajectory():
    mask, pos = window_layout(4, 5)
    for i in range(20):
        l, j = divmod(i, 5)
        seen = set(torch.nonzero(mask[i]).view(-1).tolist())
        assert seen == {c for c in range(j + 1)} | {m * 5 + j for m in range(1, l + 1)}
        assert sorted(pos[list(seen)].tolist()) == list(range(int(pos[i]) + 1))  # x at 0, then one per position


def test_lookahead_forward_rows_equal_plain_causal_forwards():
    """The one forward (window + candidates, custom mask and positions) gives every row the logits of a
    causal forward over what it sees: window rows their Jacobi sequence, candidates x + their own prefix."""
    target = tiny_model()
    m = build("lookahead", target, method_cfg("lookahead", window=3, ngram=4, guess=3, full_match_bonus=True))
    m.seed, m.gen = 0, torch.Generator().manual_seed(0)
    m.start([5, 17, 99, 3, 42, 8, 17])
    m.rows = [[11, 12], [21, 22, 23], [31, 32, 33]]
    x = m.tokens[-1]
    m.pool = {x: [(50, 51, 52), (50, 53, 54), (60, 61, 62)]}
    prop = m.propose(0)
    assert prop.tokens == [50, 60, 51, 53, 61, 52, 54, 62]  # the trie: 50's two continuations share their first node
    m.full_match_bonus = False  # lade's rule: the same forward, the last depth fed but not verified
    lade = m.propose(0)
    assert lade.tokens == prop.tokens[:5] and len(lade.tree) == 6 and lade.layout.feed == prop.layout.feed
    assert lade.layout.rows == prop.layout.rows[:6]
    feed, mask, offsets, rows = verification_input(prop, x)
    committed = len(m.tokens) - 1
    logits, _ = target.forward(feed, m.cache, positions=committed + offsets, tree_mask=mask)
    for i in range(len(feed)):
        seen = sorted(torch.nonzero(mask[i]).view(-1).tolist(), key=lambda j: int(offsets[j]))
        assert [int(offsets[j]) for j in seen] == list(range(len(seen)))
        ref, _ = target.forward(m.tokens[:-1] + [feed[j] for j in seen], target.new_cache(), last_only=True)
        torch.testing.assert_close(logits[i], ref[-1], rtol=0, atol=1e-9)
    assert all(not mask[i, 1:9].any() for i in range(9, len(feed)))  # candidates never see the window


@pytest.mark.parametrize("ngram", [3, 5])
@pytest.mark.parametrize("bonus", [False, True])
def test_a_fully_matched_ngram_commits_what_lade_commits(ngram, bonus):
    """lade (decoding.py): a candidate matched to its end commits its N-1 tokens, no token after them;
    `full_match_bonus` adds the target's token after them. A candidate that fails at its last token
    commits N-1 under both (N-2 matched + the target's token)."""
    target, prompt = tiny_model(), [5, 17, 99, 3, 42, 8, 17]
    ar = ar_tokens(target, prompt, ngram + 1)
    for gram, want in ((tuple(ar[1:ngram]), ngram - 1 + bonus), (tuple(ar[1:ngram - 1]) + (ar[ngram - 1] + 1,), ngram - 1)):
        m = build("lookahead", target, method_cfg("lookahead", window=3, ngram=ngram, guess=3, pool_from_prompt=False,
                                                  full_match_bonus=bonus))
        m.seed, m.gen = 0, torch.Generator().manual_seed(0)
        m.start(prompt)
        m.pool = {m.tokens[-1]: [gram]}
        window = sum(len(row) for row in m.rows)
        r = m.step(20)
        assert r.tokens == ar[1 : 1 + want], (gram, bonus)
        assert r.n_verified == 1 + window + ngram - 1  # every candidate token is fed under both rules
        assert r.n_candidates == ngram - 2 + bonus  # ... the last one verified only with the bonus


def test_pool_trie_orders_candidates_first_seen_first():
    tree, tokens = pool_trie([(7, 8), (7, 9), (5, 6)])
    assert tokens == [7, 5, 8, 9, 6] and tree.paths[1:] == [(0,), (1,), (0, 0), (0, 1), (1, 0)]
    tree, tokens = pool_trie([])
    assert tokens == [] and len(tree) == 1


def test_lookahead_collects_the_window_ngrams():
    """A full window's columns become n-grams (row 0[j], rows 1..N-2 [j], output j) under row 0[j]."""
    target = tiny_model()
    m = build("lookahead", target, method_cfg("lookahead", window=3, ngram=3, guess=5, pool_from_prompt=False))
    m.seed, m.gen = 0, torch.Generator().manual_seed(0)
    m.start([5, 17, 99, 3])
    m.rows = [[11, 12], [21, 22, 23]]  # full: N - 1 = 2 rows
    x, seen = m.tokens[-1], {}
    verify = m.verify_forward

    def spy(prop, feed, mask, positions):
        seen["logits"], hidden = verify(prop, feed, mask, positions)
        return seen["logits"], hidden

    m.verify_forward = spy
    m.step(10)
    out = seen["logits"][3:6].argmax(-1).tolist()
    assert m.pool == {x: [(21, out[0])], 11: [(22, out[1])], 12: [(23, out[2])]}
    assert m.rows == [[22, 23], out]  # one Jacobi iteration on


# -- bad settings: one line ---------------------------------------------------------------------
@pytest.mark.parametrize("name, kw, words", [
    ("lookahead", {"ngram": 2}, "method.ngram=2"), ("lookahead", {"window": 0}, "method.window=0"),
    ("lookahead", {"guess": 0}, "method.guess=0"), ("token_recycling", {"topk": 4}, "method.topk=4"),
    ("token_recycling", {"tree": "nope"}, "'nope'"), ("token_recycling", {"tree": [[0, 0]]}, "no parent"),
    ("token_recycling", {"max_nodes": 0}, "method.max_nodes=0"),
])
def test_bad_settings_are_one_line_errors(name, kw, words):
    with pytest.raises(SpecBenchError, match=words):
        if isinstance(kw.get("tree"), list):  # explicit paths: the method reads them, the schema types `tree` as a string
            build(name, tiny_model(), replace(method_cfg(name), **kw))
        else:
            build(name, tiny_model(), method_cfg(name, **kw))


@pytest.mark.slow
def test_bad_setting_on_the_command_line(tmp_path, data_dir):
    r = run_cli(["method=lookahead", "method.ngram=2", "model=tiny-llama", "task.num_samples=1",
                 f"run_dir={tmp_path}/run"], data_dir)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == ["specbench: error: method.ngram=2 is not allowed; expected an integer >= 3"]
    assert not (tmp_path / "run").exists()


def test_token_recycling_takes_explicit_paths_on_the_command_line(tmp_path, data_dir):
    """conf/method/token_recycling.yaml documents `method.tree=[[0],[1],[0,0],...]` and template_tree
    builds it, but the schema took only a template name (refused as 'a non-empty string')."""
    r = run_cli(["method=token_recycling", "method.tree=[[0],[1],[0,0]]", "model=tiny-llama", "task.num_samples=1",
                 "max_new_tokens=8", "profile.enabled=false", "progress=false", "threads=1", f"run_dir={tmp_path}/run"], data_dir)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "identical to AR: 1/1" in r.stdout, r.stdout[-2000:]
