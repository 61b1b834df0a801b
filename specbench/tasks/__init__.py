"""Evaluation tasks. Importing this package registers the built-in ones in `TASKS` (`build_task`
lives here, not in base.py, so no module imports the package from inside it)."""

from specbench.config import settings
from specbench.core.errors import choice_error
from specbench.tasks import gsm8k, humaneval, jsonl_task, mt_bench, spec_bench, xsum  # noqa: F401 - registration
from specbench.tasks.base import TASKS, Sample, Task

__all__ = ["TASKS", "Sample", "Task", "build_task"]


def build_task(cfg) -> Task:
    """`cfg`: the task's settings (specbench/config/settings.py)."""
    settings.expect(cfg, "build_task")
    name = cfg.name
    if name not in TASKS:
        raise choice_error("task", name, TASKS)
    return TASKS[name](cfg)
