"""EAGLE-2: greedy output equals AR (untrained, trained and oracle drafts), sampling follows the
target, training lowers the loss, the head sees at decode time the pairs it was trained on, a
checkpoint reloads identically, and the authors' released format loads (bad ones: one line)."""

import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from specbench.engine.sampling import SamplingConfig
from specbench.core.errors import SpecBenchError
from specbench.methods.eagle_head import EagleHead, training_pairs
from specbench.train.eagle import eagle_loss, soft_cross_entropy, train_eagle
from specbench.train.trainers import TRAINERS
from tests.helpers import ar_tokens, build, method_cfg, tiny_model, write_released
from tests.test_medusa import E2E_SAMPLING, check_sampling_matches_target, tiny_sequences, train_cfg

TARGETS = [{}, {"init_std": 0.1}, {"init_std": 0.1, "num_layers": 2}]
prompts = st.one_of(st.lists(st.integers(0, 258), min_size=1, max_size=16),
                    st.lists(st.sampled_from([40, 41, 42]), min_size=1, max_size=16))
shapes = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 20))  # top_k, depth, num_nodes (schema: each >= 1)


def eagle(target, top_k=4, depth=4, num_nodes=15, sampling=SamplingConfig(), **kw):
    cfg = method_cfg("eagle", allow_untrained=True, top_k=top_k, depth=depth, num_nodes=num_nodes, **kw)
    return build("eagle", target, cfg, sampling=sampling)


def oracle(m, ref, seed=0, miss=0.15, second=0.4):
    """Make the draft know AR's future: below a node on AR's path, the right child gets a high
    score at rank 0 (or rank 1, behind a wrong one), sometimes none. The head still runs (its
    cache, masks and features are exercised); only the proposed tokens and scores change."""
    rng = random.Random(seed)
    real = m.children

    def children(tree, parents, logits, parent_scores, top_k):
        scores, tokens = (x.clone() for x in real(tree, parents, logits, parent_scores, top_k))
        for i, p in enumerate(parents.tolist()):
            chain = chain_tokens(tree, p)
            j = len(m.tokens) + len(chain)  # index in ref of these children's token
            on_path = ref[len(m.tokens): j] == chain and j < len(ref)
            if not on_path or rng.random() < miss:
                continue
            good = ref[j]
            r = 1 if top_k > 1 and rng.random() < second else 0
            others = [x for x in range(50, 60) if x != good]
            top = 0.0 if p < 0 else float(tree.scores[p])
            for c in range(top_k):
                tokens[i, c] = good if c == r else others[c]
                # a wrong rank-0 sibling outscores the right rank-1 one
                scores[i, c] = top + (math.log(0.3) if c == r else math.log(0.6) if c < r else math.log(0.02) - c)
        return scores, tokens

    m.children = children
    return m


def chain_tokens(tree, p):
    """The tokens from the root's child down to candidate p of a GrownTree (p = -1: none)."""
    parents, tokens, chain = tree.parents.tolist(), tree.tokens.tolist(), []
    while p >= 0:
        chain.append(tokens[p])
        p = parents[p]
    return chain[::-1]


def target_topk(m, target):
    """Children = the target's own top-k tokens at the node (exact forward over the node's
    prefix): still a deterministic function of the context, as EAGLE-2's draft is, and accepted
    often, through first and later children and at depth."""
    real = m.children

    def children(tree, parents, logits, parent_scores, top_k):
        scores, tokens = real(tree, parents, logits, parent_scores, top_k)
        tokens = tokens.clone()
        for i, p in enumerate(parents.tolist()):
            logits, _ = target.forward(m.tokens + chain_tokens(tree, p), target.new_cache(), last_only=True)
            tokens[i] = torch.topk(logits[-1], top_k).indices
        return scores, tokens

    m.children = children
    return m


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(target_i=st.integers(0, 2), prompt=prompts, shape=shapes, max_new=st.integers(1, 30),
       use_oracle=st.booleans(), eos_at=st.one_of(st.none(), st.integers(0, 29)))
