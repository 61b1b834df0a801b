"""Finding and reading finished runs: `find_runs(dirs)` -> `Run`s (summary, flattened config, samples).

Reading goes through `specbench.run.rundir.read_finished`, which refuses a run in progress, damaged or
mixed; runs moved aside by overwrite=true and runs without finished samples are skipped with a note.
`footer_text` describes a set of runs (model, hardware, dtype, versions, sample counts) for the
tables and the plots.
"""

from __future__ import annotations

import copy
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from specbench.core.errors import SpecBenchError
from specbench.config.identity import drop_unread_training_keys
from specbench.run.rundir import moved_aside, read_finished

# fingerprint keys that never make two runs different systems
# (profile.* only feeds the predicted speedup; warmup_tokens is an unmeasured warm-up; measure.* are
# interference retries and CI settings)
NEUTRAL_KEYS = ("seed", "run_name", "run_dir", "progress", "overwrite", "print_summary", "num_samples", "profile", "warmup_tokens", "measure")
# keys that define the setting (compared first, for a precise error message)
SETTING_KEYS = ("model", "task", "max_new_tokens", "sampling")
# the weights' identity in a fingerprint (specbench/run/provenance.py); trained artifacts are under
# provenance.artifacts.<key> and make systems differ
WEIGHTS = "provenance.model."
ARTIFACTS = "provenance.artifacts."
UNRECORDED = "unrecorded"
DRAFT_QUANT = "model.draft_quant"  # recorded only when not "none" (config/identity.py)


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
    # where a file lies is not what it is (its hash is kept): runs on two machines may be repeats
    where = top == "provenance" and key.endswith(".path")
    return top in NEUTRAL_KEYS or key.endswith(".num_samples") or key.endswith(".progress") or where


def short_key(key: str) -> str:
    """A flattened config key as a label shows it (`method.k` -> `k`, an artifact's hash -> its name)."""
    for prefix in ("method.", "control.", "model.", WEIGHTS, ARTIFACTS):
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    key = re.sub(r"[.]sha256$", "", key)
    return "weights" if key == "sha256" else key


def short_value(key: str, value):
    return value[:8] if key.endswith("sha256") and isinstance(value, str) else value


def model_identity(config: dict, name: str) -> dict:
    """Which model ran: its name, its config group (id, revision, seed, shape, dtype, backend ...)
    and its weights' identity (hash, hub commit). Runs whose identities differ are never pooled."""
    out = {"model.name": name}
    out |= {k: v for k, v in config.items() if k.startswith("model.") or (k.startswith(WEIGHTS) and not _is_neutral(k))}
    # eager execution is what every run before model.execution existed did; a graph width matters in graphs only
    if out.get("model.execution", "eager") == "eager":
        out.pop("model.execution", None)
        out.pop("model.graph_max_width", None)
    out.pop(DRAFT_QUANT, None)  # how a method's trained parts are rounded: the method's system, not the model
    return out


@dataclass
class Run:
    path: Path
    summary: dict
    config: dict  # flattened config.json (the run's fingerprint); {} when absent
    _samples: list | None = field(default=None, repr=False)
    model_label: str | None = None  # the model's name plus what tells it apart (find_runs), when two models share a name

    @property
    def meta(self) -> dict:
        return self.summary.get("meta", {})

    @property
    def model_name(self) -> str:
        return str(self.meta.get("model", self.config.get("model.name", "?")))

    @property
    def model(self) -> str:
        """The model as tables and plots name it: unique per model identity among the runs read together."""
        return self.model_label or self.model_name

    def model_identity(self) -> str:
        return json.dumps(model_identity(self.config, self.model_name), sort_keys=True, default=str)

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
        return (self.model_identity(), self.task, self.max_new_tokens, self.sampling)

    @property
    def hardware(self) -> str:
        """The device the run measured on: the GPU's name, else the CPU's model (runner.cpu_model);
        "unrecorded" for runs written before the CPU model was kept."""
        env = self.meta.get("env") or {}
        return str(env.get("gpu") or env.get("cpu_model") or UNRECORDED)

    def variant(self) -> dict:
        """Config keys that make a system (everything but the setting and the neutral keys), and
        the hardware: the same method on two machines is two systems, never pooled as repeats."""
        out = {"hardware": self.hardware}
        for k, v in self.config.items():
            top = k.split(".")[0]
            if k != DRAFT_QUANT and (_is_neutral(k) or top in ("model", "task", "sampling", "max_new_tokens") or k.startswith(WEIGHTS)):
                continue
            out[k] = v
        return out

    def samples(self) -> list[dict]:
        """Per sample: from samples.jsonl, or from the summary's per_sample where a lean copy of the run
        dir (config.json + summary.json: results/leaderboard) has no samples.jsonl."""
        if self._samples is None:
            p = self.path / "samples.jsonl"
            records = []
            if p.exists():
                for line in p.read_text().splitlines():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
            else:
                records = self.summary.get("per_sample") or []
            self._samples = [_sample(r) for r in records]
        return self._samples


