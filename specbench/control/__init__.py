"""Draft-length controllers; importing this package registers the built-in ones in `CONTROLLERS`
(`build_controller` lives here, not in base.py, so no module imports the package from inside it)."""

from specbench.control import beta_ts, cali_ts, fixed, threshold  # noqa: F401 - registration
from specbench.control.base import CONTROLLERS, Controller, DraftInfo
from specbench.errors import choice_error

__all__ = ["CONTROLLERS", "Controller", "DraftInfo", "build_controller"]


def build_controller(cfg, **extra) -> Controller:
    params = dict(cfg)
    name = params.pop("name", None)
    if name not in CONTROLLERS:
        raise choice_error("controller", name, CONTROLLERS)
    params.update(extra)
    return CONTROLLERS[name](**params)
