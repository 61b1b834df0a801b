"""Draft-length controllers; importing this package registers the built-in ones."""

from specbench.control import beta_ts, cali_ts, fixed, threshold  # noqa: F401 - registration
from specbench.control.base import CONTROLLERS, Controller, DraftInfo, build_controller

__all__ = ["CONTROLLERS", "Controller", "DraftInfo", "build_controller"]
