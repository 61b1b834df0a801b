"""Medusa: greedy output equals AR (untrained and trained heads), typical is labelled lossy,
training lowers the loss, a saved checkpoint reloads to identical outputs."""

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import specbench.train.medusa  # noqa: F401 - registers the trainer
from specbench.engine.sampling import SamplingConfig
from specbench.core.errors import SpecBenchError
from specbench.train.trainers import TRAINERS
from tests.helpers import ar_tokens, build, method_cfg, tiny_model, train_run

prompts = st.lists(st.integers(3, 258), min_size=1, max_size=12)


def tiny_sequences(n=12, seed=0, length=40):
    """Hand-made (ids, loss_start) sequences with learnable structure (repeated motifs)."""
    pool = random.Random(1234)
    motifs = [[pool.randrange(3, 40) for _ in range(pool.randint(3, 6))] for _ in range(3)]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        motif = rng.choice(motifs)
        motif = motif[rng.randrange(len(motif)):] + motif  # a random phase
        seq = [0] + (motif * 20)[:length]
        out.append((seq, 4))
    return out


def train_cfg(method: dict, **train):
    t = {"lr": 1e-2, "epochs": 3, "batch_size": 4, "max_len": 64, "max_minutes": 2, "eval_fraction": 0.25, "seed": 0}
    return train_run(method, **(t | train))


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(prompt=prompts, sizes=st.sampled_from([[2, 2, 1, 1], [3, 1], [1, 1, 1, 1]]))
def test_greedy_equals_ar_untrained(prompt, sizes):
    target = tiny_model()
    m = build("medusa", target, method_cfg("medusa", allow_untrained=True, sizes=sizes, checkpoint="auto"))
    assert m.lossless
    out = m.generate(prompt, 16, frozenset(), 0).tokens
    assert out == ar_tokens(target, prompt, 16)


def test_missing_heads_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(SpecBenchError, match="python -m specbench.train method=medusa"):
        build("medusa", tiny_model(), method_cfg("medusa"))


def test_typical_marks_lossy():
    cfg = method_cfg("medusa", allow_untrained=True, acceptance="typical")
    m = build("medusa", tiny_model(), cfg, sampling=SamplingConfig(temperature=0.7))
    assert m.lossless is False
    out = m.generate([5, 6, 7], 8, frozenset(), 0).tokens
    assert len(out) == 8
    greedy = build("medusa", tiny_model(), cfg)  # T=0: typical falls back to greedy verification
    assert greedy.lossless and greedy.generate([5, 6, 7], 8, frozenset(), 0).tokens == ar_tokens(tiny_model(), [5, 6, 7], 8)


@torch.no_grad()
def test_typical_first_token_is_greedy():
    """Medusa 3.3.1 (and the authors' generate_candidates): greedy for the sequence's first token
    under typical acceptance, at any temperature; `auto` still samples it (lossless rejection)."""
    target = tiny_model()
    prompt = [5, 6, 7]
    logits, _ = target.forward(prompt, target.new_cache(), last_only=True)
    greedy_first = int(logits[-1].argmax())
    hot = SamplingConfig(temperature=1.5)
    typical = build("medusa", target, method_cfg("medusa", allow_untrained=True, acceptance="typical"), sampling=hot)
    firsts = {typical.generate(prompt, 1, frozenset(), seed).tokens[0] for seed in range(20)}
    assert firsts == {greedy_first}  # every seed starts the same (a new turn starts the same way)
    auto = build("medusa", target, method_cfg("medusa", allow_untrained=True), sampling=hot)
    assert len({auto.generate(prompt, 1, frozenset(), seed).tokens[0] for seed in range(20)}) > 1


def test_sparse_tree_config():
    target = tiny_model()
    m = build("medusa", target, method_cfg("medusa", allow_untrained=True, tree=[[0], [1], [0, 0], [0, 1], [0, 0, 0]]))
    assert len(m.tree) == 6
    g = m.generate([9, 10, 11], 12, frozenset(), 0)
    assert g.tokens == ar_tokens(target, [9, 10, 11], 12)
    # a step records the tree's depth (v_d's denominator) and its nodes (tokens drafted)
    assert g.steps and all(x.drafted == 3 and x.candidates == 5 and x.verified == 6 for x in g.steps)


def test_bad_trees_are_one_line():
    """The same checks as Hydra's (one helper serves both, methods/medusa.py paths_tree)."""
    with pytest.raises(SpecBenchError, match="medusa tree depth 3 exceeds num_heads=2"):
        build("medusa", tiny_model(), method_cfg("medusa", allow_untrained=True, num_heads=2, tree=[[0], [0, 0], [0, 0, 0]]))
    with pytest.raises(SpecBenchError, match=r"medusa method.tree: .*no parent"):
        build("medusa", tiny_model(), method_cfg("medusa", allow_untrained=True, tree=[[0], [1, 0]]))


