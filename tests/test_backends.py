"""model.backend: CPU linear-layer kernels (specbench/kernels/backends.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import GREEDY, ar_tokens, build, control, method_cfg, run_cli, tiny_model
from torch import nn

from specbench.core.errors import SpecBenchError
from specbench.methods.medusa import load_heads
from specbench.models import (
    BACKENDS,
    apply_backend,
    backend_of,
    truncated_copy,
)
from specbench.kernels import backends
from specbench.kernels.backends import (
    BATCH_DEPENDENT,
    HYBRID_MIN_ROWS,
    BackendLinear,
    check_backend,
)

FAST = [b for b in BACKENDS if b != "eager"]
# max |logits - eager logits| / max |eager logits| on a small random fp32 model (init_std 0.02)
TOLERANCE = {"ggml": 1e-5, "ggml_f32": 1e-5, "ggml_q8": 2e-2, "mkldnn": 1e-5, "hybrid": 1e-5, "bf16": 2e-2, "qint8": 6e-2}


def fp32_model(backend: str, **kw):
    """A private fp32 tiny model (the cached ones are shared: never switch their backend)."""
    m = copy.deepcopy(tiny_model(dtype="float32", **kw))
    apply_backend(m.model, backend)
    return m


def logits(target, ids) -> torch.Tensor:
    with torch.no_grad():
        return target.forward(ids, target.new_cache())[0]


def test_bad_backend_is_one_line_error():
    with pytest.raises(SpecBenchError, match=r"unknown model.backend 'fast'; allowed: .*bf16.*eager.*mkldnn"):
        check_backend("fast")
    assert check_backend(None) == "eager"


def test_bad_backend_on_cli_writes_nothing(tmp_path, data_dir):
    run_dir = tmp_path / "run"
    proc = run_cli(["model=tiny-llama", "method=pld", "model.backend=fast", f"run_dir={run_dir}"], data_dir)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "specbench: error: unknown model.backend 'fast'; allowed: bf16, eager, ggml, ggml_f32, ggml_q8, hybrid, mkldnn, qint8"
    ]
    assert not run_dir.exists()


@pytest.mark.parametrize("backend", FAST)
def test_forward_matches_eager_within_tolerance(backend):
    ref_model = fp32_model("eager", init_std=0.02)
    ids = list(range(20, 60))
    ref = logits(ref_model, ids)
    model = fp32_model(backend, init_std=0.02)
    out = logits(model, ids)
    assert backend_of(model.model) == backend
    assert "_packed" in model.lm_head.__dict__, "the packed kernel never ran (several rows)"
    err = (out - ref).abs().max().item() / ref.abs().max().item()
    assert err <= TOLERANCE[backend], (backend, err)
    if backend in ("bf16", "qint8"):
        assert err > 0, "a lower-precision backend returned eager's exact logits: it did not run"


@pytest.mark.parametrize("backend", FAST)
def test_float64_models_stay_exact(backend):
    ref = tiny_model()
    model = copy.deepcopy(ref)
    apply_backend(model.model, backend)
    ids = list(range(5, 30))
    assert torch.equal(logits(model, ids), logits(ref, ids))


@pytest.mark.parametrize("backend", FAST)
def test_packed_copy_follows_weight_changes(backend):
    """Loading a checkpoint or an optimizer step changes the weight in place: the packed copy
    must not keep serving the old one."""
    lin = nn.Linear(16, 8)
    apply_backend(lin, backend)
    x = torch.randn(6, 16)  # enough rows for hybrid's packed path
    with torch.no_grad():
        before = lin(x)
        lin.weight.mul_(-1.0)
        lin.bias.zero_()
        after = lin(x)
        expect = nn.functional.linear(x, lin.weight, lin.bias)
    assert not torch.allclose(after, before)
    assert torch.allclose(after, expect, rtol=TOLERANCE[backend] * 5, atol=TOLERANCE[backend] * 5)


@pytest.mark.parametrize("backend", FAST)
def test_training_runs_eagerly_with_gradients(backend):
    lin = nn.Linear(16, 8)
    apply_backend(lin, backend)
    x = torch.randn(3, 16)
    with torch.enable_grad():
        y = lin(x)
        y.sum().backward()
    assert torch.equal(y.detach(), nn.functional.linear(x, lin.weight, lin.bias).detach())
    assert lin.weight.grad is not None
    clone = copy.deepcopy(lin)  # EESD copies the target's last layer, SPACE the whole model
    assert type(clone) is BackendLinear and "_packed" not in clone.__dict__


def test_hybrid_routes_few_rows_to_f_linear(monkeypatch):
    """hybrid: 1..HYBRID_MIN_ROWS-1 rows run F.linear itself (bit-identical to eager), from
    HYBRID_MIN_ROWS rows on the packed oneDNN kernel."""
    calls = []
    pack, run = backends.KERNELS["hybrid"]
    monkeypatch.setitem(backends.KERNELS, "hybrid", (pack, lambda x, p: calls.append(x.shape) or run(x, p)))
    lin = nn.Linear(64, 32)
    apply_backend(lin, "hybrid")
    assert "_packed" in lin.__dict__, "packed when the backend was applied, not inside the first timed forward"
    with torch.no_grad():
        for rows in range(1, HYBRID_MIN_ROWS):
            x = torch.randn(1, rows, 64)
            assert torch.equal(lin(x), nn.functional.linear(x, lin.weight, lin.bias))
        assert not calls, "a few-row input went through oneDNN"
        lin(torch.randn(1, HYBRID_MIN_ROWS, 64))
    assert calls, "a verify-sized input did not reach the packed kernel"


def test_eager_restores_plain_linear_and_keeps_tying():
    model = fp32_model("mkldnn")
    assert type(model.lm_head) is BackendLinear
    assert model.lm_head.weight is model.embed_tokens.weight  # tied head untouched by the swap
    apply_backend(model.model, "eager")
    assert all(type(m) is nn.Linear for m in model.model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("backend", FAST)
def test_drafts_and_trained_parts_follow_the_target_backend(backend):
    target = fp32_model(backend)
    draft = truncated_copy(target, 1)
    assert backend_of(draft.model) == backend
    heads, _ = load_heads(target, method_cfg("medusa", num_heads=2, share_head=False, checkpoint=None, allow_untrained=True))
    assert {m.backend for m in heads.modules() if isinstance(m, BackendLinear)} == {backend}


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_speculative_equals_ar_under_each_backend(backend):
    """AR and the method run the same (backend) model: greedy output must be AR's. qint8 rounds a
    k-token verify differently from one-token steps (one activation scale per call): on this tiny
    model that changes the tokens, which is why it is labelled batch-dependent and never a default
    (bench/backends.py measures how often on the embedded model). Until this test ran under
    no_grad, as the runner does, every backend here silently ran F.linear and qint8 'agreed'."""
    target = fp32_model(backend)
    prompt = list(b"Speculative decoding on a CPU")
    ar = ar_tokens(target, prompt, 40)
    for name, cfg in [("vanilla_sd", method_cfg("vanilla_sd")), ("pld", method_cfg("pld"))]:
        with torch.no_grad():  # as the runner does (with grad on, the layers run F.linear)
            got = build(name, target, cfg, GREEDY, control("fixed", 4)).generate(prompt, 40, frozenset(), 0).tokens
        if backend in BATCH_DEPENDENT:
            assert len(got) == len(ar), (backend, name)
        else:
            assert got == ar, (backend, name)
    assert backend_of(target.model) == backend


def test_backend_does_not_change_the_model_key():
    """Checkpoints are keyed by model key: the same weights under another backend must find them."""
    assert tiny_model(backend="mkldnn").key == tiny_model().key == tiny_model(backend="eager").key
