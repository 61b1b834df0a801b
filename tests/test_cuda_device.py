"""On a real GPU only (marker `cuda`; skipped elsewhere, run by `python -m specbench.doctor`):
what fake CUDA tensors cannot show. Every method's greedy output equals AR's on the tiny model in
float32 on the device, and SDPA's memory-efficient kernel accepts the verification call the
adapter makes on CUDA (a boolean mask, grouped K/V with enable_gqa)."""

import pytest
import torch
from omegaconf import OmegaConf

import test_every_method as every
from helpers import TINY, build
from specbench.methods.base import METHODS
from specbench.models import load_model

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def target():
    return load_model(OmegaConf.create(TINY | {"dtype": "float32", "device": "cuda", "backend": "eager"}))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_greedy_equals_ar_on_the_gpu(method, target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    m = build(method, target, every.method_config(method))
    ref = m.finetuned_adapter if getattr(m, "baseline_weights", None) == "fine-tuned" else target
    ar = build("ar", ref, every.method_config("ar"))
    for prompt in every.PROMPTS:
        with torch.no_grad():
            assert m.generate(prompt, 16, frozenset(), 0).tokens == ar.generate(prompt, 16, frozenset(), 0).tokens


def test_memory_efficient_kernel_takes_the_verification_call():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 8, 7, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 7, 40, dtype=torch.bool, device="cuda").tril(33)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
    assert out.shape == q.shape
