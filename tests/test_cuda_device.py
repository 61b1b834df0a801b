"""On a real GPU only (marker `cuda`; skipped elsewhere, run by `python -m specbench.tools.doctor`):
what fake CUDA tensors cannot show. Every method's greedy output equals AR's on the tiny model in
float32 on the device, and SDPA's memory-efficient kernel accepts the verification call the
adapter makes on CUDA (a boolean mask, grouped K/V with enable_gqa)."""

import pytest
import test_every_method as every
import torch
from helpers import build, tiny_settings

from specbench.methods.base import METHODS
from specbench.models import load_model

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def target():
    return load_model(tiny_settings(dtype="float32", device="cuda", backend="eager"))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_greedy_equals_ar_on_the_gpu(method, target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    m = build(method, target, every.method_config(method))
    ref = m.finetuned_adapter if getattr(m, "baseline_weights", None) == "fine-tuned" else target
    ar = build("ar", ref, every.method_config("ar"))
    for prompt in every.PROMPTS:
        with torch.no_grad():
            assert m.generate(prompt, 16, frozenset(), 0).tokens == ar.generate(prompt, 16, frozenset(), 0).tokens


def test_the_verification_calls_attention_on_each_kernel_that_takes_it():
    """A masked grouped query (9 query heads over 3 KV heads, as SmolLM2's): with K/V repeated to the
    query's heads the memory-efficient kernel takes it; with enable_gqa only the math kernel does on
    torch 2.11 (an H200, session 54: the fused kernels refuse grouped heads for dense input). Both agree."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    q = torch.randn(1, 9, 7, 64, device="cuda")
    k = torch.randn(1, 3, 40, 64, device="cuda")
    mask = torch.ones(1, 1, 7, 40, dtype=torch.bool, device="cuda").tril(33)
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        kk = k.repeat_interleave(3, 1)
        out = torch.nn.functional.scaled_dot_product_attention(q, kk, kk, attn_mask=mask)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


# -- model.execution=graphs with real captures (models/graphs.py) ----------------------------------
def _graphs_model(dtype: str):
    m = load_model(tiny_settings(dtype=dtype, device="cuda", backend="eager"))
    m.set_execution("graphs", 16)
    return m


@pytest.fixture(scope="module")
def eager64():
    return load_model(tiny_settings(dtype="float64", device="cuda", backend="eager"))


@pytest.mark.parametrize("method", sorted(m for m in METHODS if m != "hf_assisted"))
def test_captured_graphs_give_eager_ars_tokens(method, eager64, tmp_path, monkeypatch):
    """float64 on the GPU (no near-ties): every method in graphs mode, its forwards captured and
    replayed, returns eager AR's tokens; once every call has been seen twice (a key is captured at
    its second call), the same generations replay only."""
    from specbench.models.graphs import CAPTURES

    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    g = _graphs_model("float64")
    torch.manual_seed(0)
    m = build(method, g, every.method_config(method))
    ref = m.finetuned_adapter if m.baseline_weights == "fine-tuned" else eager64
    before = CAPTURES[0]
    with torch.no_grad():
        for prompt in every.PROMPTS:
            assert m.generate(prompt, 16, frozenset(), 0).tokens == build("ar", ref, every.method_config("ar")).generate(
                prompt, 16, frozenset(), 0).tokens
        for prompt in every.PROMPTS:  # the second time: what was called once so far is captured now
            assert m.generate(prompt, 16, frozenset(), 0).tokens == build("ar", ref, every.method_config("ar")).generate(
                prompt, 16, frozenset(), 0).tokens
        assert CAPTURES[0] > before, "nothing was captured"
        captured = CAPTURES[0]
        for prompt in every.PROMPTS:
            m.generate(prompt, 16, frozenset(), 0)
    assert CAPTURES[0] == captured, "the same generations captured again instead of replaying"


@pytest.mark.parametrize("execution", ["eager", "graphs"])
@pytest.mark.parametrize("method", ["ar", "pld", "eagle3", "eesd"])
def test_the_gpus_sync_count_is_the_fake_counts_accounting(method, execution, tmp_path, monkeypatch):
    """tests/test_sync_budget.py's accounting on the real GPU: per decoding step, the synchronising
    calls torch reports (set_sync_debug_mode) are exactly the budget's reads (AR 1, a chain's drafted
    tokens + 1, a tree 2): nothing the fake counter misses (pageable copies, implicit reads)."""
    from test_sync_budget import GREEDY, budget

    from specbench.models.graphs import precapture
    from specbench.tools.syncs import count_generation

    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    t = load_model(tiny_settings(dtype="float32", device="cuda", backend="eager"))
    t.set_execution(execution, 16)
    precapture(t)
    m = build(method, t, every.method_config(method))
    prompt = [1, 5, 6, 7, 5, 6, 7, 5]
    with torch.no_grad():
        m.generate(prompt, 12, frozenset(), 0)  # warm-up: graphs captured (a capture synchronises)
    got, gen = count_generation(m, prompt, 12)
    tree = getattr(m, "uses_controller", True) is False
    expected = [budget(m, (s.drafted, s.accepted, 0, 0, [], tree, {}), GREEDY) for s in gen.steps]
    assert got.per_step == expected, f"{method} [{execution}]: {got.per_step} != {expected}; sites {got.top(8)}"
