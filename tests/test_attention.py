"""The adapter's grouped attention (specbench/models/attention.py): same attention as
transformers' sdpa, without materialising grouped K/V heads for a masked query."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers.integrations.sdpa_attention as hf_sdpa
from helpers import tiny_model, tiny_settings
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specbench.models import load_model
from specbench.models.attention import GROUPED_SDPA, grouped_sdpa_attention


class Attn:  # what the attention function reads off the module
    num_key_value_groups = 3
    is_causal = True
    layer_idx = 0


def additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)


@pytest.mark.parametrize("q", [1, 2, 5, 8])
def test_grouped_equals_transformers_sdpa(q):
    torch.manual_seed(q)
    n = 20 + q
    query = torch.randn(2, 9, q, 16, dtype=torch.float64)
    key, value = torch.randn(2, 2, 3, n, 16, dtype=torch.float64)
    allowed = torch.rand(q, n) < 0.7
    allowed[:, 0] = True  # every row sees something
    mask = additive(allowed).view(1, 1, q, n).expand(2, 1, q, n)
    ref, _ = sdpa_attention_forward(Attn(), query, key, value, mask, scaling=0.25)
    out, _ = grouped_sdpa_attention(Attn(), query, key, value, mask, scaling=0.25)
    assert out.shape == ref.shape == (2, q, 9, 16)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_masked_multi_token_query_never_repeats_kv(monkeypatch):
    """A verification forward (several new tokens, explicit mask) must not copy K/V per layer."""
    target = tiny_model()
    assert target.config._attn_implementation == GROUPED_SDPA
    cache = target.new_cache()
    target.forward(list(range(10, 30)), cache)

    def no_repeat(*a, **k):
        raise AssertionError("repeat_kv materialised the grouped K/V heads")

    monkeypatch.setattr(hf_sdpa, "repeat_kv", no_repeat)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    target.forward([40, 41, 42, 43], cache, positions=torch.tensor([20, 21, 21, 22]), tree_mask=tree)
    target.forward([44, 45, 46], cache)


def test_tree_forward_matches_transformers_sdpa():
    """The whole adapter path (cache, tree mask, positions) against transformers' own sdpa
    attention on the same weights."""
    grouped = tiny_model()
    plain = copy.deepcopy(grouped)
    plain.config._attn_implementation = "sdpa"
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    outs = []
    for m in (grouped, plain):
        cache = m.new_cache()
        a = m.forward(list(range(3, 40)), cache)[0]
        b = m.forward([50, 51, 52], cache, positions=torch.tensor([37, 38, 38]), tree_mask=tree)[0]
        c = m.forward([53], cache)[0]
        outs.append(torch.cat([a, b, c]))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-10)


def test_other_attention_choices_stay():
    eager = load_model(tiny_settings(attn_implementation="eager"))
    assert eager.config._attn_implementation == "eager"
