"""Which of pyproject.toml's requirements this Python lacks: `make setup` runs pip only if any.

Usage: python tools/missing_requirements.py [extra,extra,...]. Prints each missing or too old
requirement (and the project itself when not installed), one a line; exit status 1 if any, 0 if
none. Stdlib only, so it runs before anything is installed; where it cannot tell (no tomllib on
Python 3.10, no packaging), it says so and exits 1, so pip decides.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def requirement_class():
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip vendors it
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def missing(pyproject: Path, extras: list[str]) -> list[str]:
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = list(project.get("dependencies", []))
    for extra in extras:
        wanted += project.get("optional-dependencies", {}).get(extra, [])
    Requirement = requirement_class()
    out = []
    try:
        metadata.version(project["name"])
    except metadata.PackageNotFoundError:
        out.append(f"{project['name']} (this project)")
    for line in wanted:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate():
            continue  # not for this platform / Python
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            out.append(line)
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append(f"{line} (installed: {have})")
    return out


def main(argv: list[str]) -> int:
    extras = [e for e in (argv[1] if len(argv) > 1 else "").split(",") if e]
    pyproject = Path(argv[2]) if len(argv) > 2 else ROOT / "pyproject.toml"
    try:
        lacking = missing(pyproject, extras)
    except ImportError as e:  # Python 3.10 (no tomllib) or no packaging: let pip decide
        print(f"cannot check the requirements here ({e}): running pip")
        return 1
    for line in lacking:
        print(f"missing: {line}")
    return 1 if lacking else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
