"""Decoding methods, registered by name (see base.METHODS)."""

from specbench.methods.base import METHODS, Method, build_method, register_method  # noqa: F401
from specbench.methods import eesd, hf_assisted, pld, vanilla_sd, medusa, space  # noqa: F401
from specbench.methods import self_sd  # noqa: F401
from specbench.methods import eagle  # noqa: F401
