"""XSum extreme summarisation: 1-shot, one-sentence summary, scored by ROUGE-1/2/L F1."""

from __future__ import annotations

from functools import lru_cache

from specbench.core.errors import SpecBenchError
from specbench.tasks.base import Sample, Task, first_available, hub_source, local_source, register_task

INSTRUCTION = "Summarize the article above in one sentence."


def truncate_words(text: str, max_words: int | None) -> str:
    words = text.split()
    if max_words is None or len(words) <= max_words:
        return " ".join(words)
    return " ".join(words[:max_words]) + " ..."


def prompt(document: str, max_words: int | None) -> str:
    return f"Article: {truncate_words(document, max_words)}\n\n{INSTRUCTION}"


@lru_cache(maxsize=None)
def _scorer(types: tuple[str, ...]):
    from rouge_score import rouge_scorer  # not `evaluate`: that one needs the network

    return rouge_scorer.RougeScorer(list(types), use_stemmer=True)


def rouge(
    prediction: str, reference: str, types: tuple[str, ...] = ("rouge1", "rouge2", "rougeL")
) -> dict[str, float]:
    """ROUGE F1 (stemmed) of a prediction against one reference."""
    scores = _scorer(types).score(reference, prediction)
    return {k: scores[k].fmeasure for k in types}


@register_task
class XSum(Task):
    name = "xsum"
    primary_metric = "rouge2"  # the figure Self-SD reports

    def load_all(self) -> list[Sample]:
        rows = first_available(
            self.name, [local_source(self, "xsum/test.jsonl"), hub_source("EdinburghNLP/xsum", split="test")]
        )
        max_words = self.cfg.max_doc_words
        few_shot = []
        k = self.cfg.fewshot_index  # null: zero-shot
        if k is not None:
            if not 0 <= int(k) < len(rows):
                raise SpecBenchError(f"task.fewshot_index={k} is outside the xsum split (0..{len(rows) - 1})")
            ex = rows[int(k)]
            few_shot = [(prompt(ex["document"], max_words), ex["summary"].strip())]
            rows = rows[: int(k)] + rows[int(k) + 1 :]  # the exemplar is never evaluated
        return [
            Sample(
                id=str(r["id"]),
                turns=[prompt(r["document"], max_words)],
                few_shot=few_shot,
                system=self.cfg.system,
                reference=r["summary"].strip(),
            )
            for r in rows
        ]

    def score(self, sample: Sample, replies: list[str]) -> dict[str, float]:
        return rouge(replies[0].strip(), sample.reference)
