"""Engine: KVCache semantics, the model adapter against the HF model, PhaseTimer nesting."""

import time

import pytest
import torch

from helpers import tiny_model
from specbench.engine.cache import KVCache
from specbench.engine.timer import PhaseTimer
from specbench.models import LayerSkip
from specbench.models.adapter import cache_kwarg


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def kv(n, start=0, heads=2, dim=3):
    """[1, heads, n, dim] keys whose entries encode their position (start, start+1, ...)."""
    pos = torch.arange(start, start + n, dtype=torch.float64).view(1, 1, n, 1)
    return pos.expand(1, heads, n, dim).clone(), -pos.expand(1, heads, n, dim).clone()


def positions_in(t):
    return t[0, 0, :, 0].tolist()


# --- KVCache --------------------------------------------------------------------------------


def test_cache_update_returns_history():
    c = KVCache(2)
    assert c.num_layers == 2 and c.length(0) == c.length(1) == 0
    k, v = c.update(*kv(3), 0)
    assert positions_in(k) == [0, 1, 2] and positions_in(v) == [0, -1, -2]
    k, v = c.update(*kv(2, start=3), 0)
    assert positions_in(k) == [0, 1, 2, 3, 4] and positions_in(v) == [0, -1, -2, -3, -4]
    assert k.shape == (1, 2, 5, 3)
    assert c.length(0) == 5 and c.get_seq_length(0) == 5
    assert c.length(1) == 0  # per-layer lengths


def test_cache_grows_past_capacity():
    c = KVCache(1)
    total = 0
    for n in (1, 60, 3, 10, 100, 1, 200):  # crosses the initial 64 and several doublings
        k, v = c.update(*kv(n, start=total), 0)
        total += n
        assert positions_in(k) == list(range(total))
        assert positions_in(v) == [-float(i) for i in range(total)]
    assert c.length() == total
    assert c.keys[0].shape[-2] >= total


def test_cache_crop_per_layer():
    c = KVCache(3)
    c.update(*kv(10), 0)
    c.update(*kv(10), 1)
    c.update(*kv(4), 2)
    c.crop(6)
    assert c.lengths == [6, 6, 4]  # crop never lengthens
    c.crop(2, layers=range(1, 2))
    assert c.lengths == [6, 2, 4]
    k, _ = c.update(*kv(3, start=100), 1)  # appends right after the cropped length
    assert positions_in(k) == [0, 1, 100, 101, 102]
    k, _ = c.update(*kv(1, start=6), 0)
    assert positions_in(k) == [0, 1, 2, 3, 4, 5, 6]


def test_cache_keep_moves_path_down():
    c = KVCache(2)
    c.update(*kv(10), 0)
    c.update(*kv(10), 1)
    c.keep(4, [0, 2, 5])  # keep [0, 4) plus positions 4, 6, 9
    assert c.lengths == [7, 7]
    k, v = c.update(*kv(1, start=50), 0)
    assert positions_in(k) == [0, 1, 2, 3, 4, 6, 9, 50]
    assert positions_in(v) == [0, -1, -2, -3, -4, -6, -9, -50]
    c.keep(7, [], layers=range(1, 2))
    assert c.lengths == [8, 7]


def test_cache_keep_skips_empty_layers():
    c = KVCache(2)
    c.update(*kv(5), 0)
    c.keep(1, [1, 3])
    assert c.lengths == [3, 0]
    k, _ = c.update(*kv(1, start=7), 0)
    assert positions_in(k) == [0, 2, 4, 7]


# --- the adapter against the HF model ---------------------------------------------------------

PROMPT = [0] + [3 + b for b in b"The quick brown fox jumps over 13 lazy dogs."]


@pytest.fixture(scope="module")
def m():
    return tiny_model()


def full_logits(m, ids):
    logits, hidden = m.forward(ids, m.new_cache())
    return logits, hidden


def test_adapter_facts(m):
    assert m.num_layers == 4 and m.hidden_size == 64 and m.vocab_size == 259
    assert m.dtype == torch.float64 and m.device.type == "cpu"
    assert m.new_cache().num_layers == 4