def test_greedy_equals_ar(target_i, prompt, shape, max_new, use_oracle, eos_at):
    target = tiny_model(**TARGETS[target_i])
    full = ar_tokens(target, prompt, max_new)
    eos, want = frozenset(), full
    if eos_at is not None and eos_at < len(full):
        eos = frozenset({full[eos_at]})
        want = full[: full.index(full[eos_at]) + 1]
    m = eagle(target, *shape)
    if use_oracle:
        oracle(m, prompt + full, seed=len(prompt))
    g = m.generate(prompt, max_new, eos, 0)
    assert g.tokens == want
    for drafted, acc, kept in ((s.drafted, s.accepted, s.kept) for s in g.steps):
        assert 0 <= kept <= acc <= drafted <= shape[1] + 1


def test_oracle_accepts_deep_paths_through_second_ranks():
    target = tiny_model()
    prompt = [0, 17, 99, 42]
    full = ar_tokens(target, prompt, 40)
    m = oracle(eagle(target, top_k=3, depth=4, num_nodes=12), prompt + full)
    g = m.generate(prompt, 40, frozenset(), 0)
    assert g.tokens == full
    assert max(s.accepted for s in g.steps) >= 4 and sum(s.accepted for s in g.steps) >= 20


def test_tree_rejection_sampling_is_lossless_end_to_end():
    target = tiny_model(init_std=0.1, num_layers=2)
    m = target_topk(eagle(target, top_k=3, depth=2, num_nodes=8, sampling=E2E_SAMPLING), target)
    acc = check_sampling_matches_target(m, target)
    assert acc > 300  # draft tokens were accepted often enough to matter


def test_sampling_is_seeded():
    m = eagle(tiny_model(), sampling=SamplingConfig(temperature=0.8))
    a = m.generate([5, 6], 12, frozenset(), 3).tokens
    assert a == m.generate([5, 6], 12, frozenset(), 3).tokens and len(a) == 12


def test_decode_time_pairs_equal_training_pairs():
    """Every committed (feature, token) pair the head reads while decoding is the pair
    `training_pairs` builds from the final sequence at the same position."""
    target = tiny_model()
    prompt = [0, 17, 99, 42, 7]
    full = ar_tokens(target, prompt, 30)
    m = oracle(eagle(target, top_k=2, depth=3, num_nodes=6), prompt + full)
    m.record_pairs = True
    out = m.generate(prompt, 30, frozenset(), 0).tokens
    seq = torch.tensor([prompt + out])
    feats, toks, _ = training_pairs(target, seq)
    covered = 0
    for start, f, tk in m.fed:
        n = len(tk)
        assert start == covered  # contiguous: no committed pair skipped or fed twice
        assert tk == toks[0, start: start + n].tolist()
        torch.testing.assert_close(f, feats[0, start: start + n], rtol=0, atol=1e-10)
        covered = start + n
    assert covered > len(prompt) + len(out) // 2 and max(len(tk) for _, _, tk in m.fed[1:]) >= 3  # multi-token steps


def test_train_lowers_loss_and_reload_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    target = tiny_model()
    assert TRAINERS["eagle"] is train_eagle
    mcfg = {"name": "eagle", "top_k": 3, "depth": 3, "num_nodes": 8}
    res = train_eagle(target, train_cfg(mcfg), tiny_sequences())
    assert res["held_out_loss"][1] < res["held_out_loss"][0]
    a, b = build("eagle", target, method_cfg(**mcfg)), build("eagle", target, method_cfg(**mcfg))
    assert a.info["head_trained"]
    for (ka, x), (kb, y) in zip(a.head.state_dict().items(), b.head.state_dict().items()):
        assert ka == kb and torch.equal(x, y)
    prompt = tiny_sequences(1, seed=5)[0][0][:10]
    ga = a.generate(prompt, 20, frozenset(), 0)
    assert ga.tokens == b.generate(prompt, 20, frozenset(), 0).tokens == ar_tokens(target, prompt, 20)


