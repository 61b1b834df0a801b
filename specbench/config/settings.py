"""Typed settings: what each part of a run reads, built once from the validated composed config.

One class per schema table, generated from specbench/config/schema.py (the one source of types): a frozen
dataclass whose fields are the table's keys, each with its `schema.Key` in the field's metadata and
none with a default, since every value comes from the composed YAML (conf/, the one place a default
is written). A dotted key (`draft.num_layers`) is a field `draft` holding a nested settings object.
Reading a key the table does not have is an AttributeError, not a silent default.

    run = settings.of(cfg)                      # after config.validate(cfg): the whole run
    run.method.draft.num_layers, run.task.seed  # each part gets its own group's object
    settings.group("method", node)              # one group's settings from its config node
    settings.merge(s, {"lr": 1e-4})             # s with keys replaced (checked again)
    settings.record(s)                          # the resolved node s was built from, key order kept

A method gets its own settings and `RunValues` (the few run-level values it reads), never the run.
Records (config.json, checkpoint metadata, the tiny model's key) use `record`, which returns the
node as composed: the same bytes as before settings existed. Keys a table marks optional (not
shipped in conf/) read as their `absent` value when not given and are left out of `record`.

A method, task or controller registered at runtime (library use, tests) without a table gets an
untyped settings object with the keys its node has.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from specbench.config import schema
from specbench.core.errors import SpecBenchError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
_CLASSES: dict[str, type] = {}
_TYPES = {"int": "int", "num": "float", "bool": "bool", "str": "str", "list": "list", "table": "dict", "any": "Any"}
SOURCE = "_source"  # the instance attribute holding the node a settings object was built from
KINDS = ("method", "task", "model", "control", "engine", "train")  # a run's groups, in its `Run` object


def _camel(text: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[^0-9A-Za-z]+", text) if p)


def _annotation(key: schema.Key) -> str:
    text = _TYPES[key.type]
    if key.type in ("int", "num") and key.choices:
        text += " | str"
    return text + (" | None" if key.null or key.optional else "")


def settings_class(name: str, table: dict, where: str) -> type:
    """The frozen dataclass for `table` (flat dotted keys), generated once per name; `where`: its
    keys' prefix in error lines (`method`, `method.draft`)."""
    if name in _CLASSES:
        return _CLASSES[name]
    leaves, nested = {}, {}
    for key, spec in table.items():
        head, dot, rest = key.partition(".")
        if dot:
            nested.setdefault(head, {})[rest] = spec
        else:
            leaves[head] = spec
    fields = [(k, _annotation(spec), dataclasses.field(metadata={"key": spec})) for k, spec in leaves.items()]
    fields += [(k, name + _camel(k), dataclasses.field(metadata={"class": settings_class(name + _camel(k), sub, f"{where}.{k}")}))
               for k, sub in nested.items()]
    cls = dataclasses.make_dataclass(name, fields, frozen=True, namespace={"__module__": __name__, "_where": where})
    _CLASSES[name] = cls
    return cls


def _plain(node) -> dict:
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True)
    if dataclasses.is_dataclass(node):
        return record(node)
    return copy.deepcopy(dict(node))


def build(cls: type, node: Mapping):
    """An instance of `cls` from `node` (every key of its table there, no other; values checked)."""
    node, where = _plain(node), cls._where
    names = {f.name for f in dataclasses.fields(cls)}
    for k in node:
        if k not in names:
            allowed = ", ".join(sorted(f.name for f in dataclasses.fields(cls) if not _optional(f)))
            raise SpecBenchError(f"unknown key '{where}.{k}'; allowed: {allowed}")
    values = {}
    for f in dataclasses.fields(cls):
        at = f"{where}.{f.name}"
        if "class" in f.metadata:
            if f.name not in node or not isinstance(node[f.name], dict):
                raise SpecBenchError(f"{at} is missing" if f.name not in node else f"{at}: expected a mapping")
            values[f.name] = build(f.metadata["class"], node[f.name])
            continue
        spec = f.metadata["key"]
        if f.name in node:
            schema.check(at, node[f.name], spec)
            values[f.name] = node[f.name]
        elif spec.optional:
            values[f.name] = spec.absent
        else:
            raise SpecBenchError(f"{at} is missing (conf/ ships every key: build settings from the composed YAML)")
    out = cls(**values)
    object.__setattr__(out, SOURCE, node)
    return out


def _optional(f) -> bool:
    return "key" in f.metadata and f.metadata["key"].optional


def _untyped(kind: str, node: Mapping):
    """A group registered at runtime without a schema table: its node's own keys, untyped."""
    node = _plain(node)
    label = _camel(str(node["name"])) if "name" in node else ""
    return build(settings_class(f"{label}{_camel(kind)}Untyped{len(_CLASSES)}", {k: schema.ANY for k in node}, kind), node)


