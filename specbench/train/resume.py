"""Resumable training: the state of a train_loop (trained parameters, AdamW state, RNG states,
step, loss log) saved every `train.checkpoint_every` steps next to the artifact it will become,
and read back by a rerun of the same setting, so that the rerun continues from that step and ends
with exactly the weights an uninterrupted run ends with.

The file is safetensors (tensors) plus JSON metadata, never a pickle; it is written atomically
(artifacts.atomic_write). A state saved by another setting (its `key` differs: other train or
method settings, other data, other parameter shapes), a file that cannot be read, or one holding
NaN or infinite values is ignored with one line, and training starts from step 0.
Each setting has its own file (`<stage>-<hash of the setting>`); save_checkpoint deletes an artifact's
resume states once the artifact itself is written.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specbench.config import settings
from specbench.config.identity import drop_unset_training_keys
from specbench.models.artifacts import all_finite, atomic_write, checkpoint_path, safe_key

FORMAT = "specbench-train-resume/1"
OPT_KEYS = ("step", "exp_avg", "exp_avg_sq")  # AdamW's per-parameter state
# settings that change how long or how often, never what is computed at a given step
RUN_ONLY = ("max_minutes", "checkpoint_every", "first_use", "prefill_batch_size")


@dataclass
class Resume:
    path: Path   # where the state is kept
    key: dict    # what a saved state must match to be reused


def resume_for(cfg, kind: str, model_key: str, structure: dict, stage: str) -> Resume | None:
    """The resume state of one train_loop call (`stage`) of the artifact (kind, model, structure);
    None when train.checkpoint_every is null (no resume states)."""
    if not cfg.train.checkpoint_every:
        return None
    art = checkpoint_path(kind, model_key, structure)
    train = {k: v for k, v in settings.record(cfg.train).items() if k not in RUN_ONLY}
    drop_unset_training_keys(train)  # as the run identity does: a key added later changes nothing while unset
    key = {"stage": stage, "model": model_key, "structure": structure, "train": train,
           "method": settings.record(cfg.method)}
    # one file a setting: a run of another setting (a first-use training, a short trial) starts its own
    # state instead of replacing the interrupted run's (which then restarted from step 0)
    tag = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return Resume(art.with_name(f"{art.stem}.{safe_key(stage)}-{tag}.resume.safetensors"), key)


def full_key(resume: Resume, sequences, params) -> str:
    """resume.key plus the data and the parameters' shapes, hashed."""
    blob = json.dumps([resume.key, [list(s[0]) for s in sequences], [list(p.shape) for p in params]],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def opt_params(opt) -> list:
    return [p for g in opt.param_groups for p in g["params"]]


def save(resume: Resume, key: str, opt, rngs, meta: dict) -> None:
    """Write the loop's state (between two steps) atomically."""
    params = opt_params(opt)
    sd = opt.state_dict()
    tensors = {f"param/{i}": p.detach() for i, p in enumerate(params)}
    tensors |= {f"opt/{i}/{k}": v for i, st in sd["state"].items() for k, v in st.items() if torch.is_tensor(v)}
    tensors["rng/torch"] = torch.get_rng_state()
    if params and params[0].device.type == "cuda":
        tensors["rng/cuda"] = torch.cuda.get_rng_state(params[0].device)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    info = meta | {"format": FORMAT, "key": key, "groups": sd["param_groups"], "rngs": [r.getstate() for r in rngs]}
    atomic_write(resume.path, lambda p: save_file(tensors, str(p), metadata={"specbench": json.dumps(info)}))


def _read(path: Path) -> tuple[dict, dict]:
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads((f.metadata() or {})["specbench"])
        return meta, {k: f.get_tensor(k) for k in f.keys()}


def _check(tensors: dict, params) -> str | None:
    """Why the tensors do not fit the parameters (None: they fit)."""
    for i, p in enumerate(params):
        t = tensors.get(f"param/{i}")
        if t is None or tuple(t.shape) != tuple(p.shape) or t.dtype != p.dtype:
            return f"parameter {i} missing or of another shape/dtype"
    for k, t in tensors.items():
        part = k.split("/")
        if part[0] == "param" and int(part[1]) >= len(params):
            return f"unexpected {k}"
        if part[0] == "opt":
            i = int(part[1])
            if i >= len(params) or part[2] not in OPT_KEYS:
                return f"unexpected {k}"
            want = () if part[2] == "step" else tuple(params[i].shape)
            if tuple(t.shape) != want:
                return f"{k} has shape {list(t.shape)}"
    bad = next((k for k, t in tensors.items() if not all_finite(t)), None)
    return f"{bad} holds NaN or infinite values" if bad else None


def load(resume: Resume, key: str, opt, rngs) -> dict | None:
    """Restore a saved state into the optimiser's parameters, the optimiser, torch's RNG and
    `rngs` (random.Random objects the loss uses); the loop's metadata, or None (start afresh)."""
    if not resume.path.is_file():
        return None
    params = opt_params(opt)
    try:
        meta, tensors = _read(resume.path)
        why = "another setting" if meta.get("format") != FORMAT or meta.get("key") != key else _check(tensors, params)
    except Exception as e:  # noqa: BLE001 - damaged or foreign file: it is only a shortcut, start over
        why = f"unreadable ({type(e).__name__})"
    if why:
        print(f"train: ignoring the resume state {resume.path}: {why}; starting from step 0", flush=True)
        return None
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(tensors[f"param/{i}"])
    state: dict = {}
    for k, v in tensors.items():
        part = k.split("/")
        if part[0] == "opt":
            state.setdefault(int(part[1]), {})[part[2]] = v
    opt.load_state_dict({"state": state, "param_groups": meta["groups"]})
    torch.set_rng_state(tensors["rng/torch"])
    if "rng/cuda" in tensors and params:
        torch.cuda.set_rng_state(tensors["rng/cuda"], params[0].device)
    for r, s in zip(rngs, meta["rngs"]):
        r.setstate((s[0], tuple(s[1]), s[2]))
    return meta


def drop_states(artifact: Path) -> None:
    """The resume states of a part whose training is finished (save_checkpoint's keep_resume left them)."""
    for stale in artifact.parent.glob(f"{artifact.stem}.*.resume.safetensors"):
        stale.unlink(missing_ok=True)