def test_soft_cross_entropy_by_hand():
    q = torch.log(torch.tensor([[1.0, 2.0, 1.0]]))  # softmax: 0.25, 0.5, 0.25
    p = torch.tensor([[0.5, 0.5, 0.0]])
    assert float(soft_cross_entropy(q, p)) == pytest.approx(-(0.5 * math.log(0.25) + 0.5 * math.log(0.5)))


@torch.no_grad()
def test_eagle_loss_classification_term_is_soft_by_default(monkeypatch):
    """A head that predicts the target's next feature exactly: L_reg = 0 and the soft L_cls is
    H(p, p) = the entropy of the target's next-token distribution (from the model's own forward),
    averaged over the loss region; the hard option gives -log p(label) instead."""
    target = tiny_model()
    head = EagleHead(target)
    monkeypatch.setattr(head, "forward", lambda feats, toks, cache: training_pairs(target, ids)[2])
    ids = torch.tensor([[5, 9, 17, 33, 2, 40, 41]])
    labels = ids.clone()
    labels[0, :3] = -100  # the prompt: outside the loss region
    logp = torch.log_softmax(target.model(ids).logits[0, 1:].double(), -1)  # p at positions 1.., an independent path
    keep = labels[0, 1:] != -100
    entropy = -(logp.exp() * logp).sum(-1)[keep].mean()
    loss, (right, counted) = eagle_loss(target, head, ids, labels, w_reg=1.0, w_cls=0.1)
    assert float(loss) == pytest.approx(0.1 * float(entropy), rel=1e-6) and counted == int(keep.sum())
    hard, _ = eagle_loss(target, head, ids, labels, w_reg=1.0, w_cls=0.1, cls_labels="hard")
    nll = -logp[keep].gather(-1, labels[0, 1:][keep].unsqueeze(-1)).mean()
    assert float(hard) == pytest.approx(0.1 * float(nll), rel=1e-6) and float(hard) != pytest.approx(float(loss))


def test_missing_head_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))
    with pytest.raises(SpecBenchError, match="python -m specbench.train method=eagle"):
        build("eagle", tiny_model(), method_cfg("eagle"))


def released(tmp_path, target, fmt="safetensors", with_embed=True, **edits):
    """A synthetic head in the authors' layout: config.json + weights named fc.*, layers.0.*."""
    torch.manual_seed(1)
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": target.hidden_size, "num_hidden_layers": 1,
           "num_attention_heads": target.config.num_attention_heads, "vocab_size": target.vocab_size, "bias": True}
    embed = target.embed_tokens.weight if with_embed else None
    return write_released(tmp_path, EagleHead(target).state_dict(), cfg, fmt, embed=embed, **edits)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_released_format_loads(tmp_path, fmt):
    target = tiny_model()
    state = released(tmp_path, target, fmt)
    m = build("eagle", target, method_cfg("eagle", checkpoint=str(tmp_path)))
    assert m.info["head_trained"] and m.info["format"] == "released"
    got = m.head.state_dict()
    assert set(got) == set(state) - {"embed_tokens.weight"}
    assert all(torch.equal(got[k], state[k]) for k in got)
    assert m.generate([5, 6, 7], 12, frozenset(), 0).tokens == ar_tokens(target, [5, 6, 7], 12)


@pytest.mark.parametrize("change, msg", [
    (dict(drop="fc.weight"), r"missing key 'fc.weight'"),
    (dict(rename=("layers.0.mlp.up_proj.weight", "layers.1.mlp.up_proj.weight")), "unexpected"),
    (dict(conf={"num_hidden_layers": 2}), "num_hidden_layers=2"),
    (dict(conf={"hidden_size": 32}), "hidden_size=32"),
])
def test_released_format_errors_are_one_line(tmp_path, change, msg):
    target = tiny_model()
    released(tmp_path, target, **change)
    with pytest.raises(SpecBenchError, match=msg) as e:
        build("eagle", target, method_cfg("eagle", checkpoint=str(tmp_path)))
    assert "\n" not in str(e.value)


