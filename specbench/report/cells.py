"""The leaderboard's cells: its spec (results/leaderboard/leaderboard.yaml: rows, tasks, shared settings), the
command that measures a cell, and the stored runs read back as cells, each checked against that command today.

A cell is one run dir, <folder>/<host>/<task>/<row>/; the repository keeps its config.json and summary.json (the
summary carries the per-sample pairs behind the interval), the rest of the run dir stays on the machine that
measured it. A stored run is compared with what its row's command would run today (the composed config's
fingerprint, on the keys both know): a difference (a default changed) makes the cell stale; so is a trained part
loaded from specbench/published_artifacts that is no longer the one published there. specbench/report/board.py
draws the tables.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from specbench.core.errors import SpecBenchError
from specbench.report.load import UNRECORDED, Run, _flatten, _is_neutral, find_runs

REPO = Path(__file__).resolve().parents[2]
FOLDER = REPO / "results" / "leaderboard"
SPEC = "leaderboard.yaml"
PUBLISHED = REPO / "specbench" / "published_artifacts"
# left out of the stale check: file locations, the run's name, training settings (a cell's part is compared by hash)
IGNORED = re.compile(r"^(task\.data_dir|model\.path|run_name|train\..*|provenance\..*)$")


@dataclass(frozen=True)
class Row:
    name: str
    method: str
    label: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Spec:
    model: str
    tasks: tuple[str, ...]
    overrides: tuple[str, ...]
    rows: tuple[Row, ...]

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise SpecBenchError(f"unknown leaderboard row {name!r}; allowed: {', '.join(r.name for r in self.rows)}")

    def check_task(self, task: str) -> None:
        if task not in self.tasks:
            raise SpecBenchError(f"task {task!r} is not a leaderboard column; allowed: {', '.join(self.tasks)}")


def load_spec(folder: Path = FOLDER) -> Spec:
    path = Path(folder) / SPEC
    if not path.is_file():
        raise SpecBenchError(f"{folder} holds no {SPEC} (a leaderboard folder: its spec, then one folder per host)")
    try:
        d = yaml.safe_load(path.read_text())
        rows = tuple(Row(str(r["name"]), str(r["method"]), str(r.get("label") or r["name"]), tuple(r.get("overrides") or ()))
                     for r in d["rows"])
        spec = Spec(str(d["model"]), tuple(d["tasks"]), tuple(d.get("overrides") or ()), rows)
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise SpecBenchError(f"{path}: not a leaderboard spec ({type(e).__name__}: {e}); needs model, tasks, rows") from None
    if len({r.name for r in rows}) != len(rows):
        raise SpecBenchError(f"{path}: two rows share a name")
    return spec


def overrides(spec: Spec, row: Row, task: str) -> list[str]:
    """What `python -m specbench` is given to measure one cell (the caller adds run_dir)."""
    from omegaconf import OmegaConf

    from specbench.config.compose import CONF_DIR

    spec.check_task(task)
    method_conf = CONF_DIR / "method" / f"{row.method}.yaml"
    if not method_conf.is_file():
        raise SpecBenchError(f"leaderboard row {row.name!r}: no method {row.method!r} ({method_conf} is missing)")
    trains = "train_if_missing" in OmegaConf.load(method_conf)
    return [f"model={spec.model}", f"method={row.method}", f"task={task}", *spec.overrides, *row.overrides,
            *(["method.train_if_missing=false"] if trains else []), f"run_name={row.name}"]


def expected_config(args: list[str]) -> dict:
    """What a run of `python -m specbench args` records as its config.json (identity.fingerprint), provenance aside."""
    from specbench.config.compose import compose
    from specbench.config.identity import fingerprint

    return fingerprint(compose([*args, "run_dir=unused"]))


def stale_reasons(run: Run, expected: dict) -> list[str]:
    """Settings on which the stored run differs from what its command runs today (keys both know)."""
    want = _flatten(expected)
    keys = sorted(k for k in set(run.config) & set(want) if not _is_neutral(k) and not IGNORED.match(k))
    return [f"{k} {run.config[k]} -> {want[k]}" for k in keys if run.config[k] != want[k]]


def published_hashes() -> set[str]:
    out = set()
    for p in PUBLISHED.rglob("*.json"):
        try:
            out.add(json.loads(p.read_text()).get("sha256"))
        except (OSError, ValueError, AttributeError):
            continue
    return out


# inputs a method reads that no training made (REST's and SAM-Decoding's corpus and the datastore
# built from it: Method.inputs()); the run's provenance pins them, the leaderboard's budget column skips them
DATA_INPUTS = frozenset({"corpus", "datastore"})


def trained_parts(run: Run, published: set[str]) -> tuple[list[str], list[str]]:
    """(what the trained parts are: their budgets and where they came from, stale reasons)."""
    budgets = sorted(set(_find(run.meta.get("method_settings") or {}, "trained")))
    notes, stale = [], []
    for key, sha in run.config.items():
        if not (key.startswith("provenance.artifacts.") and key.endswith(".sha256")):
            continue
        name = key[len("provenance.artifacts."): -len(".sha256")]
        if name.split(".")[0].removeprefix("aux_") in DATA_INPUTS or "draft_vocab" in name:  # built from data (a
            continue  # datastore, a ranked token file), not trained: no budget
        path = str(run.config.get(key[: -len("sha256")] + "path", ""))
        if sha in published:
            notes.append("published")
        elif "published_artifacts" in path:
            stale.append(f"its {key.split('.')[2]} is no longer the published part")
        else:
            notes.append("from the measuring host's cache, not published")
    text = "; ".join(budgets) or ("budget not recorded" if notes else "")
    return ([f"{text} ({', '.join(sorted(set(notes)))})"] if notes else [text] if text else []), stale


def _find(d, key: str):
    for k, v in d.items() if isinstance(d, dict) else ():
        yield from [v] if k == key and isinstance(v, str) else _find(v, key)


@dataclass
class Cell:
    row: Row
    task: str
    run: Run
    stale: list[str]
    trained: list[str]

    def ar_speed(self) -> float | None:
        """AR's tokens/s here; None where AR decoded other weights than the base model's (SPACE's delta moves both)."""
        base = self.run.meta.get("baseline_weights", "base") == "base"
        return (self.run.summary.get("ar") or {}).get("tokens_per_s") if base else None

    def beside(self) -> float | None:
        """The machine's load beyond the cell's own threads while it ran (its median 1-minute load average less
        torch's threads): other work on other cores, which shares memory bandwidth, caches and clocks with
        it. None where the run recorded no load."""
        sc = self.run.summary.get("shared_cores") or {}
        load, threads = sc.get("loadavg_1m_median"), sc.get("threads")
        return None if load is None or not threads else max(0.0, load - threads)


def find_cells(spec: Spec, folder: Path = FOLDER) -> list[Cell]:
    """Every run dir under `folder`, matched to its row (the run dir's name) and checked against today's command."""
    runs = find_runs([folder], allow_empty=True)
    published = published_hashes()
    cells, expected = [], {}  # one compose per command (~0.5 s each), not per host's cell
    for run in runs:
        row = spec.row(run.path.name)
        spec.check_task(run.task)
        if run.hardware == UNRECORDED:
            raise SpecBenchError(f"{run.path}: the run recorded no CPU or GPU name; a leaderboard cell must say its host")
        args = tuple(overrides(spec, row, run.task))
        expected[args] = expected[args] if args in expected else expected_config(list(args))
        stale = stale_reasons(run, expected[args])
        trained, gone = trained_parts(run, published)
        cells.append(Cell(row, run.task, run, stale + gone, trained))
    seen = defaultdict(list)
    for c in cells:
        seen[(c.run.hardware, c.row.name, c.task)].append(c.run.path)
    for key, paths in seen.items():
        if len(paths) > 1:
            raise SpecBenchError(f"two runs of one cell {key}: " + ", ".join(map(str, paths)))
    return cells


def host_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"
