"""The typed schema (specbench/config/schema.py) against what ships: every key of conf/ has an entry,
every entry is shipped (or marked optional), its choice lists equal the code's registries, every
shipped group choice validates, and the model shape read without weights matches the loader's."""

from pathlib import Path

import pytest
import yaml
from helpers import tiny_settings

from specbench.config import modelinfo, schema
from specbench.config.compose import CONF_DIR, compose
from specbench.config.validate import check_value, validate
from specbench.core.errors import SpecBenchError

GROUP_TABLES = {"method": schema.METHODS, "task": schema.TASKS, "control": schema.CONTROLS}


def leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if k in ("defaults", "hydra"):
            continue
        if isinstance(v, dict) and v:  # an empty mapping ({}: samd's aux_settings) is a shipped key
            yield from leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def shipped(group: str) -> dict[str, set[str]]:
    """choice -> the keys its YAML file ships."""
    out = {}
    for p in sorted((CONF_DIR / group).glob("*.yaml")):
        data = yaml.safe_load(p.read_text()) or {}
        out[data.get("loader") if group == "model" else data.get("name", p.stem)] = set(leaves(data))
    return out


@pytest.mark.parametrize("group", ["method", "task", "control", "model"])
def test_every_shipped_key_has_a_schema_entry_and_back(group):
    tables = schema.MODELS if group == "model" else GROUP_TABLES[group]
    files = shipped(group)
    assert set(files) == set(tables)
    for choice, keys in files.items():
        table = tables[choice]
        assert keys <= set(table), (choice, keys - set(table))
        stale = {k for k, spec in table.items() if not spec.optional} - keys
        assert not stale, (choice, stale)  # an entry the YAML does not ship: mark it optional or drop it


def test_top_level_and_train_tables_match_their_files():
    top = set(leaves(yaml.safe_load((CONF_DIR / "config.yaml").read_text())))
    assert top == set(schema.TOP)
    train = set(leaves(yaml.safe_load((CONF_DIR / "train" / "default.yaml").read_text())))
    flat = {k for k in schema.TRAIN if schema.TRAIN[k].type != "table"}
    nested = {f"first_use.train.{k}" for k in schema.TRAIN["first_use.train"].table}
    assert train - flat <= nested and flat <= train


def test_choice_lists_equal_the_code_registries():
    from specbench.control import CONTROLLERS
    from specbench.control.beta_ts import COUNTS
    from specbench.methods import METHODS
    from specbench.models import DTYPES, MODEL_LOADERS, tiny_llama_config
    from specbench.kernels.backends import BACKENDS
    from specbench.models.tokenizer import ByteTokenizer
    from specbench.tools.skipsearch import SEARCH_FILE
    from specbench.tasks import TASKS

    assert set(schema.CONTROLS) == set(CONTROLLERS)
    assert set(schema.METHODS) == set(METHODS)
    assert set(schema.TASKS) == set(TASKS)
    assert set(schema.MODELS) == set(MODEL_LOADERS)
    assert set(schema.DTYPES) == {"auto", *DTYPES}
    assert set(schema.BACKENDS) == set(BACKENDS) and set(schema.COUNTS) == set(COUNTS)
    assert set(schema.SEARCH) == set(yaml.safe_load(SEARCH_FILE.read_text()))
    assert modelinfo.TINY_VOCAB == ByteTokenizer.vocab_size
    assert modelinfo.TINY_CONTEXT == tiny_llama_config(tiny_settings()).max_position_embeddings


def choices(group):
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.mark.parametrize("override", [f"method={m}" for m in choices("method")] + [f"task={t}" for t in choices("task")]
                         + [f"control={c}" for c in choices("control")] + [f"model={m}" for m in choices("model")])
def test_every_shipped_choice_validates(override):
    extra = ["model.id=gpt2"] if override == "model=hf" else []
    validate(compose([override, *extra]))


def test_first_use_budget_is_accepted():
    validate(compose(["train.max_minutes=1.5", "train.first_use.train.max_minutes=0.5"]))


def test_value_checks_bite():
    spec = schema.INT(1, choices=("auto",))
    for bad in (0, 2.5, True, "2", None, float("nan")):
        with pytest.raises(SpecBenchError):
            check_value("k", bad, spec)
    for good in (1, 10**9, "auto"):
        check_value("k", good, spec)
    with pytest.raises(SpecBenchError, match="expected a finite number > 0"):
        check_value("lr", -0.0, schema.POS())


def test_model_shape_without_weights_matches_the_loader():
    from specbench.models import tiny_llama_config

    cfg = tiny_settings()
    shape, real = modelinfo.model_shape(cfg), tiny_llama_config(cfg)
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.intermediate, shape.vocab) == (
        real.num_hidden_layers, real.hidden_size, real.num_attention_heads, real.num_key_value_heads,
        real.intermediate_size, real.vocab_size)
    from transformers import LlamaForCausalLM

    assert shape.params() == sum(p.numel() for p in LlamaForCausalLM(real).parameters())


def test_gguf_header_reader(tmp_path: Path):
    """The header parser skips string and scalar arrays (the tokenizer's) to reach later keys."""
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "m.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_token_list(["a", "bb", "ccc"])
    w.add_token_scores([0.0, 1.0, 2.0])
    w.add_block_count(3)
    w.add_context_length(512)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shape = modelinfo.gguf_shape(path)
    assert (shape.layers, shape.context, shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.vocab) == (
        3, 512, 32, 64, 4, 2, 3)