def test_released_shape_mismatch(tmp_path):
    target = tiny_model()
    released(tmp_path, tiny_model(intermediate_size=96))  # same d, another MLP width
    with pytest.raises(SpecBenchError, match="has shape .*, the model needs") as e:
        build("eagle", target, method_cfg("eagle", checkpoint=str(tmp_path)))
    assert "\n" not in str(e.value)


def test_bad_tree_settings():
    with pytest.raises(SpecBenchError, match="method.num_nodes=0 is not allowed; expected an integer >= 1"):
        eagle(tiny_model(), num_nodes=0)


def test_tree_node_features_equal_their_own_chain():
    """A node's predicted feature (from the batched, tree-masked head call) equals the head run
    alone over the committed pairs and that node's own chain: siblings and cousins in the
    head's cache are invisible to it."""
    from specbench.engine.cache import KVCache

    target = tiny_model()
    m = eagle(target, top_k=3, depth=3, num_nodes=10)
    m.start([0, 17, 99, 42, 7])
    feats0, toks0 = m.backlog
    outs, seen = [], []
    real_step, real_children = m.tree_step, m.children

    def tree_step(*args):
        logits, out = real_step(*args)
        outs.append(out.clone())
        return logits, out

    def children(tree, parents, logits, parent_scores, top_k):  # called right after tree_step, same rows
        if parents.min() >= 0:
            seen.extend((p, outs[-1][i], chain_tokens(tree, p)) for i, p in enumerate(parents.tolist()))
        return real_children(tree, parents, logits, parent_scores, top_k)

    m.tree_step, m.children = tree_step, children
    m.draft_tree()
    assert len(seen) == 9  # three frontiers of three
    for _, feat, chain in seen:
        cache = KVCache(1)
        f = m.head(feats0.unsqueeze(0), toks0, cache)[0, -1]
        for tok in chain:
            f = m.head(f.view(1, 1, -1), [tok], cache)[0, -1]
        torch.testing.assert_close(feat, f, rtol=0, atol=1e-9)


def test_the_task_confidence_scorer_aligns_each_guess_with_the_choice_it_drafts():
    """bench/task_confidence.py: a guess that is the target's own next choice accepts at every drafted answer
    position (one per answer token after the first), a guess one position early does not, and a real head's
    guesses are scored at the same positions; reweighting a task to its own bin shares changes nothing."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("task_confidence", Path(__file__).parents[1] / "bench/task_confidence.py")
    tc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tc)
    target = tiny_model()
    oracle = lambda t, head, ids, h: t.lm_head(h[:, 1:]).argmax(-1)[0]  # noqa: E731 - row t: the choice at t+1
    early = lambda t, head, ids, h: t.lm_head(h[:, :-1]).argmax(-1)[0]  # noqa: E731 - row t: the choice at t
    from specbench.methods.eagle3_head import Eagle3Head, tap_layers
    e3 = Eagle3Head(target, tap_layers(target.num_layers), torch.arange(target.vocab_size))
    drafts = {"oracle": (oracle, None), "early": (early, None), "eagle": (tc.guess_eagle, EagleHead(target)),
              "eagle3": (tc.guess_eagle3, e3)}
    prompt, new = [0, 5, 6, 7, 8], ar_tokens(target, [0, 5, 6, 7, 8], 12)
    with torch.no_grad():
        conf, right, pos = tc.score_sample(target, drafts, prompt, new)
    assert len(conf) == len(new) - 1 and all(0 < c <= 1 for c in conf)
    assert pos == list(range(len(prompt) + 1, len(prompt) + len(new)))  # answer tokens 2..n
    assert right["oracle"] == [True] * (len(new) - 1)
    assert not all(right["early"])
    assert len(right["eagle"]) == len(right["eagle3"]) == len(new) - 1
    bins = tc.bins_of(conf, right["early"])
    assert sum(b["n"] for b in bins) == len(conf)
    assert tc.reweighted(bins, bins) == pytest.approx(sum(right["early"]) / len(conf))
