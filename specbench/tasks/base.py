"""Task interface: load a split, build prompts, score outputs.

A task yields `Sample`s. The runner turns a sample into chat messages (few-shot exemplars, then
the user turns one at a time, each followed by the model's own reply) and asks the task to score
the list of replies. Loading order for every task: a local data directory, then the Hugging Face
hub through `datasets`, then data shipped in a package; if none works, one clear error naming
every place that was tried. A file that is there but cannot be read (damaged, truncated, not
UTF-8, not JSONL) is an error naming it, never skipped for the next place: the run would measure
other data than the user put there.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from specbench.core.errors import SpecBenchError


@dataclass
class Sample:
    id: str
    turns: list[str]  # user messages; turn i+1 is sent after the model answered turn i
    few_shot: list[tuple[str, str]] = field(default_factory=list)  # (user, assistant) exemplars
    system: str | None = None
    reference: Any = None  # whatever the task's score() needs
    category: str | None = None

    def messages(self, replies: list[str]) -> list[dict]:
        """Chat messages for the next turn, given the model's replies to the earlier turns."""
        msgs: list[dict] = []
        if self.system:
            msgs.append({"role": "system", "content": self.system})
        for user, assistant in self.few_shot:
            msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        for i, reply in enumerate(replies):
            msgs += [{"role": "user", "content": self.turns[i]}, {"role": "assistant", "content": reply}]
        msgs.append({"role": "user", "content": self.turns[len(replies)]})
        return msgs

    def digest(self) -> str:
        """16 hex digits of what the sample is: every turn with its system prompt and exemplars, its
        reference and category. Each finished sample's record keeps it, so a resumption after the
        task's data changed in place is refused instead of mixing old answers with new prompts."""
        what = [self.messages([""] * (len(self.turns) - 1)), self.reference, self.category]
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Task:
    """Base class. Subclasses set `name` and implement `load_all` and `score`."""

    name: str = "base"
    # metric used as the headline quality figure in summaries (None: no quality score)
    primary_metric: str | None = None

    def __init__(self, cfg):
        self.cfg = cfg  # the task's settings (specbench/config/settings.py)

    # -- data -------------------------------------------------------------------------------
    def data_dir(self) -> Path | None:
        d = self.cfg.data_dir or os.environ.get("SPECBENCH_DATA_DIR")
        return Path(d).expanduser() if d else None

    def load_all(self) -> list[Sample]:
        """Every sample of the evaluated split, in a fixed order."""
        raise NotImplementedError

    def load(self) -> list[Sample]:
        """The reproducible subset chosen by `num_samples` and `seed`."""
        samples = self.load_all()
        if not samples:
            raise SpecBenchError(f"the {self.name} split is empty: nothing to run")
        n = self.cfg.num_samples
        if n is None or n == "all":
            return samples
        if isinstance(n, bool) or not isinstance(n, int):
            raise SpecBenchError(f"task.num_samples={n!r} is not allowed; expected an integer >= 1 or null or 'all'")
        if n < 1:
            raise SpecBenchError(f"task.num_samples must be >= 1, got {n}")
        if n > len(samples):
            raise SpecBenchError(
                f"task.num_samples={n} is larger than the {self.name} split ({len(samples)} samples)"
            )
        rng = random.Random(int(self.cfg.seed))
        idx = sorted(rng.sample(range(len(samples)), n))
        return [samples[i] for i in idx]

    def notes(self) -> list[str]:
        """Warnings about how this run's scores were obtained, for the summary (none by default)."""
        return []

    # -- scoring ----------------------------------------------------------------------------
    def score(self, sample: Sample, replies: list[str]) -> dict[str, float]:
        """Quality scores of one sample's replies (one per turn). Empty dict: no score."""
        return {}


# what a user without the data can do (a fresh clone has no ../shared/data beside it)
DATA_HINT = ("Set SPECBENCH_DATA_DIR (or task.data_dir) to a data folder (docs/data.md), "
             "or HF_DATASETS_OFFLINE=0 to download the task from the hub")


def first_available(task: str, loaders: list[tuple[str, Callable[[], Any]]]):
    """Try each (description, loader) in turn; one error naming every place tried if all fail. A
    loader's SpecBenchError (a file there but unreadable) ends the search: it is reported as is."""
    tried = []
    for where, loader in loaders:
        try:
            result = loader()
        except SpecBenchError:
            raise
        except Exception as e:  # noqa: BLE001 - each failure is reported in the final message
            tried.append(f"{where} ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")
            continue
        if result is not None:
            return result
        tried.append(f"{where} (not found)")
    raise SpecBenchError(f"no data for task {task!r}; looked in: " + "; ".join(tried) + f". {DATA_HINT}")



def read_jsonl(path: Path) -> list[dict] | None:
    """Records of a JSONL file (.gz too), blank lines skipped; None if the file does not exist."""
    path = Path(path)
    if not path.is_file():
        return None
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    i = 0
    try:
        with opener(path, "rb") as f:
            for i, raw in enumerate(f, 1):
                line = utf8_line(raw, path, i)
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise SpecBenchError(f"{path}:{i} is not valid JSON ({e.msg})") from None
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError; a cut-off .gz: EOFError
        where = f"{path}:{i + 1}" if i else str(path)
        raise SpecBenchError(f"{where} cannot be read ({type(e).__name__}: {e}); replace or remove the file") from None
    return records


def utf8_line(raw: bytes, path, i: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecBenchError(f"{path}:{i} is not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1})") from None


def local_source(task: Task, rel: str) -> tuple[str, Callable[[], Any]]:
    """A `first_available` entry: a JSONL file under the task's data directory."""
    d = task.data_dir()
    if d is None:
        return "data_dir (unset: task.data_dir or SPECBENCH_DATA_DIR)", lambda: None
    return str(d / rel), lambda: read_jsonl(d / rel)


def load_hub_dataset(*args, **kwargs):
    """`datasets.load_dataset`, offline unless HF_DATASETS_OFFLINE=0 is set explicitly.

    Without a network every hub request retries for ~25 s, so the hub is only read from the local
    cache by default. Only the datasets flag is set: model downloads (huggingface_hub) are untouched.
    """
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    # datasets reads the flag when first imported; it may have been imported before we set it
    if os.environ["HF_DATASETS_OFFLINE"].upper() in datasets.config.ENV_VARS_TRUE_VALUES:
        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    return datasets.load_dataset(*args, **kwargs)


def hub_source(path: str, *args, split: str, **kwargs) -> tuple[str, Callable[[], Any]]:
    """A `first_available` entry: a split of a hub dataset, as a list of dicts."""
    where = f"hub {path}[{split}] (cache only unless HF_DATASETS_OFFLINE=0)"
    return where, lambda: [dict(r) for r in load_hub_dataset(path, *args, split=split, **kwargs)]


TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    TASKS[cls.name] = cls
    return cls


def filter_categories(samples: list, wanted, task: str) -> list:
    """Keep the samples of the `wanted` categories (a name or a list; empty/None: all); an
    unknown category is bad input naming the known ones."""
    if not wanted:
        return samples
    wanted = [wanted] if isinstance(wanted, str) else list(wanted)
    if all(s.category is None for s in samples):
        raise SpecBenchError(f"task.categories={wanted} needs samples with categories; the {task} samples have none "
                             "(task.category_field names the field that holds them)")
    known = sorted({s.category for s in samples if s.category is not None})
    bad = [c for c in wanted if c not in known]
    if bad:
        raise SpecBenchError(f"unknown {task} categories {bad}; allowed: {', '.join(known)}")
    return [s for s in samples if s.category in wanted]
