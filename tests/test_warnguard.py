"""The suite fails on a transformers deprecation set off by specbench's code (tests/warnguard.py),
and only on those: transformers' own or another library's internals pass."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

import warnguard
from helpers import REPO, tiny_model
from specbench.models import adapter

RENAMED = adapter.cache_kwarg(LlamaDecoderLayer) == "cache"  # 5.24+: `past_key_values` warns
needs_rename = pytest.mark.skipif(not RENAMED, reason="this transformers takes past_key_values without a warning")


def old_kwarg_forward():
    """The adapter as it was before it learnt the new name: every layer call warns."""
    target = tiny_model()
    cache = target.new_cache()
    target.forward([1, 2, 3], cache)


@needs_rename
def test_a_deprecated_kwarg_from_the_adapter_is_caught(monkeypatch):
    monkeypatch.setattr(adapter, "cache_kwarg", lambda module_type: "past_key_values")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        old_kwarg_forward()
    found, warnguard.offenders[:] = list(warnguard.offenders), []  # seen here; not this test's failure
    assert found and all("specbench/models/adapter.py" in f for f in found), found
    assert "past_key_values" in found[0]


def test_transformers_internals_called_from_a_test_pass():
    model = tiny_model().model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(model, "is_gradient_checkpointing", None)  # deprecated in 5.24 (the test's own call)
    found, warnguard.offenders[:] = list(warnguard.offenders), []
    assert found == []
    if hasattr(type(model), "is_activation_checkpointing"):
        assert any(issubclass(w.category, FutureWarning) for w in caught)  # it did warn: the guard let it by


@pytest.mark.ci  # CI only (docs/testing.md): a pytest process, ~8 s of CPU
@needs_rename
def test_the_guard_fails_the_test(tmp_path):
    """End to end: a test that sets one off fails, naming our line."""
    r = subprocess.run([sys.executable, "-m", "pytest", f"{__file__}::test_bites_when_asked", "-q", "-p",
                        "no:cacheprovider", "-p", "no:randomly"],
                       capture_output=True, text=True, cwd=REPO, timeout=300,
                       env={**os.environ, "SPECBENCH_WARNGUARD_BITE": "1"})
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "specbench calls a deprecated transformers API" in r.stdout, r.stdout[-3000:]
    assert "specbench/models/adapter.py" in r.stdout


@pytest.mark.skipif(os.environ.get("SPECBENCH_WARNGUARD_BITE") != "1", reason="run by test_the_guard_fails_the_test")
def test_bites_when_asked(monkeypatch):
    monkeypatch.setattr(adapter, "cache_kwarg", lambda module_type: "past_key_values")
    old_kwarg_forward()
