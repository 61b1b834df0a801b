"""`spec_bench`: Spec-Bench's `question.jsonl` (Xia et al., 2024), the workload the field compares on.

480 questions in 13 raw categories: MT-Bench's 8 (writing, roleplay, reasoning, math, coding,
extraction, stem, humanities; 80 two-turn questions) and translation, summarization, qa,
math_reasoning, rag (80 each). Spec-Bench reports MT-Bench's 8 as one column, "Multi-turn
Conversation" (its evaluation/speed.py groups them as `mt_bench`); `group_mt_bench: true` does
the same here, so `per_category` in the summary has Spec-Bench's six columns.

A preset over the generic `jsonl` task (fields question_id, category, turns). Where the file comes
from, first found wins: `task.path`; `<data_dir>/spec_bench/question.jsonl`; a copy cached by an
earlier download; a download of `task.url` (only with HF_DATASETS_OFFLINE=0 set, the same rule the
hub datasets follow: without a network every attempt would wait for a timeout).

Not scored (Spec-Bench measures speed; its categories have no common quality metric): the
replies are kept in samples.jsonl. Spec-Bench's own speedup is the ratio of per-sample mean
tokens/s; ours is pooled (ratio of sums), as for every task; both are in summary.json
(`speedup`, `speedup_per_sample_mean`).
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from specbench.core.errors import SpecBenchError
from specbench.tasks.base import Sample, filter_categories, register_task
from specbench.tasks.jsonl_task import JsonlTask

MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# Spec-Bench's column order and names (its Leaderboard.md)
COLUMNS = (
    ("mt_bench", "Multi-turn Conversation"),
    ("translation", "Translation"),
    ("summarization", "Summarization"),
    ("qa", "Question Answering"),
    ("math_reasoning", "Mathematical Reasoning"),
    ("rag", "Retrieval-aug. Generation"),
)
REL_PATH = "spec_bench/question.jsonl"


def cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "specbench" / "data" / REL_PATH


def _download(url: str, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 - a configured https URL
        tmp.write_bytes(r.read())
    tmp.replace(dest)
    return dest


@register_task
class SpecBenchTask(JsonlTask):
    name = "spec_bench"

    def path(self) -> Path:
        if self.cfg.path:
            return super().path()
        tried = []
        d = self.data_dir()
        for p in ([d / REL_PATH] if d is not None else []) + [cache_path()]:
            if p.is_file():
                return p
            tried.append(str(p))
        url = self.cfg.url
        if url and os.environ.get("HF_DATASETS_OFFLINE", "1").upper() in ("0", "FALSE", "NO", "OFF"):
            try:
                return _download(str(url), cache_path())
            except OSError as e:
                tried.append(f"{url} ({type(e).__name__}: {e})")
        else:
            tried.append(f"{url} (not downloaded: set HF_DATASETS_OFFLINE=0 to allow it)")
        raise SpecBenchError(
            "task spec_bench needs Spec-Bench's question.jsonl: pass task.path=<file> "
            f"(data/spec_bench/question.jsonl of github.com/hemingkx/Spec-Bench); looked at: {'; '.join(tried)}"
        )

    def load_all(self) -> list[Sample]:
        samples = super().load_all()
        if self.cfg.group_mt_bench:
            for s in samples:
                if s.category in MT_BENCH_CATEGORIES:
                    s.category = "mt_bench"
        samples = filter_categories(samples, self.cfg.categories, "spec_bench")
        return samples
