"""Self-SD (method=self_sd) and its skip-set search (specbench/train/skipsearch.py)."""

import functools
import json

import pytest
import torch
from helpers import build, control_settings, method_cfg, tiny_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.engine.sampling import SamplingConfig, probs
from specbench.core.errors import SpecBenchError
from specbench.methods.self_sd import heuristic_skip, resolve_skip
from specbench.models import LayerSkip, load_model
from specbench.train.skipsearch import load_result, result_path, save_result, search_control, search_skip_set

EOS = frozenset({1})
NUM_LAYERS = 4
FIXED2, FIXED3 = {"name": "fixed", "k": 2}, {"name": "fixed", "k": 3}
ADAPTIVE = search_control("adaptive", 4, 0.8, 0.9)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny model is ~20x slower with 2 threads on a loaded 2-core machine (oversubscription)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@functools.lru_cache(maxsize=None)
def tiny():
    torch.set_grad_enabled(False)
    return load_model(tiny_settings(num_layers=NUM_LAYERS))


def self_sd(skip: dict, control: dict, sampling: SamplingConfig = SamplingConfig()):
    over = {k: v for k, v in control.items() if k != "name"}
    return build("self_sd", tiny(), method_cfg("self_sd", skip=skip), sampling, control_settings(control["name"], **over))


def ar_tokens(prompt, max_new, seed=0):
    return build("ar", tiny(), method_cfg("ar")).generate(prompt, max_new, EOS, seed).tokens


layer_sets = st.lists(st.integers(0, NUM_LAYERS - 1), max_size=NUM_LAYERS, unique=True)
controls = st.one_of(
    st.integers(1, 6).map(lambda k: {"name": "fixed", "k": k, "k_max": k}),
    st.tuples(st.floats(0.0, 1.0), st.integers(1, 6)).map(lambda g: {"name": "threshold", "gamma": g[0], "k_max": g[1]}),
    st.integers(1, 8).map(lambda k: {"name": "adaptive_threshold", "k_max": k, "alpha": 0.5}),
    st.integers(1, 8).map(lambda k: {"name": "beta_ts", "k_max": k}),
    st.integers(1, 8).map(lambda k: {"name": "cali_ts", "k_max": k}),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(st.integers(3, 258), min_size=1, max_size=24),
    attn=layer_sets,
    mlp=layer_sets,
    control=controls,
    max_new=st.integers(1, 40),
    seed=st.integers(0, 3),
)
def test_greedy_equals_ar(prompt, attn, mlp, control, max_new, seed):
    m = self_sd({"source": "explicit", "attn": attn, "mlp": mlp}, control)
    g = m.generate(prompt, max_new, EOS, seed)
    assert g.tokens == ar_tokens(prompt, max_new, seed)
    # the cache invariant: every layer holds exactly the committed tokens minus the pending one
    assert m.cache.lengths == [len(m.tokens) - 1] * NUM_LAYERS


def test_skipping_nothing_accepts_everything():
    # (with source auto, empty lists mean "no explicit set": the heuristic; explicit + empty = nothing)
    m = self_sd({"source": "explicit", "attn": [], "mlp": []}, {"name": "fixed", "k": 5, "k_max": 5})
    g = m.generate([10, 20, 30, 40], 60, EOS, 0)
    assert m.describe()["skip_attn"] == [] and m.describe()["skip_mlp"] == []
    drafted = sum(s.drafted for s in g.steps)
    assert drafted > 0 and sum(s.accepted for s in g.steps) == drafted
    assert g.tokens == ar_tokens([10, 20, 30, 40], 60)


@pytest.mark.parametrize("attn,mlp", [([1, 2], [3]), ([0, 3], []), ([], [1, 2]), ([0, 1, 2, 3], [0, 1, 2, 3])])
def test_draft_is_the_skipped_model(attn, mlp):
    """Each draft token is the greedy choice of the model with the skip set applied, over the full
    model's cache of the committed tokens (one batched forward from scratch as the reference:
    default positions are right there because every kept layer starts at the committed length)."""
    target = tiny()
    skip = LayerSkip(frozenset(attn), frozenset(mlp))
    m = self_sd({"attn": attn, "mlp": mlp}, {"name": "fixed", "k": 6, "k_max": 6})
    m.gen, m.seed = torch.Generator().manual_seed(0), 0
    m.start([5, 17, 99, 42, 7])
    m.step(10)  # one full round first, so drafting starts from a verified cache
    committed = list(m.tokens)
    prop = m.draft_candidates(6)
    drafts, q = prop.tokens, prop.q
    assert q is None and len(drafts) == 6
    assert m.cache.lengths == [len(committed) - 1] * NUM_LAYERS  # the draft's entries are gone
    for j in range(len(drafts)):
        cache = target.new_cache()
        target.forward(committed[:-1], cache)
        logits, _ = target.forward([committed[-1]] + drafts[:j], cache, skip=skip)
        assert int(logits[-1].argmax()) == drafts[j]


