"""EAGLE-3: greedy output equals AR (untrained, oracle, reduced vocabulary), tree rejection
sampling follows the target, the training-time test shows the draft at step j exactly what
decoding shows it at depth j, d2t/t2d round-trip, training lowers the loss and reloads, and the
authors' / SpecForge's released format loads (bad ones: one line)."""

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from specbench.engine.sampling import SamplingConfig
from specbench.core.errors import SpecBenchError
from specbench.methods.eagle3_head import Eagle3Head, check_maps, tap_layers, vocab_maps
from specbench.train.eagle3 import draft_vocabulary, eagle3_loss, train_eagle3, ttt_mask, ttt_unroll
from specbench.train.trainers import TRAINERS
from tests.helpers import ar_tokens, build, method_cfg, tiny_model, write_released
from tests.test_eagle import oracle, target_topk
from tests.test_medusa import E2E_SAMPLING, check_sampling_matches_target, tiny_sequences, train_cfg

TARGETS = [{}, {"init_std": 0.1, "num_layers": 2}]
prompts = st.one_of(st.lists(st.integers(0, 258), min_size=1, max_size=12),
                    st.lists(st.sampled_from([40, 41, 42]), min_size=1, max_size=12))


def eagle3(target, top_k=4, depth=4, num_nodes=15, sampling=SamplingConfig(), **kw):
    torch.manual_seed(0)
    cfg = method_cfg("eagle3", allow_untrained=True, top_k=top_k, depth=depth, num_nodes=num_nodes, **kw)
    return build("eagle3", target, cfg, sampling=sampling)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(target_i=st.integers(0, 1), prompt=prompts, shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 12)),
       vocab=st.sampled_from([None, 16, 300]), use_oracle=st.booleans(), max_new=st.integers(1, 24))
def test_greedy_equals_ar(target_i, prompt, shape, vocab, use_oracle, max_new):
    target = tiny_model(**TARGETS[target_i])
    m = eagle3(target, *shape, draft_vocab_size=vocab)
    if use_oracle:
        oracle(m, prompt + ar_tokens(target, prompt, max_new), seed=len(prompt))
    assert m.generate(prompt, max_new, frozenset(), 0).tokens == ar_tokens(target, prompt, max_new)


def test_reduced_vocabulary_drafts_only_its_tokens():
    target = tiny_model()
    m = eagle3(target, top_k=3, draft_vocab_size=16)
    m.start([5, 6, 7])
    tree, nodes = m.draft_tree()
    allowed = set(m.head.target_ids().tolist())
    assert len(allowed) == 16 and set(nodes[1:]) <= allowed and len(nodes) > 1


def test_tree_rejection_sampling_is_lossless_end_to_end():
    target = tiny_model(init_std=0.1, num_layers=2)
    m = target_topk(eagle3(target, top_k=3, depth=2, num_nodes=8, sampling=E2E_SAMPLING, draft_vocab_size=64), target)
    assert check_sampling_matches_target(m, target) > 300


def test_layers_default_and_override():
    assert tap_layers(30) == [2, 15, 27] and tap_layers(32) == [2, 16, 29]  # the authors' 2, N//2, N-3
    assert tap_layers(4) == [1, 2, 3]
    with pytest.raises(SpecBenchError, match=r"method.layers=\[1, 2\] is not allowed"):
        tap_layers(4, [1, 2])
    with pytest.raises(SpecBenchError, match="three layer indices in"):
        build("eagle3", tiny_model(), method_cfg("eagle3", allow_untrained=True, layers=[0, 1, 9]))
    m = eagle3(tiny_model(), layers=[0, 0, 3])
    assert m.head.layers == [0, 0, 3] and m.generate([5, 6], 10, frozenset(), 0).tokens == ar_tokens(tiny_model(), [5, 6], 10)


