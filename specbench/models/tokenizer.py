"""Tokenizer wrappers: one interface for chat prompts, whatever the model ships."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from specbench.core.cachedir import cache_dir
from specbench.models.artifacts import file_sha256


def gguf_tokenizer(path: Path):
    """The Hugging Face tokenizer of the GGUF file `path`. transformers converts it from the file's
    metadata in ~10 s on a 2-core machine (gguf-py reads the 49k-entry vocabulary and merges field by
    field; the weights' load reads them again); the converted tokenizer is kept in the cache,
    tokenizers/<the file's sha256>-transformers-<version>/, and loads from there in ~0.5 s, the same
    tokenizer (vocabulary, merges, special tokens, chat template: tests/test_tokenizer_cache.py)."""
    import transformers
    from transformers import AutoTokenizer

    saved = cache_dir() / "tokenizers" / f"{file_sha256(path)}-transformers-{transformers.__version__}"
    if (saved / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(saved))
        except Exception:  # noqa: BLE001 - a damaged copy: convert again and replace it
            shutil.rmtree(saved, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tmp = saved.with_name(f"{saved.name}.tmp-{os.getpid()}")
    try:  # written whole, then renamed: a concurrent run sees a complete copy or none
        tok.save_pretrained(str(tmp))
        if not same_tokenizer(tok, AutoTokenizer.from_pretrained(str(tmp))):
            raise ValueError("the saved copy tokenizes differently")  # transformers 5.0.0 drops the byte-level
        tmp.rename(saved)  # pre-tokenizer on this round trip ("Hello world" gains two unknown tokens): not kept
    except Exception:  # noqa: BLE001 - another run renamed its copy first, the cache is not writable, or this
        shutil.rmtree(tmp, ignore_errors=True)  # transformers cannot save it: the converted one is used as it is
    return tok


PROBES = ["Hello world", "  spaces  and\ttabs\n\nnewlines", "<|im_start|>user\nhi<|im_end|>", "émoji 🤖 中文 ÿ",
          "def f(x):\n    return x**2  # code", "<|endoftext|> after the end", "a" * 50]


def same_tokenizer(a, b) -> bool:
    """Whether `b` tokenizes as `a` does: vocabulary, special tokens, chat template, and the probes encoded."""
    return (a.get_vocab() == b.get_vocab() and a.all_special_ids == b.all_special_ids
            and a.chat_template == b.chat_template
            and all(a.encode(t, add_special_tokens=s) == b.encode(t, add_special_tokens=s) for t in PROBES for s in (True, False)))


class ChatTokenizer:
    """Wraps a Hugging Face tokenizer: chat template when the model has one, else plain text."""

    def __init__(self, hf_tokenizer, use_chat_template: bool = True, eos_tokens: list[str] | None = None):
        self.tok = hf_tokenizer
        self.use_chat_template = use_chat_template and getattr(hf_tokenizer, "chat_template", None) is not None
        ids = set()
        if hf_tokenizer.eos_token_id is not None:
            ids.add(int(hf_tokenizer.eos_token_id))
        for t in eos_tokens or []:
            tid = hf_tokenizer.convert_tokens_to_ids(t)
            if isinstance(tid, int) and tid != hf_tokenizer.unk_token_id:
                ids.add(tid)
        self.eos_ids = frozenset(ids)

    @property
    def vocab(self) -> dict[str, int]:
        return self.tok.get_vocab()

    def encode_chat(self, messages: list[dict]) -> list[int]:
        if self.use_chat_template:
            out = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(out, dict) or hasattr(out, "input_ids"):
                out = out["input_ids"]
            return [int(i) for i in out]
        return self.encode(plain_prompt(messages))

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tok(text, add_special_tokens=False)["input_ids"]]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def plain_prompt(messages: list[dict]) -> str:
    parts = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join(parts) + "\n\nAssistant:"


class ByteTokenizer:
    """UTF-8 bytes as tokens (ids 3..258), for the tiny random test models: no download."""

    BOS, EOS, PAD = 0, 1, 2
    OFFSET = 3
    vocab_size = 259

    def __init__(self):
        self.eos_ids = frozenset({self.EOS})
        self.use_chat_template = False

    @property
    def vocab(self) -> dict[str, int]:
        return {f"<0x{b:02X}>": b + self.OFFSET for b in range(256)} | {"<s>": 0, "</s>": 1, "<pad>": 2}

    def encode(self, text: str) -> list[int]:
        return [b + self.OFFSET for b in text.encode("utf-8")]

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return [self.BOS] + self.encode(plain_prompt(messages))

    def decode(self, ids: list[int]) -> str:
        return bytes(i - self.OFFSET for i in ids if i >= self.OFFSET).decode("utf-8", errors="replace")
