"""`jsonl`: prompts from any local JSONL file, one object per line.

The prompt field holds a string (one turn) or a list of strings (several turns). With a reference
field the replies are scored by exact match and ROUGE-1/L; without one they are only kept.
"""

from __future__ import annotations

import json
from pathlib import Path

from specbench.core.errors import SpecBenchError
from specbench.core.taskfile import task_file
from specbench.tasks.base import Sample, Task, register_task, utf8_line
from specbench.tasks.xsum import rouge


def _score_one(reply: str, reference: str) -> dict[str, float]:
    scores = {"exact_match": float(reply.strip() == str(reference).strip())}
    scores.update(rouge(reply, str(reference), ("rouge1", "rougeL")))
    return scores


def _label(rec: dict, field: str, where: str) -> str:
    """An id or category: a string or a number, as text. null, a list or an object would become
    'None' or its Python repr, a label no one wrote."""
    v = rec[field]
    if isinstance(v, bool) or not isinstance(v, (str, int, float)) or v == "":
        shown = json.dumps(v)
        raise SpecBenchError(f"{where}: field {field!r} is {shown[:80]}; expected a non-empty string or a number")
    return str(v)


def _reference(rec: dict, field: str, n_turns: int, where: str):
    """A string (scores the last reply) or one string per turn. null or [] left the sample unscored
    without a word (the quality figure then averaged over fewer samples), an object was scored against
    its Python repr, a shorter list dropped the last turns from the score."""
    v = rec[field]
    if isinstance(v, str) or (isinstance(v, list) and len(v) == n_turns and all(isinstance(r, str) for r in v)):
        return v
    raise SpecBenchError(f"{where}: field {field!r} is {json.dumps(v)[:80]}; expected a string or a list of "
                         f"{n_turns} string{'s' if n_turns > 1 else ''} (one a turn)")


JSON_TYPES = {type(None): "null", str: "string", int: "number", float: "number", list: "array", bool: "boolean"}


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@register_task
class JsonlTask(Task):
    name = "jsonl"

    def __init__(self, cfg):
        super().__init__(cfg)
        # no reference, no quality figure
        self.primary_metric = "rougeL" if cfg.reference_field else None

    def path(self) -> Path:
        return task_file(self.cfg.path, self.data_dir())

    def load_all(self) -> list[Sample]:
        path = self.path()
        field = self.cfg.prompt_field
        id_field, cat_field, ref_field = self.cfg.id_field, self.cfg.category_field, self.cfg.reference_field
        samples = []
        with open(path, "rb") as f:
            for i, raw in enumerate(f):
                if i == 0 and raw.startswith(b"\x1f\x8b"):
                    raise SpecBenchError(f"task.path={str(path)!r} is gzip-compressed; decompress it (gunzip) first")
                line = utf8_line(raw.removeprefix(b"\xef\xbb\xbf") if i == 0 else raw, path, i + 1)  # a BOM is no text
                if not line.strip():
                    continue
                where = f"{path}:{i + 1}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SpecBenchError(f"{where} is not valid JSON ({e.msg})") from None
                if not isinstance(rec, dict):
                    raise SpecBenchError(f"{where} is a JSON {JSON_TYPES.get(type(rec), type(rec).__name__)}; expected an object")
                for key in (field, id_field, cat_field, ref_field):
                    if key and key not in rec:
                        raise SpecBenchError(f"{where} has no field {key!r}; fields: {', '.join(rec)}")
                turns = rec[field]
                turns = [turns] if isinstance(turns, str) else turns
                if not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns)):
                    raise SpecBenchError(
                        f"{where}: field {field!r} must be a string or a non-empty list of strings"
                    )
                if any(not t.strip() for t in turns):  # nothing to answer: the model would decode from its template alone
                    raise SpecBenchError(f"{where}: field {field!r} holds an empty prompt; give every turn some text")
                if bad := next((t for t in turns if not _encodable(t)), None):  # a lone surrogate: "\ud800" is valid JSON
                    raise SpecBenchError(f"{where}: field {field!r} holds text that is not Unicode (a lone surrogate "
                                         f"escape, e.g. \\ud800, in {bad[:40]!r}); give valid text")
                samples.append(
                    Sample(
                        id=_label(rec, id_field, where) if id_field else str(i),
                        turns=turns,
                        system=self.cfg.system,
                        reference=_reference(rec, ref_field, len(turns), where) if ref_field else None,
                        category=_label(rec, cat_field, where) if cat_field else None,
                    )
                )
        if not samples:
            raise SpecBenchError(f"task.path={str(path)!r} has no records")
        ids = [s.id for s in samples]
        dup = next((x for x in ids if ids.count(x) > 1), None) if len(set(ids)) < len(ids) else None
        if dup is not None:
            raise SpecBenchError(f"task.id_field={id_field!r}: id {dup!r} occurs more than once in {path}")
        return samples

    def score(self, sample: Sample, replies: list[str]) -> dict[str, float]:
        """A list reference scores turn by turn (averaged); a single one scores the last reply."""
        ref = sample.reference
        if ref is None:
            return {}
        if isinstance(ref, list):
            per_turn = [_score_one(r, x) for r, x in zip(replies, ref)]
            return {k: sum(s[k] for s in per_turn) / len(per_turn) for k in per_turn[0]} if per_turn else {}
        return _score_one(replies[-1], ref)
