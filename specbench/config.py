"""Composing and validating the configuration, before anything is written to disk.

Every entry point (`python -m specbench`, `specbench.train`, `specbench.skipsearch`) composes the
Hydra config through here and runs `validate` once over the result: a bad value is one line
`specbench: error: ...` (exit 2) naming the key, the value and what is allowed. For multiruns and
`+experiment` presets every combination of the sweep is composed and validated before the first
job starts, so Hydra's multi-line reports never reach the user.

This module imports nothing of specbench but `errors`: cli, train and skipsearch all import it.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
from pathlib import Path

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf

from specbench.errors import SpecBenchError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("method", "task", "model", "control", "experiment")
MULTIRUN_FLAGS = ("-m", "--multirun")
MAX_COMBINATIONS = 256  # beyond: each swept value once, the other keys at their first value


PAPER_CONTROL_FALLBACK = "fixed"  # the default controller of a method without conf/control/paper/<method>.yaml


def register_paper_control_fallbacks(conf_dir: Path = CONF_DIR) -> list[str]:
    """`control: paper/${method}` (conf/config.yaml) picks each method's paper default controller;
    the file is optional: for a method without one, `control/paper/<method>` is registered in
    Hydra's config store as PAPER_CONTROL_FALLBACK (a file, where there is one, is found first).
    Runs when this module is imported, which every entry point does before composing."""
    store = ConfigStore.instance()
    missing = sorted(p.stem for p in (conf_dir / "method").glob("*.yaml")
                     if not (conf_dir / "control" / "paper" / p.name).is_file())
    for name in missing:
        store.store(group="control/paper", name=name, node={"defaults": [f"/control/{PAPER_CONTROL_FALLBACK}@_here_"]})
    return missing


register_paper_control_fallbacks()


def fail(message: str, code: int = 2) -> None:
    print(f"specbench: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def one_line(e: BaseException, lines: int = 2) -> str:
    """Hydra's and OmegaConf's errors span several lines; keep the first ones, joined."""
    parts = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return "; ".join(parts[:lines]) or type(e).__name__


def check_choices(argv: list[str]) -> None:
    """Reject unknown group choices before Hydra does (its message spans many lines)."""
    for arg in argv:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if sep and key in GROUPS and "," not in value:
            options = sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml"))
            if value not in options:
                fail(f"unknown {key} {value!r}; allowed: {', '.join(options)}")


def compose(overrides: list[str], hydra_config: bool = False) -> DictConfig:
    """The composed config; any composition failure is a one-line SpecBenchError."""
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose("config", overrides=overrides, return_hydra_config=hydra_config)
    except Exception as e:  # noqa: BLE001 - any composition failure is bad input
        raise SpecBenchError(one_line(e)) from None


def _sweep_values(overrides: list[str]) -> list[list[str]]:
    """Each override as the list of its values (`k=1,2` -> ['k=1', 'k=2'])."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:  # noqa: BLE001
        raise SpecBenchError(one_line(e)) from None
    out = []
    for o in parsed:
        if o.is_sweep_override():
            key = o.get_key_element()
            out.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            out.append([o.input_line])
    return out


def combinations(argv: list[str]) -> list[list[str]] | None:
    """The override lists of every job `argv` starts (one unless it is a multirun); None when
    `argv` holds a Hydra flag we leave to Hydra (--help, --cfg, ...)."""
    flags = [a for a in argv if a.startswith("-")]
    if any(f not in MULTIRUN_FLAGS for f in flags):
        return None
    overrides = [a for a in argv if not a.startswith("-") and not a.startswith("hydra")]
    multirun = bool(flags)
    per_key = _sweep_values(overrides) if multirun else [[o] for o in overrides]
    first = [values[0] for values in per_key]
    base = compose(first, hydra_config=True)
    if str(base.hydra.mode).endswith("MULTIRUN"):
        multirun = True
        per_key = _sweep_values(overrides)
    if not multirun:
        return [overrides]
    # sweeps of a preset (hydra.sweeper.params), unless the command line sets the same key
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    params = base.hydra.sweeper.get("params") or {}
    per_key += [_sweep_values([f"{k}={v}"])[0] for k, v in params.items() if k not in given]
    if math.prod(len(v) for v in per_key) <= MAX_COMBINATIONS:
        return [list(c) for c in itertools.product(*per_key)]
    first = [values[0] for values in per_key]
    return [first[:i] + [v] + first[i + 1:] for i, values in enumerate(per_key) for v in values]