def test_forward_equals_hf_model(m):
    ref = m.model(torch.tensor([PROMPT])).logits[0]
    logits, hidden = full_logits(m, PROMPT)
    assert logits.shape == (len(PROMPT), 259) and hidden.shape == (len(PROMPT), 64)
    assert torch.equal(logits, ref)
    last, _ = m.forward(PROMPT, m.new_cache(), last_only=True)
    # the head over one row is a GEMV, over all rows a GEMM: on some CPUs (AVX2 MKL) float64
    # rounds the last bits differently, so last-only is compared to 1e-12, not bitwise
    assert last.shape == (1, 259) and torch.allclose(last[0], ref[-1], rtol=0, atol=1e-12)


def test_incremental_equals_full(m):
    ref, ref_h = full_logits(m, PROMPT)
    cache = m.new_cache()
    rows, hs = [], []
    for t in PROMPT:
        logits, h = m.forward([t], cache)
        rows.append(logits[0])
        hs.append(h[0])
    assert cache.length() == len(PROMPT)
    assert torch.allclose(torch.stack(rows), ref, rtol=0, atol=1e-10)
    assert torch.allclose(torch.stack(hs), ref_h, rtol=0, atol=1e-10)


@pytest.mark.parametrize("k", [2, 5, 11])
def test_block_after_cache_equals_one_by_one(m, k):
    split = 9
    a, b = m.new_cache(), m.new_cache()
    m.forward(PROMPT[:split], a)
    m.forward(PROMPT[:split], b)
    block, _ = m.forward(PROMPT[split : split + k], a)
    single = torch.cat([m.forward([t], b)[0] for t in PROMPT[split : split + k]])
    assert torch.allclose(block, single, rtol=0, atol=1e-10)
    assert a.lengths == b.lengths == [split + k] * 4
    # and both equal the full forward's rows
    ref, _ = full_logits(m, PROMPT[: split + k])
    assert torch.allclose(block, ref[split:], rtol=0, atol=1e-10)


def test_causal_tree_mask_equals_default(m):
    a, b = m.new_cache(), m.new_cache()
    m.forward(PROMPT[:7], a)
    m.forward(PROMPT[:7], b)
    new = PROMPT[7:13]
    default, _ = m.forward(new, a)
    causal = torch.ones(len(new), len(new), dtype=torch.bool).tril()
    tree, _ = m.forward(new, b, tree_mask=causal)
    assert torch.allclose(default, tree, rtol=0, atol=1e-10)
    # with explicit positions too
    c = m.new_cache()
    m.forward(PROMPT[:7], c)
    pos, _ = m.forward(new, c, positions=torch.arange(7, 13), tree_mask=causal)
    assert torch.allclose(default, pos, rtol=0, atol=1e-10)


def test_tree_mask_branches_are_independent(m):
    """Two siblings after a shared prefix see only the prefix: each equals its own linear run."""
    ctx = PROMPT[:8]
    x, y = PROMPT[8], PROMPT[20]
    c = m.new_cache()
    m.forward(ctx, c)
    mask = torch.eye(2, dtype=torch.bool)
    both, _ = m.forward([x, y], c, positions=torch.tensor([8, 8]), tree_mask=mask)
    rx, _ = full_logits(m, ctx + [x])
    ry, _ = full_logits(m, ctx + [y])
    assert torch.allclose(both[0], rx[-1], rtol=0, atol=1e-10)
    assert torch.allclose(both[1], ry[-1], rtol=0, atol=1e-10)


def test_layerskip_nothing_skipped_equals_plain(m):
    ref, _ = full_logits(m, PROMPT)
    out, _ = m.forward(PROMPT, m.new_cache(), skip=LayerSkip())
    assert torch.equal(out, ref)
    out, _ = m.forward(PROMPT, m.new_cache(), skip=LayerSkip(attn=frozenset({7}), mlp=frozenset({9})))  # other indices
    assert torch.equal(out, ref)


