"""Fail a test on a transformers deprecation that specbench's own code set off.

transformers attributes its deprecation warnings to its own files (`deprecate_kwarg` warns with
stacklevel=2, which lands in transformers' layer wrapper or in torch's `Module.__call__`; a
deprecated property warns from modeling_utils), so a pytest `filterwarnings` line scoped by
module cannot tell our call from its own internals. This looks at the live call stack instead: a
FutureWarning or DeprecationWarning issued from inside transformers with a frame of the specbench
package on the stack is ours to fix (a run would print it). Third-party-internal noise (no
specbench frame between the warning and the test) passes.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path

SPECBENCH = str(Path(__file__).resolve().parents[1] / "specbench") + os.sep
_spec = importlib.util.find_spec("transformers")  # located, not imported (import is slow)
TRANSFORMERS = str(Path(_spec.submodule_search_locations[0]).resolve()) + os.sep
CATEGORIES = (FutureWarning, DeprecationWarning)

offenders: list[str] = []


def _ours(msg: warnings.WarningMessage) -> str | None:
    """The first specbench frame under a transformers deprecation being shown now, else None."""
    if not issubclass(msg.category, CATEGORIES):
        return None
    frame = sys._getframe(2)  # 0: here, 1: the _showwarnmsg wrapper, 2: whoever called warnings.warn
    if not os.path.realpath(frame.f_code.co_filename).startswith(TRANSFORMERS):
        return None
    while frame is not None:
        if os.path.realpath(frame.f_code.co_filename).startswith(SPECBENCH):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


_show = warnings._showwarnmsg  # called by warnings.warn, on the warning's own stack, when shown


def _showwarnmsg(msg):
    where = _ours(msg)
    if where is not None:
        offenders.append(f"{msg.category.__name__} from transformers, called from {where}: {msg.message}")
    return _show(msg)


def install() -> None:
    warnings._showwarnmsg = _showwarnmsg
