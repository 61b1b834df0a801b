"""The CUDA path without a GPU: every device-sensitive piece run on fake `cuda` tensors
(tests/fakecuda.py). An op that mixes `cuda:0` and `cpu` tensors raises; values are fake, so
these tests check devices, dtypes and shapes only (value tests live elsewhere). The model is a
tiny bf16 Llama (the GPU default dtype) built under fake mode on `cuda`."""

import json
import random

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError

from fakecuda import fake_cuda, fake_tiny_llama, on_cuda
from helpers import build, control, controller_args, method_cfg
from specbench.config.settings import merge
from specbench.control.cali_ts import CaliPredictor, CaliTS
from specbench.control.base import DraftInfo
from specbench.engine.sampling import (
    SamplingConfig, accept_tests, draft_token_probs, one_hot, probs, residual, verify_sampling)
from specbench.engine.tree import TokenTree, space_layout, verify_tree_sampling, verify_tree_typical
from specbench.methods.eesd import EarlyExit
from specbench.methods.medusa import MedusaHeads
from specbench.methods.space import MaskedEmbed, finetuned_copy
from specbench.models import LayerSkip, truncated_copy
from specbench.train.medusa import medusa_loss
from specbench.train.space import sar_batch, space_loss
from specbench.train.loop import ce_loss, pad_batch
from specbench.train.trainers import cali_examples

pytestmark = pytest.mark.fake_cuda

SAMPLE = SamplingConfig(temperature=0.8, top_p=0.9, top_k=20)
V = 259  # the byte tokenizer's vocabulary


# -- rejection sampling math ---------------------------------------------------------------
def test_cpu_one_hot_against_cuda_probabilities_is_caught():
    """The bug the issue names: a one-hot built with torch.tensor(tok) lives on the CPU."""
    with fake_cuda():
        p = probs(torch.empty(3, V, device="cuda", dtype=torch.bfloat16), SAMPLE)
        with pytest.raises(FakeTensorDeviceMismatchError):
            p[0] - torch.nn.functional.one_hot(torch.tensor(5), V).to(p.dtype)


def test_residual_with_one_hot_draft_stays_on_device():
    with fake_cuda():
        p = probs(torch.empty(3, V, device="cuda", dtype=torch.bfloat16), SAMPLE)
        q = one_hot(5, p[0])
        r = residual(p[0], q)
        assert on_cuda(q, r) and r.dtype == torch.float32 and r.shape == (V,)


@pytest.mark.parametrize("with_q", [True, False])
def test_acceptance_math_on_device_in_float32(with_q):
    with fake_cuda():
        logits = torch.empty(4, V, device="cuda", dtype=torch.bfloat16)
        p = probs(logits, SAMPLE)
        q = probs(torch.empty(3, V, device="cuda", dtype=torch.bfloat16), SAMPLE) if with_q else None
        draft = torch.tensor([1, 2, 3], device="cuda")
        p_x, q_x = draft_token_probs(p[:3], q, draft)
        ok = accept_tests(p_x, q_x, torch.rand(3).to("cuda"))
        assert on_cuda(p, p_x, q_x, ok) and p.dtype == p_x.dtype == q_x.dtype == torch.float32
        assert ok.dtype == torch.bool and ok.shape == (3,)


@pytest.mark.parametrize("accept", [True, False])
@pytest.mark.parametrize("with_q", [True, False])
def test_verify_sampling_on_cuda(accept, with_q):
    """The accept tests, the residual and the all-accepted row are all computed on the device
    (the row to sample from is chosen there), whatever the fake values say."""
    with fake_cuda(bool_value=accept) as mode:
        logits = torch.empty(4, V, device="cuda", dtype=torch.bfloat16)
        q = probs(torch.empty(3, V, device="cuda", dtype=torch.bfloat16), SAMPLE) if with_q else None
        n, tok = verify_sampling(logits, [1, 2, 3], q, SAMPLE, torch.Generator().manual_seed(0))
    assert 0 <= n <= 3 and isinstance(tok, int)
    assert mode.counter.count("d2h") == 1  # the decision and the row in one copy


