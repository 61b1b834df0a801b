"""Trained artifacts (checkpoints, self-distillation data, Self-SD skip sets): where they live and
how they are written and read. Sits below both the methods (which load) and training (which
saves), so neither needs the other.

- Cache: `$SPECBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/specbench`, else `~/.cache/specbench`,
  always an absolute path (never relative to the working directory).
- Writes are atomic: a uniquely named temporary file in the same folder, then `os.replace`, so
  two processes training the same part at once each leave a whole file, never a mixed one.
- Checkpoints are safetensors files whose header carries the metadata as JSON (kind, model key,
  structure, training settings: steps, data size, held-out agreement). Loading never unpickles
  anything, so a crafted file cannot run code; a damaged file is a one-line error that names it
  and says how to re-create it. A published one (shipped in the package) loads only if its bytes
  still have the sha256 recorded beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specbench.core.cachedir import cache_dir
from specbench.core.errors import SpecBenchError
from specbench.kernels.backends import apply_backend, backend_of, round_weights

FORMAT = "specbench-checkpoint/1"
TRAIN_HINT = {
    "eesd": "python -m specbench.train method=eesd model={model} method.n_layers={n}",
    "vanilla_draft": "python -m specbench.train method=vanilla_sd model={model} method.draft.num_layers={n}",
    "medusa": "python -m specbench.train method=medusa model={model}",
    "hydra": "python -m specbench.train method=hydra model={model}",
    "space": "python -m specbench.train method=space model={model}",
    "eagle": "python -m specbench.train method=eagle model={model}",
    "eagle3": "python -m specbench.train method=eagle3 model={model}",
    "cali": "python -m specbench.train method=eesd model={model} method.n_layers={n} (trains the Cali-TS predictor too)",
}


def safe_key(key: str) -> str:
    """A model key usable as a file name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(key))


