"""What a run was made with beyond its config: the model's weights and every trained artifact.

A run's fingerprint (config.json, specbench/run/rundir.py) holds `provenance`:
  model:     the weights' identity. The embedded GGUF and a local Hugging Face directory: the
             SHA-256 of their files; a hub id: its snapshot's commit; the tiny random Llama: its
             seed and shape are in the config already, its key is recorded.
  artifacts: each trained or given file a method names (its describe(): EESD exit layer,
             Cali-TS predictor, Medusa/EAGLE/SPACE heads, distilled draft, skip set, draft
             vocabulary), each existing path among the method's and controller's settings, and
             each file the method declares it reads (its inputs(): REST's corpus files and
             datastore): path and SHA-256, under the key that names it.
So new weights at the same `model.id`, a cached checkpoint replaced by a new training, or a corpus
rewritten in place make a resumption a different run (refused in one line naming what changed),
never a silent mix.

Hashes are cached per file by (path, size, mtime, inode) under the specbench cache dir, so a
500 MB file is read once, not on every run; a file replaced in place (a new inode or mtime) is
hashed again. Imports nothing heavy at module level: the report reads `describe_change`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from specbench.core.cachedir import cache_dir

CHUNK = 1 << 20
SHORT = 8  # hex digits of a hash shown in messages and labels


def _cache_entry(path: Path, st: os.stat_result) -> Path:
    key = json.dumps([str(path), st.st_size, st.st_mtime_ns, st.st_ino])
    return cache_dir() / "hashes" / (hashlib.sha1(key.encode()).hexdigest() + ".json")


def file_sha256(path: Path) -> str:
    """The file's SHA-256, read once per (path, size, mtime, inode)."""
    path = Path(path).resolve()
    st = path.stat()
    entry = _cache_entry(path, st)
    try:
        return json.loads(entry.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    try:  # a cache that cannot be written only costs the next run a re-read
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"path": str(path), "sha256": digest}))
        os.replace(tmp, entry)
    except OSError:
        pass
    return digest


def _files(path: Path) -> list[Path]:
    """A directory's files, recursively, in a stable order; hidden entries (a hub download's
    `.cache`, editor files) are not part of the content."""
    out = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [Path(root) / f for f in sorted(files) if not f.startswith(".")]
    return out


def path_digest(path) -> dict:
    """{"path", "sha256"} of a file, or of a directory's files (their names and hashes)."""
    path = Path(str(path)).expanduser()
    if path.is_file():
        return {"path": str(path.resolve()), "sha256": file_sha256(path)}
    h = hashlib.sha256()
    for f in _files(path):
        h.update(f"{f.relative_to(path).as_posix()}\0{file_sha256(f)}\n".encode())
    return {"path": str(path.resolve()), "sha256": h.hexdigest()}


def model_provenance(model_cfg, adapter) -> dict:
    """The weights' identity for `model_cfg` (model settings) as loaded into `adapter`."""
    loader = model_cfg.loader
    if loader == "gguf":
        from specbench.models import gguf_path

        return path_digest(gguf_path(model_cfg))
    if loader == "hf":
        local = Path(str(model_cfg.id)).expanduser()
        if local.exists():
            return path_digest(local)
        return {"id": str(model_cfg.id), "commit": _hub_commit(model_cfg)}
    return {"key": getattr(adapter, "key", None)}  # tiny: built from the seed and shape in the config


def _hub_commit(model_cfg) -> str | None:
    """The commit of the cached hub snapshot the model was loaded from (files at a commit never change)."""
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(str(model_cfg.id), revision=model_cfg.revision, local_files_only=True)
        return Path(path).name
    except Exception:  # noqa: BLE001 - not cached as a snapshot: the id and revision are all we know
        return None


def _paths(obj, prefix: str = ""):
    """(key, value) of every string in `obj` that names an existing file or directory."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, f"{prefix}{k}.")
    elif isinstance(obj, str) and (os.sep in obj or obj.startswith("~")) and Path(obj).expanduser().exists():
        yield prefix[:-1], obj


def _inputs(inputs: dict):
    """(key, path) of each file a method declares it reads (SpeculativeMethod.inputs); a list of
    several is numbered key.0, key.1, ..."""
    for key, value in inputs.items():
        paths = list(value) if isinstance(value, (list, tuple)) else [value]
        for i, path in enumerate(paths):
            yield (key if len(paths) == 1 else f"{key}.{i}"), str(path)


def artifact_provenance(settings: dict, describe: dict, inputs: dict | None = None) -> dict:
    """key -> {"path", "sha256"} for every file the method loaded (its describe()), was given (a
    path among `settings`, the method's and controller's config) or reads (its inputs())."""
    out = {}
    for key, value in [*_paths(settings), *_paths(describe), *_inputs(inputs or {})]:
        digest = path_digest(value)
        if digest not in out.values():
            out[key] = digest
    return out


def run_provenance(run, target, method) -> dict:
    """`run`: the run's settings (specbench/config/settings.py)."""
    from specbench.config.settings import record

    given = {g: record(getattr(run, g)) for g in ("method", "control")}
    return {"model": model_provenance(run.model, target),
            "artifacts": artifact_provenance(given, method.describe(), method.inputs())}


def _short(entry: dict | None) -> str:
    if not entry:
        return "none"
    if entry.get("sha256"):
        return f"sha256 {entry['sha256'][:SHORT]}"
    return ", ".join(f"{k} {v}" for k, v in sorted(entry.items()) if k != "path") or "unknown"


def describe_change(old: dict | None, new: dict) -> str | None:
    """One phrase naming what differs between two provenances, or None when they agree."""
    if old == new:
        return None
    if not old:
        return "its samples were recorded without the weights' and trained artifacts' hashes (an older specbench)"
    changes = []
    if old.get("model") != new.get("model"):
        o, n = old.get("model") or {}, new.get("model") or {}
        where = n.get("path") or n.get("id") or n.get("key") or "the model"
        changes.append(f"the model's weights {where} ({_short(o)} -> {_short(n)})")
    oa, na = old.get("artifacts") or {}, new.get("artifacts") or {}
    for key in sorted(set(oa) | set(na)):
        if oa.get(key) != na.get(key):
            where = (na.get(key) or oa.get(key))["path"]
            changes.append(f"{key} {where} ({_short(oa.get(key))} -> {_short(na.get(key))})")
    return "; ".join(changes) or "its provenance"
