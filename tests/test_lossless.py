"""Greedy speculative decoding must reproduce AR token for token (vanilla SD, PLD, every controller).

The tiny targets (float64, so batched and one-token forwards never flip an argmax):
- "std0.3": conf/model/tiny-llama.yaml (4 layers); a truncated draft rarely agrees with it;
- "std0.1-4L" / "std0.1-2L": a smaller init, whose outputs repeat themselves: partial agreement
  with a truncated draft and many prompt-lookup hits;
- draft "same": the draft is the target itself (own cache), so every draft token is accepted and
  every round ends with the bonus token.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import ar_tokens, build, control, method_cfg, tiny_model
from specbench.engine.sampling import SamplingConfig

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
    for drafted, accepted, kept in g.steps:
        assert 0 <= kept <= accepted <= drafted <= k_max
    # every step commits at least one token; the prefill commits the first
    assert len(g.steps) <= len(g.tokens) - 1
    return g


def accepted(g) -> int:
    return sum(s[2] for s in g.steps)


# --- hypothesis: random prompts, K, seeds, lengths ------------------------------------------------

vanilla_setups = st.one_of(
    st.tuples(st.sampled_from(["std0.3", "std0.1-4L"]), st.sampled_from([1, 2, 3, "same"])),
    st.tuples(st.just("std0.1-2L"), st.sampled_from([1, "same"])),
)


@settings(max_examples=60, **SETTINGS)
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


@settings(max_examples=60, **SETTINGS)
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
        st.floats(0.0, 1.0),
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


@settings(max_examples=60, **SETTINGS)
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
        total_drafted += sum(s[0] for s in g.steps)
        if expect == "all":
            # every draft accepted: rounds of k drafts + 1 bonus token (the last one may be cut short)
            assert all(s[0] == s[1] for s in g.steps)
            assert all(s[0] == k for s in g.steps[:-1])
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


def test_hf_assisted_greedy_equals_ar():
    target = tiny_model(init_std=0.1)
    for mode in ("assistant", "prompt_lookup"):
        m = build("hf_assisted", target, method_cfg("hf_assisted", mode=mode, k=4))
        for i, prompt in enumerate(FIXED_PROMPTS[:2]):
            assert m.generate(prompt, 20, frozenset(), i).tokens == ar_tokens(target, prompt, 20)


def test_sampling_same_draft_accepts_everything():
    """Under sampling a draft identical to the target (q == p) is never rejected."""
    target, m = vanilla("std0.1-2L", "same", control("fixed", 4))
    m.sampling = SamplingConfig(temperature=0.8, top_p=0.9, top_k=20)
    for seed in range(3):
        g = m.generate(FIXED_PROMPTS[0], 25, frozenset(), seed)
        assert len(g.tokens) == 25
        assert all(d == a for d, a, _ in g.steps)
