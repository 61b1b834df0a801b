"""The embedded model, converted from the GGUF once and then read from the cache (specbench/models/converted.py):
the copy is the converted model bit for bit, a damaged copy is converted again, a copy that loads as another
model is not kept, and a conversion inside read_once() (the GGUF parsed once) is transformers' own."""

import copy

import gguf as gguf_py
import pytest
import torch
from transformers import AutoModelForCausalLM

from specbench.config.settings import shipped
from specbench.core.cachedir import cache_dir
from specbench.models import converted, gguf_path
from specbench.models.converted import gguf_model, plain, read_once, same_model
from specbench.models.tokenizer import gguf_tokenizer

F32 = torch.float32


@pytest.fixture(scope="module")
def gguf():
    try:
        return gguf_path(shipped("model", "smollm2-135m"))
    except Exception as e:  # noqa: BLE001 - the package is installed by make setup
        pytest.skip(f"the embedded model is not installed: {e}")


@pytest.fixture(scope="module")
def reference(gguf):
    """transformers' own conversion, outside read_once (~20 s: the one real conversion of this module)."""
    return plain(AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=F32))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cache"))  # empty (the suite shares its models/)
    return tmp_path / "cache"


def fake_conversions(monkeypatch, reference) -> list:
    """Conversions from the GGUF (`gguf_file=`) recorded and answered with a copy of `reference`; loads of a
    saved copy go to transformers."""
    calls, real = [], AutoModelForCausalLM.from_pretrained

    def counted(*args, **kwargs):
        if kwargs.get("gguf_file"):
            calls.append(args[0])
            return copy.deepcopy(reference)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted)
    return calls


def test_within_read_once_the_file_is_parsed_once_and_converts_as_transformers_does(gguf, reference, cache,
                                                                                   monkeypatch):
    """Bites: a memo that does not hold (three parses: tokenizer, config, weights), a shared reader or name
    map that changes what is converted, a swap that is not undone."""
    parses, real = [], gguf_py.GGUFReader

    def counted(path, mode="r"):
        parses.append(mode)
        return real(path, mode)

    monkeypatch.setattr(gguf_py, "GGUFReader", counted)
    with read_once():
        gguf_tokenizer(gguf)
        model = gguf_model(gguf, F32)
    assert parses == ["r"]
    assert gguf_py.GGUFReader is counted and not hasattr(gguf_py.get_tensor_name_map, "cache_info")
    assert same_model(reference, model)


def test_the_cached_copy_is_the_converted_model_and_a_damaged_one_is_replaced(gguf, reference, cache, monkeypatch):
    """Bites: a copy that lost or changed a tensor, its dtype, the tied head or the config; a load that
    converts again instead of reading the copy; a damaged copy trusted."""
    calls = fake_conversions(monkeypatch, reference)
    gguf_model(gguf, F32)
    saved = list((cache_dir() / "models").iterdir())
    assert len(calls) == 1 and len(saved) == 1 and saved[0].name.endswith("-float32")
    again = gguf_model(gguf, F32)
    assert len(calls) == 1 and same_model(reference, again)
    weights = saved[0] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert same_model(reference, gguf_model(gguf, F32)) and len(calls) == 2
    assert same_model(reference, gguf_model(gguf, F32)) and len(calls) == 2  # the replaced copy is read


def test_a_copy_that_loads_as_another_model_is_not_kept(gguf, reference, cache, monkeypatch):
    calls = fake_conversions(monkeypatch, reference)
    monkeypatch.setattr(converted, "same_model", lambda a, b: False)
    model = gguf_model(gguf, F32)
    assert not any((cache_dir() / "models").iterdir())  # nor a temporary directory left behind
    gguf_model(gguf, F32)
    assert len(calls) == 2 and model is not None


def test_same_model_tells_a_changed_bit_a_dtype_an_untied_head_and_a_config(reference):
    def changed(edit):
        other = copy.deepcopy(reference)
        edit(other)
        return not same_model(reference, other)

    def flip_one_bit(m):
        w = m.model.layers[3].mlp.down_proj.weight.data.view(torch.int32)
        w[7, 11] ^= 1

    def untie(m):
        m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone())

    assert same_model(reference, copy.deepcopy(reference))
    assert changed(flip_one_bit)
    assert changed(lambda m: m.model.norm.to(torch.float64))
    assert changed(untie)
    assert changed(lambda m: setattr(m.config, "rms_norm_eps", 0.5))