def test_tapped_features_are_layer_inputs():
    target = tiny_model()
    ids = torch.tensor([[3, 9, 27, 81]])
    out = target.model(ids, output_hidden_states=True)  # transformers' own: hidden_states[i] = input of layer i
    _, taps = target.run_layers_tapped(target.embed(ids), None, [3, 1, 2])
    want = torch.cat([out.hidden_states[i] for i in (3, 1, 2)], -1)
    torch.testing.assert_close(taps, want, rtol=0, atol=1e-12)


def test_vocab_maps_round_trip():
    ids = torch.tensor([2, 5, 6, 40, 258])
    d2t, t2d = vocab_maps(ids[[3, 0, 4, 1, 2]], 259)  # any order in, sorted out
    assert (torch.arange(5) + d2t).tolist() == ids.tolist() and d2t.tolist() == [2, 4, 4, 37, 254]
    assert t2d.nonzero().flatten().tolist() == ids.tolist() and t2d.dtype == torch.bool
    check_maps(d2t, t2d, "x")
    with pytest.raises(SpecBenchError, match="t2d does not mark"):
        check_maps(d2t, t2d.roll(1), "x")
    with pytest.raises(SpecBenchError, match="not in increasing order"):
        check_maps(torch.tensor([5, 0]), t2d, "x")


def test_draft_vocabulary_is_the_most_frequent_loss_tokens():
    target = tiny_model()
    seqs = [([1, 2, 9, 9], 2), ([7, 7, 7, 9, 8], 3)]  # loss tokens: 9 9 | 9 8; 7 is prompt only
    eos = sorted(target.tokenizer.eos_ids)
    assert draft_vocabulary(target, seqs, 2 + len(eos)).tolist() == sorted(eos + [8, 9])


def test_ttt_mask_layout():
    m = ttt_mask(3, 2)
    assert ttt_mask(3, 0) is None and m.shape == (3, 9)
    assert m[:, :3].tolist() == torch.ones(3, 3, dtype=torch.bool).tril().tolist()
    assert m[:, 3:6].tolist() == m[:, 6:].tolist() == torch.eye(3, dtype=torch.bool).tolist()


def test_training_unroll_equals_decoding_by_depth():
    """INVARIANT: at training step j, row t, the draft reads the same feature and token at the same
    position, over the same attended entries, as decoding does at depth j below the committed
    pair t (the accepted path). Checked on every tree node that lies on the final output's path:
    inputs, positions and outputs (the output differs if the attended entries differ)."""
    target = tiny_model()
    prompt = [0, 17, 99, 42, 7]
    depth = 3
    full = ar_tokens(target, prompt, 30)
    m = oracle(eagle3(target, top_k=2, depth=depth, num_nodes=6), prompt + full)
    calls = []
    real = m.head.forward

    def spy(features, tokens, cache, positions=None, tree_mask=None):
        out = real(features, tokens, cache, positions=positions, tree_mask=tree_mask)
        calls.append((features.detach().clone(), list(tokens), None if positions is None else positions.tolist(),
                      out.detach().clone(), cache.length()))
        return out

    m.head.forward = spy
    out = m.generate(prompt, 30, frozenset(), 0).tokens
    del m.head.forward  # the unroll below must not be recorded as decoding
    seq = torch.tensor([prompt + out])
    steps = {}
    with torch.no_grad():
        _, taps = target.run_layers_tapped(target.embed(seq), None, m.head.layers)
        ttt_unroll(m.head, taps[:, :-1], seq, depth + 1, 0,
                   record=lambda j, h, tk, pos, o: steps.__setitem__(j, (h[0], tk[0].tolist(), pos.tolist(), o[0])))
    checked, roots = 0, 0
    for feats, toks, pos, got, length in calls:
        if pos is None:  # catch-up of committed pairs: step 0 rows, and the last is the tree's root
            n = len(toks)
            torch.testing.assert_close(got[0], steps[0][3][length - n: length], rtol=0, atol=1e-9)
            roots += 1
            continue
        for i, p in enumerate(pos):
            for d in range(1, depth + 1):
                t = p - d  # the committed pair this depth-d node extends: base - 1
                if t < 0 or t >= len(steps[d][1]) or toks[i] != steps[d][1][t]:
                    continue
                if torch.allclose(feats[0, i], steps[d][0][t], rtol=0, atol=1e-9):
                    assert p == steps[d][2][t] == t + d
                    torch.testing.assert_close(got[0, i], steps[d][3][t], rtol=0, atol=1e-9)
                    checked += 1
    assert roots >= 5 and checked >= 10


