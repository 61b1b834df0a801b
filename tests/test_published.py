"""Published artifacts in their authors' formats (tiny files written here with the same key names
and file layout): Medusa heads, Self-SD skip sets; each format error is one line naming the file."""

import json
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specbench.core.errors import SpecBenchError
from specbench.methods.self_sd import resolve_skip
from specbench.models import LayerSkip
from specbench.models.published import is_medusa_checkpoint
from tests.helpers import ar_tokens, build, method_cfg, tiny_model

D, V = 64, 259  # tiny-llama's hidden size and byte vocabulary
PROMPT = [5, 17, 99, 42, 7, 7, 13]


def medusa_state(k=3, layers=1, seed=0, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(k):
        for j in range(layers):
            state[f"{i}.{j}.linear.weight"] = torch.randn(D, D, generator=g, dtype=torch.float64) * scale
            state[f"{i}.{j}.linear.bias"] = torch.randn(D, generator=g, dtype=torch.float64) * scale
        state[f"{i}.{layers}.weight"] = torch.randn(V, D, generator=g, dtype=torch.float64)
    return state


def write_medusa(d, state, k=3, layers=1, fmt="pt", config=None):
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"medusa_num_heads": k, "medusa_num_layers": layers, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}
    (d / "config.json").write_text(json.dumps(config if config is not None else cfg))
    if fmt == "pt":
        torch.save(state, d / "medusa_lm_head.pt")
    else:
        save_file({k_: v.contiguous() for k_, v in state.items()}, str(d / "medusa_lm_head.safetensors"))
    return d


def medusa(d, **kw):
    cfg = method_cfg("medusa", **{"num_heads": 4, "sizes": None, "checkpoint": str(d), "tree": None} | kw)
    return build("medusa", tiny_model(), cfg)


def reference_head(state, i, layers, h):
    x = h
    for j in range(layers):
        x = x + F.silu(x @ state[f"{i}.{j}.linear.weight"].T + state[f"{i}.{j}.linear.bias"])
    return x @ state[f"{i}.{layers}.weight"].T


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
@pytest.mark.parametrize("layers", [1, 2])
def test_medusa_heads_load_and_compute_as_published(tmp_path, fmt, layers):
    state = medusa_state(3, layers)
    m = medusa(write_medusa(tmp_path / "heads", state, 3, layers, fmt), tree=[[0], [1], [0, 0], [0, 0, 0]])
    d = m.describe()
    assert d["published"] and d["num_heads"] == 3 and d["medusa_num_layers"] == layers
    assert d["base_model"] == "lmsys/vicuna-7b-v1.3" and d["checkpoint"].endswith(f"medusa_lm_head.{fmt}")
    h = torch.randn(2, D, dtype=torch.float64)
    for i in range(3):
        assert torch.allclose(m.heads.head(i, h), reference_head(state, i, layers, h), atol=1e-10)
    assert not any(p.requires_grad for p in m.heads.parameters())
    # lossless with someone else's heads too
    g = m.generate(PROMPT, 24, frozenset(), 0)
    assert g.tokens == ar_tokens(tiny_model(), PROMPT, 24)


def paths(m):
    return sorted(list(q) for q in m.tree.paths[1:])  # the tree orders nodes its own way


def test_medusa_default_tree_is_the_published_one(tmp_path, monkeypatch):
    d = write_medusa(tmp_path / "heads", medusa_state(3), 3)
    # without Medusa installed: the dense `sizes` tree, and the run says why
    monkeypatch.setitem(sys.modules, "medusa", None)
    m = medusa(d, sizes=[2, 1])
    assert "mc_sim_7b_63 unavailable" in m.describe()["tree_source"] and m.describe()["tree_nodes"] == 4
    # with it: the authors' default tree (a stand-in module with the same name and shape of data)
    fake_tree = [[0], [1], [0, 0], [2], [0, 1], [0, 0, 0]]
    pkg, sub, choices = (types.ModuleType(n) for n in ("medusa", "medusa.model", "medusa.model.medusa_choices"))
    choices.mc_sim_7b_63 = fake_tree
    pkg.model, sub.medusa_choices = sub, choices
    for name, mod in (("medusa", pkg), ("medusa.model", sub), ("medusa.model.medusa_choices", choices)):
        monkeypatch.setitem(sys.modules, name, mod)
    m = medusa(d)
    assert m.describe()["tree_source"] == "mc_sim_7b_63" and paths(m) == sorted(fake_tree)
    assert paths(medusa(d, tree="mc_sim_7b_63")) == sorted(fake_tree)
    (tmp_path / "tree.json").write_text(json.dumps([[0], [0, 0]]))
    assert paths(medusa(d, tree=str(tmp_path / "tree.json"))) == [[0], [0, 0]]
    with pytest.raises(SpecBenchError, match="method.tree='nope': no such tree in an installed Medusa"):
        medusa(d, tree="nope")


class NotATensor:
    pass


