"""Medusa-2: greedy output equals AR on the jointly trained weights, the training lowers both
losses, the heads warm-up leaves the backbone untouched, a checkpoint reloads identically."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specbench.run import runner
from specbench.models.artifacts import checkpoint_path, load_checkpoint
from specbench.core.errors import SpecBenchError
from specbench.methods.medusa import medusa2_structure
from specbench.metrics.acceptance import prefix_agreement
from specbench.train import medusa2  # registers the Medusa-2 trainer
from specbench.train.trainers import TRAINERS
from tests.helpers import CONF, ar_tokens, build, method_cfg, tiny_model
from tests.test_medusa import tiny_sequences, train_cfg

prompts = st.lists(st.integers(3, 258), min_size=1, max_size=12)
# full fine-tuning: these tests check the joint loss, warm-up and reload, whatever the backbone recipe
MCFG = {"name": "medusa", "variant": "medusa2", "num_heads": 3, "share_head": False, "sizes": [2, 2, 1],
        "lambda0": 0.2, "lm_loss": "kl", "heads_lr_ratio": 10.0, "lr": 3e-4, "warmup_epochs": 2, "warmup": "heads",
        "backbone": "full"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short Medusa-2 training (through the Medusa trainer's variant dispatch), cached."""
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECBENCH_CACHE_DIR", str(cache))
    torch.manual_seed(0)
    target = tiny_model()
    w0 = {k: v.clone() for k, v in target.model.state_dict().items()}
    res = TRAINERS["medusa"](target, train_cfg(MCFG, epochs=4, labels="target"), tiny_sequences())
    yield target, res, w0, cache
    mp.undo()


def test_training_lowers_medusa_loss_and_kl_term_holds_the_backbone(trained, tmp_path, monkeypatch):
    target, res, w0, _ = trained
    b, a = res["held_out_before"], res["held_out_after"]
    assert a["medusa"] < 0.8 * b["medusa"]
    assert b["lm"] == pytest.approx(0.0, abs=1e-9)  # the copy starts as the original: KL 0
    for k, v in target.model.state_dict().items():  # the shared original is never trained
        assert torch.equal(v, w0[k]), k
    # the same run with the KL term drowned (lambda0 huge; AdamW ignores the loss scale) drifts
    # much further from the original: the KL term is what keeps the backbone's behaviour
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    loose = TRAINERS["medusa2"](target, train_cfg(MCFG | {"lambda0": 1e4}, epochs=4, labels="target"), tiny_sequences())["held_out_after"]
    assert a["lm"] < 0.5 * loose["lm"]
    assert a["backbone_agreement"] > loose["backbone_agreement"]


def test_ce_variant_lowers_both_losses(tmp_path, monkeypatch):
    """With lm_loss=ce (SFT-style) L_LM starts above 0, and the joint stage lowers it and L_Medusa-1."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    res = TRAINERS["medusa2"](tiny_model(), train_cfg(MCFG | {"lm_loss": "ce"}, epochs=4), tiny_sequences())
    b, a = res["held_out_before"], res["held_out_after"]
    assert a["lm"] < b["lm"] and a["medusa"] < b["medusa"]


def test_heads_warmup_freezes_the_backbone(tmp_path, monkeypatch):
    """Warm-up only (no joint epoch): the saved backbone is bit-identical to the original, the heads moved."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    target = tiny_model()
    cfg = train_cfg(MCFG)  # no joint epoch: train.epochs=0, which a run's config refuses, set unchecked
    res = TRAINERS["medusa2"](target, replace(cfg, train=replace(cfg.train, epochs=0)), tiny_sequences())
    assert res["held_out_after"]["medusa"] < res["held_out_before"]["medusa"]
    ft = build("medusa", target, method_cfg(**MCFG)).finetuned_adapter  # reloaded from the checkpoint
    saved = ft.model.state_dict()
    for k, v in target.model.state_dict().items():
        assert torch.equal(saved[k], v), k


