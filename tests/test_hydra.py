"""Hydra / Hydra++: greedy output equals AR (untrained and oracle heads, both variants), sampling
follows the target, the heads read at decode time exactly what training feeds them, the
prefix-attention layer's cache equals a fresh prefill of the committed tokens after rejections,
training lowers the loss and its checkpoint reloads, and the authors' released format loads
strictly (bad ones: one line)."""

import json

import pytest
import torch
from omegaconf import OmegaConf

from specbench.engine.cache import KVCache
from specbench.engine.sampling import SamplingConfig
from specbench.core.errors import SpecBenchError
from specbench.methods.hydra_heads import HydraHeads, teacher_forced_inputs
from specbench.train.hydra import train_hydra  # noqa: F401 - registers the trainer
from specbench.train.trainers import TRAINERS
from tests.helpers import ar_tokens, build, method_cfg, tiny_model
from tests.test_medusa import E2E_SAMPLING, check_sampling_matches_target, tiny_sequences, train_cfg

CHAIN = [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]
WIDE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0], [0, 0, 0, 0]]


def hydra(target, variant="hydra_pp", tree=WIDE, sampling=SamplingConfig(), **kw):
    kw.setdefault("num_heads", 4)  # the authors' count (the default is 3): these trees reach depth 4
    cfg = method_cfg("hydra", allow_untrained=True, variant=variant, tree=tree, **kw)
    return build("hydra", target, cfg, sampling=sampling)


def target_oracle(m, target):
    """The heads propose the target's own top-k after each row's path (the heads still run)."""
    state = {}

    def choose(d, logits, k):
        if d == 0:
            state["paths"] = [[m.tokens[-1]]]
        paths = state["paths"]
        top = torch.stack([torch.topk(target.forward(m.tokens[:-1] + p, target.new_cache(), last_only=True)[0][-1], k).indices
                           for p in paths])
        lv = m.levels[d]
        found = top.reshape(-1)[lv.pick].tolist()
        if lv.grow_rows is not None:
            state["paths"] = [paths[r] + [found[n]] for r, n in zip(lv.grow_rows.tolist(), lv.grow_nodes.tolist())]
        return top.to(logits.device)

    m.choose = choose
    return m


def text_oracle(m, seq, cuts):
    """Chain tree: depth d proposes seq's token there while d < the step's cut, a wrong one after."""
    steps = []

    def choose(d, logits, k):
        if d == 0:
            steps.append(cuts[len(steps) % len(cuts)])
        i = len(m.tokens) + d  # seq index of the token head d predicts
        tok = seq[i] if d < steps[-1] else (seq[i] + 1) % m.target.vocab_size
        return torch.tensor([[tok]], device=logits.device)

    m.choose = choose
    return m


@pytest.mark.parametrize("variant", ["hydra_pp", "hydra"])
@pytest.mark.parametrize("prompt", [[5, 17, 99, 3, 42, 8], [40, 41, 42, 40, 41, 42, 40]])
def test_greedy_equals_ar_untrained_and_oracle(variant, prompt):
    target = tiny_model()
    want = ar_tokens(target, prompt, 30)
    assert hydra(target, variant).generate(prompt, 30, frozenset(), 0).tokens == want
    g = target_oracle(hydra(target, variant), target).generate(prompt, 30, frozenset(), 0)
    assert g.tokens == want
    assert max(s.accepted for s in g.steps) == 4 and len(g.steps) <= 8  # the oracle's deep paths were accepted


@pytest.mark.slow  # ~1.5 min: the oracle runs the target once per tree row
def test_tree_rejection_sampling_is_lossless_end_to_end():
    target = tiny_model(init_std=0.1, num_layers=2)
    m = target_oracle(hydra(target, tree=[[0], [1], [2], [0, 0], [0, 1], [1, 0]], sampling=E2E_SAMPLING), target)
    assert check_sampling_matches_target(m, target) > 300  # accepted often enough to matter


