"""What a method loads from the artifact cache, and how each part is trained on first use.

A trainer module declares the parts of the method(s) it trains next to its trainer:

    first_use("eagle")(checkpoint_part("the EAGLE-2 draft head", "eagle", lambda m: {...}))

registers `FIRST_USE["eagle"]`, a function `(cfg, target) -> [Part]` listing the parts that
method would load (given the run's settings, specbench/config/settings.py) and where. specbench/train/session.py imports every module
of this package (so trainers and their first-use parts are found, not listed), and
specbench/run/firstuse.py trains the missing ones. This module imports nothing of specbench.train,
so trainer modules can import it without a cycle.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbench.config import settings
from specbench.models.artifacts import file_sha256, find_checkpoint

FIRST_USE: dict[str, Callable] = {}  # method name -> (cfg, target) -> [Part]


@dataclass
class Part:
    what: str                       # "the EESD exit layer"
    path: Path                      # where the method looks for it
    train: str | Callable           # a TRAINERS name, or (cfg with the first-use budget, target) -> None
    minutes: Callable               # (cfg with the first-use budget) -> rough duration in minutes, or None (unknown before it starts)
    key: str = ""                   # parts with one key are trained by one call
    method: Any = None              # the method config its trainer reads (None: the run's; SAM-Decoding's auxiliary's)


def first_use(*methods: str):
    """Decorator: `fn(cfg, target) -> [Part]` lists what each of `methods` loads from the cache."""

    def register(fn: Callable) -> Callable:
        for m in methods:
            FIRST_USE[m] = fn
        return fn

    return register


def train_minutes(cfg) -> float | None:
    """The safety caps' sum when both are set, else None: the budget is counted in sequences and
    steps, and the training prints its own estimate (from its timed first step) as it starts."""
    t = cfg.train
    caps = (t.data.gen_minutes, t.max_minutes)
    return None if None in caps else float(caps[0]) + float(caps[1]) + 1.0  # + teacher labels, evaluation


def checkpoint_part(what: str, kind: str, structure: Callable, trainer: str | None = None, where: str = "checkpoint"):
    """Parts list for a method whose trained part is one checkpoint `kind` with `structure(method
    cfg)`, trained by TRAINERS[trainer] (default: the method's name), looked up when
    `method.<where>` is auto."""

    def parts(cfg, target):
        m = cfg.method
        given = functools.reduce(getattr, where.split("."), m)
        if given != "auto" or (settings.has(m, "allow_untrained") and m.allow_untrained):
            return []
        path = find_checkpoint(kind, target.key, structure(m))  # a published part counts as present
        name = trainer or m.name
        return [Part(what, path, name, train_minutes, name)]

    return parts


def init_record(kind: str, target_key: str, structure: dict, where, info: dict) -> dict:
    """train.init's entry in a fine-tune's settings: what it started from (as given, the file, its bytes) and
    that file's own budget (`info["trained"]`, from its loader), so the record carries both budgets. `auto`
    names the file a run of `kind` loads (the cache's, else the published one)."""
    path = find_checkpoint(kind, target_key, structure) if where == "auto" else Path(str(where)).expanduser()
    return {"from": str(where), "file": path.name, "sha256": file_sha256(path) if path.is_file() else None,
            "trained": info.get("trained")}
