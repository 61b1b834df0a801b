"""Where a task's `task.path` points: one function for the task that reads it and for the
validation that refuses a missing one before any sweep point runs (config/ may not import tasks/)."""

from __future__ import annotations

from pathlib import Path

from specbench.core.errors import SpecBenchError


def task_file(raw, data_dir: Path | None) -> Path:
    """The file `task.path=raw` names: as given, or (relative) under the task's data dir."""
    if not raw:
        raise SpecBenchError("task jsonl needs task.path=<a JSONL file of prompts>")
    p = Path(str(raw)).expanduser()
    tried = [p]
    if not p.is_absolute() and data_dir is not None:
        tried.append(data_dir / p)
    for candidate in tried:
        if candidate.is_file():
            return candidate
    if any(c.is_dir() for c in tried):
        raise SpecBenchError(f"task.path={raw!r} is a directory; give a JSONL file of prompts")
    raise SpecBenchError(f"task.path={raw!r} not found; looked at: {', '.join(map(str, tried))}")