def test_layerskip_whole_layer_equals_dropping_it(m):
    """Skipping both sub-layers of layer 1 is the model without layer 1 (its cache stays empty)."""
    skip = LayerSkip(attn=frozenset({1}), mlp=frozenset({1}))
    cache = m.new_cache()
    out, _ = m.forward(PROMPT, cache, skip=skip)
    assert cache.lengths == [len(PROMPT), 0, len(PROMPT), len(PROMPT)]
    ref_cache = m.new_cache()
    h = m.embed(PROMPT)
    h = m.run_layers(h, ref_cache, layers=[m.layers[0], m.layers[2], m.layers[3]])
    ref = m.head(h)[0]
    assert torch.allclose(out, ref, rtol=0, atol=1e-10)


def test_layerskip_mlp_only_matches_manual(m):
    skip = LayerSkip(mlp=frozenset({3}))
    cache = m.new_cache()
    out, _ = m.forward(PROMPT, cache, skip=skip)
    assert cache.lengths == [len(PROMPT)] * 4  # attention still ran and cached
    # manual: layers 0-2 as usual, layer 3 attention residual only
    c2 = m.new_cache()
    h = m.run_layers(m.embed(PROMPT), c2, start=0, end=3)
    layer = m.layers[3]
    pos = torch.arange(len(PROMPT)).view(1, -1)
    pe = m.rotary_emb(h, pos)
    mask = m._mask(0, len(PROMPT), None, h.dtype, h.device)
    attn, _ = layer.self_attn(hidden_states=layer.input_layernorm(h), position_embeddings=pe, attention_mask=mask,
                          **{cache_kwarg(type(layer.self_attn)): c2})
    ref = m.head(h + attn)[0]
    assert torch.allclose(out, ref, rtol=0, atol=1e-10)


# --- PhaseTimer -----------------------------------------------------------------------------


def test_phase_timer_nesting():
    # upper bounds leave 0.15 s of slack for a loaded machine; they still tell "inner time charged
    # to the outer phase too" (+0.2 s) apart
    t = PhaseTimer("cpu")
    t.start()
    time.sleep(0.03)  # other
    with t.phase("draft"):
        time.sleep(0.02)
        with t.phase("control"):
            time.sleep(0.2)
        time.sleep(0.02)
    with t.phase("verify"):
        time.sleep(0.03)
    out = t.stop()
    assert 0.04 <= out["draft"] < 0.04 + 0.15, out  # inner time is charged to the inner phase only
    assert 0.2 <= out["control"] < 0.2 + 0.15, out
    assert 0.03 <= out["verify"] < 0.03 + 0.15, out
    assert out["prefill"] == 0.0
    phases = sum(v for k, v in out.items() if k not in ("other", "wall"))
    assert out["other"] == pytest.approx(out["wall"] - phases, abs=1e-9)
    assert 0.03 <= out["other"] < 0.03 + 0.15, out
    assert out["wall"] >= 0.3


def test_phase_timer_reentrant_and_custom_phase():
    t = PhaseTimer()
    t.start()
    for _ in range(3):
        with t.phase("draft"):
            with t.phase("control"):
                time.sleep(0.005)
            with t.phase("draft"):  # the same phase nested in itself is not counted twice
                time.sleep(0.005)
    with t.phase("hf_generate"):
        pass
    out = t.stop()
    assert "hf_generate" in out
    assert out["draft"] + out["control"] + out["hf_generate"] + out["other"] == pytest.approx(out["wall"], abs=1e-9)
    assert out["draft"] >= 0.015 and out["control"] >= 0.015


def test_phase_timer_exception_still_charges():
    t = PhaseTimer()
    t.start()
    with pytest.raises(RuntimeError):
        with t.phase("verify"):
            time.sleep(0.01)
            raise RuntimeError("x")
    with t.phase("draft"):
        pass
    out = t.stop()
    assert out["verify"] >= 0.01
    assert not t._stack


def test_adapter_layer_calls_raise_no_deprecation_warning():
    """Our own layer calls use the kwarg names of the installed transformers (5.24 renamed the
    cache's `past_key_values` to `cache` and warns on the old one): a default run prints nothing
    a user must ignore. Both paths: whole layers, and attention alone (a skipped MLP)."""
    import warnings

    target = tiny_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = target.new_cache()
        target.forward([1, 2, 3], cache)
        target.forward([4], cache, skip=LayerSkip(mlp=frozenset({0})))
    assert [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []
