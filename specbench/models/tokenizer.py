"""Tokenizer wrappers: one interface for chat prompts, whatever the model ships."""

from __future__ import annotations


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
