"""The embedded GGUF model as transformers converts it, converted once and then read from the cache.

transformers converts a GGUF on every load: gguf-py parses the file's metadata in Python (the 49k-entry
vocabulary and merges, field by field; once for the config and again for the weights), builds its tensor-name
map once per submodule (~400 times) and dequantizes every tensor: ~19 s of a run on a 2-core machine. The
dequantized model is saved once, under models/<the file's sha256>-transformers-<version>-<dtype>/ in the cache
(config and safetensors; ~540 MB at float32), and loads from there in about a second. A copy is kept only when it
loads back as the same model: every tensor bit for bit, the same config (tests/test_model_cache.py).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from pathlib import Path

import torch

from specbench.core.cachedir import cache_dir
from specbench.models.artifacts import file_sha256


def gguf_model(path: Path, dtype: torch.dtype):
    """The transformers model of the GGUF file `path` at `dtype`, from the cache when a copy is there."""
    import transformers
    from transformers import AutoModelForCausalLM

    dt = str(dtype).replace("torch.", "")
    saved = cache_dir() / "models" / f"{file_sha256(path)}-transformers-{transformers.__version__}-{dt}"
    if (saved / "config.json").is_file():
        try:
            return AutoModelForCausalLM.from_pretrained(str(saved), dtype=dtype, use_safetensors=True)  # never a pickle
        except Exception:  # noqa: BLE001 - a damaged copy: convert again and replace it
            shutil.rmtree(saved, ignore_errors=True)
    model = plain(AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype))
    tmp = saved.with_name(f"{saved.name}.tmp-{os.getpid()}")
    try:  # written whole, then renamed: a concurrent run sees a complete copy or none
        model.save_pretrained(str(tmp))
        if not same_model(model, AutoModelForCausalLM.from_pretrained(str(tmp), dtype=dtype, use_safetensors=True)):
            raise ValueError("the saved copy loads as another model")
        tmp.rename(saved)
    except Exception:  # noqa: BLE001 - another run renamed its copy first, the disk is full or read-only, or
        shutil.rmtree(tmp, ignore_errors=True)  # the copy differs: the converted model is used as it is
    return model


@contextlib.contextmanager
def read_once():
    """Within it, gguf-py parses a GGUF file once, not once per transformers call (the tokenizer, the config,
    the weights: ~5 s each on a 2-core machine), and builds a tensor-name map once, not once per submodule.
    transformers imports both names from `gguf` at call time (5.0 to 5.24), so they are swapped here for
    memoized versions and restored on exit. Both are read-only: a reader is a memory map of the file, a name
    map a lookup table; the model converted within is transformers' own (tests/test_model_cache.py)."""
    import gguf

    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers = {}

    def reader(path, mode="r"):
        if mode != "r":  # a writable map is never shared
            return real_reader(path, mode)
        key = os.path.realpath(path)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(real_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map


def plain(model):
    """`model` without the GGUF "quantizer" and its quantization_config: they only dequantized on load (the
    weights are plain tensors by then), and save_pretrained refuses a model that still carries them."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def same_model(a, b) -> bool:
    """Whether `b` is `a`: the same class, the same tensors (names, dtypes, values bit for bit), tied as in `a`,
    the same config."""
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys() or any(sa[k].dtype != sb[k].dtype or not torch.equal(sa[k], sb[k]) for k in sa):
        return False
    tied = [_tied(m) for m in (a, b)]
    ca, cb = (m.config.to_dict() for m in (a, b))
    for c in (ca, cb):  # where it was loaded from; the class name save_pretrained writes (the class is compared)
        c.pop("_name_or_path", None), c.pop("architectures", None)
    return type(a) is type(b) and tied[0] == tied[1] and ca == cb


def _tied(model) -> bool:
    out = model.get_output_embeddings()
    return out is not None and out.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