def test_heuristic_skip_set():
    s = heuristic_skip(30)
    assert len(s.attn) == 11 and len(s.mlp) == 7
    assert min(s.attn | s.mlp) >= 30 // 4 and max(s.attn | s.mlp) < 29  # upper 3/4, last layer kept
    assert len(s.attn) > len(s.mlp)
    assert heuristic_skip(1) == LayerSkip()
    skip, info = resolve_skip(tiny(), method_cfg("self_sd", skip={"source": "heuristic"}).skip)
    assert skip == heuristic_skip(NUM_LAYERS) and info["skip_source"] == "heuristic"
    # the default (auto) without lists is the heuristic
    assert resolve_skip(tiny(), method_cfg("self_sd").skip)[0] == heuristic_skip(NUM_LAYERS)


def test_bad_layer_index():
    with pytest.raises(SpecBenchError, match=r"skip.attn layer 4 .*valid indices 0\.\.3"):
        self_sd({"source": "explicit", "attn": [1, 4]}, {"name": "fixed", "k": 3})
    # a negative index is refused by the settings (as the command line's check does), before the method
    with pytest.raises(SpecBenchError, match=r"method.skip.mlp=\[-1\] is not allowed; expected a list of an integer >= 0"):
        self_sd({"mlp": [-1]}, {"name": "fixed", "k": 3})
    with pytest.raises(SpecBenchError, match="unknown skip.source"):
        self_sd({"source": "magic"}, {"name": "fixed", "k": 3})
    with pytest.raises(SpecBenchError, match="only used with skip.source=explicit"):
        self_sd({"source": "heuristic", "attn": [1]}, {"name": "fixed", "k": 3})


def test_missing_search_result(tmp_path):
    with pytest.raises(SpecBenchError, match="python -m specbench.tools.skipsearch"):
        self_sd({"source": "search", "cache_dir": str(tmp_path)}, {"name": "fixed", "k": 3})


def test_search_writes_a_result_the_method_uses(tmp_path):
    target = tiny()
    prompts = [[5, 6, 7, 8], [40, 41, 42]]
    result = search_skip_set(target, prompts, iterations=3, max_new_tokens=12, control=FIXED3, seed=0, sampler="tpe")
    assert result["iterations"] == 3 and len(result["trials"]) == 3
    assert result["objective"] == min(t["value"] for t in result["trials"]) and result["objective"] > 0
    assert result["model_key"] == target.key and [p["tokens"] for p in result["prompts"]] == prompts
    assert result["timestamp"]
    path = save_result(result, result_path(tmp_path, target.key))
    loaded = load_result(path)
    assert loaded["skip"] == result["skip"]
    json.loads(path.read_text())  # plain JSON

    m = self_sd({"source": "search", "cache_dir": str(tmp_path)}, {"name": "adaptive_threshold", "k_max": 5})
    info = m.describe()
    assert info["skip_source"] == "search" and info["skip_file"] == str(path)
    assert (info["skip_attn"], info["skip_mlp"]) == (result["skip"]["attn"], result["skip"]["mlp"])
    assert m.generate([9, 8, 7], 20, EOS, 0).tokens == ar_tokens([9, 8, 7], 20)


def test_interrupted_search_keeps_its_finished_trials(tmp_path, monkeypatch):
    import specbench.train.skipsearch as ss

    real, calls = ss.time_per_token, []

    def timed(*a, **kw):  # call 1: the AR reference; then one per trial
        calls.append(1)
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(ss, "time_per_token", timed)
    progress = ss.progress_path(tmp_path / "skip.json")
    args = dict(iterations=4, max_new_tokens=6, control=ADAPTIVE, seed=0, sampler="tpe", progress_file=progress)
    stop_at = 4  # interrupted in the third trial: two finished
    with pytest.raises(KeyboardInterrupt):
        search_skip_set(tiny(), [[5, 6, 7]], **args)
    calls.clear()
    stop_at = None
    result = search_skip_set(tiny(), [[5, 6, 7]], **args)
    assert len(calls) == 1 + 2 and len(result["trials"]) == 4  # only the two missing trials ran
    calls.clear()
    other = search_skip_set(tiny(), [[5, 6, 8]], **args)  # another setting: its own trials, none mixed in
    assert len(calls) == 1 + 4 and len(other["trials"]) == 4


def test_search_gp_sampler():
    pytest.importorskip("scipy")
    result = search_skip_set(tiny(), [[5, 6, 7]], iterations=3, max_new_tokens=6, control=FIXED2, seed=1, sampler="gp")
    assert len(result["trials"]) == 3 and result["sampler"] == "gp"


