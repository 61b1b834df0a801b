"""One training session with an already loaded target: self-distillation data, then a trainer.
Used by `python -m specbench.train` and by training on first use (specbench/firstuse.py)."""

from __future__ import annotations

import os

import specbench.train.eagle  # noqa: F401 - registers the eagle trainer
import specbench.train.medusa2  # noqa: F401 - registers the Medusa-2 trainer (method.variant=medusa2)
import specbench.train.medusa_space  # noqa: F401 - registers the medusa and space trainers
from specbench.train.data import build_sequences
from specbench.train.trainers import TRAINERS


def train_model(cfg, target, trainer: str | None = None) -> dict:
    """Train with an already loaded target (`trainer`: a TRAINERS name, default the method's)."""
    data_dir = cfg.task.get("data_dir") or os.environ.get("SPECBENCH_DATA_DIR")
    sequences = build_sequences(target, cfg.train.data, data_dir, int(cfg.train.seed))
    cap = cfg.train.get("max_sequences")
    if cap and len(sequences) > int(cap):
        # generated sequences come first: keep them all, cap the original text
        sequences = sequences[: int(cap)]
    return TRAINERS[trainer or cfg.method.name](target, cfg, sequences)