@pytest.mark.parametrize("break_it, match", [
    (lambda s: s.pop("1.0.linear.bias"), r"missing key '1\.0\.linear\.bias'"),
    (lambda s: s.update({"3.1.weight": torch.zeros(V, D)}), r"unexpected key '3\.1\.weight'"),
    (lambda s: s.update({"0.1.weight": torch.zeros(V + 1, D)}), r"'0\.1\.weight' has shape \[260, 64\], the model needs \[259, 64\]"),
    (lambda s: s.update({"2.0.linear.weight": torch.zeros(D, 2 * D)}), r"'2\.0\.linear\.weight' has shape \[64, 128\]"),
])
@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_medusa_wrong_key_or_shape_is_one_line(tmp_path, break_it, match, fmt):
    state = medusa_state(3)
    break_it(state)
    d = write_medusa(tmp_path / "heads", state, 3, 1, fmt)
    with pytest.raises(SpecBenchError, match=match) as e:
        medusa(d)
    msg = str(e.value)
    assert "\n" not in msg and str(d / f"medusa_lm_head.{fmt}") in msg and "expected Medusa's layout" in msg


def test_medusa_bad_files(tmp_path):
    d = write_medusa(tmp_path / "a", medusa_state(3), config={"medusa_num_layers": 1})
    with pytest.raises(SpecBenchError, match=r"config.json: no positive integer 'medusa_num_heads'; expected Medusa's layout"):
        medusa(d)
    d = tmp_path / "b"
    write_medusa(d, medusa_state(3))
    torch.save({"0.0.linear.weight": NotATensor()}, d / "medusa_lm_head.pt")  # weights_only refuses to unpickle it
    with pytest.raises(SpecBenchError, match=r"medusa_lm_head.pt: cannot read .*expected Medusa's layout"):
        medusa(d)
    d = tmp_path / "c"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"medusa_num_heads": 2}))
    with pytest.raises(SpecBenchError, match=r"no medusa_lm_head.safetensors or medusa_lm_head.pt"):
        medusa(d)
    # a hub id that is not cached, offline: one line, no traceback
    with pytest.raises(SpecBenchError, match=r"Medusa heads 'nobody/medusa-x-v1.3': not a local directory"):
        medusa("nobody/medusa-x-v1.3")
    assert is_medusa_checkpoint("FasterDecoding/medusa-vicuna-7b-v1.3") and not is_medusa_checkpoint("cache/heads.pt")
    assert not is_medusa_checkpoint("auto") and not is_medusa_checkpoint(None)


# -- Self-SD skip sets --------------------------------------------------------------------------


def skip_cfg(path, **kw):
    return method_cfg("self_sd", skip={"source": str(path), "attn": [], "mlp": [], "model": None} | kw).skip


def test_self_sd_skip_file_as_published(tmp_path):
    p = tmp_path / "skip_layers.json"
    p.write_text(json.dumps({"llama-2-13b": {"attention": [1, 3], "mlp": [2]}, "tiny": {"attention": [2], "mlp": [1, 3]}}))
    skip, info = resolve_skip(tiny_model(), skip_cfg(p, model="tiny"))
    assert skip == LayerSkip(frozenset({2}), frozenset({1, 3}))
    assert info["skip_source"] == "file" and info["skip_entry"] == "tiny" and info["skip_file"] == str(p)
    with pytest.raises(SpecBenchError, match=r"holds skip sets for llama-2-13b, tiny; choose one with method.skip.model"):
        resolve_skip(tiny_model(), skip_cfg(p))
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"tiny": {"attention": [1], "mlp": []}}))
    assert resolve_skip(tiny_model(), skip_cfg(one))[0] == LayerSkip(frozenset({1}), frozenset())
    # end to end: the file's skip set drives the draft; greedy output is AR's
    cfg = method_cfg("self_sd", skip={"source": str(p), "model": "tiny"})
    m = build("self_sd", tiny_model(), cfg)
    assert m.describe()["skip_attn"] == [2]
    assert m.generate(PROMPT, 20, frozenset(), 0).tokens == ar_tokens(tiny_model(), PROMPT, 20)


@pytest.mark.parametrize("content, match", [
    ({"tiny": {"attention": [1, 9], "mlp": []}}, r"one.json \[tiny\]: skip.attn layer 9 is out of range: the model has 4 layers"),
    ({"tiny": {"attn": [1], "mlp": []}}, r"one.json: entry 'tiny' needs lists 'attention' and 'mlp'; expected Self-SD's"),
    ([1, 2], r"one.json: a JSON list; expected Self-SD's skip_layers.json layout"),
])
def test_self_sd_bad_skip_file(tmp_path, content, match):
    p = tmp_path / "one.json"
    p.write_text(json.dumps(content))
    with pytest.raises(SpecBenchError, match=match) as e:
        resolve_skip(tiny_model(), skip_cfg(p))
    assert "\n" not in str(e.value)
    with pytest.raises(SpecBenchError, match=r"skip.source='.*missing.json': no such file"):
        resolve_skip(tiny_model(), skip_cfg(tmp_path / "missing.json"))