def test_train_lowers_loss_and_reload_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    target = tiny_model()
    assert TRAINERS["eagle3"] is train_eagle3
    mcfg = {"name": "eagle3", "top_k": 3, "depth": 3, "num_nodes": 8, "draft_vocab_size": 48, "ttt_steps": 3, "layers": "auto"}
    res = train_eagle3(target, train_cfg(mcfg, labels="target", epochs=8), tiny_sequences())
    assert res["held_out_loss"][1] < res["held_out_loss"][0]
    assert res["held_out_agreement"][1] > res["held_out_agreement"][0]
    a, b = build("eagle3", target, method_cfg(**mcfg)), build("eagle3", target, method_cfg(**mcfg))
    assert a.info["head_trained"] and a.head.draft_vocab_size == 48
    for (ka, x), (kb, y) in zip(a.head.state_dict().items(), b.head.state_dict().items()):
        assert ka == kb and torch.equal(x, y)
    seen = {t for s, st_ in tiny_sequences() for t in s[st_:]}
    assert seen <= set(a.head.target_ids().tolist())  # every training token is in the draft vocabulary
    prompt = tiny_sequences(1, seed=5)[0][0][:10]
    g = a.generate(prompt, 24, frozenset(), 0)
    assert g.tokens == ar_tokens(target, prompt, 24)


def test_loss_is_soft_cross_entropy_over_the_draft_vocabulary():
    """One step, a draft whose logits over its vocabulary equal the target's there: the loss is the
    entropy of the target's renormalised distribution (over kept positions), and labels outside
    the draft vocabulary are not counted in the loss."""
    target = tiny_model()
    ids = torch.tensor([[5, 9, 17, 33, 2, 40, 41]])
    labels = ids.clone()
    labels[0, :2] = -100
    vocab = torch.tensor(sorted({9, 17, 33, 40, 41} | set(range(60, 70))))
    head = Eagle3Head(target, [1, 2, 3], vocab)
    with torch.no_grad():
        full = target.model(ids).logits[0].double()
    sub = full[:, vocab]
    head.draft_logits = lambda out: out[..., : len(vocab)]
    head.forward = lambda h, toks, cache, positions=None, tree_mask=None: sub[1:].unsqueeze(0)
    loss, (right, counted) = eagle3_loss(target, head, ids, labels, steps=1)
    keep = torch.tensor([bool(labels[0, t + 1] != -100 and int(labels[0, t + 1]) in vocab.tolist()) for t in range(6)])
    logp = torch.log_softmax(sub[1:], -1)
    want = -(logp.exp() * logp).sum(-1)[keep].mean()
    assert float(loss) == pytest.approx(float(want), rel=1e-5) and counted == 5


def released(tmp_path, target, fmt="safetensors", dv=32, with_embed=False, **edits):
    """A synthetic EAGLE-3 draft in the authors' layout: config.json + fc/midlayer/norm/lm_head/d2t/t2d."""
    torch.manual_seed(1)
    vocab = torch.randperm(target.vocab_size)[:dv]
    state = Eagle3Head(target, tap_layers(target.num_layers), vocab).state_dict()
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": target.hidden_size, "num_hidden_layers": 1,
           "vocab_size": target.vocab_size, "draft_vocab_size": dv, "num_attention_heads": target.config.num_attention_heads}
    embed = target.embed_tokens.weight if with_embed else None  # SpecForge keeps the embedding in its state
    return write_released(tmp_path, state, cfg, fmt, embed=embed, **edits)