@pytest.mark.parametrize("accept", [True, False])
def test_tree_verification_on_cuda(accept):
    tree = TokenTree.cartesian([2, 2])  # structure built on the host, as methods do
    with fake_cuda(bool_value=accept):
        logits = torch.empty(len(tree), V, device="cuda", dtype=torch.bfloat16)
        nodes = list(range(len(tree)))
        path, tok = verify_tree_sampling(tree, nodes, logits, SAMPLE, torch.Generator().manual_seed(0))
        path2, _ = verify_tree_typical(tree, nodes, logits, 0.8, 0.09, 0.3)
    assert path[0] == 0 and path2[0] == 0


# -- the adapter and the cache -------------------------------------------------------------
def test_adapter_forward_masks_positions_skip_and_cache_on_cuda():
    with fake_cuda():
        t = fake_tiny_llama()
        cache = t.new_cache()
        logits, h = t.forward([1, 2, 3, 4], cache)
        assert on_cuda(logits, h) and logits.dtype == torch.bfloat16 and logits.shape == (4, V)
        tree = TokenTree.cartesian([2, 1])
        L = cache.length()
        logits, _ = t.forward(list(range(len(tree))), cache, positions=L + tree.depths.to(t.device),
                              tree_mask=tree.mask.to(t.device))
        cache.keep(L, [0, 2, 4])
        assert cache.length() == L + 3
        _, mask, pos = space_layout(3)
        t.forward([5] * len(pos), cache, positions=cache.length() + pos.to(t.device), tree_mask=mask)  # mask on host
        cache.crop(L)
        skip = LayerSkip(attn=frozenset({1}), mlp=frozenset({0}))
        logits, _ = t.forward([7], cache, positions=torch.tensor([L], device=t.device), skip=skip, last_only=True)
        assert on_cuda(logits) and cache.length(1) == L and cache.length(0) == L + 1
        h = t.run_layers(t.embed([[1, 2], [3, 4]]), None, 0, 1)  # batched, no cache (training)
        assert on_cuda(h) and h.shape == (2, 2, t.hidden_size)


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_cuda_verification_hands_sdpa_a_boolean_mask_with_gqa(kv_heads, monkeypatch):
    """What SDPA gets for a multi-token verification on CUDA: a boolean [1, 1, q, past + q] mask
    on the device (with which its memory-efficient kernel is eligible; an additive float mask
    was what the CPU path passes), the KV heads ungrouped (no repeat_kv copy) with enable_gqa
    where the model groups its heads, rows of contiguous head_dim. Bites: the float mask on CUDA,
    a dropped enable_gqa, K/V repeated to the query heads."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None:
            seen.append((attn_mask.dtype, tuple(attn_mask.shape), attn_mask.device.type, enable_gqa, k.shape[1],
                         q.stride(-1), k.stride(-1)))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    tree = TokenTree.cartesian([2, 1])
    with fake_cuda():
        t = fake_tiny_llama(num_kv_heads=kv_heads)
        cache = t.new_cache()
        t.forward([1, 2, 3, 4], cache)
        seen.clear()
        t.forward(list(range(len(tree))), cache, positions=4 + tree.depths.to(t.device), tree_mask=tree.mask.to(t.device))
    q = len(tree)
    assert seen == [(torch.bool, (1, 1, q, 4 + q), "cuda", kv_heads < 4, kv_heads, 1, 1)] * 2  # one per layer


def test_the_shape_only_ops_still_refuse_what_a_gpu_refuses():
    """tests/fakecuda.py makes linear's and SDPA's outputs by shape alone (fake mode ran their math op by
    op in Python, most of the sync-budget test's time): a cpu operand, a second dtype, grouped heads
    without enable_gqa still raise, and the shapes are the real ones."""
    F = torch.nn.functional
    with fake_cuda():
        x, w = (torch.empty(*s, device="cuda", dtype=torch.bfloat16) for s in ((2, 3, 8), (4, 8)))
        assert F.linear(x, w).shape == (2, 3, 4) and on_cuda(F.linear(x, w, w[:, 0]))
        for bad in (torch.empty(4, 8, dtype=torch.bfloat16), w.float()):
            with pytest.raises(RuntimeError):
                F.linear(x, bad)
        q, k = torch.empty(1, 4, 3, 8, device="cuda", dtype=torch.bfloat16), torch.empty(1, 2, 5, 8, device="cuda", dtype=torch.bfloat16)
        mask = torch.ones(3, 5, dtype=torch.bool, device="cuda")
        assert F.scaled_dot_product_attention(q, k, k[..., :6], attn_mask=mask, enable_gqa=True).shape == (1, 4, 3, 6)
        for args, kw in [((q, k, k), {}), ((q, k, k), {"attn_mask": mask.cpu(), "enable_gqa": True}),
                         ((q, k.float(), k), {"enable_gqa": True}), ((q, k[..., :6], k), {"enable_gqa": True})]:
            with pytest.raises(RuntimeError):
                F.scaled_dot_product_attention(*args, **kw)


def test_cpu_keeps_the_additive_float_mask(monkeypatch):
    """The CPU numerics were measured with the additive float mask: a CPU verification still
    hands SDPA that one (the ggml backends' own kernel takes it too: their bits do not move)."""
    from helpers import tiny_model

    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: seen.append(k.get("attn_mask")) or sdpa(*a, **k))
    t = tiny_model()
    tree = TokenTree.cartesian([2, 1])
    with torch.no_grad():
        cache = t.new_cache()
        t.forward([1, 2, 3, 4], cache)
        seen.clear()
        t.forward(list(range(len(tree))), cache, positions=4 + tree.depths, tree_mask=tree.mask)
    assert seen and all(m.dtype == torch.float64 and m.shape == (1, 1, len(tree), 4 + len(tree)) for m in seen)


# -- every method, end to end --------------------------------------------------------------
METHODS = {
    "ar": method_cfg("ar"),
    "vanilla_sd": method_cfg("vanilla_sd"),
    "pld": method_cfg("pld"),
    "self_sd": method_cfg("self_sd", skip={"attn": [1], "mlp": [0]}),
    "eesd": method_cfg("eesd", n_layers=1, allow_untrained=True, checkpoint=None),
    "medusa": method_cfg("medusa", num_heads=2, allow_untrained=True, checkpoint=None, sizes=[2, 1]),
    "space": method_cfg("space", k=2, allow_untrained=True, checkpoint=None),
}
CASES = [(m, "greedy", True) for m in METHODS] + [(m, "sampling", True) for m in METHODS if m != "ar"]
CASES += [("vanilla_sd", "sampling", False), ("pld", "sampling", False), ("medusa", "sampling", False)]


@pytest.mark.parametrize("name,mode,accept", CASES)
def test_method_generates_on_cuda(name, mode, accept):
    """Prefill, drafting, verification (with its residual branch when accept=False), cache
    rollback and the controller on fake CUDA tensors; token values are dummies."""
    sampling = SamplingConfig() if mode == "greedy" else SAMPLE
    with fake_cuda(bool_value=accept):
        t = fake_tiny_llama()
        m = build(name, t, METHODS[name], sampling, control("fixed", 2))
        g = m.generate([1, 5, 6, 7, 5, 6], 4, {2}, 0)
    assert len(g.tokens) == 4


@pytest.mark.parametrize("name", ["beta_ts", "adaptive_threshold", "cali_ts"])
def test_controllers_drive_a_draft_on_cuda(name):
    with fake_cuda():
        t = fake_tiny_llama()
        m = build("eesd", t, METHODS["eesd"], SAMPLE, control(name, 2))
        assert len(m.generate([1, 5, 6, 7], 4, {2}, 0).tokens) == 4


def test_cali_predictor_on_cuda_with_bf16_hidden_states():
    with fake_cuda():
        pred = CaliPredictor(32, max_i=4).to("cuda")
        th = torch.empty(3, 32, device="cuda", dtype=torch.bfloat16)
        p = pred(th, th, torch.tensor([1, 2, 9]))  # positions on the host, as the controller passes them
        assert on_cuda(p) and p.dtype == torch.float32 and p.shape == (3,)
        ctrl = CaliTS(**controller_args("cali_ts", k_max=4) | {"predictor": pred})
        ctrl.keep_drafting(DraftInfo(2, 0.5, th[0], th[1]))


# -- a training step of each trainer -------------------------------------------------------
# (up to the loss: autograd's engine would abort on a fake CUDA device, see tests/fakecuda.py)


def _batch(t):
    return pad_batch([([1, 2, 3, 4, 5, 6], 2), ([7, 8, 9], 1, [8, 9, 10])], 16, 0, t.device)


def test_eesd_and_vanilla_losses_on_cuda():
    with fake_cuda():
        t = fake_tiny_llama()
        ids, labels = _batch(t)
        assert on_cuda(ids, labels)
        exit_ = EarlyExit(t, 1).to(t.device)
        logits, _ = exit_(t, t.run_layers(t.embed(ids), None, 0, 1), None)
        loss, _ = ce_loss(logits, labels)
        draft = truncated_copy(t, 1)
        loss2, _ = ce_loss(draft.head(draft.run_layers(draft.embed(ids), None)), labels)
        assert on_cuda(loss, loss2) and loss.dtype == torch.float32


def test_medusa_and_space_losses_on_cuda():

    with fake_cuda():
        t = fake_tiny_llama()
        ids, labels = _batch(t)
        heads = MedusaHeads(t, 2)
        loss, _ = medusa_loss(t, heads, ids, labels)
        ft = finetuned_copy(t, "space", {"k": 2})
        s_ids, s_labels = sar_batch(ids, labels, 2, 0.0, random.Random(0), 0)
        loss2, _ = space_loss(ft, MaskedEmbed(t), s_ids, s_labels)
        assert on_cuda(loss, loss2, s_ids, s_labels)


def test_optimizer_step_on_cuda():
    with fake_cuda():
        heads = MedusaHeads(fake_tiny_llama(), 2)
        params = list(heads.parameters())
        for p in params:
            p.requires_grad_(True)
            p.grad = torch.empty_like(p)
        # SGD: AdamW's bias correction and clip_grad_norm_ divide by values read back as dummy 0s
        torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=False).step()


