"""Train on first use: when a method needs a trained part that is not cached yet and the model is
small enough to train here, train it once with the first-use budget (`train.first_use`), say so,
cache it, then run.

Sits above the methods and training (the runner calls `ensure_trained`), so neither imports the
other. What each method loads is declared next to its trainer in specbench/train/
(`FIRST_USE`, specbench/train/parts.py), found there when specbench.train.session imports that
package's modules; a method with no entry needs nothing trained.

Nothing is trained when `method.train_if_missing=false`, when the part is given by an explicit
path, or for models that are not small (`train.first_use.loaders` / `max_params`; `model=hf`
never trains silently): the method then raises its usual error with the exact command.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from specbench.config import settings
from specbench.models.artifacts import checkpoint_meta, trained_summary
from specbench.core.errors import SpecBenchError
from specbench.train.parts import Part
from specbench.train.session import FIRST_USE, train_model


def small_enough(cfg, target) -> bool:
    """`cfg`: the run's settings (specbench/config/settings.py), here and below."""
    fcfg = cfg.train.first_use
    n = sum(p.numel() for p in target.model.parameters())
    return cfg.model.loader in list(fcfg.loaders) and n <= float(fcfg.max_params)


def missing_parts(cfg, target) -> list[Part]:
    parts = FIRST_USE.get(cfg.method.name, lambda c, t: [])(cfg, target)
    return [p for p in parts if not p.path.is_file()]


def ensure_trained(cfg, target) -> list[Part]:
    """Train what the method needs and is missing, if allowed; returns what was trained."""
    missing = missing_parts(cfg, target)
    # SAM-Decoding has no train_if_missing of its own: its auxiliary's parts read the auxiliary's (train/samd.py)
    refused = settings.has(cfg.method, "train_if_missing") and not cfg.method.train_if_missing
    if not missing or refused or not small_enough(cfg, target):
        return []  # the method reports what is missing, with the command to train it
    fcfg = cfg.train.first_use
    budget = settings.merge(cfg, {"train": fcfg.train})
    done: set[str] = set()
    for part in missing:
        if part.key in done:
            continue
        done.add(part.key)
        what = " + ".join(p.what for p in missing if p.key == part.key)
        minutes = part.minutes(budget)
        up_to = f"up to ~{minutes:.0f} min" if minutes is not None else "the estimate follows"
        print(f"specbench: training {what} for {cfg.model.name}, once, {up_to} "
              f"(first use; budget train.first_use, method.train_if_missing=false to skip); cached at {part.path}",
              file=sys.stderr, flush=True)
        start = time.monotonic()
        run = budget if part.method is None else settings.with_group(budget, "method", part.method)
        if isinstance(part.train, str):
            train_model(run, target, part.train)
        else:
            part.train(run, target)
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