def test_train_lowers_loss_reload_identical_and_greedy_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    target = tiny_model()
    mcfg = {"name": "medusa", "num_heads": 3, "share_head": False, "sizes": [2, 2, 1]}
    res = TRAINERS["medusa"](target, train_cfg(mcfg), tiny_sequences())
    assert res["held_out_loss_after"] < res["held_out_loss_before"]
    cfg = method_cfg(**mcfg)
    a = build("medusa", target, cfg)
    assert a.info["heads_trained"]
    b = build("medusa", target, cfg)
    for x, y in zip(a.heads.state_dict().values(), b.heads.state_dict().values()):
        assert torch.equal(x, y)
    prompt = tiny_sequences(1, seed=5)[0][0][:10]
    out_a = a.generate(prompt, 20, frozenset(), 0)
    assert out_a.tokens == b.generate(prompt, 20, frozenset(), 0).tokens
    assert out_a.tokens == ar_tokens(target, prompt, 20)
    # the accuracies feed a sparse tree
    c = build("medusa", target, method_cfg(**mcfg | {"tree_from_accuracies": 5, "sizes": None}))
    assert len(c.tree) == 6
    assert c.generate(prompt, 20, frozenset(), 0).tokens == out_a.tokens


def test_sampling_runs_and_is_seeded():
    target = tiny_model()
    s = SamplingConfig(temperature=0.8)
    m = build("medusa", target, method_cfg("medusa", allow_untrained=True), sampling=s)
    a = m.generate([5, 6], 10, frozenset(), 3).tokens
    assert a == m.generate([5, 6], 10, frozenset(), 3).tokens and len(a) == 10


@pytest.mark.parametrize("sizes", [[2, 2, 1], [3, 2]])
def test_oracle_heads_accept_many_and_stay_equal(sizes):
    """Heads that know AR's future (sometimes at rank 1, behind a wrong rank-0 token) exercise
    multi-token acceptance through non-first branches and the cache compaction."""
    target = tiny_model()
    prompt = [0, 17, 99, 42]
    ref = prompt + ar_tokens(target, prompt, 40)
    m = build("medusa", target, method_cfg("medusa", allow_untrained=True, num_heads=len(sizes), sizes=sizes))
    rng = random.Random(0)

    def head(d, h):
        logits = torch.zeros(target.vocab_size, dtype=h.dtype)
        i = len(m.tokens) + d  # m.tokens[-1] is pending: head d predicts index len(tokens) + d
        if i < len(ref):
            good, bad = ref[i], (ref[i] + 1) % target.vocab_size
            wrong_first = rng.random() < 0.4
            logits[bad] = 2.0 if wrong_first else 1.0
            logits[good] = 1.5 if wrong_first else 3.0
            if rng.random() < 0.15:
                logits[good] = -1.0  # a miss
        return logits

    m.heads.head = head
    g = m.generate(prompt, 40, frozenset(), 0)
    assert g.tokens == ref[len(prompt):]
    assert sum(s.accepted for s in g.steps) >= 15


# -- sampling follows the target's distribution (end to end) ------------------------------------
E2E_SAMPLING = SamplingConfig(temperature=1.0, top_k=5)
E2E_PROMPT = [0] + [3 + b for b in b"Q: 12 apples, 5 eaten. A:"]


def exact_marginal(target, pos: int) -> dict[int, float]:
    """The target's exact marginal of new token `pos` under E2E_SAMPLING (top-5: few paths)."""
    from specbench.engine.sampling import probs

    dists = {(): 1.0}
    for _ in range(pos + 1):
        nxt: dict[tuple, float] = {}
        for prefix, w in dists.items():
            logits, _ = target.forward(E2E_PROMPT + list(prefix), target.new_cache(), last_only=True)
            p = probs(logits[-1], E2E_SAMPLING)
            for tok in torch.nonzero(p).view(-1).tolist():
                nxt[prefix + (tok,)] = nxt.get(prefix + (tok,), 0.0) + w * float(p[tok])
        dists = nxt
    out: dict[int, float] = {}
    for path, w in dists.items():
        out[path[pos]] = out.get(path[pos], 0.0) + w
    return out


def check_sampling_matches_target(method, target, seeds: int = 500, max_new: int = 3) -> int:
    """Chi-square goodness of fit of new tokens 1 and 2 against the exact marginals; returns
    the number of accepted draft tokens (so callers can check both branches were exercised)."""
    import numpy as np
    from scipy.stats import chisquare

    outs, acc = [], 0
    for seed in range(seeds):
        g = method.generate(E2E_PROMPT, max_new, frozenset(), seed)
        outs.append(g.tokens)
        acc += sum(s.kept for s in g.steps)
    for pos in (1, 2):
        marg = exact_marginal(target, pos)
        seen = [o[pos] for o in outs]
        assert set(seen) <= set(marg), "tokens outside the target's support"
        cats = sorted(marg)
        counts = np.array([seen.count(c) for c in cats], dtype=float)
        exp = np.array([marg[c] for c in cats]) * seeds
        small = exp < 5
        obs, ex = counts[~small], exp[~small]
        if small.any():
            obs, ex = np.append(obs, counts[small].sum()), np.append(ex, exp[small].sum())
        assert chisquare(obs, ex * obs.sum() / ex.sum()).pvalue > 1e-3, (pos, counts, exp)
    return acc


def test_tree_rejection_sampling_is_lossless_end_to_end():
    target = tiny_model(init_std=0.1, num_layers=2)
    m = build("medusa", target, method_cfg("medusa", allow_untrained=True, num_heads=2, sizes=[3, 2]), sampling=E2E_SAMPLING)
    acc = check_sampling_matches_target(m, target)
    assert acc > 20  # candidates were accepted often enough to matter