def atomic_write(path: Path, write) -> Path:
    """Call `write(tmp_path)`, then move the finished file to `path` in one step."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_json(path: Path, obj) -> Path:
    return atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=1, default=str)))


def read_json(path: Path, what: str, hint: str):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecBenchError(f"{what} {path} is unreadable ({type(e).__name__}); delete it and re-create it with `{hint}`") from None


# -- checkpoints --------------------------------------------------------------------------------
# trained parts shipped with the package (float16, with their sha256 and the command that made them:
# specbench/tools/publish.py); found when the cache holds none, so a new user of the embedded model waits for nothing
PUBLISHED = Path(__file__).resolve().parents[1] / "published_artifacts"


def checkpoint_path(kind: str, model_key: str, structure: dict) -> Path:
    """Where training writes (the cache)."""
    h = hashlib.sha1(json.dumps(structure, sort_keys=True).encode()).hexdigest()[:10]
    return cache_dir() / kind / f"{safe_key(model_key)}-{h}.safetensors"


def published_path(kind: str, model_key: str, structure: dict) -> Path:
    return PUBLISHED / safe_key(model_key) / kind / checkpoint_path(kind, model_key, structure).name


def find_checkpoint(kind: str, model_key: str, structure: dict) -> Path:
    """The cache's checkpoint (a local training wins), else the published one, else the cache path
    (where first-use training will write)."""
    cached = checkpoint_path(kind, model_key, structure)
    if cached.is_file():
        return cached
    shipped = published_path(kind, model_key, structure)
    return shipped if shipped.is_file() else cached


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest_path(path: Path) -> Path:
    """The record shipped beside a published artifact: `<name>.json` (a skip set, itself JSON: `<name>.sha256.json`)."""
    path = Path(path)
    return path.with_name(path.stem + ".sha256.json") if path.suffix == ".json" else path.with_suffix(".json")


def check_published(path: Path, hint: str) -> None:
    """A shipped artifact loads only with the bytes it shipped with: its sha256 (read afresh, not
    from provenance's cache) must be the one in the manifest beside it (tools/publish.py), else its
    metadata's training record would be printed for weights nobody trained that way."""
    path = Path(path).resolve()
    if not path.is_relative_to(PUBLISHED.resolve()):
        return
    manifest = manifest_path(path)
    try:
        expected = json.loads(manifest.read_text())["sha256"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise SpecBenchError(f"published artifact {path} has no readable manifest {manifest.name} with its sha256 "
                             f"({type(e).__name__}); reinstall specbench, or train your own with `{hint}`") from None
    actual = file_sha256(path)
    if actual != expected:
        raise SpecBenchError(f"published artifact {path} does not match its shipped sha256 ({manifest.name}: "
                             f"{str(expected)[:8]}, file: {actual[:8]}): it was altered after it was published; "
                             f"reinstall specbench (in a checkout: git checkout -- {path.name}), or train your own "
                             f"with `{hint}`")


def _flatten(state: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}/")
        else:  # a private contiguous copy: safetensors refuses tensors that share memory (tied weights)
            out[prefix + k] = v.detach().to("cpu").contiguous().clone()
    return out


def _unflatten(flat: dict) -> dict:
    out: dict = {}
    for k, v in flat.items():
        *parents, leaf = k.split("/")
        d = out
        for p in parents:
            d = d.setdefault(p, {})
        d[leaf] = v
    return out


def check_trained(settings: dict, what: str) -> None:
    """A checkpoint is 'trained' only if optimisation ran on data: refuse to cache anything else."""
    steps, seqs = settings.get("steps"), settings.get("train_sequences")
    if not steps or not seqs:
        raise SpecBenchError(
            f"training {what} ran {steps or 0} steps on {seqs or 0} training sequences: nothing was learned, so no "
            "checkpoint is written; give it data (train.data.*, train.max_sequences) and time (train.max_minutes, train.epochs)"
        )


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or infinity in `t`. One min/max reduction (aminmax propagates NaN; an infinity is an
    extreme): no boolean copy of a store of several GB, and ~20x faster than isfinite on a CPU."""
    if not t.dtype.is_floating_point or t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def save_checkpoint(kind: str, model_key: str, structure: dict, state: dict, settings: dict, keep_resume: bool = False) -> Path:
    check_trained(settings, kind)
    # no time stamp: the same setting trained again (or resumed) gives the same bytes, the same provenance hash
    meta = {"format": FORMAT, "kind": kind, "model_key": model_key, "structure": structure, "settings": settings}
    flat = _flatten(state)
    bad = [k for k, v in flat.items() if not all_finite(v)]
    if bad:  # a poisoned artifact would be found and loaded by every later run: never cache one
        raise SpecBenchError(f"training {kind} ended with NaN or infinite values in {len(bad)} tensors ({bad[0]!r} first); "
                             "no checkpoint written")
    path = checkpoint_path(kind, model_key, structure)
    atomic_write(path, lambda p: save_file(flat, str(p), metadata={"specbench": json.dumps(meta, default=str)}))
    if settings.get("stopped_by") != "train.max_minutes" and not keep_resume:  # a capped run keeps its state: a rerun continues it
        for stale in path.parent.glob(f"{path.stem}.*.resume.safetensors"):  # the training it resumed is finished
            stale.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path, hint: str) -> dict:
    """Metadata and tensors of a checkpoint file, or a one-line error naming the file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["specbench"])
            flat = {k: f.get_tensor(k) for k in f.keys()}
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}")
    except Exception as e:  # noqa: BLE001 - zero-byte, truncated, random bytes, a pickle, foreign metadata
        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise SpecBenchError(
            f"checkpoint {path} is damaged or not a specbench checkpoint ({reason}); delete it and re-create it with `{hint}`"
        ) from None
    return meta | {"state": _unflatten(flat)}