def _tps(side: dict | None):
    side = side or {}
    if side.get("tokens_per_s") is not None:
        return side["tokens_per_s"]
    tok, wall = side.get("new_tokens"), side.get("wall")
    return tok / wall if tok is not None and wall else None


def _sample(r: dict) -> dict:
    ar, m = r.get("ar") or {}, r.get("method") or {}
    return {
        "id": r["id"],
        "category": r.get("category"),
        "ar_tps": _tps(ar),
        "method_tps": _tps(m),
        "speedup": r.get("speedup"),
        "predicted_speedup": r.get("predicted_speedup"),
        # for the bootstrap CI of the pooled speedup
        "pair": tuple(side.get(f) for side in (ar, m) for f in ("new_tokens", "wall")),
    }


def find_runs(dirs, allow_empty: bool = False) -> list[Run]:
    """The native engine's finished runs under `dirs` (engine=vllm runs: specbench.vllm_engine.report)."""
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
            if moved_aside(rd):
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
            if summary.get("engine") == "vllm":  # per batch size, not per sample: specbench.vllm_engine.report
                continue
            # refuses a run in progress, damaged or mixed; the records are those its summary counts
            config, records = read_finished(rd, summary)
            config = copy.deepcopy(config)
            drop_unread_training_keys(config)  # as the run's identity: keys the method cannot read
            runs.append(Run(rd, summary, _flatten(config), [_sample(r) for r in records]))
    if not runs and not allow_empty:
        raise SpecBenchError("no run dirs (holding summary.json) under " + ", ".join(str(d) for d in dirs))
    label_models(runs)
    return runs


def label_models(runs: list[Run]) -> None:
    """Runs of different models that share a name (every `model=hf` run is `hf`; tiny models of
    two seeds) get labels that tell them apart: the name plus the keys that differ."""
    by_name = defaultdict(list)
    for r in runs:
        r.model_label = None
        by_name[r.model_name].append(r)
    for name, rs in by_name.items():
        idents = [model_identity(r.config, name) for r in rs]
        if len({json.dumps(i, sort_keys=True, default=str) for i in idents}) < 2:
            continue
        keys = sorted({k for i in idents for k in i})
        varying = [k for k in keys if len({json.dumps(i.get(k), default=str) for i in idents}) > 1]
        for r, ident in zip(rs, idents):
            shown = ", ".join(f"{short_key(k)}={short_value(k, ident.get(k))}" for k in varying)
            r.model_label = f"{name} ({shown})"


def _uniq(vals) -> str:
    vals = [str(v) for v in dict.fromkeys(vals) if v is not None]
    return ", ".join(vals) if vals else "?"


def footer_text(runs: list[Run], sep: str = " | ", labels: dict | None = None) -> str:
    """Model, hardware, dtype, versions and sample counts, from the runs' stored meta."""
    env = [r.meta.get("env", {}) for r in runs]
    hw = _uniq(
        (e.get("gpu") or f"{e.get('cpu_model') or e.get('processor', '?')} CPU x{e.get('cpu_count', '?')}") + f" ({r.meta.get('device', '?')})"
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
