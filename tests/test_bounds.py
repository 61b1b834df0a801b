"""Every size-like setting bounded by the model (specbench/config/bounds.py, issue 42): each integer key of every
method and controller is decided (bounded, or listed with why not), each bounded one set past its bound is
one line naming it before anything loads, and the widths the built method reports are checked again
before the run directory exists."""

from __future__ import annotations

import json

import pytest

from specbench.config import bounds, schema
from specbench.config.compose import compose, validate
from specbench.core.errors import SpecBenchError

HUGE = 10**9
KINDS = {bounds.VOCAB, bounds.CONTEXT, bounds.WIDTH, bounds.MEMORY, bounds.LAYERS, "hidden (medusa2 with LoRA)",
         "hidden (lora: true)"}


def int_keys(table: dict) -> set[str]:
    return {k for k, spec in table.items() if spec.type == "int" or (spec.type == "list" and spec.item.type == "int")
            or k in ("tree", "sizes")}  # medusa's and hydra's trees: lists of ranks


@pytest.mark.parametrize("method", sorted(schema.METHODS))
def test_every_size_key_of_every_method_is_decided(method):
    decided = bounds.SIZES.get(method, {})
    missing = int_keys(schema.METHODS[method]) - set(decided)
    assert not missing, f"{method}: bound these in specbench/config/bounds.py SIZES (or say there why not): {sorted(missing)}"
    assert set(decided) <= set(schema.METHODS[method]), f"{method}: SIZES names keys the method does not have"


def test_every_size_key_of_every_controller_is_decided():
    keys = set().union(*(int_keys(t) for t in schema.CONTROLS.values()))
    assert keys == set(bounds.SIZES["control"])


def bounded(table: dict) -> list[str]:
    return [k for k, why in table.items() if set(why.split("+")) <= KINDS]


# a value past every bound of the key (lists where the key takes a list), and what must be set beside it
VALUE = {"sizes": "[100000]", "tree": "[[0],[100000]]", "skip.attn": f"[{HUGE}]", "skip.mlp": f"[{HUGE}]",
         # Token Recycling's ranks index its top-k, not the vocabulary: a tree past the context's width
         ("token_recycling", "tree"): "[" + ",".join(f"[{i}]" for i in range(5000)) + "]"}
BESIDE = {("medusa", "sizes"): ["method.tree_from_accuracies=null"], ("medusa", "tree"): ["method.tree_from_accuracies=null"],
          ("rest", "min_suffix"): [f"method.max_suffix={HUGE}"], ("pld", "min_ngram"): [f"method.max_ngram={HUGE}"],
          ("medusa", "lora_r"): ["method.variant=medusa2"], ("space", "lora_r"): ["method.lora=true"]}
PARTNER = {"min_suffix": "max_suffix", "min_ngram": "max_ngram"}  # the rule between them may name the other
CASES = [(m, k) for m in sorted(bounds.SIZES) if m != "control" for k in bounded(bounds.SIZES[m])]


@pytest.mark.parametrize("method, key", CASES, ids=[f"{m}.{k}" for m, k in CASES])
def test_each_bounded_key_past_its_bound_is_refused_naming_it(method, key):
    value = VALUE.get((method, key), VALUE.get(key, HUGE))
    cfg = compose(["model=tiny-llama", f"method={method}", f"method.{key}={value}", *BESIDE.get((method, key), [])])
    with pytest.raises(SpecBenchError) as e:
        validate(cfg)
    named = [f"method.{key}="] + ([f"method.{PARTNER[key]}="] if key in PARTNER else [])
    assert any(str(e.value).startswith(n) for n in named) and "\n" not in str(e.value), str(e.value)


def test_lora_rank_is_bounded_only_where_lora_is_used():
    validate(compose(["model=tiny-llama", "method=medusa", f"method.lora_r={HUGE}"]))  # medusa1: no LoRA
    validate(compose(["model=tiny-llama", "method=space", "method.lora=false", f"method.lora_r={HUGE}"]))  # full fine-tuning


@pytest.mark.parametrize("key", sorted(bounds.SIZES["control"]))
def test_controller_sizes_past_the_context_are_refused(key):
    with pytest.raises(SpecBenchError, match=rf"^control.{key}=4095 is not allowed; .*4095 fit \(the context of the model tiny-llama, 4096"):
        validate(compose(["model=tiny-llama", "method=vanilla_sd", "control=threshold" if key == "k_max" else "control=fixed",
                          f"control.{key}=4095"]))
    validate(compose(["model=tiny-llama", "method=vanilla_sd", f"control.{key}=4094"]))  # k + 1 = 4095: fits


@pytest.mark.parametrize("method", sorted(schema.METHODS))
def test_the_shipped_defaults_pass(method):
    validate(compose(["model=tiny-llama", f"method={method}"]))
    validate(compose([f"method={method}"]))  # the embedded model (its GGUF header), where installed


def test_the_profile_context_counts_for_profiled_widths_only():
    """A tree the start-up profile measures must fit after profile.context; a linear draft's k need not."""
    base = ["model=tiny-llama", "method=rest", "method.num_draft=4000"]
    with pytest.raises(SpecBenchError, match=r"method.num_draft=4000 .* 3896 fit .* less profile.context=200"):
        validate(compose(base))
    validate(compose([*base, "profile.enabled=false"]))
    validate(compose(["model=tiny-llama", "method=vanilla_sd", "control.k=4000"]))  # not profiled


def test_dense_nodes_counts_a_cartesian_tree():
    from specbench.engine.tree import TokenTree

    for sizes in ([2, 2, 1, 1], [3], [4, 3, 2], [1, 1, 1]):
        assert bounds.dense_nodes(sizes) == len(TokenTree.cartesian(sizes)) - 1


def test_the_built_methods_widths_are_checked_before_the_run_dir(tmp_path, data_dir):
    """A tree given as a file has no size the config can see: the width the built method reports is
    refused against the loaded model's context, before the run directory exists."""
    from specbench.run.runner import run

    paths = [[i] for i in range(200)] + [[i, j] for i in range(200) for j in range(20)]  # 4200 nodes, depth 2
    (tmp_path / "tree.json").write_text(json.dumps(paths))
    cfg = compose(["model=tiny-llama", "method=medusa", f"method.tree={tmp_path / 'tree.json'}", "method.tree_from_accuracies=null",
                   "method.allow_untrained=true", "method.train_if_missing=false", "profile.enabled=false", "progress=false",
                   f"task.data_dir={data_dir}", "task.num_samples=1", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(SpecBenchError, match=r"^method medusa verifies 4,201 tokens per step; the model's context \(4096\) less one "
                                             r"prompt token leaves room for 4095; choose a smaller tree$"):
        run(cfg)
    assert not (tmp_path / "run").exists()
