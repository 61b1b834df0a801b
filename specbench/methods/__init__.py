"""Decoding methods, registered by name in `base.METHODS` (`@register_method`) when their module
is imported; every module of this package is imported here (specbench/core/discover.py), so a new
method is its file `specbench/methods/<name>.py` plus `conf/method/<name>.yaml`.

`build_method` lives in the package, not in base.py, so that building one needs no import of the
package from inside it (the registry pattern would otherwise be an import cycle)."""

from specbench.config import settings
from specbench.core.discover import import_submodules
from specbench.engine.sampling import SamplingConfig
from specbench.core.errors import choice_error
from specbench.methods.base import METHODS, Method, register_method
from specbench.models import ModelAdapter
from specbench.config.settings import RunValues

import_submodules(__name__)  # registration: each method module registers itself on import

__all__ = ["METHODS", "Method", "build_method", "register_method"]


def build_method(name: str, target: ModelAdapter, cfg, sampling: SamplingConfig, run: RunValues) -> Method:
    """`cfg`: the method's settings; `run`: the run-level values it reads (specbench/config/settings.py)."""
    settings.expect(cfg, "build_method")
    if name not in METHODS:
        raise choice_error("method", name, METHODS)
    return METHODS[name](target, cfg, sampling, run)