def test_decode_inputs_equal_training_inputs():
    """Head d's input at decode time, on a path equal to the teacher's tokens, is the row that
    `teacher_forced_inputs` builds for training at the same position (across accepts and
    rejections, so the prefix cache's rollback is exercised too)."""
    target = tiny_model()
    prompt = [0, 17, 99, 42, 7]
    seq = prompt + ar_tokens(target, prompt, 40)
    m = text_oracle(hydra(target, tree=CHAIN), seq, cuts=[4, 1, 0, 2, 3, 0, 4])
    m.record_inputs = True
    starts = []
    real = m.propose
    m.propose = lambda k: (starts.append(len(m.tokens) - 1), real(k))[1]  # pending token's position
    g = m.generate(prompt, 30, frozenset(), 0)
    assert g.tokens == seq[len(prompt):len(prompt) + 30]
    _, train_inputs = teacher_forced_inputs(m.heads, target, torch.tensor([seq]))
    d_model, checked = target.hidden_size, 0
    for step, (pos, inputs) in enumerate(zip(starts, m.recorded)):
        t = pos - 1  # the last committed position: its base feature, then the pending token's embedding
        cut = [4, 1, 0, 2, 3, 0, 4][step % 7]
        for d in range(min(cut, 3) + 1):  # head d's input holds tokens of depths < d: all on the teacher's path
            got, want = inputs[d][0], train_inputs[d][0, t]
            assert torch.equal(got[d_model:], want[d_model:]), (step, d)  # the path's embeddings, exactly
            torch.testing.assert_close(got[:d_model], want[:d_model], rtol=1e-9, atol=1e-9)
            checked += 1
    assert checked >= 20


