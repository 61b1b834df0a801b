"""The embedded model as the bench scripts load it: no grad, `threads` torch threads, a backend."""

from __future__ import annotations

from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def embedded_model(threads: int, backend: str = "eager"):
    """SmolLM2-135M (conf/model/smollm2-135m.yaml) on `backend` (eager: the scripts switch it)."""
    from omegaconf import OmegaConf

    from specbench.models import load_model

    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    cfg = OmegaConf.load(REPO / "conf" / "model" / "smollm2-135m.yaml")
    cfg.backend = backend
    return load_model(cfg)
