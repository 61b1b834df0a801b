"""Evaluation tasks. Importing this package registers the built-in ones in `TASKS`."""

from specbench.tasks import gsm8k, humaneval, jsonl_task, mt_bench, spec_bench, xsum  # noqa: F401 - registration
from specbench.tasks.base import TASKS, Sample, Task, build_task

__all__ = ["TASKS", "Sample", "Task", "build_task"]
