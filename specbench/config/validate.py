"""Validating a composed configuration, before anything is written to disk.

One pass over a composed config: every key against the typed schema (specbench/config/schema.py: types,
ranges, null; a key the schema does not know is refused, with the nearest known one), then the rules
between keys, then the resource bounds that need the model's shape (specbench/config/modelinfo.py: read
without the weights). A hand-built config may leave keys out (tests, library use): only what is there is
checked. Imports no torch (specbench/config/compose.py calls it before torch loads).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from specbench.config import bounds, modelinfo, schema, settings
from specbench.config.engines import engine_rules
from specbench.config.identity import check_resumable, check_run_dir
from specbench.core.errors import SpecBenchError, bad_value, one_line, show_value
from specbench.core.taskfile import task_file

NEAR = 0.75  # an unknown key's nearest known one is suggested from this similarity of their last names
ABSENT = object()  # a key the config does not have


def _get(cfg, key: str):
    try:
        v = OmegaConf.select(cfg, key, default=ABSENT, throw_on_missing=True)
    except Exception as e:  # noqa: BLE001 - e.g. an interpolation that does not resolve
        raise SpecBenchError(f"{key}: {one_line(e, 1)}") from None
    return OmegaConf.to_container(v, resolve=True) if isinstance(v, (DictConfig, ListConfig)) else v


_show, _bad = show_value, bad_value


check_value = schema.check


def check_values(values: dict, table: dict) -> None:
    """Plain key -> value settings (specbench.tools.skipsearch's own keys) against a schema table."""
    for key, value in values.items():
        if key not in table:
            raise SpecBenchError(f"unknown key {key!r}; allowed: {', '.join(sorted(table))}")
        check_value(key, value, table[key])


def _walk(cfg, path: str, table: dict, where: str, rel: str = "") -> None:
    """Every key under `path` (a dict node of cfg) against `table` (keys relative to the group)."""
    node = OmegaConf.select(cfg, path) if path else cfg
    for k in node.keys():
        if not path and k in schema.GROUP_KEYS:
            _group(cfg, k)
            continue
        full, key = f"{path}.{k}" if path else str(k), f"{rel}{k}"
        spec = table.get(key)
        if spec is not None and spec.type == "table":
            _walk(cfg, full, spec.table, where)
        elif spec is not None:
            check_value(full, _get(cfg, full), spec)
        elif any(t.startswith(key + ".") for t in table) and isinstance(node._get_node(k), DictConfig):
            _walk(cfg, full, table, where, key + ".")
        elif any(t.startswith(key + ".") for t in table):
            raise _bad(full, _get(cfg, full), "a mapping of " + ", ".join(sorted(t for t in table if t.startswith(key + "."))))
        else:
            siblings = {t[len(rel):].split(".")[0] for t in table if t.startswith(rel) and not table[t].optional}
            siblings = sorted(siblings | (set(schema.GROUP_KEYS) if not path else set()))  # the groups are keys too
            raise SpecBenchError(f"unknown key {full!r}{where}{_nearest(cfg, full)}; allowed: {', '.join(siblings)}")


def _nearest(cfg, key: str) -> str:
    """' (did you mean ...?)' for a misspelt or misplaced key (n_samples -> task.num_samples), else ''."""
    def paths(node, prefix=""):
        for k in node.keys():
            full = f"{prefix}{k}"
            yield full
            if isinstance(node._get_node(k), DictConfig):
                yield from paths(node[k], full + ".")
    parent, _, leaf = key.rpartition(".")
    group = key.split(".")[0] + "." if parent else ""  # a group's key is another key of that group, not train's
    # leaf names are compared (full paths would match any sibling on the shared prefix); ties go to a sibling,
    # then to the shallower key (temperature: sampling.temperature, not train.data.temperature)
    scored = [(difflib.SequenceMatcher(None, leaf, p.rpartition(".")[2]).ratio(), p.rpartition(".")[0] == parent,
               -p.count("."), p)
              for p in paths(cfg) if p.startswith(group) and p != key and not key.startswith(p + ".")
              and not p.startswith(key + ".")]
    best = max(scored, default=(0.0, False, 0, ""))
    return f" (did you mean {best[3]!r}?)" if best[0] >= NEAR else ""


def validate(cfg: DictConfig) -> None:
    """One pass over a composed config; raises SpecBenchError naming the first bad value."""
    _walk(cfg, "", schema.TOP, "")
    rules(cfg)
    resources(cfg)
    if (run_dir := _get(cfg, "run_dir")) is not ABSENT:  # the values first, then where they would be written:
        # for every sweep point before the first starts, a directory that is not a run, or one whose
        # results are another configuration's or cannot be resumed
        check_run_dir(run_dir)
        check_resumable(run_dir, cfg, _get(cfg, "overwrite") is True)


def _group(cfg, group: str) -> None:
    if not isinstance(cfg[group], DictConfig):
        raise _bad(group, _get(cfg, group), f"a {group} config (a mapping)")
    choice, table = schema.group_table(group, cfg[group], _get(cfg, "engine.name"))
    if table is None and group != "model":
        # a method, task or controller registered at runtime (library use, tests), not shipped in
        # conf/: its own code checks its keys (the command line only offers conf/'s choices)
        return
    if table is None:
        raise SpecBenchError(f"unknown {group} {choice}; allowed: {', '.join(sorted(schema.MODELS))}")
    _walk(cfg, group, table, f" for {group} {choice}" if group != "train" else " in the train config")


# ----------------------------------------------------------------------------- rules between keys
def _present(*values) -> bool:
    return all(v is not ABSENT and v is not None for v in values)


# below it, logits / temperature overflow float32 to inf and sampling fails (vLLM treats such values as greedy)
MIN_TEMPERATURE = 1e-5


def rules(cfg) -> None:
    """What one key allows given another (each key's own type and range are already checked)."""
    for key in ("sampling.temperature", "train.data.temperature"):
        if isinstance(t := _get(cfg, key), (int, float)) and 0 < t < MIN_TEMPERATURE:
            least = f"a number >= {MIN_TEMPERATURE}"
            raise _bad(key, t, f"{'0 (greedy) or ' if key.startswith('sampling') else ''}{least} (below, logits / temperature overflow float32)")
    if _get(cfg, "train") is not ABSENT:  # refused here, not after the data is generated
        if _get(cfg, "train.max_steps") is None and _get(cfg, "train.epochs") is None:
            raise SpecBenchError("train.max_steps and train.epochs are both null: set train.max_steps=N (optimiser steps) "
                                 "or train.epochs=N")
        new, prefix = _get(cfg, "train.data.max_new_tokens"), _get(cfg, "train.data.greedy_prefix")
        if _present(new, prefix) and isinstance(new, int) and isinstance(prefix, int) and new <= prefix:
            raise _bad("train.data.max_new_tokens", new, f"an integer > train.data.greedy_prefix ({prefix}), the greedy "
                       "tokens before a sampled answer")
    lo, hi = _get(cfg, "method.min_ngram"), _get(cfg, "method.max_ngram")
    if _get(cfg, "method.name") == "pld" and _present(lo, hi) and hi < lo:
        raise _bad("method.max_ngram", hi, f"an integer >= method.min_ngram ({lo})")
    lo, hi = _get(cfg, "method.min_suffix"), _get(cfg, "method.max_suffix")
    if _get(cfg, "method.name") == "rest" and _present(lo, hi) and hi < lo:
        raise _bad("method.max_suffix", hi, f"an integer >= method.min_suffix ({lo})")
    if _get(cfg, "method.name") == "samd":
        _aux_settings(cfg)
    if _get(cfg, "model.loader") == "tiny":
        hidden, heads, kv = (_get(cfg, f"model.{k}") for k in ("hidden_size", "num_heads", "num_kv_heads"))
        if _present(hidden, heads) and hidden % heads:
            raise _bad("model.hidden_size", hidden, f"a multiple of model.num_heads ({heads})")
        if _present(hidden, heads) and (hidden // heads) % 2:
            raise _bad("model.hidden_size", hidden, f"model.hidden_size / model.num_heads ({heads}) even (rotary embeddings rotate pairs)")
        if _present(heads, kv) and heads % kv:
            raise _bad("model.num_kv_heads", kv, f"a divisor of model.num_heads ({heads})")
    if _get(cfg, "model.loader") == "hf":
        _hf_path(cfg, "model.id")
    if _get(cfg, "method.draft.source") == "hf":
        if _get(cfg, "method.draft.id") in (ABSENT, None, ""):
            raise SpecBenchError("method.draft.source=hf needs method.draft.id=<hub id or local path of the draft model>")
        _hf_path(cfg, "method.draft.id")
    engine_rules(lambda key: None if (v := _get(cfg, key)) is ABSENT else v)
    if _present(_get(cfg, "task.path")):  # (none given: task=jsonl says so when it loads)
        _task_file(cfg)


def _task_file(cfg) -> None:
    """task.path names a file that exists, where the task will look for it (also under its data dir)."""
    data_dir = _get(cfg, "task.data_dir")
    data_dir = data_dir if _present(data_dir) and data_dir else os.environ.get("SPECBENCH_DATA_DIR")
    task_file(_get(cfg, "task.path"), Path(data_dir).expanduser() if data_dir else None)


def _hf_path(cfg, key: str) -> None:
    """A Hugging Face model given as a local path: a folder holding config.json (a hub id is org/name)."""
    if (raw := _get(cfg, key)) in (ABSENT, None):
        return
    p = Path(str(raw)).expanduser()
    if str(raw).startswith(("/", "./", "../", "~")) and not p.exists():
        raise SpecBenchError(f"{key}={str(raw)!r}: no such directory (a local model is a folder holding config.json)")
    if p.is_dir() and not (p / "config.json").is_file():
        raise SpecBenchError(f"{key}={str(p)!r} is a directory but not a Hugging Face model (no config.json in it)")


def _aux_settings(cfg) -> None:
    """SAM-Decoding's `aux_settings`: keys of its auxiliary drafter's own table (not its name)."""
    aux, over = _get(cfg, "method.aux"), _get(cfg, "method.aux_settings")
    if over is ABSENT or aux not in schema.METHODS:
        return
    if not isinstance(over, dict):
        raise _bad("method.aux_settings", over, f"a mapping of method.aux={aux}'s settings")
    if "name" in over:
        raise SpecBenchError("method.aux_settings.name is not allowed; choose the auxiliary with method.aux")
    _walk(cfg, "method.aux_settings", schema.METHODS[aux], f" for the auxiliary method.aux={aux}")


# ----------------------------------------------------------------------------- resource bounds
def resources(cfg) -> None:
    """Bounds that need the model's shape (read without its weights): layer indices and draft
    depths within the model, every method's and controller's sizes within its vocabulary, context
    and memory (specbench/config/bounds.py), profile sizes within its context and the memory there is, a
    tiny model's weights within the memory there is."""
    if _get(cfg, "model") is ABSENT or (shape := modelinfo.model_shape(settings.group("model", cfg.model))) is None:
        return
    of = f"the model {shape.name}"
    n_layers, draft_layers = _get(cfg, "method.n_layers"), _get(cfg, "method.draft.num_layers")
    if _get(cfg, "method.name") == "eesd" and _present(n_layers) and n_layers >= shape.layers:
        raise _bad("method.n_layers", n_layers, f"an integer from 1 to {shape.layers - 1} ({of} has {shape.layers} layers)")
    if isinstance(draft_layers, int) and draft_layers >= shape.layers:  # all of them would be the target itself
        raise _bad("method.draft.num_layers", draft_layers, f"an integer from 1 to {shape.layers - 1} or 'auto' ({of} has {shape.layers} layers)")
    for key in ("method.skip.attn", "method.skip.mlp"):
        if isinstance(v := _get(cfg, key), list) and any(i >= shape.layers for i in v):
            raise _bad(key, v, f"layer indices from 0 to {shape.layers - 1} ({of} has {shape.layers} layers)")
    layers = _get(cfg, "method.layers") if _get(cfg, "method.name") == "eagle3" else "auto"
    if layers not in (ABSENT, None, "auto") and not (isinstance(layers, list) and len(layers) == 3 and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < shape.layers for i in layers)):
        raise _bad("method.layers", layers, f"'auto' or three layer indices from 0 to {shape.layers - 1} ({of} has {shape.layers} layers)")
    if _present(size := _get(cfg, "method.draft_vocab.size")) and size > shape.vocab:
        raise _bad("method.draft_vocab.size", size, f"at most the vocabulary, {shape.vocab} tokens, or null")
    if shape.context and _present(warm := _get(cfg, "warmup_tokens")) and warm >= shape.context:
        raise _bad("warmup_tokens", warm, f"an integer below {shape.context}, the context length of {of}")
    _memory(cfg, shape)
    profiled = _get(cfg, "profile.enabled") is True
    if profiled:
        _profile(cfg, shape)
    if _get(cfg, "engine.name") in (ABSENT, None, "native"):  # engine=vllm: vLLM's methods, its own bounds
        free = modelinfo.available_bytes() if _on_cpu(cfg) else None
        lim = bounds.Limits(shape, _get(cfg, "profile.context") if profiled else None, free, _width(cfg))
        bounds.check(lambda key: None if (v := _get(cfg, key)) is ABSENT else v, lim)
        if _get(cfg, "method.name") == "samd" and (aux := _get(cfg, "method.aux")) in schema.METHODS:
            _aux_bounds(cfg, aux, lim)


def _aux_bounds(cfg, aux: str, lim) -> None:
    """SAM-Decoding's auxiliary drafter within the same bounds as when it runs alone (its shipped
    settings with `aux_settings` over them): a top-k beyond the vocabulary failed inside the run."""
    over = _get(cfg, "method.aux_settings")
    node = OmegaConf.merge(OmegaConf.load(settings.CONF_DIR / "method" / f"{aux}.yaml"), {} if over in (ABSENT, None) else over)

    def get(key: str):
        if key == "method.name":
            return aux
        v = OmegaConf.select(node, key.removeprefix("method."), default=None) if key.startswith("method.") else None
        return OmegaConf.to_container(v) if isinstance(v, (DictConfig, ListConfig)) else v
    try:
        bounds.check(get, lim)
    except SpecBenchError as e:
        raise SpecBenchError(f"{e} (method.aux_settings of the auxiliary method.aux={aux})") from None


def _on_cpu(cfg) -> bool:
    """Memory bounds compare with the host's free memory: they apply to CPU runs only."""
    device = _get(cfg, "model.device")
    return device == "cpu" or (device in ("auto", None, ABSENT) and not Path("/dev/nvidiactl").exists())


def _width(cfg) -> int:
    return modelinfo.DTYPE_BYTES.get(str(_get(cfg, "model.dtype")), 4)


def _memory(cfg, shape) -> None:
    free = modelinfo.available_bytes()
    if _get(cfg, "model.loader") != "tiny" or not _on_cpu(cfg) or free is None:
        return
    need = shape.params() * _width(cfg)
    if need > free:
        key = max(("num_layers", "hidden_size", "intermediate_size"), key=lambda k: _get(cfg, f"model.{k}"))
        raise _bad(f"model.{key}", _get(cfg, f"model.{key}"),
                   f"a size whose weights fit in memory: {shape.params():,} parameters need "
                   f"{need / modelinfo.GIB:.1f} GiB, {free / modelinfo.GIB:.1f} GiB are free")


def _profile(cfg, shape) -> None:
    """profile.ks after profile.context (the method's verify widths, which it measures too: bounds.py)."""
    ks, context = _get(cfg, "profile.ks"), _get(cfg, "profile.context")
    if not isinstance(ks, list) or not ks or not _present(context):
        return
    k = max(ks)
    if shape.context and context + k > shape.context:
        key, value = ("profile.ks", ks) if k >= context else ("profile.context", context)
        raise _bad(key, value, f"profile.context + max(profile.ks) <= {shape.context}, the context length of the model {shape.name}")
    free = modelinfo.available_bytes()
    if not _on_cpu(cfg) or free is None:
        return
    width = _width(cfg)
    prefill, step = shape.forward_bytes(context, 0, 1, width), shape.forward_bytes(k, context, k, width)
    need = shape.params() * width + max(prefill, step)
    if need > free:
        key, value = ("profile.ks", ks) if step > prefill else ("profile.context", context)
        raise _bad(key, value, f"smaller profile sizes: a forward over {k if step > prefill else context} tokens "
                   f"with {context if step > prefill else 0} cached needs about {need / modelinfo.GIB:.1f} GiB "
                   f"with the weights (KV cache, activations, logits), {free / modelinfo.GIB:.1f} GiB are free")
