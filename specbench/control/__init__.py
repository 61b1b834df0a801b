"""Draft-length controllers; importing this package registers the built-in ones in `CONTROLLERS`
(`build_controller` lives here, not in base.py, so no module imports the package from inside it)."""

from specbench.control import beta_ts, cali_ts, fixed, threshold  # noqa: F401 - registration
from specbench.control.base import CONTROLLERS, Controller, DraftInfo, DraftRef
from specbench.errors import choice_error

__all__ = ["CONTROLLERS", "DEFAULT_CONTROL", "Controller", "DraftInfo", "DraftRef", "build_controller"]

# what a drafting method built without a control config (library use, tests) gets
DEFAULT_CONTROL = {"name": "fixed", "k": 10}


def build_controller(cfg, draft: DraftRef | None = None, **extra) -> Controller:
    """The controller named by `cfg`, with what it needs from `draft` attached (Cali-TS: the
    predictor trained for that draft, when `predictor` is null or auto)."""
    params = dict(cfg)
    name = params.pop("name", None)
    if name not in CONTROLLERS:
        raise choice_error("controller", name, CONTROLLERS)
    params.update(extra)
    cls = CONTROLLERS[name]
    return cls(**cls.attach(params, draft))
