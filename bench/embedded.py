"""The embedded model as the bench scripts load it: no grad, `threads` torch threads, a backend."""

from __future__ import annotations

from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def embedded_model(threads: int, backend: str = "eager"):
    """SmolLM2-135M (conf/model/smollm2-135m.yaml) on `backend` (eager: the scripts switch it)."""
    from specbench.models import load_model
    from specbench.config.settings import shipped

    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    return load_model(shipped("model", "smollm2-135m", {"backend": backend}))
