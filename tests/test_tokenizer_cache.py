"""The embedded model's tokenizer, converted from the GGUF once and then read from the cache
(specbench/models/tokenizer.py gguf_tokenizer): the copy is the same tokenizer, a run with it
tokenizes exactly as one that converted, and a damaged copy is converted again."""

import random
import shutil

import pytest
from transformers import AutoTokenizer

from specbench.config.settings import shipped
from specbench.core.cachedir import cache_dir
from specbench.models import gguf_path
from specbench.models.tokenizer import ChatTokenizer, gguf_tokenizer

MODEL = shipped("model", "smollm2-135m")


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    """The embedded GGUF, and an empty tokenizer cache (the suite shares one: tests/conftest.py)."""
    try:
        path = gguf_path(MODEL)
    except Exception as e:  # noqa: BLE001 - the package is installed by make setup
        pytest.skip(f"the embedded model is not installed: {e}")
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cache"))
    return path


def conversions(monkeypatch) -> list:
    """The calls that convert from the GGUF (transformers' `gguf_file=`), recorded."""
    calls, real = [], AutoTokenizer.from_pretrained

    def counted(*args, **kwargs):
        if kwargs.get("gguf_file"):
            calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", counted)
    return calls


def texts() -> list[str]:
    rng = random.Random(0)
    fixed = ["Hello world", "  spaces  and\ttabs\n\nnewlines", "<|im_start|>user\nhi<|im_end|>", "émoji 🤖 中文 ÿ",
             "def f(x):\n    return x**2  # code", "", "a" * 300, "<|endoftext|> after the end"]
    return fixed + ["".join(chr(rng.randint(32, 0x2FFF)) for _ in range(120)) for _ in range(20)]


def test_the_cached_copy_is_the_tokenizer_transformers_converts(gguf, monkeypatch, tmp_path):
    """Bites: a copy that lost the chat template, a special token, the merges (any encoding
    differs) or the end tokens; a load that converts again instead of reading the copy."""
    calls = conversions(monkeypatch)
    converted = gguf_tokenizer(gguf)
    assert len(calls) == 1
    saved = list((cache_dir() / "tokenizers").iterdir())
    cached = gguf_tokenizer(gguf)
    if not faithful_round_trip(converted, tmp_path):  # transformers 5.0.0 (make test-oldest): no copy is kept
        assert saved == [] and len(calls) == 2
        return
    assert len(saved) == 1 and (saved[0] / "tokenizer.json").is_file()
    assert len(calls) == 1, "the second load converted again"
    assert cached.get_vocab() == converted.get_vocab() and cached.chat_template == converted.chat_template
    assert cached.all_special_ids == converted.all_special_ids and cached.special_tokens_map == converted.special_tokens_map
    for text in texts():
        for special in (True, False):
            assert cached.encode(text, add_special_tokens=special) == converted.encode(text, add_special_tokens=special)
        ids = converted.encode(text)
        assert cached.decode(ids) == converted.decode(ids)
    a, b = (ChatTokenizer(t, MODEL.chat_template, list(MODEL.eos_tokens)) for t in (converted, cached))
    chat = [{"role": "user", "content": "What is 7 * 6? Answer briefly."}]
    assert a.encode_chat(chat) == b.encode_chat(chat) and a.eos_ids == b.eos_ids


def faithful_round_trip(tok, tmp_path) -> bool:
    """Does this transformers save and load the converted tokenizer unchanged? (Checked here on its own
    terms: every text of texts(), not the loader's probes.)"""
    tok.save_pretrained(tmp_path / "round-trip")
    back = AutoTokenizer.from_pretrained(str(tmp_path / "round-trip"))
    return all(tok.encode(t) == back.encode(t) for t in texts())


def test_a_damaged_copy_is_converted_again(gguf, monkeypatch, tmp_path):
    calls = conversions(monkeypatch)
    first = gguf_tokenizer(gguf)
    if not faithful_round_trip(first, tmp_path):
        pytest.skip("this transformers keeps no copy (its round trip changes the tokenizer)")
    (saved,) = (cache_dir() / "tokenizers").iterdir()
    (saved / "tokenizer.json").write_text("{not json")
    again = gguf_tokenizer(gguf)
    assert len(calls) == 2 and again.get_vocab() == first.get_vocab()
    shutil.rmtree(saved)
    gguf_tokenizer(gguf)
    assert len(calls) == 3 and (saved / "tokenizer.json").is_file()