def test_prefix_cache_after_rollback_equals_fresh_prefill():
    target = tiny_model()
    prompt = [3, 9, 27, 81, 4]
    seq = prompt + ar_tokens(target, prompt, 40)
    m = text_oracle(hydra(target, tree=CHAIN), seq, cuts=[2, 0, 4, 1, 3])
    g = m.generate(prompt, 25, frozenset(), 0)
    assert any(s.accepted < s.drafted for s in g.steps) and any(s.accepted > 1 for s in g.steps)
    committed = m.tokens[:-1]
    assert m.pcache.length() == len(committed) == m.cache.length()
    fresh = KVCache(1)
    with torch.no_grad():
        h = target.norm(target.run_layers(target.embed(committed), None))
        out = m.heads.base(h, fresh)
    n = len(committed)
    torch.testing.assert_close(m.pcache.keys[0][..., :n, :], fresh.keys[0][..., :n, :], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(m.pcache.values[0][..., :n, :], fresh.values[0][..., :n, :], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(m.base_feat, out[0, -1], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("variant", ["hydra_pp", "hydra"])
def test_training_lowers_loss_and_checkpoint_reloads(variant, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = tiny_model()
    cfg = train_cfg({"name": "hydra", "variant": variant, "num_heads": 2, "num_layers": None, "dropout": 0.0,
                     "share_head": False}, epochs=4, lr=3e-3)
    res = TRAINERS["hydra"](target, cfg, tiny_sequences(16))
    before, after = res["held_out_loss"]
    assert after < before
    m = build("hydra", target, method_cfg("hydra", variant=variant, num_heads=2, share_head=False, tree=[[0], [1], [0, 0]]))
    assert m.info["heads_trained"]
    prompt = tiny_sequences(1, seed=5)[0][0][:12]
    g = m.generate(prompt, 20, frozenset(), 0)
    assert g.tokens == ar_tokens(target, prompt, 20)


# -- the authors' released format ----------------------------------------------------------------
def released_state(target, arch: str, K: int, L: int) -> dict:
    """A state dict as the authors' HydraMLP / HydraPrefixMLP saves it (random values): blocks 2..L
    are one shared module there, so their keys hold equal tensors."""
    g = torch.Generator().manual_seed(0)
    d, V = target.hidden_size, target.vocab_size
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64) * 0.05  # noqa: E731
    prefix = arch == "prefix-mlp"
    state = {}
    for k in range(K):
        idx = [2 * j + 1 for j in range(L)] if prefix else list(range(L))
        state |= {f"hydra_mlp.{k}.{idx[0]}.linear.weight": rnd(d, d * (k + 2)), f"hydra_mlp.{k}.{idx[0]}.linear.bias": rnd(d),
                  f"hydra_mlp.{k}.{idx[0]}.res_connection.weight": rnd(d, d * (k + 2)),
                  f"hydra_mlp.{k}.{idx[0]}.res_connection.bias": rnd(d)}
        shared_w, shared_b = rnd(d, d), rnd(d)
        for j in idx[1:]:
            state |= {f"hydra_mlp.{k}.{j}.linear.weight": shared_w, f"hydra_mlp.{k}.{j}.linear.bias": shared_b}
        p = f"hydra_lm_head.{k}.1" if prefix else f"hydra_lm_head.{k}"
        state |= {f"{p}.weight": rnd(V, d), f"{p}.bias": rnd(V)}
    if prefix:
        layer = target.new_layer()
        state |= {f"prefix_embeding_layer.layers.0.{n}": rnd(*t.shape) for n, t in layer.state_dict().items()}
        state |= {"prefix_embeding_layer.norm.weight": 1 + rnd(d), "prefix_embeding_layer.embed_tokens.weight": rnd(V, d),
                  "prefix_embeding_layer.layers.0.self_attn.rotary_emb.inv_freq": rnd(d // 8)}
    return state


def write_release(path, state, arch, K, L, **conf):
    path.mkdir(parents=True, exist_ok=True)
    torch.save(state, path / "hydra_lm_head.pt")
    config = {"hydra_num_heads": K, "hydra_num_layers": L, "hydra_head_arch": arch, "grounded_heads": True,
              "hidden_state_offset": 0, "base_model_name_or_path": "tiny"} | conf
    (path / "config.json").write_text(json.dumps(config))
    return path


def reference_head(state, prefix: bool, k: int, L: int, x):
    """The authors' head k, written out from their code's arithmetic, on its input x."""
    idx = [2 * j + 1 for j in range(L)] if prefix else list(range(L))
    w = lambda n: state[f"hydra_mlp.{k}.{n}"]  # noqa: E731
    y = x @ w(f"{idx[0]}.res_connection.weight").T + w(f"{idx[0]}.res_connection.bias")
    y = y + torch.nn.functional.silu(x @ w(f"{idx[0]}.linear.weight").T + w(f"{idx[0]}.linear.bias"))
    for j in idx[1:]:
        y = y + torch.nn.functional.silu(y @ w(f"{j}.linear.weight").T + w(f"{j}.linear.bias"))
    p = f"hydra_lm_head.{k}.1" if prefix else f"hydra_lm_head.{k}"
    return y @ state[f"{p}.weight"].T + state[f"{p}.bias"]


@pytest.mark.parametrize("arch, K, L", [("prefix-mlp", 2, 3), ("mlp", 3, 1)])
def test_released_heads_load_and_compute_as_the_authors(arch, K, L, tmp_path):
    target = tiny_model()
    state = released_state(target, arch, K, L)
    d = write_release(tmp_path / "rel", state, arch, K, L)
    m = build("hydra", target, method_cfg("hydra", checkpoint=str(d), tree=[[0], [1], [0, 0]]))
    assert m.info["format"] == "released" and m.heads.variant == ("hydra_pp" if arch == "prefix-mlp" else "hydra")
    x = torch.randn(3, target.hidden_size * 2, dtype=torch.float64)
    for k in range(K):
        xk = torch.randn(3, target.hidden_size * (k + 2), dtype=torch.float64)
        torch.testing.assert_close(m.heads.head(k, xk), reference_head(state, arch == "prefix-mlp", k, L, xk))
    if arch == "prefix-mlp":
        got = m.heads.prefix_embeding_layer.state_dict()
        assert torch.equal(got["norm.weight"], state["prefix_embeding_layer.norm.weight"])
        assert torch.equal(got["layers.0.self_attn.q_proj.weight"], state["prefix_embeding_layer.layers.0.self_attn.q_proj.weight"])
    prompt = [5, 17, 99, 3]
    assert m.generate(prompt, 16, frozenset(), 0).tokens == ar_tokens(target, prompt, 16)
    del x


def _bad(tmp_path, mutate_state=None, **conf):
    target = tiny_model()
    state = released_state(target, "prefix-mlp", 2, 2)
    if mutate_state:
        mutate_state(state)
    d = write_release(tmp_path / "bad", state, "prefix-mlp", 2, 2, **conf)
    with pytest.raises(SpecBenchError) as e:
        build("hydra", target, method_cfg("hydra", checkpoint=str(d)))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_released_wrong_shape_missing_key_and_bad_config_are_one_line(tmp_path):
    msg = _bad(tmp_path, lambda s: s.__setitem__("hydra_mlp.1.1.linear.weight", torch.zeros(3, 3, dtype=torch.float64)))
    assert "hydra_mlp.1.1.linear.weight" in msg and "shape" in msg
    msg = _bad(tmp_path, lambda s: s.pop("hydra_lm_head.0.1.bias"))
    assert "hydra_lm_head.0.1.bias" in msg and "missing" in msg
    msg = _bad(tmp_path, lambda s: s.__setitem__("hydra_mlp.0.9.linear.weight", torch.zeros(2, dtype=torch.float64)))
    assert "unexpected key" in msg
    assert "grounded_heads" in _bad(tmp_path, grounded_heads=False)
    assert "hydra_head_arch" in _bad(tmp_path, hydra_head_arch="cross-attn")
    assert "embed_tokens" in _bad(tmp_path, lambda s: s.__setitem__("prefix_embeding_layer.embed_tokens.weight", torch.zeros(2, 2)))


def test_released_pickle_with_objects_is_refused(tmp_path):
    d = tmp_path / "pickle"
    write_release(d, {}, "mlp", 1, 1)
    torch.save({"x": OmegaConf.create({"a": 1})}, d / "hydra_lm_head.pt")  # an arbitrary object: weights_only refuses it
    with pytest.raises(SpecBenchError) as e:
        build("hydra", tiny_model(), method_cfg("hydra", checkpoint=str(d)))
    assert "\n" not in str(e.value) and "hydra_lm_head.pt" in str(e.value)


def test_missing_heads_name_the_training_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(SpecBenchError, match="python -m specbench.train method=hydra"):
        build("hydra", tiny_model(), method_cfg("hydra"))


def test_bad_trees_are_one_line():
    with pytest.raises(SpecBenchError, match="exceeds num_heads"):
        hydra(tiny_model(), tree=[[0], [0, 0], [0, 0, 0]], num_heads=2)
    with pytest.raises(SpecBenchError, match=r"hydra method.tree: .*no parent"):
        hydra(tiny_model(), tree=[[0], [1, 0]])


def test_heads_layout_is_the_authors():
    target = tiny_model()
    names = set(HydraHeads(target, "hydra_pp", 2, 2).state_dict())
    assert {"hydra_mlp.0.1.res_connection.weight", "hydra_mlp.1.3.linear.bias", "hydra_lm_head.1.1.bias",
            "prefix_embeding_layer.norm.weight"} <= names
    assert {"hydra_mlp.0.0.res_connection.weight", "hydra_lm_head.0.weight"} <= set(HydraHeads(target, "hydra", 1, 1).state_dict())


def test_shared_head_reads_out_through_the_targets_head_trains_and_saves_no_projection(tmp_path, monkeypatch):
    """share_head (the default): every head's logits are the target's LM head over its MLP's output,
    the head stays frozen (bit for bit after training) and out of the checkpoint, and the trained
    heads reload and decode exactly as AR."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = tiny_model()
    d, V = target.hidden_size, target.vocab_size
    heads = HydraHeads(target, "hydra_pp", 2, 2, 0.2, share_head=True).eval()
    assert not any(k.startswith("hydra_lm_head") for k in heads.state_dict())
    own = sum(p.numel() for p in HydraHeads(target, "hydra_pp", 2, 2, share_head=False).parameters())
    assert own - sum(p.numel() for p in heads.parameters()) == 2 * (V * d + V)
    x = torch.randn(3, 3 * d, dtype=target.dtype)
    assert torch.equal(heads.head(1, x), target.lm_head(heads.hydra_mlp[1](x)))
    head_before = target.lm_head.weight.detach().clone()
    cfg = train_cfg({"name": "hydra", "variant": "hydra_pp", "num_heads": 2, "num_layers": None, "dropout": 0.0,
                     "share_head": True}, epochs=4, lr=3e-3)
    res = TRAINERS["hydra"](target, cfg, tiny_sequences(16))
    assert res["held_out_loss"][1] < res["held_out_loss"][0]
    assert torch.equal(target.lm_head.weight, head_before)
    from safetensors import safe_open
    with safe_open(res["hydra"], framework="pt") as f:
        assert not any(k.startswith("hydra_lm_head") for k in f.keys())
    m = build("hydra", target, method_cfg("hydra", num_heads=2, share_head=True, tree=[[0], [1], [0, 0]]))
    assert m.info["heads_trained"] and m.info["share_head"]
    with pytest.raises(SpecBenchError, match="method.share_head=false"):  # the other structure is not these heads
        build("hydra", target, method_cfg("hydra", num_heads=2, share_head=False, tree=[[0], [1], [0, 0]]))
    prompt = tiny_sequences(1, seed=5)[0][0][:12]
    assert m.generate(prompt, 20, frozenset(), 0).tokens == ar_tokens(target, prompt, 20)
