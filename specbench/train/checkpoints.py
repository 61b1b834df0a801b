"""Checkpoint cache for every trainable part, keyed by model and structural config.

A checkpoint lives at `<cache_dir>/<kind>/<model key>-<structure hash>.pt` and stores, beside
the weights, the model key and structure it was trained for and the training settings, so a
checkpoint can never be loaded into a model it does not match. Inference code finds a
checkpoint from the same (model, structure) pair; training settings are recorded, not keyed,
so retraining with other settings replaces the previous checkpoint for that structure.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

from specbench.errors import SpecBenchError
from specbench.models.backends import apply_backend, backend_of

TRAIN_HINT = {
    "eesd": "python -m specbench.train method=eesd model={model} method.n_layers={n}",
    "vanilla_draft": "python -m specbench.train method=vanilla_sd model={model} method.draft.num_layers={n}",
    "medusa": "python -m specbench.train method=medusa model={model}",
    "space": "python -m specbench.train method=space model={model}",
    "cali": "python -m specbench.train method=eesd model={model} method.n_layers={n} (trains the Cali-TS predictor too)",
}


def cache_dir() -> Path:
    return Path(os.environ.get("SPECBENCH_CACHE", "cache")).expanduser()


def checkpoint_path(kind: str, model_key: str, structure: dict) -> Path:
    h = hashlib.sha1(json.dumps(structure, sort_keys=True).encode()).hexdigest()[:10]
    return cache_dir() / kind / f"{model_key}-{h}.pt"


def save_checkpoint(kind: str, model_key: str, structure: dict, state: dict, settings: dict) -> Path:
    path = checkpoint_path(kind, model_key, structure)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {"kind": kind, "model_key": model_key, "structure": structure, "state": state, "settings": settings,
         "saved": time.strftime("%Y-%m-%dT%H:%M:%S")},
        tmp,
    )
    os.replace(tmp, path)  # never leave a half-written checkpoint under the real name
    return path


def load_checkpoint(kind: str, model_key: str, structure: dict, where="auto", required: bool = True, model_name: str = "") -> dict | None:
    """`where`: "auto" (the cache), a path, or None (no checkpoint)."""
    if where in (None, "none", False):
        return None
    path = checkpoint_path(kind, model_key, structure) if where == "auto" else Path(str(where)).expanduser()
    if not path.is_file():
        if not required:
            return None
        hint = TRAIN_HINT.get(kind, "python -m specbench.train").format(model=model_name or model_key, n=structure.get("n_layers", "N"))
        raise SpecBenchError(f"no trained {kind} checkpoint at {path}; train it with `{hint}`")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if ckpt.get("kind") != kind or ckpt.get("model_key") != model_key or ckpt.get("structure") != structure:
        raise SpecBenchError(
            f"checkpoint {path} was trained for {ckpt.get('kind')} on model {ckpt.get('model_key')} with "
            f"{ckpt.get('structure')}, not {kind} on {model_key} with {structure}"
        )
    ckpt["path"] = str(path)
    return ckpt


def load_draft_checkpoint(draft, target, n_layers: int, where="auto") -> Path | None:
    """Load a distilled vanilla-SD draft into `draft` if one is cached (or given)."""
    structure = {"n_layers": n_layers}
    ckpt = load_checkpoint("vanilla_draft", target.key, structure, where, required=where != "auto", model_name=target.name)
    if ckpt is None:
        return None
    missing, unexpected = draft.model.load_state_dict(ckpt["state"], strict=False)
    if unexpected:
        raise SpecBenchError(f"checkpoint {ckpt['path']} does not match the draft model (unexpected {unexpected[:3]})")
    return Path(ckpt["path"])


def apply_checkpoint(module, ckpt: dict | None, target, info: dict, strict: bool = True):
    """Load `ckpt` (if any) into a trainable part, record where it came from in `info`, and
    make the part ready for inference on the target's device, dtype and linear backend, frozen."""
    if ckpt is not None:
        module.load_state_dict(ckpt["state"], strict=strict)
        info["checkpoint"] = ckpt["path"]
        info["train_settings"] = ckpt.get("settings")
    module.to(device=target.device, dtype=target.dtype).eval()
    apply_backend(module, backend_of(target.model))
    for p in module.parameters():
        p.requires_grad_(False)
    return module
