"""MT-Bench: 80 two-turn questions in 8 categories (the Spec-Bench / Medusa / EAGLE speed workload).

Not scored here: MT-Bench quality needs an LLM judge (GPT-4 in the paper), which is not available
offline, so `score` returns an empty dict. Both replies of every sample are kept in the run's
outputs, with the category and the reference answer, so a judge can be run on them later.
"""

from __future__ import annotations

from specbench.tasks.base import Sample, Task, filter_categories, first_available, hub_source, local_source, register_task


def _from_hub_rows(rows: list[dict]) -> list[dict]:
    """HuggingFaceH4/mt_bench_prompts rows in FastChat's question.jsonl layout."""
    return [
        {
            "question_id": r["prompt_id"],  # a hash there, not FastChat's 81..160
            "category": r["category"],
            "turns": r["prompt"],
            "reference": r.get("reference"),
        }
        for r in rows
    ]


@register_task
class MTBench(Task):
    name = "mt_bench"
    primary_metric = None

    def load_all(self) -> list[Sample]:
        where, hub = hub_source("HuggingFaceH4/mt_bench_prompts", split="train")
        rows = first_available(
            self.name, [local_source(self, "mt_bench/question.jsonl"), (where, lambda: _from_hub_rows(hub()))]
        )
        samples = [
            Sample(
                id=str(r["question_id"]),
                turns=list(r["turns"]),
                system=self.cfg.system,
                reference=r.get("reference") or None,  # only math/reasoning/coding have one
                category=r["category"],
            )
            for r in rows
        ]
        samples = filter_categories(samples, self.cfg.categories, "mt_bench")  # null: all
        return samples
