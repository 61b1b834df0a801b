"""A model's shape (layers, heads, context length, vocabulary) read without its weights, and what a
forward costs in memory: enough for `config.validate` to bound profile sizes, draft lengths and
tiny-model sizes before anything is loaded. Reads the tiny model's config keys, a GGUF file's
header (the key/value section only: tensors are never touched) or a Hugging Face config.json
(a local directory or the hub cache; nothing is downloaded). Imports nothing heavy.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

TINY_CONTEXT = 4096  # = models.tiny_llama_config's max_position_embeddings (a test keeps them equal)
TINY_VOCAB = 259     # = models.tokenizer.ByteTokenizer.vocab_size
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "auto": 4}
GIB = 2**30


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    context: int | None  # max positions; None: not stated
    tied: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // max(1, self.heads)

    def params(self) -> int:
        kv = self.kv_heads * self.head_dim
        per_layer = self.hidden * (2 * self.hidden + 2 * kv) + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def forward_bytes(self, new: int, cached: int, logits: int, width: int) -> int:
        """KV cache for cached + new tokens, plus the largest layer's activations (attention
        scores materialised, as the eager path does) and the logits; `width` bytes per number."""
        kv = 2 * self.layers * self.kv_heads * self.head_dim * (cached + new)
        scores = self.heads * new * (cached + new)
        acts = new * (4 * self.hidden + 3 * self.intermediate)
        return width * (kv + scores + acts + logits * self.vocab)


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux); None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def model_shape(model) -> Shape | None:
    """The shape of the model its settings name; None when it cannot be read cheaply
    (the loader then reports what is wrong with it)."""
    loader = model.loader
    try:
        if loader == "tiny":
            return Shape("tiny-llama", int(model.num_layers), int(model.hidden_size), int(model.num_heads),
                         int(model.num_kv_heads), int(model.intermediate_size), TINY_VOCAB, TINY_CONTEXT,
                         bool(model.tie_embeddings))
        if loader == "gguf":
            path = gguf_file(model)
            return _gguf_shape_once(str(path), path.stat().st_size, path.stat().st_mtime_ns) if path else None
        if loader == "hf" and model.id:
            path = hf_config_file(str(model.id), model.revision)
            return hf_shape(json.loads(path.read_text()), str(model.id)) if path else None
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    return None


# ------------------------------------------------------------------------------ Hugging Face
def hf_config_file(model_id: str, revision=None) -> Path | None:
    p = Path(model_id).expanduser()
    if p.is_dir():
        return p / "config.json" if (p / "config.json").is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache
        found = try_to_load_from_cache(model_id, "config.json", revision=revision)
    except Exception:  # noqa: BLE001 - not a hub id, no cache: the loader reports it
        return None
    return Path(found) if isinstance(found, str) else None


def hf_shape(c: dict, name: str) -> Shape:
    c = c.get("text_config", c)
    heads = int(c["num_attention_heads"])
    return Shape(name, int(c["num_hidden_layers"]), int(c["hidden_size"]), heads,
                 int(c.get("num_key_value_heads") or heads), int(c.get("intermediate_size") or 4 * c["hidden_size"]),
                 int(c["vocab_size"]), c.get("max_position_embeddings"), bool(c.get("tie_word_embeddings", True)))


# ------------------------------------------------------------------------------ GGUF header
def gguf_file(model) -> Path | None:
    """Where the loader (models.gguf_path) finds the file; None when it is not there."""
    if model.path:
        p = Path(str(model.path)).expanduser()
    else:
        spec = importlib.util.find_spec(str(model.package))
        if spec is None or not spec.submodule_search_locations:
            return None
        p = Path(list(spec.submodule_search_locations)[0]) / str(model.gguf_file)
    return p if p.is_file() else None


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def gguf_metadata(path: Path) -> dict:
    """The GGUF key/value section (arrays as their length only); raises ValueError if not GGUF."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        pos, out = 24, {}
        (n_kv,) = struct.unpack_from("<Q", m, 16)
        for _ in range(n_kv):
            key, pos = _string(m, pos)
            (vtype,) = struct.unpack_from("<I", m, pos)
            out[key], pos = _value(m, pos + 4, vtype)
        return out


def _string(m, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", m, pos)
    if n > len(m):
        raise ValueError("GGUF string longer than the file")
    return bytes(m[pos + 8 : pos + 8 + n]).decode("utf-8", "replace"), pos + 8 + n


def _value(m, pos: int, vtype: int):
    if vtype == _STRING:
        return _string(m, pos)
    if vtype == _ARRAY:
        etype, count = struct.unpack_from("<IQ", m, pos)
        pos += 12
        if etype in _SCALARS:
            return count, pos + count * struct.calcsize("<" + _SCALARS[etype])
        for _ in range(count):
            _, pos = _value(m, pos, etype)
        return count, pos
    fmt = "<" + _SCALARS[vtype]
    return struct.unpack_from(fmt, m, pos)[0], pos + struct.calcsize(fmt)


@functools.lru_cache(maxsize=8)
def _gguf_shape_once(path: str, size: int, mtime_ns: int) -> Shape:
    """Parsing the header walks the tokenizer's ~100k strings (~0.1-0.5 s): once per file version."""
    return gguf_shape(Path(path))


def gguf_shape(path: Path) -> Shape:
    meta = gguf_metadata(path)
    arch = meta["general.architecture"]
    g = lambda k: meta[f"{arch}.{k}"]  # noqa: E731
    heads = int(g("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or meta["tokenizer.ggml.tokens"]
    return Shape(path.name, int(g("block_count")), int(g("embedding_length")), heads,
                 int(meta.get(f"{arch}.attention.head_count_kv", heads)), int(g("feed_forward_length")),
                 int(vocab), int(g("context_length")))