def test_first_speculative_token_distribution_matches_ar():
    """Temperature 1, top-k 5: the first token of a speculative step follows the target's
    processed distribution (chi-square goodness of fit), while the draft differs enough from the
    target that both acceptance and rejection happen."""
    from scipy.stats import chisquare

    sampling = SamplingConfig(temperature=1.0, top_k=5)
    target = tiny()
    prompt, pending = [11, 22, 33, 44, 55], 66
    cache = target.new_cache()
    logits, _ = target.forward(prompt + [pending], cache)
    p = probs(logits[-1], sampling)
    support = torch.nonzero(p > 0).flatten().tolist()
    assert len(support) == 5

    m = self_sd({"attn": [1], "mlp": [3]}, {"name": "fixed", "k": 3, "k_max": 3}, sampling)
    n, counts, accepted_first = 1000, {t: 0 for t in support}, 0
    for s in range(n):
        m.gen, m.seed = torch.Generator().manual_seed(s), s
        m.controller.reset(s)
        m.start(prompt)
        m.tokens[-1] = pending  # the pending token is any token the cache has not seen yet
        r = m.step(4)
        counts[r.tokens[0]] += 1
        accepted_first += r.n_accepted > 0
    assert 0.05 * n < accepted_first < 0.95 * n
    expected = [float(p[t]) * n for t in support]
    pvalue = chisquare([counts[t] for t in support], expected).pvalue
    print(f"first-draft acceptance {accepted_first / n:.3f}, chi-square p = {pvalue:.3f}")
    assert pvalue > 1e-3


def test_confirming_keeps_the_set_with_the_best_median_speedup_not_the_luckiest_timing(monkeypatch):
    """The search's minimum of single timings is re-timed against AR: a set whose one search timing
    was lucky loses to one that is faster every time it is re-timed."""
    import specbench.train.skipsearch as ss
    from specbench.models.artifacts import skip_result_summary as search_summary

    result = search_skip_set(tiny(), [[5, 6, 7]], iterations=3, max_new_tokens=6, control=FIXED2, seed=0, sampler="tpe")
    trials = [{"number": 0, "value": 1.0, "attn": [1], "mlp": []},   # lucky: 1.0 in the search, 3.0 re-timed
              {"number": 1, "value": 1.5, "attn": [2], "mlp": [3]},  # 2.0 re-timed
              {"number": 2, "value": 1.5, "attn": [2], "mlp": [3]},  # the same set again: confirmed once
              {"number": 3, "value": 9.0, "attn": [], "mlp": [1]}]
    result |= {"trials": trials, "skip": {"attn": [1], "mlp": []}, "best_trial": 0}
    retimed = {(1,): 3.0, (2,): 2.0, (): 5.0}

    def timing(method, *a, **kw):
        attn = tuple(sorted(method.skip.attn)) if hasattr(method, "skip") else None
        return (4.0 if attn is None else retimed[attn]), {}

    monkeypatch.setattr(ss, "time_per_token", timing)
    out = ss.confirm_best(tiny(), result, top=3, repeats=2)
    assert out["skip"] == {"attn": [2], "mlp": [3]} and out["search_best"]["skip"] == {"attn": [1], "mlp": []}
    assert (out["best_trial"], out["objective"], out["search_best"]["trial"]) == (1, 1.5, 0)
    cands = out["confirm"]["candidates"]
    assert [c["trial"] for c in cands] == [0, 1, 3]  # distinct sets, fastest first
    assert [c["speedups"] for c in cands[:2]] == [[4 / 3, 4 / 3], [2.0, 2.0]] and out["confirm"]["chosen_trial"] == 1
    assert search_summary(out).endswith("x 6 tokens, K=2; best of 3 re-timed 2x: 2.00x AR")
    with pytest.raises(SpecBenchError, match="top >= 1 and repeats >= 1"):
        ss.confirm_best(tiny(), result, top=0, repeats=2)


