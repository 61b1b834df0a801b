"""Grouping runs into systems and settings, pooling repeats, per-group statistics (`group_frame`).

How runs are grouped (nothing incompatible is ever averaged):
  * a "setting" is (model, task, max_new_tokens, sampling), where the model is its whole identity
    (name, config group, weights' hash: Run.model_identity), so two `model=hf` runs of different
    weights or two tiny seeds are two models, labelled apart (load.label_models). Every table is per model and
    per task (or has one column group per task), split further by setting, so runs of different
    models, tasks, lengths or sampling never share one number; they get their own tables.
  * a "system" is method (+controller) plus whatever config keys vary between runs of that
    method+controller (e.g. "eesd+fixed (k=4)", "eesd+beta_ts (n_layers=3)").
  * runs of the same setting and system whose configs differ only in `seed` (and run_name /
    run_dir) are repeats: numbers are their mean, speedup is shown as mean ± std.
  * runs that *declare* themselves repeats of one another (same parent dir and same run_name
    up to a `-seed<N>` suffix, as conf/experiment/repeats.yaml names them) must differ only in
    seed; if they differ in model, task, max_new_tokens, sampling or anything else, the report
    refuses with SpecBenchError (CLI: `specbench: error: ...`, exit 2) rather than pool them.
  * `pool_repeats(runs)` (the function every aggregate goes through) raises the same error when
    handed runs that are not repeats; `paired_test` refuses pairs from different settings.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from specbench.core.errors import SpecBenchError
from specbench.metrics.acceptance import position_rates
from specbench.report.load import Run, label_models, short_key, short_value
from specbench.core.stats import PairedTest, mean_std, pooled_speedup_ci, wilcoxon_paired

SEED_SUFFIX = re.compile(r"[-_.]?seed[-_=]?(\d+)$")
SELF = "__reference__"  # p_vs of the --baseline system itself
PHASES = [("prefill", "Prefill"), ("draft", "Drafting"), ("verify", "Verification"), ("control", "Sampling (control)"),
          ("other", "Other"), ("hf_generate", "transformers generate (not broken down)")]


def _describe_difference(a: Run, b: Run) -> str | None:
    if a.model_identity() != b.model_identity():
        return f"model ({a.model} vs {b.model})" if a.model != b.model else f"model ({a.model_identity()} vs {b.model_identity()})"
    for k, va, vb in (
        ("task", a.task, b.task),
        ("max_new_tokens", a.max_new_tokens, b.max_new_tokens),
        ("sampling", a.sampling, b.sampling),
    ):
        if va != vb:
            return f"{k} ({va} vs {vb})"
    va, vb = a.variant(), b.variant()
    diff = sorted(k for k in set(va) | set(vb) if va.get(k) != vb.get(k))
    if diff:
        return ", ".join(f"{k} ({va.get(k)} vs {vb.get(k)})" for k in diff[:3]) + (" ..." if len(diff) > 3 else "")
    return None


def pool_repeats(runs: list[Run]) -> list[Run]:
    """Check that `runs` are repeats (differ only in seed) and may be averaged; returns them."""
    for r in runs[1:]:
        d = _describe_difference(runs[0], r)
        if d:
            raise SpecBenchError(f"refusing to average runs {runs[0].path} and {r.path} into one number: they differ in {d}")
    return runs


def check_declared_repeats(runs: list[Run]) -> None:
    """Runs in one dir named <stem>-seed<N> claim to be repeats; they must differ only in seed."""
    declared = defaultdict(list)
    for r in runs:
        m = SEED_SUFFIX.search(r.path.name)
        if m:
            declared[(r.path.parent, r.path.name[: m.start()])].append(r)
    for group in declared.values():
        if len(group) > 1:
            pool_repeats(group)


def system_labels(runs: list[Run]) -> dict[Path, str]:
    """method(+controller) plus the config keys that vary between runs of that method+controller."""
    by_base = defaultdict(list)
    for r in runs:
        base = r.method + (f"+{r.controller}" if r.controller else "")
        by_base[base].append(r)
    labels = {}
    for base, rs in by_base.items():
        variants = [r.variant() for r in rs]
        keys = sorted({k for v in variants for k in v})
        varying = [k for k in keys if len({json.dumps(v.get(k), sort_keys=True) for v in variants}) > 1]
        if "control.k" in varying and "control.k_max" in varying:
            varying.remove("control.k_max")
        for r, v in zip(rs, variants):
            extra = ", ".join(f"{short_key(k)}={short_value(k, v.get(k))}" for k in varying if v.get(k) is not None)
            labels[r.path] = base + (f" ({extra})" if extra else "")
    return labels


def num(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


@dataclass
class Group:
    """Repeats of one system in one setting."""

    label: str
    runs: list[Run]

    @property
    def first(self) -> Run:
        return self.runs[0]

    def mean(self, fn):
        return mean_std(fn(r) for r in self.runs)[0]

    def per_sample(self, key: str) -> dict:
        """sample id -> value averaged over the repeats."""
        acc = defaultdict(list)
        for r in self.runs:
            for s in r.samples():
                if s[key] is not None:
                    acc[s["id"]].append(s[key])
        return {k: sum(v) / len(v) for k, v in acc.items()}

    def speedup_ci(self) -> tuple[float, float] | None:
        """95% bootstrap CI of the pooled speedup over all samples of all repeats."""
        return pooled_speedup_ci([s["pair"] for r in self.runs for s in r.samples()])


def build_groups(runs: list[Run]) -> list[Group]:
    label_models(runs)  # find_runs did; runs gathered otherwise get their labels too
    check_declared_repeats(runs)
    labels = system_labels(runs)
    by = defaultdict(list)
    for r in runs:
        by[(r.setting(), labels[r.path])].append(r)
    groups = [Group(label, pool_repeats(rs)) for (_, label), rs in by.items()]
    return sorted(groups, key=lambda g: (g.first.model, g.first.task, str(g.first.max_new_tokens), g.first.sampling, natural_key(g.label)))


def natural_key(s: str):
    """Sort key with numbers compared as numbers (k=2 before k=10)."""
    return [(0, float(t), "") if re.fullmatch(r"\d+(\.\d+)?", t) else (1, 0.0, t) for t in re.split(r"(\d+(?:\.\d+)?)", s) if t]


def pooled_position_rates(runs) -> tuple[list, list | None]:
    """Per-position acceptance pooled over runs (counts summed): unconditional, and conditional
    where every run recorded how often each position was reached (metrics/acceptance.py)."""
    keys = ("pos_drafted", "pos_accepted", "pos_reached")
    n = max((len(r.summary.get("pos_drafted") or []) for r in runs), default=0)
    tot = {k: [0] * n for k in keys}
    for r in runs:
        for k in keys:
            for i, v in enumerate(r.summary.get(k) or []):
                tot[k][i] += v
    rates = position_rates(tot["pos_drafted"], tot["pos_accepted"], tot["pos_reached"])
    cond = rates["conditional"] if all("pos_reached" in r.summary for r in runs) else None
    return rates["unconditional"], cond


def _acc(r: Run, k):
    return (r.summary.get("acceptance") or {}).get(k)


def _ms(r: Run, k):
    return (r.summary.get("method") or {}).get(k)


def _ar(r: Run, k):
    return (r.summary.get("ar") or {}).get(k)


def _time(r: Run, side: str, phase: str):
    return ((r.summary.get(side) or {}).get("times") or {}).get(phase, 0.0)


def paired_test(a: Group, b: Group | None) -> PairedTest:
    """Wilcoxon on per-sample tokens/s matched by sample id: b's method vs a's method, or vs its own AR when b is None."""
    if b is None:
        return wilcoxon_paired(a.per_sample("ar_tps"), a.per_sample("method_tps"))
    if a.first.setting() != b.first.setting():
        raise SpecBenchError(
            f"refusing a paired test between {a.label} and {b.label}: different settings "
            f"({_describe_difference(a.first, b.first)})"
        )
    return wilcoxon_paired(a.per_sample("method_tps"), b.per_sample("method_tps"))


def group_frame(groups: list[Group], baseline: str | None) -> pd.DataFrame:
    rows = []
    for g in groups:
        r0 = g.first
        sp_mean, sp_std, _ = mean_std(num(r.summary.get("speedup")) for r in g.runs)
        base = _find_baseline(g, groups, baseline)
        if baseline in (None, "ar"):
            test, base_label = paired_test(g, None), "AR"
        elif base is g:
            test, base_label = None, SELF
        elif base is None:
            test, base_label = None, None
        else:
            test, base_label = paired_test(base, g), base.label
        k = r0.config.get("control.k") if r0.controller == "fixed" else None
        pos_rate, pos_cond = pooled_position_rates(g.runs)
        cats = defaultdict(list)
        for r in g.runs:
            for c, s in (r.summary.get("per_category") or {}).items():
                if s.get("speedup") is not None:
                    cats[c].append(s["speedup"])
        row = {
            "group": g,
            "model": r0.model,
            "task": r0.task,
            "max_new_tokens": r0.max_new_tokens,
            "sampling": r0.sampling,
            "setting": (r0.model, r0.task, r0.max_new_tokens, r0.sampling),
            "label": g.label,
            "method": r0.method,
            "controller": r0.controller,
            "k": k,
            "n_layers": r0.config.get("method.n_layers") if r0.method == "eesd" else None,
            "runs": len(g.runs),
            "seeds": [r.seed for r in g.runs],
            "samples": [r.n_samples for r in g.runs],
            "speedup": sp_mean,
            "speedup_std": sp_std,
            "speedup_ci": g.speedup_ci(),
            "shared_cores": any((r.summary.get("shared_cores") or {}).get("shared") for r in g.runs),
            "n": sum(r.n_samples for r in g.runs),
            "v_d": g.mean(lambda r: _acc(r, "v_d")),
            "r_d": g.mean(lambda r: _acc(r, "r_d")),
            "hm": g.mean(lambda r: _acc(r, "hm")),
            "tau": g.mean(lambda r: _acc(r, "tau")),
            "tps": g.mean(lambda r: _ms(r, "tokens_per_s")),
            "ar_tps": g.mean(lambda r: _ar(r, "tokens_per_s")),
            "time_per_sample": g.mean(lambda r: (_ms(r, "wall") or 0) / max(1, r.n_samples)),
            "ar_time_per_sample": g.mean(lambda r: (_ar(r, "wall") or 0) / max(1, r.n_samples)),
            "predicted": g.mean(lambda r: num(r.summary.get("predicted_speedup"))),
            "eq14": g.mean(lambda r: num(r.summary.get("eq14_speedup"))),
            "p": None if test is None else test.p_value,
            "p_n": None if test is None else test.n,
            "p_stat": None if test is None else test.statistic,
            "p_median_diff": None if test is None else test.median_diff,
            "p_note": None if test is None else test.note,
            "p_vs": base_label,
            "pos_rate": pos_rate,  # unconditional: accepted at i / drafts with a position i
            "pos_cond": pos_cond,  # conditional: accepted at i / drafts that reached i (None: not recorded)
            "v_d_tokens": g.mean(lambda r: _acc(r, "v_d_tokens")),
            "per_category": {c: sum(v) / len(v) for c, v in cats.items()},
        }
        for phase, _ in PHASES:
            row[f"t_{phase}"] = g.mean(lambda r, p=phase: _time(r, "method", p))
            row[f"ar_t_{phase}"] = g.mean(lambda r, p=phase: _time(r, "ar", p))
            row[f"tps_{phase}"] = g.mean(lambda r, p=phase: _time(r, "method", p) / max(1, r.n_samples))
            row[f"ar_tps_{phase}"] = g.mean(lambda r, p=phase: _time(r, "ar", p) / max(1, r.n_samples))
        row["t_wall"] = g.mean(lambda r: _ms(r, "wall"))
        rows.append(row)
    return pd.DataFrame(rows)


def _find_baseline(g: Group, groups: list[Group], baseline: str | None) -> Group | None:
    if baseline in (None, "ar"):
        return None
    same = [h for h in groups if h.first.setting() == g.first.setting()]
    exact = [h for h in same if h.label == baseline]
    if exact:
        return exact[0]
    by_method = [h for h in same if h.first.method == baseline or h.label.split(" (")[0] == baseline]
    if len(by_method) > 1:
        raise SpecBenchError(
            f"--baseline {baseline!r} is ambiguous on task {g.first.task}: "
            + ", ".join(repr(h.label) for h in by_method)
            + " (pass one of these labels)"
        )
    return by_method[0] if by_method else None
