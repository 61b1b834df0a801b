"""Finding and reading finished runs: `find_runs(dirs)` -> `Run`s (summary, flattened config, samples).

Reading goes through `specbench.rundir.read_finished`, which refuses a run in progress, damaged or
mixed; runs moved aside by overwrite=true and runs without finished samples are skipped with a note.
`footer_text` describes a set of runs (model, hardware, dtype, versions, sample counts) for the
tables and the plots.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from specbench.errors import SpecBenchError
from specbench.rundir import OLD_MARK, read_finished

# fingerprint keys that never make two runs different systems
# (profile.* only feeds the predicted speedup; warmup_tokens is an unmeasured warm-up; measure.* are
# interference retries and CI settings)
NEUTRAL_KEYS = ("seed", "run_name", "run_dir", "progress", "overwrite", "print_summary", "num_samples", "profile", "warmup_tokens", "measure")
# keys that define the setting (compared first, for a precise error message)
SETTING_KEYS = ("model", "task", "max_new_tokens", "sampling")


def _flatten(d, prefix=""):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    key = prefix[:-1]
    out[key] = json.dumps(d, sort_keys=True) if isinstance(d, list) else d
    return out


def _is_neutral(key: str) -> bool:
    top = key.split(".")[0]
    return top in NEUTRAL_KEYS or key.endswith(".num_samples") or key.endswith(".progress")


@dataclass
class Run:
    path: Path
    summary: dict
    config: dict  # flattened config.json (the run's fingerprint); {} when absent
    _samples: list | None = field(default=None, repr=False)

    @property
    def meta(self) -> dict:
        return self.summary.get("meta", {})

    @property
    def model(self) -> str:
        return str(self.meta.get("model", self.config.get("model.name", "?")))

    @property
    def task(self) -> str:
        return str(self.meta.get("task", self.config.get("task.name", "?")))

    @property
    def method(self) -> str:
        return str(self.meta.get("method", self.config.get("method.name", "?")))

    @property
    def controller(self) -> str | None:
        c = self.meta.get("controller")
        return None if c is None else str(c)

    @property
    def max_new_tokens(self):
        return self.meta.get("max_new_tokens", self.config.get("max_new_tokens"))

    @property
    def sampling(self) -> str:
        s = self.meta.get("sampling")
        if s is None:
            s = {k.split(".", 1)[1]: v for k, v in self.config.items() if k.startswith("sampling.")}
        return json.dumps(s, sort_keys=True)

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def run_name(self) -> str:
        return str(self.config.get("run_name") or self.path.name)

    @property
    def n_samples(self) -> int:
        return int(self.summary.get("samples", 0))

    def setting(self) -> tuple:
        return (self.model, self.task, self.max_new_tokens, self.sampling)

    def variant(self) -> dict:
        """Config keys that make a system (everything but the setting and the neutral keys)."""
        out = {}
        for k, v in self.config.items():
            top = k.split(".")[0]
            if _is_neutral(k) or top in ("model", "task", "sampling", "max_new_tokens"):
                continue
            out[k] = v
        return out

    def samples(self) -> list[dict]:
        if self._samples is None:
            self._samples = []
            p = self.path / "samples.jsonl"
            if p.exists():
                for line in p.read_text().splitlines():
                    try:
                        r = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    self._samples.append(
                        {
                            "id": r["id"],
                            "category": r.get("category"),
                            "ar_tps": (r.get("ar") or {}).get("tokens_per_s"),
                            "method_tps": (r.get("method") or {}).get("tokens_per_s"),
                            "speedup": r.get("speedup"),
                            "predicted_speedup": r.get("predicted_speedup"),
                            # for the bootstrap CI of the pooled speedup
                            "pair": tuple((r.get(k) or {}).get(f) for k in ("ar", "method") for f in ("new_tokens", "wall")),
                        }
                    )
        return self._samples


def find_runs(dirs) -> list[Run]:
    runs = []
    seen = set()
    for d in dirs:
        d = Path(d)
        if not d.exists():
            raise SpecBenchError(f"results dir {d} does not exist")
        for s in sorted(d.rglob("summary.json")):
            rd = s.parent.resolve()
            if rd in seen:
                continue
            seen.add(rd)
            if OLD_MARK in rd.name:
                print(f"note: skipping {rd}: a run moved aside by overwrite=true")
                continue
            try:
                summary = json.loads(s.read_text())
                if not isinstance(summary, dict):
                    raise ValueError("not a JSON object")
            except (ValueError, UnicodeDecodeError) as e:
                raise SpecBenchError(f"{s} is not valid JSON ({e})") from None
            if not summary.get("samples"):
                print(f"note: skipping {rd}: no finished samples")
                continue
            config, _ = read_finished(rd, summary)  # refuses a run in progress, damaged or mixed
            runs.append(Run(rd, summary, _flatten(config)))
    if not runs:
        raise SpecBenchError("no run dirs (holding summary.json) under " + ", ".join(str(d) for d in dirs))
    return runs


def _uniq(vals) -> str:
    vals = [str(v) for v in dict.fromkeys(vals) if v is not None]
    return ", ".join(vals) if vals else "?"


def footer_text(runs: list[Run], sep: str = " | ", labels: dict | None = None) -> str:
    """Model, hardware, dtype, versions and sample counts, from the runs' stored meta."""
    env = [r.meta.get("env", {}) for r in runs]
    hw = _uniq(
        (e.get("gpu") or f"{e.get('processor', '?')} CPU x{e.get('cpu_count', '?')}") + f" ({r.meta.get('device', '?')})"
        for e, r in zip(env, runs)
    )
    counts = defaultdict(list)
    for r in runs:
        counts[(labels or {}).get(r.path, r.method + (f"+{r.controller}" if r.controller else ""))].append(r.n_samples)
    if len({n for v in counts.values() for n in v}) == 1:
        samples = f"{runs[0].n_samples} samples/run, {len(runs)} runs"
    else:
        samples = "samples/run: " + "; ".join(f"{k} {'+'.join(map(str, v))}" for k, v in sorted(counts.items()))
    parts = [
        f"model: {_uniq(r.model for r in runs)}",
        f"hardware: {hw}",
        f"dtype: {_uniq(r.meta.get('dtype') for r in runs)}",
        f"torch {_uniq(e.get('torch') for e in env)}, transformers {_uniq(e.get('transformers') for e in env)}",
        samples,
    ]
    return sep.join(parts)
