"""Registration by discovery: methods and trainers register themselves when their module is
imported, and the one consumer of each registry imports every module of its package, so adding
a method (or a trainer) is adding its file; no list of modules to keep in step.

tests/test_imports.py counts a call `import_submodules("pkg")` as imports of pkg's modules, so a
discovery that closes an import cycle fails there like a written import would."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def import_submodules(package: str) -> list[ModuleType]:
    """Import every module directly inside `package`, in name order; `_private` ones (`__main__`)
    are left out."""
    pkg = importlib.import_module(package)
    names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if not m.name.startswith("_"))
    return [importlib.import_module(f"{package}.{name}") for name in names]
