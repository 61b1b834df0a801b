"""A run's identity, read from its config alone (no run module needed): the fingerprint a run dir
keeps in config.json and compares on resumption, `config_hash` (the default run name's
`${fingerprint:}` part, registered in specbench/__init__.py), and `check_run_dir`, which the
config's validation runs before anything is written (the run dir itself: specbench/run/rundir.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specbench.config.engines import RUN_FILES as ENGINE_FILES, fingerprint_engine
from specbench.core.errors import SpecBenchError

# config keys that may differ between a run and its resumption
RESUMABLE_KEYS = ("num_samples", "progress", "overwrite", "print_summary")
LOCK = ".lock"


def fingerprint(cfg: DictConfig) -> dict:
    c = OmegaConf.to_container(cfg, resolve=True)
    for k in RESUMABLE_KEYS:
        c.pop(k, None)
        c.get("task", {}).pop(k, None)
    c.pop("run_dir", None)
    if c.get("timing") == "fine":  # the default, and what runs recorded before the key existed did
        c.pop("timing")
    if (c.get("model") or {}).get("draft_quant") == "none":  # likewise: float trained parts, as before the key
        c["model"].pop("draft_quant")
    drop_unread_training_keys(c)
    fingerprint_engine(c)
    return c


def drop_unread_training_keys(c: dict) -> None:
    """A config's `train` group, in place, as far as its method can read it: the whole group goes for a
    method that never trains on first use, the skip search's keys for one without a skip set, and
    keys added later go while unset. Also what the report applies to stored runs' configs, so runs
    recorded before a key left the identity are not told apart by it."""
    if not trains_on_first_use(c):
        c.pop("train", None)
    drop_unset_training_keys(c.get("train"))
    if "skip" not in (c.get("method") or {}):  # only a method with a skip set (Self-SD) searches one on first use
        ((c.get("train") or {}).get("first_use") or {}).pop("skip_search", None)


def drop_unset_training_keys(train) -> None:
    """Training keys added after runs were stored leave the identity while unset (no general
    prompts, no init), as runs recorded before they existed had them: no run dir is renamed and
    no stored run refused for a key that changes nothing."""
    if not isinstance(train, dict):
        return
    if train.get("init") is None:
        train.pop("init", None)
    if train.get("distill") == "hard":  # the loss every run before the key trained with
        train.pop("distill", None)
    if train.get("cap") == "first":  # the head of the data, as every cap before the key
        train.pop("cap", None)
    if train.get("matmul") == "float32":  # exact float32, as every run before the key
        train.pop("matmul", None)
    train.pop("prefill_batch_size", None)  # speed only: the same labels and features at any batch, up to rounding
    data = train.get("data")
    if isinstance(data, dict) and not data.get("general_prompts"):
        for k in ("general_prompts", "general_max_prompt_tokens"):
            data.pop(k, None)


def trains_on_first_use(c: dict) -> bool:
    """Whether the `train` group can change what the method runs with: only a method that trains
    on first use (its conf has `train_if_missing`) reads it. For the others (PLD, REST, suffix ...)
    it stays out of the identity, so a new first-use budget neither renames their default run dirs
    nor refuses their resumption."""
    return "train_if_missing" in (c.get("method") or {})


# the files a run dir holds (a directory holding only these, or our config.json, is a run)
RUN_FILES = {LOCK, "config.json", "config.yaml", "samples.jsonl", "summary.json", "forward_costs.json", "profile.json",
             *ENGINE_FILES}


def config_hash(cfg: DictConfig, exclude=()) -> str:
    """8 hex digits of the fingerprint of `cfg` without its run name and dir and the dotted keys
    `exclude`: the default run name's distinguishing part (conf/config.yaml `${fingerprint:}`)."""
    # unresolved, so that resolving the copy never asks for the run name being computed
    c = OmegaConf.to_container(cfg, resolve=False)
    for key in ("run_name", "run_dir", "hydra", *exclude):
        *parents, leaf = key.split(".")
        node = c
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    text = json.dumps(fingerprint(OmegaConf.create(c)), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def is_run_config(config) -> bool:
    """A config.json written by `fingerprint` (a model's config.json has no `method` group)."""
    return isinstance(config, dict) and isinstance(config.get("method"), dict) and "name" in config["method"]


def check_run_dir(path) -> Path:
    """The run dir as a Path when it may be written: new, empty, or holding a run (our config.json,
    or only a run's files). Anything else is refused before anything is written into it."""
    if path is None or not str(path).strip():
        raise SpecBenchError(f"run_dir={path!r} is empty; give a directory (default: results/runs/<model>/<task>/<run_name>)")
    p = Path(str(path)).expanduser()
    if not p.exists():
        return p
    if not p.is_dir():
        raise SpecBenchError(f"run_dir={str(path)!r} is not a directory; choose a new or empty one")
    try:
        entries = sorted(e.name for e in p.iterdir())
    except OSError as e:
        raise io_error(p, e) from None
    if not entries or "samples.jsonl" in entries:
        return p  # empty, or a run's samples (checked against its config.json once locked)
    if "config.json" in entries:
        try:
            ours = is_run_config(json.loads((p / "config.json").read_text()))
        except (OSError, ValueError, UnicodeDecodeError):
            ours = False
    else:
        ours = set(entries) <= RUN_FILES  # a run's remains (e.g. only its lock)
    if not ours:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise SpecBenchError(f"run_dir={str(path)!r} holds files that are not a specbench run ({shown}); "
                             "choose a new or empty directory")
    return p


def io_error(path: Path, e: OSError) -> SpecBenchError:
    return SpecBenchError(f"cannot write run dir {path}: {e.strerror or e}")


def _name_stem(name) -> str | None:
    """A run name without the 8-hex `${fingerprint:}` suffix: that part is derived from the keys
    compared anyway, so a change of what the fingerprint holds must not refuse a run."""
    return re.sub(r"-[0-9a-f]{8}$", "", name) if isinstance(name, str) else name


def refuse_other_config(path: Path, old: dict, fp: dict, ignored: set) -> None:
    if _name_stem(old.get("run_name")) == _name_stem(fp.get("run_name")):
        ignored = ignored | {"run_name"}
    diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k) and k not in ignored)
    if diff:
        raise SpecBenchError(
            f"run dir {path} holds results of a different configuration (differs in: {', '.join(diff)}); "
            "choose another run_name or pass overwrite=true"
        )


