"""One training session with an already loaded target: self-distillation data, then a trainer.
Used by `python -m specbench.train` and by training on first use (specbench/run/firstuse.py); the
registries TRAINERS and FIRST_USE are complete once this module is imported."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from specbench.core.discover import import_submodules
from specbench.core.errors import SpecBenchError
from specbench.models.artifacts import checkpoint_meta
from specbench.models.distill import load_sequences, sequences_hash
from specbench.train.loop import DATA
from specbench.train.parts import FIRST_USE
from specbench.train.trainers import TRAINERS

# every module of specbench.train is imported: each registers its trainers (`@trainer`) and the
# first-use parts of its methods (`first_use`), so a new trainer is its file, listed nowhere
import_submodules("specbench.train")

INIT_TRAINERS = ("eagle3", "eagle")  # trainers that read train.init
SOFT_TRAINERS = ("eesd", "space")  # trainers that read train.distill

__all__ = ["FIRST_USE", "TRAINERS", "train_model"]


def capped(sequences: list, cap: int, how: str) -> list:
    """`cap` of the sequences: the first ones (generated GSM8K answers come first, then general-domain
    ones, then the original answers), or evenly spaced over all of them, so that a mix keeps each
    source's share (train.cap=spread)."""
    if how == "first":
        return sequences[:cap]
    return [sequences[i * len(sequences) // cap] for i in range(cap)]


def train_model(cfg, target, trainer: str | None = None) -> dict:
    """Train with an already loaded target (`cfg`: the run's settings, specbench/config/settings.py;
    `trainer`: a TRAINERS name, default the method's)."""
    name = trainer or cfg.method.name
    if cfg.train.init is not None and name not in INIT_TRAINERS:  # before any data is generated
        raise SpecBenchError(f"train.init={cfg.train.init!r} (fine-tuning a trained part) is supported by "
                             f"{', '.join(INIT_TRAINERS)} only, not {name}; set train.init=null")
    if cfg.train.init not in (None, "auto"):  # a file: read its header now, not after generating the data
        init = Path(str(cfg.train.init)).expanduser()
        if not init.is_file():
            raise SpecBenchError(f"train.init={cfg.train.init!r}: no such file (a trained {name} checkpoint, or auto)")
        if not (meta := checkpoint_meta(init)):
            raise SpecBenchError(f"train.init={cfg.train.init!r} is damaged or not a specbench checkpoint")
        if (meta.get("kind"), meta.get("model_key")) != (name, target.key):  # the structure: when it is loaded
            raise SpecBenchError(f"train.init={cfg.train.init!r} was trained for {meta.get('kind')} on model "
                                 f"{meta.get('model_key')}, not {name} on {target.key}")
    if cfg.train.distill != "hard" and name not in SOFT_TRAINERS:
        raise SpecBenchError(f"train.distill={cfg.train.distill!r} is supported by {', '.join(SOFT_TRAINERS)} only, "
                             f"not {name}; set train.distill=hard")
    data_dir = cfg.task.data_dir or os.environ.get("SPECBENCH_DATA_DIR")
    sequences, stopped = load_sequences(target, cfg.train.data, data_dir, int(cfg.train.seed))
    cap = cfg.train.max_sequences
    if cap and len(sequences) > int(cap):
        sequences = capped(sequences, int(cap), cfg.train.cap)
    # the parts' initial weights (random where not copied from the target) and dropout: seeded, so
    # the same setting trains the same bytes
    torch.manual_seed(int(cfg.train.seed))
    token = DATA.set({"sequences": len(sequences), "sha256": sequences_hash(sequences), "stopped_by": stopped})
    try:
        return TRAINERS[name](target, cfg, sequences)
    finally:
        DATA.reset(token)
