"""GSM8K grade-school maths: 1-shot chain-of-thought, scored by the final number's accuracy."""

from __future__ import annotations

import re

from specbench.core.errors import SpecBenchError
from specbench.tasks.base import Sample, Task, first_available, hub_source, local_source, register_task

INSTRUCTION = 'Solve the problem step by step, and end your reply with "The answer is <number>."'

# a number with optional thousands separators and decimals, never ending in a comma ("1, 2")
NUMBER = re.compile(r"-?\d(?:[\d,]*\d)?(?:\.\d+)?")


def prompt(question: str) -> str:
    return f"{question.strip()}\n\n{INSTRUCTION}"


def exemplar_answer(answer: str) -> str:
    """A train answer as the model should write it: no <<calc>> annotations, a closing sentence."""
    body, _, final = answer.partition("####")
    body = re.sub(r"<<[^>]*>>", "", body).strip()
    return f"{body}\nThe answer is {final.strip()}."


def reference_number(answer: str) -> str:
    return answer.rsplit("####", 1)[-1].strip().replace(",", "")


def extract_number(text: str) -> float | None:
    """The number after the last "answer is", else the last number in the text."""
    text = text.replace("$", "")
    idx = text.lower().rfind("answer is")
    found = NUMBER.search(text, idx) if idx >= 0 else None
    if found is None:
        found = (NUMBER.findall(text) or [None])[-1]
    else:
        found = found.group()
    if found is None:
        return None
    try:
        return float(found.replace(",", ""))
    except ValueError:
        return None


def is_correct(reply: str, reference: str) -> bool:
    got = extract_number(reply)
    return got is not None and abs(got - float(reference)) < 1e-6


@register_task
class GSM8K(Task):
    name = "gsm8k"
    primary_metric = "accuracy"

    def _split(self, split: str) -> list[dict]:
        return first_available(
            f"{self.name}/{split}",
            [local_source(self, f"gsm8k/{split}.jsonl"), hub_source("openai/gsm8k", "main", split=split)],
        )

    def load_all(self) -> list[Sample]:
        test = self._split("test")
        few_shot = []
        k = self.cfg.fewshot_index  # null: zero-shot
        if k is not None:
            train = self._split("train")
            if not 0 <= int(k) < len(train):
                raise SpecBenchError(
                    f"task.fewshot_index={k} is outside the gsm8k train split (0..{len(train) - 1})"
                )
            ex = train[int(k)]
            few_shot = [(prompt(ex["question"]), exemplar_answer(ex["answer"]))]
        return [
            Sample(
                id=f"gsm8k-{i}",
                turns=[prompt(r["question"])],
                few_shot=few_shot,
                system=self.cfg.system,
                reference=reference_number(r["answer"]),
            )
            for i, r in enumerate(test)
        ]

    def score(self, sample: Sample, replies: list[str]) -> dict[str, float]:
        return {"accuracy": float(is_correct(replies[0], sample.reference))}
