"""`model.draft_quant: q8_0`: trained draft parts are rounded to ggml's Q8_0 blocks at load, so the
ggml backends run them on the quantized kernels (a float32 part runs the fp32 kernel: EESD's exit
layer cost two of the target's Q4_1 layers per draft token). The draft changes slightly; the
verification does not, so every such method must still return AR's tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from torch import nn

from specbench.kernels import ggml
from specbench.kernels.backends import BackendLinear
from specbench.models import ModelAdapter, truncated_copy
from specbench.models.artifacts import save_checkpoint
from specbench.methods.eesd import EarlyExit
from specbench.methods.medusa import MedusaHeads, medusa2_structure
from specbench.methods.space import lora_expected, space_structure
from tests.helpers import ar_tokens, build, method_cfg, q4_tiny_model

pytestmark = pytest.mark.skipif(ggml.compiler() is None, reason="model.backend=ggml needs a C compiler")

PROMPTS = [[5, 17, 99, 3, 42, 8], [40, 41, 42, 40, 41, 42, 40, 41]]
SETTINGS = {"steps": 1, "train_sequences": 1}


def test_a_weight_is_rounded_as_llama_cpp_stores_it_and_the_kernel_keeps_it_as_q8_0():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    r = ggml.round_to_q8_0(w)
    q8 = GGMLQuantizationType.Q8_0
    assert np.array_equal(r.numpy(), quants.dequantize(quants.quantize(w.numpy(), q8), q8))
    assert not torch.equal(r, w)
    bw = ggml.recover(r)
    assert bw.kind == "q8_0" and torch.equal(bw.dequantize(), r)
    assert ggml.round_to_q8_0(w.double()).dtype == torch.float64
    assert ggml.round_to_q8_0(torch.randn(4, 33)) is None  # rows must be whole blocks of 32


def noisy(state: dict) -> dict:
    """A trained-looking state: no longer the target's Q4_1 blocks."""
    g = torch.Generator().manual_seed(1)
    return {k: v + 0.01 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in state.items()}


def with_trained_part(name: str, target):
    """The method's config; EESD's exit layer and the vanilla-SD draft start as copies of the target's
    (already blocks), so a noisy checkpoint stands in for a trained one."""
    if name == "eesd":
        exit_ = EarlyExit(target, 1)
        save_checkpoint("eesd", target.key, exit_.structure(), noisy(exit_.state_dict()), SETTINGS)
        return method_cfg("eesd", n_layers=1)
    if name == "vanilla_sd":
        draft = truncated_copy(target, 1)
        state = {k: v for k, v in draft.model.state_dict().items() if ".layers." in k or k.endswith("norm.weight")}
        save_checkpoint("vanilla_draft", target.key, {"n_layers": 1}, noisy(state), SETTINGS)
        return method_cfg("vanilla_sd", draft={"num_layers": 1, "checkpoint": "auto"})
    if name == "medusa":  # its residual blocks start at zero, which is a block weight too
        heads = MedusaHeads(target, 4, True)
        save_checkpoint("medusa", target.key, heads.structure(), noisy(heads.state_dict()), SETTINGS)
        return method_cfg("medusa", tree_from_accuracies=None, sizes=[2, 2, 1, 1])
    if name == "space":  # a LoRA delta merged into a copy of the target: the copy's layers are no longer blocks
        cfg = method_cfg("space", k=2)
        st = space_structure(cfg)
        g = torch.Generator().manual_seed(2)
        lora = {k: 0.05 * torch.randn(shape, generator=g, dtype=dt) for k, (shape, dt) in
                lora_expected(target.model, st["lora_r"]).items()}
        save_checkpoint("space", target.key, st, {"lora": lora, "mask_embedding": torch.zeros(target.hidden_size)}, SETTINGS)
        return cfg
    if name == "medusa2":  # a jointly fine-tuned backbone (saved whole, the LoRA merged) and its heads
        cfg = method_cfg("medusa", variant="medusa2", tree_from_accuracies=None, sizes=[2, 2, 1, 1])
        heads = MedusaHeads(target, 4, True)
        state = {"model": noisy(target.model.state_dict()), "heads": noisy(heads.state_dict())}
        save_checkpoint("medusa2", target.key, medusa2_structure(cfg), state, SETTINGS)
        return cfg
    return method_cfg(name, allow_untrained=True)


def part_kinds(m, target) -> list[str]:
    """The block kind each linear layer of the method's own parts runs as on `ggml` ('f32': unquantized)."""
    mods = [v.model if isinstance(v, ModelAdapter) else v for v in vars(m).values()
            if (isinstance(v, ModelAdapter) and v is not target) or isinstance(v, nn.Module)]
    targets = {id(x) for x in target.model.modules()}
    return [x.packed()[0].kind for mod in mods for x in mod.modules() if isinstance(x, BackendLinear) and id(x) not in targets]


@pytest.mark.parametrize("name", ["eesd", "eagle", "eagle3", "medusa", "hydra", "vanilla_sd", "space", "medusa2"])
def test_trained_parts_run_as_q8_0_blocks_and_the_method_stays_lossless(name, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = q4_tiny_model("ggml")
    cfg = with_trained_part(name, target)
    method = "medusa" if name == "medusa2" else name  # Medusa-2 is Medusa's variant
    assert "f32" in part_kinds(build(method, target, cfg), target)  # what the option changes
    target.draft_quant = "q8_0"
    m = build(method, target, cfg)
    kinds = part_kinds(m, target)
    assert kinds and set(kinds) <= {"q4_1", "q8_0"}, kinds
    assert str(m.describe().get("draft_quant")).startswith("q8_0 ("), m.describe()  # the run records it
    for prompt in PROMPTS:
        with torch.no_grad():
            got = m.generate(prompt, 24, frozenset(), 0)
        # m.target: SPACE and Medusa-2 decode their fine-tuned copy, whose AR the run's baseline is
        assert got.tokens == ar_tokens(m.target, prompt, 24), f"{name} with draft_quant=q8_0 differs from AR on {prompt}"


def test_the_report_keeps_one_model_and_tells_the_rounded_parts_apart(tmp_path):
    """model.draft_quant is how a method's parts are rounded, not which model ran: the report keeps
    both runs under one model (one set of plots) and shows the setting as the method's variant."""
    from specbench.report.load import Run, model_identity

    plain = {"model.name": "m", "model.dtype": "float32", "method.name": "eesd"}
    rounded = plain | {"model.draft_quant": "q8_0"}
    assert model_identity(rounded, "m") == model_identity(plain, "m")
    variant = Run(tmp_path, {}, rounded).variant()
    assert variant["model.draft_quant"] == "q8_0" and "model.dtype" not in variant
