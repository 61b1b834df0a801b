"""device_map=auto: the adapter moves hidden states (and rotary embeddings and masks) to each
layer's device before calling it, and the final norm and head get their inputs on their own
devices. On a CPU-only machine the devices are declared (accelerate's `_hf_hook.execution_device`)
and a tensor "moved" to one carries a tag: fake layers record the tag and dtype they were called
with, and still compute with the real layer, so the outputs must equal the plain adapter's."""

import copy
import inspect

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from specbench.engine.cache import KVCache
from specbench.models import ModelAdapter, adapter as adapter_mod
from tests.helpers import build, method_cfg, tiny_model

CUDA0, CUDA1 = torch.device("cuda:0"), torch.device("cuda:1")


class Hook:
    def __init__(self, device):
        self.execution_device = device


def tag(x):
    return getattr(x, "vdev", "untagged")


class Recording(nn.Module):
    """Wraps a real module, declared to live on `device`; records what it is called with."""

    def __init__(self, inner: nn.Module, device: torch.device):
        super().__init__()
        self.inner = inner
        self._hf_hook = Hook(device)
        self.calls: list[dict] = []

    @property
    def weight(self):
        return self.inner.weight

    @property
    def self_attn(self):  # partly skipped layers call sub-modules directly
        return self.inner.self_attn

    def forward(self, hidden, *args, **kwargs):
        pe = kwargs.get("position_embeddings")
        mask = kwargs.get("attention_mask")
        self.calls.append({"hidden": tag(hidden), "dtype": hidden.dtype, "pos": None if pe is None else {tag(t) for t in pe},
                           "mask": None if mask is None else tag(mask)})
        return self.inner(hidden, *args, **kwargs)

    # the adapter names the KV-cache kwarg after the called layer's class (accelerate's dispatch keeps the class):
    # read as a Llama layer, or the stand-in is passed `past_key_values` and the layer warns (transformers 5.24+)
    forward.__signature__ = inspect.signature(LlamaDecoderLayer.forward)


@pytest.fixture
def split_model(monkeypatch):
    """tiny-llama with layers 0-1 on cuda:0, layers 2-3 and the norm on cuda:1, the head on cuda:0."""

    def fake_to(x, device):
        if device is None:
            return x
        y = x.view_as(x)
        y.vdev = device
        return y

    monkeypatch.setattr(adapter_mod, "to_device", fake_to)
    base = tiny_model()
    model = copy.deepcopy(base.model)
    inner = model.model
    inner.layers = nn.ModuleList(Recording(layer, CUDA0 if i < 2 else CUDA1) for i, layer in enumerate(inner.layers))
    inner.norm = Recording(inner.norm, CUDA1)
    model.lm_head = Recording(model.lm_head, CUDA0)
    return base, ModelAdapter(model, base.tokenizer, "split")


def test_hidden_follows_each_layer(split_model):
    base, split = split_model
    assert split.multi_device and not base.multi_device
    ids = [5, 17, 99, 42, 7]
    logits, hidden = split.forward(ids, KVCache(split.num_layers))
    ref_logits, ref_hidden = base.forward(ids, KVCache(base.num_layers))
    assert torch.equal(logits, ref_logits) and torch.equal(hidden, ref_hidden)  # moving changes nothing numerically
    layers = split.layers
    for i, layer in enumerate(layers):
        want = CUDA0 if i < 2 else CUDA1
        (call,) = layer.calls
        assert call["hidden"] == want and call["pos"] == {want} and call["mask"] == want, (i, call)
        assert call["dtype"] == torch.float64
    assert split.norm.calls[0]["hidden"] == CUDA1
    assert split.lm_head.calls[0]["hidden"] == CUDA0


def test_one_token_step_and_skipped_sublayers(split_model):
    _, split = split_model
    cache = KVCache(split.num_layers)
    split.forward([5, 17, 99], cache)
    for layer in split.layers:
        layer.calls.clear()
    split.forward([42], cache)  # cached decode step: no mask, positions after the cache
    for i, layer in enumerate(split.layers):
        assert layer.calls[0]["hidden"] == (CUDA0 if i < 2 else CUDA1) and layer.calls[0]["mask"] is None


def test_single_device_model_moves_nothing(monkeypatch):
    calls = []
    real = adapter_mod.to_device
    monkeypatch.setattr(adapter_mod, "to_device", lambda x, d: calls.append(d) or real(x, d))
    m = tiny_model()
    m.forward([5, 6, 7], KVCache(m.num_layers))
    assert set(calls) <= {None}  # the default path asks for no move


def test_timing_synchronises_every_device_the_model_uses(split_model, monkeypatch):
    """A wait on one GPU says nothing about work queued on another: the timer's two waits per
    generation cover cuda:0 and cuda:1, and its marks go on the logits' device's stream (bites:
    a timer that synchronises only the current device, or only target.device)."""

    synced, streams = [], []

    class Event:
        def __init__(self, enable_timing=False):
            self.t = 0.0

        def record(self, stream=None):
            streams.append(stream)

        def elapsed_time(self, end):
            return 0.0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: synced.append(torch.device(d)))
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: f"stream of {d}")
    _, split = split_model
    assert {CUDA0, CUDA1} <= set(split.devices)  # (the embedding stays on the cpu here)
    m = build("ar", split, method_cfg("ar"))
    with torch.no_grad():
        m.generate([5, 17, 99], 4, frozenset(), 0)
    assert sorted(synced, key=str) == [CUDA0, CUDA0, CUDA1, CUDA1]  # start and stop, each device
    assert streams and set(streams) == {f"stream of {CUDA0}"}  # where the logits are (lm_head on cuda:0)
