"""Draft-length controllers; importing this package registers the built-in ones in `CONTROLLERS`
(`build_controller` lives here, not in base.py, so no module imports the package from inside it)."""

from specbench.config import settings
from specbench.control import beta_ts, cali_ts, fixed, threshold  # noqa: F401 - registration
from specbench.control.base import CONTROLLERS, Controller, DraftInfo, DraftRef
from specbench.core.errors import choice_error

__all__ = ["CONTROLLERS", "Controller", "DraftInfo", "DraftRef", "build_controller"]


def build_controller(cfg, seed: int, draft: DraftRef | None = None) -> Controller:
    """The controller `cfg` (the control group's settings) names, its RNG seeded with `seed`, with
    what it needs from `draft` attached (Cali-TS: the predictor trained for that draft, when
    `predictor` is null or auto). Its parameters are the settings' keys, all of them given."""
    settings.expect(cfg, "build_controller")
    params = settings.record(cfg)
    name = params.pop("name")
    if name not in CONTROLLERS:
        raise choice_error("controller", name, CONTROLLERS)
    cls = CONTROLLERS[name]
    return cls(**cls.attach(params, draft), seed=seed)