def lean_summary(path: Path) -> int | None:
    """The samples a run dir's summary.json counts when the dir has no samples.jsonl to resume from
    (a copy kept as config + summary, as results/leaderboard keeps its cells), else None. Running into
    such a dir would replace those results by new ones: refused unless overwrite=true moves them aside."""
    samples = path / "samples.jsonl"
    if samples.exists() and samples.stat().st_size > 0:
        return None
    try:
        n = json.loads((path / "summary.json").read_text()).get("samples")
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def refuse_lean(path: Path) -> None:
    if (n := lean_summary(path)) is not None:
        raise SpecBenchError(
            f"run dir {path} holds the summary of {n} samples but not their samples.jsonl (a copy kept as config + "
            "summary), so a run cannot resume from it and would replace it; pass overwrite=true (moves it aside, "
            "deletes nothing) or choose another run_name")


def check_resumable(path, cfg: DictConfig, overwrite: bool) -> None:
    """Refuse, before the model is loaded or the method built (REST's datastore, a first-use
    training), and for every point of a sweep before the first runs, a run dir whose results come
    from another configuration or cannot be resumed. Only the keys that need no provenance are
    compared here; `train` and the artifacts' hashes are judged when RunDir opens the dir, after
    the method is built."""
    path = Path(str(path)).expanduser()
    if overwrite or not path.is_dir():
        return
    refuse_lean(path)
    samples = path / "samples.jsonl"
    if not samples.exists() or samples.stat().st_size == 0:
        return
    try:
        old = json.loads((path / "config.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return  # missing or damaged: RunDir says so in its own words
    if isinstance(old, dict):
        refuse_other_config(path, old, fingerprint(cfg), {"provenance", "train"})
