"""Greedy speculative decoding must reproduce AR token for token (vanilla SD, PLD, every controller).

The tiny targets (float64, so batched and one-token forwards never flip an argmax):
- "std0.3": conf/model/tiny-llama.yaml (4 layers); a truncated draft rarely agrees with it;
- "std0.1-4L" / "std0.1-2L": a smaller init, whose outputs repeat themselves: partial agreement
  with a truncated draft and many prompt-lookup hits;
- draft "same": the draft is the target itself (own cache), so every draft token is accepted and
  every round ends with the bonus token.
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chi2_contingency, chisquare

from helpers import ar_tokens, build, control, method_cfg, tiny_model
from specbench.engine.sampling import SamplingConfig, probs, verify_sampling

TARGETS = {
    "std0.3": {},
    "std0.1-4L": {"init_std": 0.1},
    "std0.1-2L": {"init_std": 0.1, "num_layers": 2},
}
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

token = st.integers(0, 258)
prompts = st.one_of(
    st.binary(min_size=1, max_size=24).map(lambda b: [3 + x for x in b]),  # byte strings
    st.lists(token, min_size=1, max_size=24),  # any ids, specials included
    st.lists(st.sampled_from([40, 41, 42]), min_size=1, max_size=24),  # repetitive: lookup hits
    st.binary(min_size=1, max_size=12).map(lambda b: [0] + [3 + x for x in b] * 2),  # BOS + a repeat
)


def vanilla(target_name: str, draft: int | str, ctrl: dict):
    target = tiny_model(**TARGETS[target_name])
    if draft == "same":
        m = build("vanilla_sd", target, method_cfg("vanilla_sd"), ctrl=ctrl)
        m.draft = target  # same weights as the target; its own cache (dcache)
    else:
        m = build("vanilla_sd", target, method_cfg("vanilla_sd", draft={"num_layers": draft}), ctrl=ctrl)
    return target, m


def pld(target_name: str, max_ngram: int, min_ngram: int, ctrl: dict):
    target = tiny_model(**TARGETS[target_name])
    return target, build("pld", target, method_cfg("pld", max_ngram=max_ngram, min_ngram=min_ngram), ctrl=ctrl)


def check_lossless(target, method, prompt, max_new, seed, eos_at, k_max):
    """method's greedy output == AR's, with and without an EOS AR emits mid-output."""
    full = ar_tokens(target, prompt, max_new, frozenset(), seed)
    assert len(full) == max_new
    eos = frozenset()
    expected = full
    if eos_at is not None and eos_at < len(full):
        t = full[eos_at]
        eos = frozenset({t})
        expected = full[: full.index(t) + 1]
        assert ar_tokens(target, prompt, max_new, eos, seed) == expected  # AR stops there too
    g = method.generate(prompt, max_new, eos, seed)
    assert g.tokens == expected
    for drafted, accepted, kept in ((s.drafted, s.accepted, s.kept) for s in g.steps):
        assert 0 <= kept <= accepted <= drafted <= k_max
    # every step commits at least one token; the prefill commits the first
    assert len(g.steps) <= len(g.tokens) - 1
    return g


def accepted(g) -> int:
    return sum(s.kept for s in g.steps)


# --- hypothesis: random prompts, K, seeds, lengths ------------------------------------------------

vanilla_setups = st.one_of(
    st.tuples(st.sampled_from(["std0.3", "std0.1-4L"]), st.sampled_from([1, 2, 3, "same"])),
    st.tuples(st.just("std0.1-2L"), st.sampled_from([1, "same"])),
)


@settings(max_examples=100, **SETTINGS)
@given(
    setup=vanilla_setups,
    prompt=prompts,
    k=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
    max_new=st.integers(1, 40),
    eos_at=st.one_of(st.none(), st.integers(0, 39)),
)
def test_vanilla_sd_greedy_equals_ar(setup, prompt, k, seed, max_new, eos_at):
    target, m = vanilla(*setup, control("fixed", k))
    check_lossless(target, m, prompt, max_new, seed, eos_at, k)


@settings(max_examples=100, **SETTINGS)
@given(
    target_name=st.sampled_from(list(TARGETS)),
    ngrams=st.tuples(st.integers(1, 4), st.integers(1, 4)).map(sorted),
    prompt=prompts,
    k=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
    max_new=st.integers(1, 40),
    eos_at=st.one_of(st.none(), st.integers(0, 39)),
)
def test_pld_greedy_equals_ar(target_name, ngrams, prompt, k, seed, max_new, eos_at):
    min_ngram, max_ngram = ngrams
    target, m = pld(target_name, max_ngram, min_ngram, control("fixed", k))
    check_lossless(target, m, prompt, max_new, seed, eos_at, k)


controllers = st.one_of(
    st.builds(lambda g: ("threshold", {"gamma": g}), st.floats(0.0, 1.0)),
    st.builds(
        lambda g, a, r: ("adaptive_threshold", {"gamma": g, "alpha": a, "epsilon": 0.01, "beta1": 0.5, "beta2": 0.9, "reset_per_sequence": r}),
        st.floats(0.0, 1.0),
        st.floats(0.0, 1.0, exclude_min=True),  # control.alpha: (0, 1] (specbench/config/schema.py)
        st.booleans(),
    ),
    st.builds(
        lambda a, b, r: ("beta_ts", {"alpha0": a, "beta0": b, "reset_per_sequence": r}),
        st.floats(0.1, 10.0),
        st.floats(0.1, 10.0),
        st.booleans(),
    ),
    st.just(("cali_ts", {"sigma_m": 0.2, "sigma_s": 0.3, "theta0": 0.5, "theta_update": "mean", "predictor": None, "reset_per_sequence": True})),
)


@settings(max_examples=100, **SETTINGS)
@given(
    ctrl=controllers,
    which=st.sampled_from(["vanilla:std0.1-4L:1", "vanilla:std0.3:2", "vanilla:std0.1-2L:same", "pld:std0.1-4L", "pld:std0.3"]),
    prompt=prompts,
    k=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
    max_new=st.integers(1, 40),
    eos_at=st.one_of(st.none(), st.integers(0, 39)),
)
def test_controllers_greedy_equal_ar(ctrl, which, prompt, k, seed, max_new, eos_at):
    name, params = ctrl
    ctl = control(name, k, **params)
    kind, target_name, *rest = which.split(":")
    if kind == "vanilla":
        draft = rest[0] if rest[0] == "same" else int(rest[0])
        target, m = vanilla(target_name, draft, ctl)
    else:
        target, m = pld(target_name, 3, 1, ctl)
    assert m.controller.name == name and m.controller.k_max == k
    check_lossless(target, m, prompt, max_new, seed, eos_at, k)


# --- fixed cases: the run must actually exercise acceptance, max_new_tokens=1 and EOS --------------

FIXED_PROMPTS = [
    [0] + [3 + b for b in b"Question: 2+2=? Answer:"],
    [3 + b for b in b"abcabcabcabc"],
    [5, 6, 7, 5, 6, 7, 200, 1, 9],
    [3 + b for b in b"x"],
]


@pytest.mark.parametrize(
    "target_name,draft,expect",
    [
        ("std0.1-4L", 1, "partial"),
        ("std0.1-4L", 3, "partial"),
        ("std0.1-2L", 1, "partial"),
        ("std0.3", 2, "any"),
        ("std0.1-2L", "same", "all"),
        ("std0.3", "same", "all"),
    ],
)
@pytest.mark.parametrize("k", [1, 3, 8])
def test_vanilla_sd_acceptance_is_exercised(target_name, draft, expect, k):
    total_acc = total_drafted = 0
    for i, prompt in enumerate(FIXED_PROMPTS):
        target, m = vanilla(target_name, draft, control("fixed", k))
        g = check_lossless(target, m, prompt, 30, i, None, k)
        total_acc += accepted(g)
        total_drafted += sum(s.drafted for s in g.steps)
        if expect == "all":
            # every draft accepted: rounds of k drafts + 1 bonus token (the last one may be cut short)
            assert all(s.drafted == s.accepted for s in g.steps)
            assert all(s.drafted == k for s in g.steps[:-1])
            assert len(g.steps) == -(-29 // (k + 1))
    if expect == "partial":
        assert 0 < total_acc < total_drafted
    if expect == "all":
        assert total_acc == total_drafted > 0


@pytest.mark.parametrize("ngrams", [(1, 1), (1, 3), (2, 2), (3, 4)])
def test_pld_acceptance_is_exercised(ngrams):
    min_ngram, max_ngram = ngrams
    total = 0
    for i, prompt in enumerate(FIXED_PROMPTS):
        target, m = pld("std0.1-4L", max_ngram, min_ngram, control("fixed", 5))
        total += accepted(check_lossless(target, m, prompt, 30, i, None, 5))
    assert total > 0


@pytest.mark.parametrize("make", ["vanilla1", "vanilla_same", "pld"])
def test_max_new_tokens_one(make):
    for prompt in FIXED_PROMPTS:
        if make == "pld":
            target, m = pld("std0.1-4L", 3, 1, control("fixed", 4))
        else:
            target, m = vanilla("std0.1-4L", 1 if make == "vanilla1" else "same", control("fixed", 4))
        g = m.generate(prompt, 1, frozenset(), 0)
        assert g.tokens == ar_tokens(target, prompt, 1) and len(g.tokens) == 1
        assert g.steps == []


@pytest.mark.parametrize("make", ["vanilla1", "vanilla_same", "pld"])
def test_eos_mid_output_stops_both(make):
    """An EOS in the middle of an accepted draft run cuts it: same stop as AR, later drafts dropped."""
    hits = 0
    for i, prompt in enumerate(FIXED_PROMPTS):
        if make == "pld":
            target, m = pld("std0.1-4L", 3, 1, control("fixed", 8))
        else:
            target, m = vanilla("std0.1-4L", 1 if make == "vanilla1" else "same", control("fixed", 8))
        full = ar_tokens(target, prompt, 30)
        for at in (0, 5, 12, 29):
            g = check_lossless(target, m, prompt, 30, i, at, 8)
            assert g.tokens[-1] == full[at] and full[at] not in g.tokens[:-1]
            hits += len(g.tokens) < 30
    assert hits > 0  # some runs really stopped early


def test_eos_in_first_token():
    target, m = vanilla("std0.1-4L", "same", control("fixed", 4))
    prompt = FIXED_PROMPTS[0]
    first = ar_tokens(target, prompt, 1)[0]
    g = m.generate(prompt, 20, frozenset({first}), 0)
    assert g.tokens == [first] and g.steps == []


@pytest.mark.parametrize("mode", ["assistant", "prompt_lookup"])
def test_hf_assisted_greedy_equals_ar(mode):
    target = tiny_model(init_std=0.1)
    eos = frozenset({1})  # the byte tokenizer's EOS, as the runner passes it
    m = build("hf_assisted", target, method_cfg("hf_assisted", mode=mode, k=4))
    for i, prompt in enumerate(FIXED_PROMPTS[:2]):
        assert m.generate(prompt, 20, eos, i).tokens == ar_tokens(target, prompt, 20, eos)


def test_hf_assisted_without_eos_ids():
    target = tiny_model(init_std=0.1)
    m = build("hf_assisted", target, method_cfg("hf_assisted", mode="prompt_lookup", k=4))
    assert m.generate(FIXED_PROMPTS[0], 10, frozenset(), 0).tokens == ar_tokens(target, FIXED_PROMPTS[0], 10)


def test_sampling_same_draft_accepts_everything():
    """Under sampling a draft identical to the target (q == p) is never rejected."""
    target, m = vanilla("std0.1-2L", "same", control("fixed", 4))
    m.sampling = SamplingConfig(temperature=0.8, top_p=0.9, top_k=20)
    for seed in range(3):
        g = m.generate(FIXED_PROMPTS[0], 25, frozenset(), seed)
        assert len(g.tokens) == 25
        assert all(s.drafted == s.accepted for s in g.steps)


# --- rejection sampling preserves the target distribution ------------------------------------------

V = 6
# target rows P[t] (t = position) and draft rows Q[t]: distinct per position, no tiny masses
TARGET_LOGITS = torch.tensor(
    [
        [1.0, 0.2, -0.5, 0.7, 0.0, -0.3],
        [-0.4, 0.9, 0.3, -0.1, 0.6, 0.0],
        [0.5, -0.2, 0.8, 0.1, -0.6, 0.3],
        [0.0, 0.4, -0.3, 0.9, 0.2, -0.1],
        [0.3, 0.0, 0.6, -0.4, 0.8, -0.2],
    ],
    dtype=torch.float64,
)
DRAFT_LOGITS = torch.tensor(
    [
        [-0.5, 1.2, 0.4, 0.0, -0.2, 0.6],
        [0.8, -0.3, 0.0, 0.5, -0.7, 0.2],
        [0.1, 0.6, -0.4, 0.9, 0.3, -0.5],
        [0.7, -0.1, 0.2, -0.6, 0.4, 0.5],
        [-0.2, 0.5, 0.1, 0.3, -0.4, 0.9],
    ],
    dtype=torch.float64,
)
SAMPLING_CFGS = {
    "t1": SamplingConfig(temperature=1.0),
    "t0.6-p0.8": SamplingConfig(temperature=0.6, top_p=0.8),
    "t1.7-k4": SamplingConfig(temperature=1.7, top_k=4),
}
DETERMINISTIC_DRAFT = [4, 2, 5]  # a fixed draft (prompt lookup): token 4 may have no target mass


def gof(counts: np.ndarray, expected_p: np.ndarray) -> float:
    """Chi-square goodness of fit on the support; no mass may land outside it."""
    support = expected_p > 0
    assert counts[~support].sum() == 0, f"tokens outside the target's support: {counts}"
    n = counts.sum()
    exp = expected_p[support] * n
    # lump cells expected below 5 (chi-square's usual validity rule) into one
    small = exp < 5
    obs, exp = counts[support][~small], exp[~small]
    if small.any():
        obs = np.append(obs, counts[support][small].sum())
        exp = np.append(exp, (expected_p[support][small] * n).sum())
    return chisquare(obs, exp).pvalue


def draw_draft(k, t, cfg, sampled, gen):
    if not sampled:
        return DETERMINISTIC_DRAFT[:k], None
    q = probs(DRAFT_LOGITS[t : t + k], cfg)
    return torch.multinomial(q, 1, generator=gen).view(-1).tolist(), q


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled-draft", "fixed-draft"])
@pytest.mark.parametrize("cfg_name", list(SAMPLING_CFGS))
@pytest.mark.parametrize("k", [1, 3])
def test_rejection_sampling_first_token(cfg_name, sampled, k):
    cfg = SAMPLING_CFGS[cfg_name]
    gen = torch.Generator().manual_seed(1234 + k)
    counts = np.zeros(V, dtype=np.int64)
    trials = 8000
    for _ in range(trials):
        draft, q = draw_draft(k, 0, cfg, sampled, gen)
        n, tok = verify_sampling(TARGET_LOGITS[: k + 1], draft, q, cfg, gen)
        assert 0 <= n <= k
        counts[draft[0] if n >= 1 else tok] += 1
    p0 = probs(TARGET_LOGITS[0], cfg).numpy()
    assert gof(counts, p0) > 1e-3, (counts / trials, p0)


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled-draft", "fixed-draft"])
@pytest.mark.parametrize("cfg_name", ["t1", "t0.6-p0.8"])
def test_rejection_sampling_first_two_tokens_joint(cfg_name, sampled):
    """Position-dependent target (P[t] at position t, whatever came before): the first two committed
    tokens must be independent with marginals P[0] and P[1]. Rounds of k=2 drafts are verified until
    two tokens are committed, each round starting at the position it reached."""
    cfg = SAMPLING_CFGS[cfg_name]
    gen = torch.Generator().manual_seed(99)
    counts = np.zeros((V, V), dtype=np.int64)
    trials, k = 8000, 2
    accepted_two = 0
    for _ in range(trials):
        out: list[int] = []
        while len(out) < 2:
            t = len(out)
            draft, q = draw_draft(k, t, cfg, sampled, gen)
            n, tok = verify_sampling(TARGET_LOGITS[t : t + k + 1], draft, q, cfg, gen)
            accepted_two += t == 0 and n == 2
            out += draft[:n] + [tok]
        counts[out[0], out[1]] += 1
    p = probs(TARGET_LOGITS, cfg).numpy()
    joint = np.outer(p[0], p[1])
    assert gof(counts.ravel(), joint.ravel()) > 1e-3
    if sampled:
        assert accepted_two > 0  # the second token sometimes came from an accepted draft


def test_rejection_sampling_greedy_is_argmax():
    cfg = SamplingConfig()
    target = TARGET_LOGITS[:4]
    choice = target.argmax(-1).tolist()
    assert verify_sampling(target, choice[:3], None, cfg, None) == (3, choice[3])
    assert verify_sampling(target, [choice[0], (choice[1] + 1) % V, 0], None, cfg, None) == (1, choice[1])
    assert verify_sampling(target[:1], [], None, cfg, None) == (0, choice[0])


def test_rejection_sampling_draft_equal_target_always_accepts():
    cfg = SamplingConfig(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    p = probs(TARGET_LOGITS[:3], cfg)
    for _ in range(500):
        draft = torch.multinomial(p[:2], 1, generator=gen).view(-1).tolist()
        assert verify_sampling(TARGET_LOGITS[:3], draft, p[:2], cfg, gen)[0] == 2


# --- end to end: vanilla SD under sampling follows the target's distribution ----------------------

E2E_SAMPLING = SamplingConfig(temperature=1.0, top_k=5)
E2E_PROMPT = [0] + [3 + b for b in b"Q: 12 apples, 5 eaten. A:"]
E2E_SEEDS = 600


def exact_next(target, prefix_dists: dict[tuple, float]) -> dict[tuple, float]:
    """Extend each prefix (of new tokens after E2E_PROMPT) by one token, exactly."""
    out: dict[tuple, float] = {}
    for prefix, w in prefix_dists.items():
        logits, _ = target.forward(E2E_PROMPT + list(prefix), target.new_cache(), last_only=True)
        p = probs(logits[-1], E2E_SAMPLING)
        for tok in torch.nonzero(p).view(-1).tolist():
            out[prefix + (tok,)] = out.get(prefix + (tok,), 0.0) + w * float(p[tok])
    return out


def lumped_table(a: list[int], b: list[int]) -> np.ndarray:
    """2 x categories table; categories with fewer than 10 observations pooled lumped together."""
    cats = sorted(set(a) | set(b))
    ca = np.array([a.count(c) for c in cats])
    cb = np.array([b.count(c) for c in cats])
    big = (ca + cb) >= 10
    table = np.stack([ca[big], cb[big]], axis=0)
    if (~big).any():
        table = np.concatenate([table, np.array([[ca[~big].sum()], [cb[~big].sum()]])], axis=1)
    return table


@pytest.fixture(scope="module")
def e2e_samples():
    target = tiny_model(init_std=0.1, num_layers=2)
    sd = build("vanilla_sd", target, method_cfg("vanilla_sd"), E2E_SAMPLING, control("fixed", 2))
    ar = build("ar", target, method_cfg("ar"), E2E_SAMPLING)
    sd_out, ar_out, acc = [], [], 0
    for seed in range(E2E_SEEDS):
        g = sd.generate(E2E_PROMPT, 3, frozenset(), seed)
        # one speculative step drafting 1 token (position 1, and position 2 when accepted); after a
        # rejection position 2 comes from a plain target step
        assert g.steps[0].drafted == 1 and len(g.steps) == 2 - g.steps[0].accepted
        acc += g.steps[0].accepted
        sd_out.append(tuple(g.tokens))
        ar_out.append(tuple(ar.generate(E2E_PROMPT, 3, frozenset(), 10**6 + seed).tokens))
    return target, sd_out, ar_out, acc


def test_e2e_sampling_exercises_both_branches(e2e_samples):
    _, _, _, acc = e2e_samples
    assert 0.05 * E2E_SEEDS < acc < 0.95 * E2E_SEEDS  # draft accepted sometimes, rejected sometimes


@pytest.mark.parametrize("pos", [1, 2])
def test_e2e_sampling_matches_ar(e2e_samples, pos):
    """Token at position `pos` (from the speculative step): SD vs AR, chi-square two-sample test."""
    _, sd_out, ar_out, _ = e2e_samples
    table = lumped_table([o[pos] for o in sd_out], [o[pos] for o in ar_out])
    assert table.shape[1] >= 2
    assert chi2_contingency(table).pvalue > 1e-3, table


@pytest.mark.parametrize("pos", [1, 2])
def test_e2e_sampling_matches_exact_target(e2e_samples, pos):
    """The same statistic against the target's exact marginal (top-5 leaves at most 125 paths)."""
    target, sd_out, _, _ = e2e_samples
    assert exact_marginal_pvalue(target, sd_out, pos) > 1e-3


def exact_marginal_pvalue(target, outs: list, pos: int) -> float:
    """Goodness of fit of the tokens at `pos` of sampled outputs (after E2E_PROMPT, E2E_SAMPLING)
    to the target's exact marginal there."""
    dists = {(): 1.0}
    for _ in range(pos + 1):
        dists = exact_next(target, dists)
    marginal: dict[int, float] = {}
    for path, w in dists.items():
        marginal[path[pos]] = marginal.get(path[pos], 0.0) + w
    cats = sorted(marginal)
    seen = [o[pos] for o in outs]
    assert set(seen) <= set(cats)
    counts = np.array([seen.count(c) for c in cats])
    return gof(counts, np.array([marginal[c] for c in cats]))
