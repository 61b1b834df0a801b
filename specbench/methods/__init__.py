"""Decoding methods, registered by name in `base.METHODS` when their module is imported here.

`build_method` lives in the package, not in base.py, so that building one needs no import of the
package from inside it (the registry pattern would otherwise be an import cycle)."""

from specbench.engine.sampling import SamplingConfig
from specbench.errors import choice_error
from specbench.methods import (  # noqa: F401 - registration
    eagle,
    eesd,
    hf_assisted,
    medusa,
    pld,
    self_sd,
    space,
    vanilla_sd,
)
from specbench.methods.base import METHODS, Method, register_method
from specbench.models import ModelAdapter

__all__ = ["METHODS", "Method", "build_method", "register_method"]


def build_method(name: str, target: ModelAdapter, cfg, sampling: SamplingConfig, ctx: dict | None = None) -> Method:
    if name not in METHODS:
        raise choice_error("method", name, METHODS)
    return METHODS[name](target, cfg, sampling, ctx)