def group(kind: str, node, engine: str = "native"):
    """The settings of one group (method, task, model, control, engine, train) from its node;
    `engine`: the run's engine.name (engine=vllm: the method is one of vLLM's)."""
    plain = _plain(node)
    choice, table = schema.group_table(kind, plain, engine)
    if table is None and kind == "model":
        raise SpecBenchError(f"unknown model {choice}; allowed: {', '.join(sorted(schema.MODELS))}")
    if table is None:
        return _untyped(kind, plain)
    label = "" if kind == "train" else _camel(str(plain["loader" if kind == "model" else "name"]))
    prefix = "Vllm" if kind == "method" and engine == "vllm" else ""
    return build(settings_class(prefix + label + _camel(kind), table, kind), plain)


def shipped(kind: str, name: str, *overrides: Mapping):
    """The settings of conf/<kind>/<name>.yaml as shipped, `overrides` merged over them: a part
    built outside a run (SAM-Decoding's auxiliary, a Hugging Face draft model, the doctor)."""
    node = OmegaConf.merge(OmegaConf.load(CONF_DIR / kind / f"{name}.yaml"), *(_plain(o) for o in overrides))
    return group(kind, node)  # interpolations resolved after the merge, as composing does (fixed: k_max: ${.k})


def expect(s, what: str) -> None:
    """Parts take settings objects, not config nodes (a DictConfig would read any key it lacks
    through interpolation or a default elsewhere): a TypeError naming the part otherwise."""
    if not dataclasses.is_dataclass(s) or type(s).__module__ != __name__:
        raise TypeError(f"{what} takes settings (specbench.config.settings.group / of), not {type(s).__name__}")


def _run_class() -> type:
    if "Run" not in _CLASSES:
        top = settings_class("RunTop", schema.TOP, "run")
        fields = [(f.name, f.type, dataclasses.field(metadata=f.metadata)) for f in dataclasses.fields(top)]
        fields += [(k, "Any", dataclasses.field(metadata={"group": k})) for k in KINDS]
        _CLASSES["Run"] = dataclasses.make_dataclass("Run", fields, frozen=True, namespace={"__module__": __name__})
    return _CLASSES["Run"]


def of(cfg) -> Any:
    """The whole run's settings from a composed config (validated: config.validate)."""
    plain = _plain(cfg)
    plain.pop("hydra", None)  # compose(return_hydra_config=True): Hydra's own node, not the run's
    missing = [k for k in KINDS if not isinstance(plain[k] if k in plain else None, dict)]
    if missing:
        raise SpecBenchError(f"the config has no {missing[0]} group")
    cls = _run_class()
    top = build(_CLASSES["RunTop"], {k: v for k, v in plain.items() if k not in KINDS})
    kwargs = {f.name: getattr(top, f.name) for f in dataclasses.fields(top)}
    kwargs |= {k: group(k, plain[k], str(plain["engine"]["name"])) for k in KINDS}
    out = cls(**kwargs)
    object.__setattr__(out, SOURCE, plain)
    return out


def record(s) -> dict:
    """The resolved node `s` was built from (a copy; key order as composed). A copy made by
    dataclasses.replace (unchecked: tests reaching a value the schema refuses) has no node: its fields."""
    if hasattr(s, SOURCE):
        return copy.deepcopy(getattr(s, SOURCE))
    out = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if not (_optional(f) and v == f.metadata["key"].absent):
            out[f.name] = record(v) if dataclasses.is_dataclass(v) else copy.deepcopy(v)
    return out


def merge(s, *overrides: Mapping):
    """`s` with `overrides` deep-merged over its node (as OmegaConf.merge: mappings merged, other
    values replaced), built and checked again."""
    node = record(s)
    for over in overrides:
        node = _merged(node, _plain(over))
    return of(node) if type(s) is _run_class() else build(type(s), node)


def with_group(run, kind: str, s):
    """The run's settings with its `kind` group replaced by `s` (first use trains SAM-Decoding's
    auxiliary with the auxiliary's settings as the method's)."""
    node = record(run)
    node[kind] = record(s)
    return of(node)


def has(s, key: str) -> bool:
    """Whether `s`'s table has `key` (a part shared by methods whose tables differ: Hugging Face's
    assisted generation has a `mode`, vanilla SD not)."""
    return key in {f.name for f in dataclasses.fields(s)}


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and k in out and isinstance(out[k], dict) else copy.deepcopy(v)
    return out


@dataclass(frozen=True)
class RunValues:
    """What a method reads of its run besides its own settings; the runner builds it once
    (`run_values`). No field has a default: tests build it from the composed YAML too."""

    timing: str       # engine/timer.py: fine | coarse
    control: Any      # the control group's settings: a drafting method's controller
    data_dir: Any     # task.data_dir: where corpora (REST, SAM-Decoding) and distillation prompts are read
    model_name: str   # model.name: names a corpus's cached datastore
    train: Any        # the train settings: draft_vocab.source=distill ranks the self-distillation data's tokens


def run_values(run) -> RunValues:
    return RunValues(run.timing, run.control, run.task.data_dir, run.model.name, run.train)