def precheck(argv: list[str]) -> None:
    """Compose and validate every job of `argv`; one line and exit 2 on the first bad one."""
    check_choices(argv)
    try:
        for overrides in combinations(argv) or []:
            validate(compose(overrides))
    except SpecBenchError as e:
        fail(str(e))


# ----------------------------------------------------------------------------- validation


ABSENT = object()  # a key the config does not have (hand-built configs): nothing to check


def _get(cfg, key: str):
    try:
        return OmegaConf.select(cfg, key, default=ABSENT, throw_on_missing=True)
    except Exception as e:  # noqa: BLE001 - e.g. an interpolation that does not resolve
        raise SpecBenchError(f"{key}: {one_line(e, 1)}") from None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _bad(key: str, value, allowed: str) -> SpecBenchError:
    return SpecBenchError(f"{key}={value!r} is not allowed; expected {allowed}")


def _int(cfg, key, lo=None, none_ok=False, extra=()):
    v = _get(cfg, key)
    if v is ABSENT or (v is None and none_ok) or v in extra:
        return v
    allowed = "an integer" + (f" >= {lo}" if lo is not None else "")
    allowed += " or null" if none_ok else ""
    allowed += "".join(f" or {x!r}" for x in extra)
    if not _is_int(v) or (lo is not None and v < lo):
        raise _bad(key, v, allowed)
    return v