def checkpoint_meta(path: Path) -> dict:
    """The metadata of a checkpoint without reading its tensors (empty if unreadable)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return json.loads((f.metadata() or {})["specbench"])
    except Exception:  # noqa: BLE001 - only used for messages; loading reports damage properly
        return {}


def load_checkpoint(kind: str, model_key: str, structure: dict, where="auto", required: bool = True,
                    model_name: str = "") -> dict | None:
    """`where`: "auto" (the cache), a path, or None (no checkpoint)."""
    if where in (None, "none", False):
        return None
    path = find_checkpoint(kind, model_key, structure) if where == "auto" else Path(str(where)).expanduser()
    hint = TRAIN_HINT.get(kind, "python -m specbench.train").format(model=model_name or model_key,
                                                                    n=structure.get("n_layers", "N"))
    if not path.is_file():
        if not required:
            return None
        raise SpecBenchError(f"no trained {kind} checkpoint at {path}; train it with `{hint}`")
    check_published(path, hint)
    ckpt = read_checkpoint(path, hint)
    if ckpt.get("kind") != kind or ckpt.get("model_key") != model_key or ckpt.get("structure") != structure:
        raise SpecBenchError(
            f"checkpoint {path} was trained for {ckpt.get('kind')} on model {ckpt.get('model_key')} with "
            f"{ckpt.get('structure')}, not {kind} on {model_key} with {structure}"
        )
    ckpt["path"], ckpt["fix"] = str(path), f"delete it and re-create it with `{hint}`"
    return ckpt


def trained_summary(settings: dict | None) -> str | None:
    """'N steps on M sequences, held-out agreement a -> b' for a run's settings line."""
    if not settings:
        return None
    text = f"{settings.get('steps')} steps on {settings.get('train_sequences')} sequences"
    init = settings.get("init") or {}
    if init:  # a fine-tune (train.init): its steps, then what it started from
        text = "fine-tuned " + text
    if settings.get("held_out_agreement_after") is not None:
        text += f", held-out agreement {settings.get('held_out_agreement_before', 0):.3f} -> {settings['held_out_agreement_after']:.3f}"
    if settings.get("capped"):
        text += " (stopped early by a safety cap: " + ", ".join(
            c for c in (settings.get("stopped_by"), (settings.get("data") or {}).get("stopped_by")) if str(c).startswith("train.")) + ")"
    if init:
        text += f" from {init.get('trained') or init.get('file')}"
    return text


def expected_state(module, keep=lambda name: True) -> dict:
    """name -> (shape, dtype) of what a checkpoint must hold for `module` (the names `keep` selects)."""
    return {k: (tuple(v.shape), v.dtype) for k, v in module.state_dict().items() if keep(k)}


def check_state(state, expected: dict, path, fix: str = "") -> None:
    """`state` holds exactly `expected`'s names (see expected_state), each a tensor of that shape, of
    a floating dtype where the model's is one, with finite values; else one line naming the file.
    Shapes are compared before the caller allocates anything the checkpoint sizes."""
    fix = f"; {fix}" if fix else ""
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SpecBenchError(f"checkpoint {path} is not a flat state dict of tensors{fix}")
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    problems = ([f"missing key {missing[0]!r} ({len(missing)} missing)"] if missing else []) + (
        [f"unexpected key {unexpected[0]!r} ({len(unexpected)} the model does not have)"] if unexpected else [])
    if problems:
        raise SpecBenchError(f"checkpoint {path}: {'; '.join(problems)}{fix}")
    for k, (shape, dtype) in expected.items():
        t = state[k]
        if tuple(t.shape) != tuple(shape):
            raise SpecBenchError(f"checkpoint {path}: {k!r} has shape {list(t.shape)}, the model needs {list(shape)}{fix}")
        if t.dtype.is_floating_point != dtype.is_floating_point or t.is_complex():
            raise SpecBenchError(f"checkpoint {path}: {k!r} is {t.dtype}, the model needs {dtype}{fix}")
        if not all_finite(t):
            raise SpecBenchError(f"checkpoint {path}: {k!r} holds NaN or infinite values{fix}")



