"""The model vLLM serves: the embedded GGUF converted once to a Hugging Face directory, or an HF id/path as-is.

transformers dequantizes the GGUF to float32 on load (models/converted.py keeps that model in the cache, without
the GGUF quantizer that save_pretrained refuses); vLLM's directory adds the tokenizer. It is cached under the
cache dir keyed by the GGUF's SHA-256, written to a temporary sibling and renamed, so a crash never leaves a
half-written model that a later run would trust.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from specbench.core.cachedir import cache_dir
from specbench.core.errors import SpecBenchError


def converted_dir(gguf_sha256: str, name: str) -> Path:
    return cache_dir() / "vllm" / f"{name}-{gguf_sha256[:16]}"


def convert_gguf(model_cfg, out: Path) -> None:
    """Load the GGUF with transformers and save it as a Hugging Face directory at `out`."""
    from specbench.models import load_gguf
    from specbench.models.converted import plain

    adapter = load_gguf(model_cfg)
    model, tok = plain(adapter.model), adapter.tokenizer.tok
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SpecBenchError(f"cannot write the converted model to {out}: {e.strerror or e}") from None


def model_for_vllm(model_cfg, provenance: dict) -> str:
    """What vLLM loads for `model_cfg`: the converted embedded model's directory, or model.id as given."""
    if model_cfg.loader == "hf":
        return str(model_cfg.id)
    out = converted_dir(provenance["sha256"], str(model_cfg.name))
    if not (out / "config.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"converting {model_cfg.name} to a Hugging Face directory for vLLM (once): {out}")
        convert_gguf(model_cfg, out)
    return str(out)


def load_tokenizer(model_cfg):
    """The native engine's tokenizer for `model_cfg` (its chat template and end tokens), without the weights."""
    from transformers import AutoTokenizer

    from specbench.models import gguf_path
    from specbench.models.tokenizer import ChatTokenizer, gguf_tokenizer

    try:
        if model_cfg.loader == "gguf":
            tok = gguf_tokenizer(gguf_path(model_cfg))
        else:
            tok = AutoTokenizer.from_pretrained(str(model_cfg.id), revision=model_cfg.revision)
    except OSError as e:
        raise SpecBenchError(f"cannot load the tokenizer of {model_cfg.name}: {str(e).splitlines()[0][:200]}") from None
    return ChatTokenizer(tok, model_cfg.chat_template, list(model_cfg.eos_tokens))