def _num(cfg, key, lo=None, hi=None, lo_open=False):
    v = _get(cfg, key)
    if v is ABSENT:
        return v
    low = "" if lo is None else (f" > {lo}" if lo_open else f" >= {lo}")
    allowed = "a number" + low + (f" and <= {hi}" if hi is not None else "")
    if not _is_num(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        raise _bad(key, v, allowed)
    return v


def _bool(cfg, key):
    v = _get(cfg, key)
    if v is not ABSENT and v is not None and not isinstance(v, bool):
        raise _bad(key, v, "true or false")


def validate(cfg: DictConfig) -> None:
    """One pass over a composed config; raises SpecBenchError naming the first bad value."""
    _int(cfg, "seed")
    _int(cfg, "max_new_tokens", 1)
    _int(cfg, "threads", 1, none_ok=True)
    _int(cfg, "warmup_tokens", 0)
    for key in ("overwrite", "progress", "profile.enabled"):
        _bool(cfg, key)
    _num(cfg, "sampling.temperature", 0)
    _num(cfg, "sampling.top_p", 0, 1, lo_open=True)
    _int(cfg, "sampling.top_k", 0)
    if _get(cfg, "profile.enabled") not in (ABSENT, None, False):
        ks = _get(cfg, "profile.ks")
        if not isinstance(ks, ListConfig) or not ks or not all(_is_int(k) and k >= 1 for k in ks):
            raise _bad("profile.ks", ks, "a non-empty list of integers >= 1")
        _int(cfg, "profile.context", 1)
        _int(cfg, "profile.reps", 1)
    _task(cfg)
    _method(cfg)
    _control(cfg)
    _model(cfg)
    _against_defaults(cfg)


def _task(cfg):
    _int(cfg, "task.num_samples", 1, none_ok=True, extra=("all",))
    _int(cfg, "task.seed")
    if _get(cfg, "task.name") == "humaneval":
        _num(cfg, "task.timeout_s", 0, lo_open=True)
        _int(cfg, "task.memory_mb", 1)


def _method(cfg):
    _int(cfg, "method.draft_vocab.size", 1, none_ok=True)  # its upper bound, the vocabulary, is the model's
    if _get(cfg, "method.name") == "medusa" and _get(cfg, "method.variant") not in (ABSENT, "medusa1", "medusa2"):
        raise _bad("method.variant", _get(cfg, "method.variant"), "one of medusa1, medusa2")
    if _get(cfg, "method.name") == "medusa" and _get(cfg, "method.backbone") not in (ABSENT, "lora", "full"):
        raise _bad("method.backbone", _get(cfg, "method.backbone"), "one of full, lora")
    if _get(cfg, "method.name") == "eagle" and _get(cfg, "method.cls_labels") not in (ABSENT, "soft", "hard"):
        raise _bad("method.cls_labels", _get(cfg, "method.cls_labels"), "one of hard, soft")
    if _get(cfg, "method.name") == "pld":
        lo = _int(cfg, "method.min_ngram", 1)
        hi = _int(cfg, "method.max_ngram", 1)
        if lo is not ABSENT and hi is not ABSENT and hi < lo:
            raise _bad("method.max_ngram", hi, f"an integer >= method.min_ngram ({lo})")


def _control(cfg):
    for key in ("control.k", "control.k_max"):
        if _get(cfg, key) not in (ABSENT, None):
            _int(cfg, key, 1)


def _model(cfg):
    if _get(cfg, "model.loader") != "hf" or _get(cfg, "model.id") in (ABSENT, None, ""):
        return
    p = Path(str(_get(cfg, "model.id"))).expanduser()
    if p.is_dir() and not (p / "config.json").is_file():
        raise SpecBenchError(f"model.id={str(p)!r} is a directory but not a Hugging Face model (no config.json in it)")


EXPLICIT = {"task.num_samples"}  # checked by `validate` itself (a number or "all")


# the files a group choice comes from, by the choice's `name`
@functools.lru_cache(maxsize=None)
def _defaults_file(group: str, name: str) -> dict | None:
    for p in sorted((CONF_DIR / group).glob("*.yaml")):
        data = yaml.safe_load(p.read_text()) or {}
        if data.get("name", p.stem) == name or (group == "train" and p.stem == name):
            return data
    return None


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if k == "defaults" or k == "hydra":
            continue
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _against_defaults(cfg):
    """A key whose shipped default is a number takes a number (an integer if the default is
    one; null where a default may be switched off); `train` takes only the keys it ships with."""
    sources = [("", _defaults_file_top())]
    for group in ("method", "task", "model", "control"):
        name = _get(cfg, f"{group}.name")
        sources.append((f"{group}.", _defaults_file(group, str(name)) or {}))
    train = _defaults_file("train", "default") or {}
    sources.append(("train.", train))
    for prefix, data in sources:
        for key, default in _leaves(data, prefix):
            if not _is_num(default) or key in EXPLICIT:
                continue
            v = _get(cfg, key)
            if v is None or v is ABSENT:
                continue
            if _is_int(default) and not _is_int(v):
                raise _bad(key, v, "an integer")
            if not _is_num(v):
                raise _bad(key, v, "a number")
    if "train" in cfg:
        known = {k for k, _ in _leaves(train, "train.")}
        known_dicts = {k.rsplit(".", 1)[0] for k in known}
        for key, _ in _leaves(OmegaConf.to_container(cfg.train, resolve=False), "train."):
            if key not in known and key not in known_dicts:
                parent = key.rsplit(".", 1)[0] + "."
                allowed = ", ".join(sorted(k for k in known if k.startswith(parent) and "." not in k[len(parent):]))
                raise SpecBenchError(f"unknown key {key!r} in the train config; allowed: {allowed}")


@functools.lru_cache(maxsize=None)
def _defaults_file_top() -> dict:
    return yaml.safe_load((CONF_DIR / "config.yaml").read_text()) or {}