def test_cali_labels_from_cuda_states_and_host_predictor():
    """train_cali: labels from the target's states on the device; the predictor trains on the
    host (CaliPredictor.train_on moves each batch to its weights' device)."""
    with fake_cuda():
        t = fake_tiny_llama()
        exit_ = EarlyExit(t, 1).to(t.device)
        th, dh, i, lab = cali_examples(t, exit_, [([1, 2, 3, 4, 5, 6], 2)], 3, 4, 0)
        assert on_cuda(th, dh) and th.dtype == torch.float32
        pred = CaliPredictor(t.hidden_size, 3)
        p = pred(th, dh, i)
        assert p.device.type == "cpu" and p.shape == lab.shape


@pytest.mark.parametrize("name", ["self_sd", "eesd", "medusa"])
@pytest.mark.parametrize("mode", ["greedy", "sampling"])
def test_draft_vocab_subset_on_cuda(name, mode, tmp_path):
    """method.draft_vocab: the subset head's rows, its -inf scatter and its ids stay on the device."""
    ranked = tmp_path / "ranked.json"
    ranked.write_text(json.dumps(list(range(100, 130))))
    cfg = merge(METHODS[name], {"draft_vocab": {"size": 8, "source": str(ranked)}})
    with fake_cuda(bool_value=True):
        t = fake_tiny_llama()
        m = build(name, t, cfg, SamplingConfig() if mode == "greedy" else SAMPLE, control("fixed", 2))
        g = m.generate([1, 5, 6, 7, 5, 6], 4, {2}, 0)
    assert len(g.tokens) == 4 and m.describe()["draft_vocab"] == 8