def test_reload_identical_and_greedy_equals_finetuned_ar(trained, monkeypatch):
    target, _, _, cache = trained
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(cache))  # the module's trained weights
    cfg = method_cfg(**MCFG)
    a, b = build("medusa", target, cfg), build("medusa", target, cfg)
    assert a.info["heads_trained"] and a.baseline_weights == "fine-tuned" and a.lossless
    ft = a.finetuned_adapter
    assert not torch.equal(ft.model.model.layers[0].mlp.up_proj.weight, target.model.model.layers[0].mlp.up_proj.weight)
    for x, y in zip(ft.model.state_dict().values(), b.finetuned_adapter.model.state_dict().values()):
        assert torch.equal(x, y)
    for x, y in zip(a.heads.state_dict().values(), b.heads.state_dict().values()):
        assert torch.equal(x, y)
    prompt = tiny_sequences(1, seed=5)[0][0][:10]
    ga = a.generate(prompt, 24, frozenset(), 0)
    assert ga.tokens == b.generate(prompt, 24, frozenset(), 0).tokens
    assert ga.tokens == ar_tokens(ft, prompt, 24)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(prompt=prompts, sizes=st.sampled_from([[2, 2, 1], [3, 1], [1, 1, 1]]))
def test_greedy_equals_finetuned_ar(trained, prompt, sizes, monkeypatch):
    target, _, _, cache = trained
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(cache))  # the module's trained weights
    m = build("medusa", target, method_cfg(**MCFG | {"sizes": sizes}))
    assert m.generate(prompt, 16, frozenset(), 0).tokens == ar_tokens(m.finetuned_adapter, prompt, 16)


def test_untrained_and_bad_variant(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = tiny_model()
    with pytest.raises(SpecBenchError, match="method.variant=medusa2"):
        build("medusa", target, method_cfg("medusa", variant="medusa2"))
    m = build("medusa", target, method_cfg("medusa", variant="medusa2", allow_untrained=True))
    assert m.generate([5, 6, 7], 12, frozenset(), 0).tokens == ar_tokens(target, [5, 6, 7], 12)
    with pytest.raises(SpecBenchError, match="allowed: medusa1, medusa2"):
        build("medusa", target, method_cfg("medusa", variant="medusa3", allow_untrained=True))
    assert load_checkpoint("medusa2", target.key, {"variant": "medusa2"}, required=False) is None


def test_default_recipe_is_lora_on_backbone_and_lm_head_with_dropout(tmp_path, monkeypatch):
    """The paper's Medusa-2 recipe (section 4) is the default: LoRA on every linear map AND the LM
    head, dropout 0.05; the tied head is untied so the embedding stays the original; the merged
    checkpoint reloads that way and decodes equal to its own AR."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    seen = []
    real = medusa2.apply_lora

    def spy(ft, structure):
        peft_model = real(ft, structure)
        seen.append(peft_model.peft_config["default"])
        return peft_model

    monkeypatch.setattr(medusa2, "apply_lora", spy)
    torch.manual_seed(0)
    target = tiny_model()
    mcfg = {k: v for k, v in MCFG.items() if k != "backbone"} | {"lora_r": 4, "lora_alpha": 8, "lr": 3e-3, "warmup_epochs": 1}
    res = TRAINERS["medusa2"](target, train_cfg(mcfg, epochs=2, labels="target"), tiny_sequences())
    assert res["held_out_after"]["medusa"] < res["held_out_before"]["medusa"]
    (conf,) = seen
    assert conf.lora_dropout == 0.05 and "lm_head" in conf.target_modules and "q_proj" in conf.target_modules
    m = build("medusa", target, method_cfg(**mcfg))
    assert m.info["heads_trained"] and m.info["backbone"] == "lora"
    ft, orig = m.finetuned_adapter.model, target.model
    assert not torch.equal(ft.lm_head.weight, orig.lm_head.weight)  # the head was adapted ...
    assert torch.equal(ft.model.embed_tokens.weight, orig.model.embed_tokens.weight)  # ... the embedding was not
    q = ft.model.layers[0].self_attn.q_proj
    assert isinstance(q, torch.nn.Linear) and not torch.equal(q.weight, orig.model.layers[0].self_attn.q_proj.weight)
    assert orig.lm_head.weight is orig.model.embed_tokens.weight  # the shared original is untouched
    prompt = [5, 6, 7, 8]
    assert m.generate(prompt, 16, frozenset(), 0).tokens == ar_tokens(m.finetuned_adapter, prompt, 16)


def test_each_backbone_recipe_has_its_own_checkpoint():
    """Training one recipe never overwrites (or is loaded as) the other: the recipe and the LoRA
    shape are in the cache key (results/bench/medusa2_recipe.md trains both side by side)."""
    def path(**kw):
        return checkpoint_path("medusa2", "m", medusa2_structure(method_cfg("medusa", variant="medusa2", **kw)))

    assert len({path(backbone="lora"), path(backbone="full"), path(backbone="lora", lora_r=8)}) == 3
    assert path(backbone="full", lora_r=8) == path(backbone="full")  # LoRA settings mean nothing to full


def test_backbone_choice_errors():
    with pytest.raises(SpecBenchError, match="backbone .qlora.; allowed: full, lora"):
        build("medusa", tiny_model(), method_cfg("medusa", variant="medusa2", backbone="qlora", allow_untrained=True))
    with pytest.raises(SpecBenchError, match="unknown key 'method.lora'; allowed: .*backbone"):  # the old key: refused
        build("medusa", tiny_model(), method_cfg("medusa", variant="medusa2", lora=True, allow_untrained=True))


def test_prefix_agreement():
    assert prefix_agreement([[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]]) == (4, 6)  # no credit after a difference
    assert prefix_agreement([[1, 2]], [[1]]) == (1, 2)


def test_run_reports_base_weights_and_agreement(trained, tmp_path, data_dir, monkeypatch):
    """The runner's AR runs on the fine-tuned weights (lossless), the "AR base" row on the
    original ones, and the record says how far the original's output follows the fine-tuned AR's."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(trained[3]))  # the module's trained weights
    over = [f"{k}={v}" for k, v in MCFG.items() if k not in ("name", "sizes")]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny-llama", "method=medusa", "task=gsm8k", "task.num_samples=2",
                                           f"task.data_dir={data_dir}", "max_new_tokens=16", "profile.enabled=false",
                                           "warmup_tokens=2", f"run_dir={tmp_path / 'run'}", "progress=false",
                                           "threads=1", "method.sizes=[2,2,1]", "method.tree_from_accuracies=null"] + [f"method.{o}" for o in over])
    grad = torch.is_grad_enabled()
    try:
        s = runner.run(cfg)
    finally:
        torch.set_grad_enabled(grad)
    assert s["matches_ar"] == 2 and s["meta"]["baseline_weights"] == "fine-tuned"
    assert "base" in s and 0 <= s["base"]["agreement"] < 1  # the trained backbone changed some greedy choice