def read_json_object(path: Path, what: str, layout: str) -> dict:
    """A checkpoint's JSON config as a dict; unreadable or not an object is one line naming the
    file, prefixed `what` (e.g. "EAGLE checkpoint "), ending with the layout expected."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecBenchError(f"{what}{path}: cannot read ({type(e).__name__}); {layout}") from None
    if not isinstance(data, dict):
        raise SpecBenchError(f"{what}{path}: a JSON {type(data).__name__}, not an object; {layout}")
    return data

def read_weights_file(path: Path, layout: str) -> dict:
    """A flat {name: tensor} from a .safetensors file or a torch file loaded with weights_only (no
    pickle ever runs); any problem (damage, a refused pickle, not a state dict) is one line."""
    try:
        if Path(path).suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - damaged, truncated, a pickle weights_only refuses, a directory
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise SpecBenchError(f"{path}: cannot read ({type(e).__name__}: {reason}); {layout}") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise SpecBenchError(f"{path}: not a flat state dict of tensors; {layout}")
    return state


def apply_checkpoint(module, ckpt: dict | None, target, info: dict):
    """Load `ckpt` (if any) into a trainable part, strictly (check_state), record where it came from in
    `info`, and make the part ready for inference on the target's device, dtype and backend, frozen."""
    if ckpt is not None:
        check_state(ckpt["state"], expected_state(module), ckpt["path"], ckpt.get("fix", ""))
        module.load_state_dict(ckpt["state"])
        info["checkpoint"] = ckpt["path"]
        info["train_settings"] = ckpt.get("settings")
        info["trained"] = trained_summary(ckpt.get("settings"))
    module.to(device=target.device, dtype=target.dtype).eval()
    info |= rounded(module, target)
    apply_backend(module, backend_of(target.model))
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def load_draft_checkpoint(draft, target, n_layers: int, where="auto") -> dict | None:
    """Load a distilled vanilla-SD draft into `draft` if one is cached (or given); its checkpoint."""
    ckpt = load_checkpoint("vanilla_draft", target.key, {"n_layers": n_layers}, where, required=where != "auto",
                           model_name=target.name)
    if ckpt is None:
        return None
    # what training saves: the layers and the final norm (the embeddings and the head are the target's)
    check_state(ckpt["state"], expected_state(draft.model, lambda k: ".layers." in k or k.endswith("norm.weight")),
                ckpt["path"], ckpt["fix"])
    draft.model.load_state_dict(ckpt["state"], strict=False)  # strict above; the rest is the target's
    return ckpt | rounded(draft.model, target)


def rounded(module, target) -> dict:
    """`model.draft_quant`: a trained part's linear layers rounded at load, and what the run records of it."""
    if target.draft_quant == "none":
        return {}
    return {"draft_quant": f"{target.draft_quant} ({round_weights(module, target.draft_quant)} linear layers)"}


# -- Self-SD skip-search results ----------------------------------------------------------------
def skip_result_path(dir_, model_key: str) -> Path:
    base = Path(str(dir_)).expanduser() if dir_ else cache_dir() / "self_sd"
    return base / f"{safe_key(model_key)}.json"


def published_skip_path(model_key: str) -> Path:
    """Where a published skip set of this model ships (tools/publish.py): the search result,
    with the command that made it; `skip.source: auto|search` falls back to it when the cache holds none."""
    return PUBLISHED / safe_key(model_key) / "self_sd" / f"{safe_key(model_key)}.json"


def find_skip_result(dir_, model_key: str) -> Path:
    """The cache's search result (a local search wins), else the published one, else the cache path
    (where a search writes)."""
    cached = skip_result_path(dir_, model_key)
    if cached.is_file() or dir_:  # an explicit cache_dir names where to look: no fallback
        return cached
    shipped = published_skip_path(model_key)
    return shipped if shipped.is_file() else cached


def load_skip_result(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise SpecBenchError(f"skip-search result not found: {path}")
    result = read_json(path, "skip-search result", "python -m specbench.tools.skipsearch model=<name>")
    skip = result.get("skip") if isinstance(result, dict) else None
    if not isinstance(skip, dict) or not isinstance(skip.get("attn"), list) or not isinstance(skip.get("mlp"), list):
        raise SpecBenchError(f"skip-search result {path} has no skip.attn / skip.mlp lists")
    return result


def skip_result_summary(result: dict) -> str:
    """One line of what made this skip set (a run's settings line and the leaderboard's budget column)."""
    c = result.get("control") or {"name": "fixed", "k": result.get("k")}
    how = f"K={c['k']}" if c["name"] == "fixed" else f"adaptive exit, K<={c['k_max']}"
    text = (f"skip search: {result.get('iterations')} trials ({result.get('sampler')}) on {len(result.get('prompts') or [])} "
            f"GSM8K-train prompts x {result.get('max_new_tokens')} tokens, {how}")
    confirm = result.get("confirm")
    if confirm:
        best = next(x for x in confirm["candidates"] if x["trial"] == confirm["chosen_trial"])
        text += f"; best of {len(confirm['candidates'])} re-timed {confirm['repeats']}x: {best['median_speedup']:.2f}x AR"
    elif result.get("objective") and result.get("ar_objective"):
        text += f"; {result['ar_objective'] / result['objective']:.2f}x AR"
    return text
