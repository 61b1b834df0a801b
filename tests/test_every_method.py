"""Every registered method (and, for drafting methods, every registered controller) reproduces
AR's greedy output on the tiny float64 model. Cases come from the registries, so a new method or
controller is tested the moment it is registered: it needs a conf/method/<name>.yaml (or
conf/control/<name>.yaml) that builds on the tiny model, plus at most an entry in TINY below.
Trained parts are left untrained (`allow_untrained`); greedy output must equal AR's anyway."""

from __future__ import annotations

import pytest
import torch
from helpers import CONF, ar_tokens, build, q4_tiny_model, tiny_model
from omegaconf import OmegaConf

import specbench.control  # noqa: F401 - registers the controllers
from specbench.config import schema, settings
import specbench.methods  # noqa: F401 - registers the methods
from specbench.control import CONTROLLERS
from specbench.methods.base import METHODS, SpeculativeMethod
from specbench.models import ModelAdapter
from specbench.kernels import ggml

K_MAX = 4
# what the tiny 4-layer model needs beyond conf/method/<name>.yaml (+ allow_untrained: true)
TINY = {
    "vanilla_sd": {"draft": {"num_layers": 1, "checkpoint": None}},
    "hf_assisted": {"k": K_MAX, "draft": {"num_layers": 1, "checkpoint": None}},
    "medusa": {"tree_from_accuracies": None, "sizes": [2, 2, 1, 1]},  # untrained heads have no accuracies
    "rest": {"corpus": [str(CONF.parent / "tests" / "data" / "retrieval_corpus.txt")]},  # a small datastore, built per test
    "samd": {"corpus": [str(CONF.parent / "tests" / "data" / "retrieval_corpus.txt")], "aux_settings": {"allow_untrained": True}},
    "swift": {"context_window": 4, "bayes_interval": 3},  # the search runs (and takes Bayesian steps) within 24 tokens
}
PROMPTS = [[5, 17, 99, 3, 42, 8], [40, 41, 42, 40, 41, 42, 40, 41]]  # the second repeats: lookup hits
CASES = [(m, c) for m in sorted(METHODS)
         for c in (sorted(CONTROLLERS) if issubclass(METHODS[m], SpeculativeMethod) and METHODS[m].uses_controller else [None])]


def method_config(name: str):
    untrained = {"allow_untrained": True} if "allow_untrained" in schema.METHODS[name] else {}
    return settings.shipped("method", name, untrained, TINY.get(name, {}))


def control_config(name: str):
    return settings.shipped("control", name, {"k": K_MAX} if name == "fixed" else {"k_max": K_MAX})


@pytest.mark.parametrize("method, controller", CASES, ids=[f"{m}-{c}" if c else m for m, c in CASES])
def test_greedy_equals_ar(method, controller, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))  # no trained parts from a local cache
    target = tiny_model()
    m = build(method, target, method_config(method), ctrl=control_config(controller) if controller else None)
    if controller:
        assert m.controller.name == controller
    # methods that change the weights (SPACE) are lossless w.r.t. their own fine-tuned model
    ref = m.finetuned_adapter if getattr(m, "baseline_weights", None) == "fine-tuned" else target
    for prompt in PROMPTS:
        got = m.generate(prompt, 24, frozenset(), 0)
        assert got.tokens == ar_tokens(ref, prompt, 24), f"{method} with {controller} differs from AR on {prompt}"


@pytest.mark.parametrize("method", sorted(m for m in METHODS if m != "hf_assisted"))  # transformers' own loop
def test_a_prefill_puts_no_prompt_row_but_the_last_through_the_vocabulary_head(method, tmp_path, monkeypatch):
    """On the embedded model the 49k-row LM head costs a fifth of a target forward per row: a method's
    prefill of a 40-token prompt needs each model's last row's logits (plus SPACE's k mask rows), not
    every row's. EESD's exit layer and SPACE's prefill put all 40 through it until session 55."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = tiny_model()
    m = build(method, target, method_config(method))
    rows = []
    heads = {id(a.lm_head): a.lm_head for a in [target, *vars(m).values()] if isinstance(a, ModelAdapter)}
    hooks = [h.register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[:-1].numel())) for h in heads.values()]
    try:
        with torch.no_grad():
            m.generate(list(range(3, 43)), 1, frozenset(), 0)
    finally:
        for hook in hooks:
            hook.remove()
    # one last row per model with a head of its own (a vanilla-SD draft has one), SPACE's masks besides
    assert sum(rows) <= len(heads) + int(getattr(m, "k", 0) if method == "space" else 0), rows


def test_every_registered_method_has_its_yaml_and_every_yaml_its_method():
    """Methods are discovered (specbench/methods/__init__.py), configs are files: both ways round."""
    files = {p.stem: OmegaConf.load(p).get("name") for p in (CONF / "method").glob("*.yaml")}
    assert sorted(METHODS) == sorted(files), "registered methods and conf/method/*.yaml differ"
    assert all(files[m] == m for m in METHODS), {m: files[m] for m in METHODS if files[m] != m}


@pytest.mark.skipif(ggml.compiler() is None, reason="model.backend=ggml needs a C compiler")
@pytest.mark.parametrize("backend", ["ggml", "ggml_q8"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_greedy_equals_ar_on_the_ggml_backends(method, backend, tmp_path, monkeypatch):
    """The embedded model's backends: weights in Q4_1 blocks, batch-invariant linear layers and
    attention for the target, its drafts and its trained parts (float32 ones through the fp32
    kernel); ggml_q8 also rounds activations to int8, which turns any batch dependence left into
    different tokens. Every method, its default controller, must still return AR's tokens."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = q4_tiny_model(backend)
    m = build(method, target, method_config(method))
    ref = m.finetuned_adapter if getattr(m, "baseline_weights", None) == "fine-tuned" else target
    for prompt in PROMPTS:
        with torch.no_grad():  # as the runner: with grad on, the backend's layers run F.linear
            got = m.generate(prompt, 24, frozenset(), 0)
        assert got.tokens == ar_tokens(ref, prompt, 24), f"{method} differs from AR on the {backend} backend on {prompt}"