def test_lambda0_sine_ramp_weights_the_heads_loss_up_to_its_peak_at_the_last_step(tmp_path, monkeypatch):
    """Joint loss = L_LM + lambda0(s) * L_Medusa-1, lambda0(s) = lambda0 * sin(pi/2 * (s+1)/S) over
    the S planned joint steps (paper 4.2; the authors' trainer). With both losses pinned to
    constants, each logged loss reveals the weight used at that step. Breaks on a constant weight,
    a ramp on L_LM instead of the heads, a reversed ramp, or a ramp over the wrong steps (counting
    the warm-up epoch, restarting each epoch)."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    A, B, peak = 2.0, 3.0, 0.5
    real = medusa2.loss_parts

    def pinned(*args, **kw):
        lm, med, agree, same = real(*args, **kw)
        return (None if lm is None else lm * 0 + A), med * 0 + B, agree, same

    monkeypatch.setattr(medusa2, "loss_parts", pinned)
    cfg = train_cfg(MCFG | {"lambda0": peak, "lambda0_schedule": "sine", "warmup_epochs": 1}, epochs=2)
    torch.manual_seed(0)
    path = TRAINERS["medusa2"](tiny_model(), cfg, tiny_sequences())["medusa2"]
    log = json.loads(Path(path).with_suffix(".log.json").read_text())["log"]
    joint = [r for r in log if r["stage"] == "joint"]
    n_train = len(tiny_sequences()) - max(1, int(len(tiny_sequences()) * 0.25))
    S = 2 * math.ceil(n_train / 4)
    assert len(joint) == S and [r["stage"] for r in log[: len(log) - S]] == ["warm-up"] * (len(log) - S)
    want = [peak * math.sin(math.pi / 2 * (s + 1) / S) for s in range(S)]
    assert [r["loss"] for r in joint] == pytest.approx([A + w * B for w in want], rel=1e-6)
    assert joint[-1]["lambda0"] == pytest.approx(peak) and joint[0]["lambda0"] < 0.3 * peak
    assert all(r["loss"] == pytest.approx(B) for r in log if r["stage"] == "warm-up")  # heads only, unweighted


def test_lambda0_schedules():
    assert [medusa2.lambda0_at(s, 4, 0.2, "constant") for s in range(4)] == [0.2] * 4
    assert [medusa2.lambda0_at(s, 4, 0.2, "linear") for s in range(4)] == pytest.approx([0.05, 0.1, 0.15, 0.2])
    assert medusa2.lambda0_at(1, 4, 0.2, "sine") == pytest.approx(0.2 * math.sin(math.pi / 4))
    assert medusa2.lambda0_at(9, 4, 0.2, "sine") == pytest.approx(0.2)  # never past the peak