def test_a_published_skip_set_is_found_checked_and_a_local_search_wins(tmp_path, monkeypatch):
    """issue 44: Self-SD's searched set ships in the package like a trained checkpoint: `skip.source:
    auto` finds it when the cache holds none (first use searches nothing), its bytes must match the
    shipped sha256, and a search of one's own in the cache wins over it."""
    from specbench.config import settings as cfg_settings
    from specbench.models import artifacts
    from specbench.tools.publish import publish_skip_set
    from specbench.train.parts import FIRST_USE
    from specbench.train.session import FIRST_USE as _every  # noqa: F401 (registers self_sd's part)
    from tests.helpers import train_run

    monkeypatch.setattr(artifacts, "PUBLISHED", tmp_path / "published")
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "empty"))
    target = tiny()
    cfg = method_cfg("self_sd").skip
    assert resolve_skip(target, cfg)[1]["skip_source"] == "heuristic"  # nothing searched, nothing shipped
    found = {"format": "x", "skip": {"attn": [2], "mlp": [1, 3]}, "model_key": target.key, "iterations": 7,
             "sampler": "tpe", "prompts": [{"id": "a", "tokens": [1]}], "max_new_tokens": 5, "k": 2,
             "objective": 0.5, "ar_objective": 0.6}
    src = save_result(found, tmp_path / "search.json")
    shipped = publish_skip_set(src, "python -m specbench.tools.skipsearch model=tiny-llama iterations=7")
    record = json.loads(artifacts.manifest_path(shipped).read_text())
    assert shipped == artifacts.published_skip_path(target.key) and record["sha256"] == artifacts.file_sha256(shipped)
    skip, info = resolve_skip(target, cfg)
    assert skip == LayerSkip(frozenset({2}), frozenset({1, 3})) and info["skip_file"] == str(shipped)
    assert info["skip_source"] == "search" and info["trained"].startswith("skip search: 7 trials (tpe)")
    run = train_run({"name": "self_sd", "skip": {"source": "auto", "model": None, "attn": [], "mlp": [],
                                                 "cache_dir": None, "path": None}})
    assert [p.path for p in FIRST_USE["self_sd"](cfg_settings.of(run), target)] == [shipped]
    # a search of one's own wins
    own = save_result(found | {"skip": {"attn": [0], "mlp": []}}, result_path(None, target.key))
    assert resolve_skip(target, cfg)[1]["skip_file"] == str(own)
    own.unlink()
    # altered after publishing: refused, naming the file
    shipped.write_text(shipped.read_text().replace('"attn": [\n   2', '"attn": [\n   0'))
    with pytest.raises(SpecBenchError, match="does not match its shipped sha256"):
        resolve_skip(target, cfg)


def test_the_command_confirms_a_finished_search_without_searching_again(tmp_path, monkeypatch, data_dir):
    import specbench.tools.skipsearch as tool

    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(data_dir))
    out = tmp_path / "skip.json"
    args = ["model=tiny-llama", "iterations=2", "num_prompts=1", "max_new_tokens=4", "k=2", "progress=false", f"out={out}"]
    first = tool.main(args)
    assert "confirm" not in first and load_result(out)["skip"] == first["skip"]

    def no_search(*a, **kw):
        raise AssertionError("searched again")

    real = tool.search_skip_set
    monkeypatch.setattr(tool, "search_skip_set", no_search)
    confirmed = tool.main(args + ["confirm=2", "repeats=1"])
    assert confirmed["confirm"]["top"] == 2 and load_result(out)["confirm"] == confirmed["confirm"]
    assert confirmed["trials"] == first["trials"]
    # more repeats is another confirmation (it reused the one of repeats=1, and saved it as asked)
    again = tool.main(args + ["confirm=2", "repeats=2"])
    assert again["confirm"]["repeats"] == 2 and all(len(c["speedups"]) == 2 for c in again["confirm"]["candidates"])
    monkeypatch.setattr(tool, "search_skip_set", real)
    assert "confirm" not in tool.main([a for a in args if a != "iterations=2"] + ["iterations=3"])  # another setting: searched


def test_each_trial_decodes_with_the_authors_search_draft_exit(monkeypatch):
    """The authors' search times each skip set with their exact_self_speculative_generate defaults: the
    adaptive threshold from 0.8 towards acceptance 0.9, at most 8 drafts, restarted at every prompt.
    specbench timed a fixed K=4 instead, under which every set lost to AR on the embedded model."""
    import specbench.train.skipsearch as ss

    seen = []
    real = ss.time_per_token

    def spy(method, *a, **kw):
        seen.append(getattr(method, "controller", None))
        return real(method, *a, **kw)

    monkeypatch.setattr(ss, "time_per_token", spy)
    control = search_control("adaptive", 8, 0.8, 0.9)
    result = search_skip_set(tiny(), [[5, 6, 7]], iterations=2, max_new_tokens=6, control=control, seed=0, sampler="tpe")
    trials = seen[1:]  # seen[0]: the AR reference
    assert len(trials) == 2 and all(c.name == "adaptive_threshold" for c in trials)
    assert all((c.gamma0, c.alpha, c.k_max, c.reset_per_sequence) == (0.8, 0.9, 8, True) for c in trials)
    assert result["control"] == control and search_control("fixed", 4, 0.8, 0.9) == {"name": "fixed", "k": 4}
    with pytest.raises(SpecBenchError, match="unknown draft_exit 'x'; allowed: adaptive, fixed"):
        search_control("x", 4, 0.8, 0.9)
