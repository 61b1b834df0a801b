"""Train on first use: when a method needs a trained part that is not cached yet and the model is
small enough to train here, train it once with the first-use budget (`train.first_use`), say so,
cache it, then run.

Sits above the methods and training (the runner calls `ensure_trained`), so neither imports the
other. `FIRST_USE` maps a method name to a function `(cfg, target) -> [Part]` listing the parts
that method would load from the cache; adding a method is one line, e.g.
`FIRST_USE["eagle"] = checkpoint_part("the EAGLE-2 draft head", "eagle", lambda m: {...})`.

Nothing is trained when `method.train_if_missing=false`, when the part is given by an explicit
path, or for models that are not small (`train.first_use.loaders` / `max_params`; `model=hf`
never trains silently): the method then raises its usual error with the exact command.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from omegaconf import OmegaConf

from specbench.config import CONF_DIR
from specbench.artifacts import checkpoint_meta, checkpoint_path, skip_result_path, trained_summary
from specbench.errors import SpecBenchError
from specbench.methods.medusa import medusa2_structure
from specbench.methods.self_sd import model_key
from specbench.methods.space import space_structure
from specbench.methods.vanilla_sd import draft_num_layers
from specbench.skipsearch import gsm8k_train_prompts, save_result, search_skip_set
from specbench.train.session import train_model



@dataclass
class Part:
    what: str                       # "the EESD exit layer"
    path: Path                      # where the method looks for it
    train: Callable                 # (cfg with the first-use budget, target) -> None
    minutes: Callable               # (first-use cfg) -> rough duration in minutes
    key: str = ""                   # parts with one key are trained by one call


def _trainer(name: str):
    def run(cfg, target):
        train_model(cfg, target, name)

    return run


def _train_minutes(fcfg) -> float:
    t = fcfg.train
    return float(t.data.gen_minutes) + float(t.max_minutes) + 1.0  # + teacher labels, evaluation


def checkpoint_part(what: str, kind: str, structure: Callable, trainer: str | None = None, where: str = "checkpoint"):
    """Parts list for a method whose trained part is one checkpoint `kind` with `structure(method
    cfg)`, trained by TRAINERS[trainer] (default: the method's name), looked up when
    `method.<where>` is auto."""

    def parts(cfg, target):
        m = cfg.method
        if OmegaConf.select(m, where, default="auto") != "auto" or m.get("allow_untrained", False):
            return []
        path = checkpoint_path(kind, target.key, structure(m))
        name = trainer or m.name
        return [Part(what, path, _trainer(name), _train_minutes, name)]

    return parts


def eesd_parts(cfg, target):
    parts = checkpoint_part("the EESD exit layer", "eesd", lambda m: {"n_layers": int(m.n_layers), "head": m.get("head", "shared")})(cfg, target)
    control = cfg.get("control") or {}
    if parts and control.get("name") == "cali_ts" and control.get("predictor") in (None, "auto"):
        path = checkpoint_path("cali", target.key, {"n_layers": int(cfg.method.n_layers), "head": cfg.method.get("head", "shared")})
        parts.append(Part("the Cali-TS predictor", path, _trainer("eesd"), _train_minutes, "eesd"))
    return parts


def draft_parts(cfg, target):
    d = cfg.method.get("draft") or {}
    if d.get("source", "truncate") != "truncate" or cfg.method.get("mode", "assistant") != "assistant":
        return []
    n = draft_num_layers(d, target)
    return checkpoint_part("the distilled vanilla-SD draft", "vanilla_draft", lambda m: {"n_layers": n},
                           "vanilla_sd", "draft.checkpoint")(cfg, target)


def skip_search_parts(cfg, target):
    skip = cfg.method.get("skip") or {}
    if skip.get("source", "auto") not in ("auto", "search") or skip.get("path") or skip.get("attn") or skip.get("mlp"):
        return []
    path = skip_result_path(skip.get("cache_dir"), model_key(target))

    def run(cfg, target):
        s = cfg.train.first_use.skip_search
        task = OmegaConf.merge(OmegaConf.load(CONF_DIR / "task" / "gsm8k.yaml"), {"data_dir": cfg.task.get("data_dir")})
        prompts, ids = gsm8k_train_prompts(task, target.tokenizer, int(s.num_prompts), int(cfg.seed))
        result = search_skip_set(target, prompts, iterations=int(s.iterations), max_new_tokens=int(s.max_new_tokens),
                                 k=int(s.k), seed=int(cfg.seed), sampler=str(s.sampler), progress=True, prompt_ids=ids)
        save_result(result | {"model_key": model_key(target), "first_use": True}, path)

    def minutes(fcfg):
        s = fcfg.skip_search
        return (int(s.iterations) + 2) * int(s.num_prompts) * int(s.max_new_tokens) * 0.1 / 60  # ~0.1 s/token on CPU

    return [Part("the Self-SD skip set (Bayesian-optimisation search)", path, run, minutes, "skip_search")]


def medusa_parts(cfg, target):
    if cfg.method.get("variant", "medusa1") == "medusa2":  # the medusa trainer hands medusa2 to its own trainer
        return checkpoint_part("the Medusa-2 backbone + heads (joint training)", "medusa2", medusa2_structure, "medusa")(cfg, target)
    return checkpoint_part("the Medusa heads", "medusa",
                           lambda m: {"num_heads": int(m.num_heads), "share_head": bool(m.share_head)})(cfg, target)


FIRST_USE: dict[str, Callable] = {
    "eesd": eesd_parts,
    "medusa": medusa_parts,
    "space": checkpoint_part("the SPACE SAR-SFT weights", "space", space_structure),
    "vanilla_sd": draft_parts,
    "hf_assisted": draft_parts,
    "self_sd": skip_search_parts,
    "eagle": checkpoint_part("the EAGLE-2 draft head", "eagle", lambda m: {"layers": 1, "bias": bool(m.get("bias", True))}),
}


def small_enough(cfg, target) -> bool:
    fcfg = cfg.train.first_use
    n = sum(p.numel() for p in target.model.parameters())
    return cfg.model.get("loader") in list(fcfg.loaders) and n <= float(fcfg.max_params)


def missing_parts(cfg, target) -> list[Part]:
    parts = FIRST_USE.get(cfg.method.name, lambda c, t: [])(cfg, target)
    return [p for p in parts if not p.path.is_file()]


def ensure_trained(cfg, target) -> list[Part]:
    """Train what the method needs and is missing, if allowed; returns what was trained."""
    missing = missing_parts(cfg, target)
    if not missing or not cfg.method.get("train_if_missing", True) or not small_enough(cfg, target):
        return []  # the method reports what is missing, with the command to train it
    fcfg = cfg.train.first_use
    budget = OmegaConf.merge(cfg, {"train": OmegaConf.to_container(fcfg.train, resolve=True)})
    done: set[str] = set()
    for part in missing:
        if part.key in done:
            continue
        done.add(part.key)
        what = " + ".join(p.what for p in missing if p.key == part.key)
        print(f"specbench: training {what} for {cfg.model.name}, once, up to ~{part.minutes(fcfg):.0f} min "
              f"(first use; budget train.first_use, method.train_if_missing=false to skip); cached at {part.path}",
              file=sys.stderr, flush=True)
        start = time.monotonic()
        part.train(budget, target)
        if not part.path.is_file():
            raise SpecBenchError(f"training {what} finished but wrote nothing at {part.path}")
        print(f"specbench: trained {what} in {(time.monotonic() - start) / 60:.1f} min{_summary(part.path)}",
              file=sys.stderr, flush=True)
    return missing


def _summary(path: Path) -> str:
    if path.suffix != ".safetensors":
        return ""
    text = trained_summary(checkpoint_meta(path).get("settings"))
    return f" ({text})" if text else ""