@pytest.mark.parametrize("fmt, with_embed", [("safetensors", False), ("bin", False), ("safetensors", True)])
def test_released_format_loads_and_decodes_losslessly(tmp_path, fmt, with_embed):
    target = tiny_model()
    state = released(tmp_path, target, fmt, with_embed=with_embed)
    m = build("eagle3", target, method_cfg("eagle3", checkpoint=str(tmp_path), top_k=3))
    assert m.info["head_trained"] and m.info["format"] == "released" and m.head.draft_vocab_size == 32
    got = m.head.state_dict()
    assert set(got) == set(state) - {"embed_tokens.weight"} and all(torch.equal(got[k], state[k]) for k in got)
    assert m.generate([5, 6, 7], 16, frozenset(), 0).tokens == ar_tokens(target, [5, 6, 7], 16)


def test_released_aux_layer_ids_are_read(tmp_path):
    target = tiny_model()
    released(tmp_path, target, conf={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}})
    assert build("eagle3", target, method_cfg("eagle3", checkpoint=str(tmp_path))).head.layers == [0, 2, 3]


@pytest.mark.parametrize("change, msg", [
    (dict(drop="d2t"), r"missing key 'd2t'"),
    (dict(drop="fc.weight"), r"missing key 'fc.weight'"),
    (dict(rename=("midlayer.hidden_norm.weight", "layers.0.hidden_norm.weight")), "unexpected key"),
    (dict(conf={"draft_vocab_size": 31}), r"has shape \[32.*\], the model needs \[31"),
    (dict(conf={"draft_vocab_size": 10**9}), r"draft_vocab_size=1000000000, need an integer in \[1, 259\]"),
    (dict(conf={"vocab_size": 32000}), "vocab_size=32000, need 259"),
    (dict(conf={"hidden_size": 32}), "hidden_size=32"),
    (dict(conf={"num_hidden_layers": 2}), "num_hidden_layers=2"),
    (dict(state_fix=lambda s: s.__setitem__("t2d", s["t2d"].roll(1))), "t2d does not mark"),
    (dict(state_fix=lambda s: s.__setitem__("d2t", s["d2t"] + 10**6)), "d2t maps draft ids outside"),
    (dict(state_fix=lambda s: s.__setitem__("fc.weight", s["fc.weight"][:, :64].contiguous())), r"'fc.weight' has shape"),
    (dict(with_embed=True, state_fix=lambda s: s.__setitem__("embed_tokens.weight", s["embed_tokens.weight"][:9].contiguous())),
     "embed_tokens.weight has shape"),
])
def test_released_format_errors_are_one_line(tmp_path, change, msg):
    target = tiny_model()
    released(tmp_path, target, **change)
    with pytest.raises(SpecBenchError, match=msg) as e:
        build("eagle3", target, method_cfg("eagle3", checkpoint=str(tmp_path)))
    assert "\n" not in str(e.value)


def test_pickle_in_bin_is_refused(tmp_path):
    import pickle

    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 1, "draft_vocab_size": 8}))
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps({"fc.weight": object()}))
    with pytest.raises(SpecBenchError, match="cannot read") as e:
        build("eagle3", tiny_model(), method_cfg("eagle3", checkpoint=str(tmp_path)))
    assert "\n" not in str(e.value)


def test_missing_draft_error_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(SpecBenchError, match="python -m specbench.train method=eagle3"):
        build("eagle3", tiny_model(), method_cfg("eagle3"))


def test_top_k_beyond_the_draft_vocabulary():
    with pytest.raises(SpecBenchError, match="top_k=5 exceeds the draft vocabulary"):
        eagle3(tiny_model(), top_k=5, draft_vocab_size=4)
