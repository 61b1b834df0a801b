"""Where specbench keeps what it builds once per machine (trained parts, calibrations, compiled
kernels): `$SPECBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/specbench`, else `~/.cache/specbench`.
A leaf module: the model layer (specbench.kernels.ggml) and the artifact store both use it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("SPECBENCH_CACHE_DIR"):
        base = Path(os.environ["SPECBENCH_CACHE_DIR"])
    elif os.environ.get("XDG_CACHE_HOME"):
        base = Path(os.environ["XDG_CACHE_HOME"]) / "specbench"
    else:
        base = Path("~/.cache/specbench")
    return base.expanduser().absolute()
