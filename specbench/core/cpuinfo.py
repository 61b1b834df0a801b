"""One field of /proc/cpuinfo (Linux): the kernels' cache key reads the CPU's flags
(kernels/ggml.py), a run's environment its model name (run/runner.py)."""

from __future__ import annotations


def cpuinfo_field(*names: str) -> str | None:
    """The value of the first line whose field is one of `names` (x86 `flags`, Arm `Features`, ...),
    stripped; None where there is no such line or no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in names:
                    return value.strip()
    except OSError:
        pass
    return None
