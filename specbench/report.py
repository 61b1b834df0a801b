"""Tables and plots from finished runs: `python -m specbench.report DIR [DIR ...] [--out DIR] [--baseline METHOD]`.

Finds every run dir (one holding summary.json) under the given dirs and writes to --out
(default `<first dir>/report/`):

  tables.md, tables.tex
    (a) method x task, HM and speedup (EESD Table 1 layout), one table per model
    (b) v_d / r_d / HM / tau / inference time / tokens/s / speedup / p-value (EESD Table 10),
        one table per model, task and setting
    (c) time breakdown drafting / verification / sampling (= controller) / other (EESD Table 8)
    (d) predicted (cost model, eq. 14) vs measured speedup
    (e) paired Wilcoxon signed-rank tests on per-sample tokens/s
    (f) repeats (runs differing only in seed): speedup mean ± std
  *.png plots (only those with data; each skipped plot is named with the reason).

How runs are grouped (nothing incompatible is ever averaged):
  * a "setting" is (model, task, max_new_tokens, sampling). Every table is per model and
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

import argparse
import json
import math
import re
import sys
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specbench.errors import SpecBenchError
from specbench.leaderboard import leaderboard_tables, plot_leaderboard
from specbench.rundir import OLD_MARK, read_finished
from specbench.stats import PairedTest, mean_std, pooled_speedup_ci, wilcoxon_paired

SEED_SUFFIX = re.compile(r"[-_.]?seed[-_=]?(\d+)$")
# fingerprint keys that never make two runs different systems
# (profile.* only feeds the predicted speedup; warmup_tokens is an unmeasured warm-up; measure.* are
# interference retries and CI settings)
NEUTRAL_KEYS = ("seed", "run_name", "run_dir", "progress", "overwrite", "print_summary", "num_samples", "profile", "warmup_tokens", "measure")
# keys that define the setting (compared first, for a precise error message)
SETTING_KEYS = ("model", "task", "max_new_tokens", "sampling")
SELF = "__reference__"  # p_vs of the --baseline system itself
PHASES = [("prefill", "Prefill"), ("draft", "Drafting"), ("verify", "Verification"), ("control", "Sampling (control)"),
          ("other", "Other"), ("hf_generate", "transformers generate (not broken down)")]


# ----------------------------------------------------------------------------- loading


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


# ----------------------------------------------------------------------------- grouping


def _describe_difference(a: Run, b: Run) -> str | None:
    for k, va, vb in (
        ("model", a.model, b.model),
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
            extra = ", ".join(f"{re.sub(r'^(method|control)[.]', '', k)}={v.get(k)}" for k in varying if v.get(k) is not None)
            labels[r.path] = base + (f" ({extra})" if extra else "")
    return labels


def _num(x):
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
    check_declared_repeats(runs)
    labels = system_labels(runs)
    by = defaultdict(list)
    for r in runs:
        by[(r.setting(), labels[r.path])].append(r)
    groups = [Group(label, pool_repeats(rs)) for (_, label), rs in by.items()]
    return sorted(groups, key=lambda g: (g.first.model, g.first.task, str(g.first.max_new_tokens), g.first.sampling, _natural(g.label)))


def _natural(s: str):
    """Sort key with numbers compared as numbers (k=2 before k=10)."""
    return [(0, float(t), "") if re.fullmatch(r"\d+(\.\d+)?", t) else (1, 0.0, t) for t in re.split(r"(\d+(?:\.\d+)?)", s) if t]


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
        sp_mean, sp_std, _ = mean_std(_num(r.summary.get("speedup")) for r in g.runs)
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
        pos_d = [0] * max((len(r.summary.get("pos_drafted") or []) for r in g.runs), default=0)
        pos_a = list(pos_d)
        for r in g.runs:
            for i, (d, a_) in enumerate(zip(r.summary.get("pos_drafted") or [], r.summary.get("pos_accepted") or [])):
                pos_d[i] += d
                pos_a[i] += a_
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
            "n": sum(r.n_samples for r in g.runs),
            "v_d": g.mean(lambda r: _acc(r, "v_d")),
            "r_d": g.mean(lambda r: _acc(r, "r_d")),
            "hm": g.mean(lambda r: _acc(r, "hm")),
            "tau": g.mean(lambda r: _acc(r, "tau")),
            "tps": g.mean(lambda r: _ms(r, "tokens_per_s")),
            "ar_tps": g.mean(lambda r: _ar(r, "tokens_per_s")),
            "time_per_sample": g.mean(lambda r: (_ms(r, "wall") or 0) / max(1, r.n_samples)),
            "ar_time_per_sample": g.mean(lambda r: (_ar(r, "wall") or 0) / max(1, r.n_samples)),
            "predicted": g.mean(lambda r: _num(r.summary.get("predicted_speedup"))),
            "eq14": g.mean(lambda r: _num(r.summary.get("eq14_speedup"))),
            "p": None if test is None else test.p_value,
            "p_n": None if test is None else test.n,
            "p_stat": None if test is None else test.statistic,
            "p_median_diff": None if test is None else test.median_diff,
            "p_note": None if test is None else test.note,
            "p_vs": base_label,
            "pos_rate": [a_ / d if d else None for d, a_ in zip(pos_d, pos_a)],
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


# ----------------------------------------------------------------------------- tables


def _f(x, spec=".2f", suffix=""):
    x = _num(x)
    return "-" if x is None else format(x, spec) + suffix


def _speed(mean, std):
    if _num(mean) is None:
        return "-"
    return f"{mean:.2f}x" + (f" ± {std:.2f}" if _num(std) is not None else "")


def _speed_cell(h) -> str:
    """Speedup with its bootstrap CI and the number of samples behind it."""
    ci = h["speedup_ci"]
    ci_text = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if isinstance(ci, tuple) else ""
    return _speed(h["speedup"], h["speedup_std"]) + ci_text + f" n={h['n']}"


def _p(p, note=None):
    if _num(p) is None:
        return "n/a"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def _setting_name(model, task, mnt, sampling) -> str:
    s = json.loads(sampling) if sampling else {}
    t = s.get("temperature", 0.0)
    samp = "greedy" if not t else "T=" + ", ".join(f"{k}={v}" for k, v in s.items())
    return f"{task}, max_new_tokens={mnt}, {samp}"


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    note: str = ""


def make_tables(df: pd.DataFrame, baseline: str | None) -> list[Table]:
    tables: list[Table] = []
    # (a) method x task (EESD Table 1): one table per model; one column pair per task setting
    for model, dm in df.groupby("model", sort=True):
        settings = list(dict.fromkeys(dm["setting"]))
        tasks_count = defaultdict(int)
        for s in settings:
            tasks_count[s[1]] += 1
        col_names = {s: (s[1] if tasks_count[s[1]] == 1 else _setting_name(*s)) for s in settings}
        header = ["Method"] + [h for s in settings for h in (f"{col_names[s]} HM", f"{col_names[s]} Speedup")]
        rows = []
        for label in sorted(dm["label"].unique(), key=_natural):
            row = [label]
            for s in settings:
                hit = dm[(dm["label"] == label) & (dm["setting"] == s)]
                if hit.empty:
                    row += ["-", "-"]
                else:
                    h = hit.iloc[0]
                    row += [_f(h["hm"]), _speed_cell(h)]
            rows.append(row)
        tables.append(
            Table(
                f"(a) HM and speedup by method and task, model {model} (EESD Table 1 layout)",
                header,
                rows,
                "HM: harmonic mean of v_d and r_d (x100). Speedup: method tokens/s over AR tokens/s measured in the "
                "same run (pooled over samples); ± is the std over repeats (seeds) where there are several; [lo, hi]: "
                "95% bootstrap CI over samples (all repeats pooled); n: samples behind the cell.",
            )
        )
    # (b) detailed per setting (EESD Table 10) and (c) time breakdown (EESD Table 8)
    vs = "AR (same run)" if baseline in (None, "ar") else baseline
    for setting, ds in df.groupby("setting", sort=False):
        model = setting[0]
        name = _setting_name(*setting)
        ar_tps = mean_std(ds["ar_tps"])[0]
        ar_t = mean_std(ds["ar_time_per_sample"])[0]
        rows = [["Auto-regressive", "-", "-", "-", "-", _f(ar_t, ".3f"), _f(ar_tps), "1.00x", "-", "-"]]
        for _, h in ds.iterrows():
            n = "+".join(str(x) for x in h["samples"])
            rows.append(
                [
                    h["label"], _f(h["v_d"]), _f(h["r_d"]), _f(h["hm"]), _f(h["tau"]),
                    _f(h["time_per_sample"], ".3f"), _f(h["tps"]), _speed_cell(h),
                    "(reference)" if h["p_vs"] == SELF else _p(h["p"]) if isinstance(h["p_vs"], str) else "n/a (no reference run)", n,
                ]
            )
        tables.append(
            Table(
                f"(b) Detailed results, model {model}, {name} (EESD Table 10 layout)",
                ["Method", "v_d", "r_d", "HM", "tau", "Inference time (s/sample)", "Tokens/s", "Speedup", f"p (vs {vs})", "Samples"],
                rows,
                "Auto-regressive row: mean of the AR measurements of all runs in this table. p: two-sided Wilcoxon "
                "signed-rank test on per-sample tokens/s, pairs matched by sample id (repeats averaged per sample). "
                "Samples: per run (one number per repeat). Speedup [lo, hi]: 95% bootstrap CI over samples.",
            )
        )
        rows = []
        for _, h in ds.iterrows():
            total = sum(h[f"t_{p}"] or 0 for p, _ in PHASES)
            cells = [h["label"]]
            for p, _ in PHASES:
                v = h[f"t_{p}"] or 0.0
                cells.append(f"{v:.3f}s ({100 * v / total:.0f}%)" if total else f"{v:.3f}s")
            cells.append(_f(h["t_wall"], ".3f", "s"))
            rows.append(cells)
        tables.append(
            Table(
                f"(c) Time breakdown of the method, model {model}, {name} (EESD Table 8 layout)",
                ["Method"] + [n for _, n in PHASES] + ["Total"],
                rows,
                "Seconds summed over all samples of a run (mean over repeats). Sampling (control) is the controller's "
                "time (the paper's 'Sampling' column: Thompson sampling / threshold updates); Other is wall time no "
                "phase claimed. Prefill is listed apart (the paper does not separate it).",
            )
        )
    # (d) predicted vs measured
    rows = []
    for _, h in df.iterrows():
        ratio = h["speedup"] / h["predicted"] if _num(h["predicted"]) and _num(h["speedup"]) else None
        rows.append([h["model"], h["task"], h["label"], _f(h["predicted"], ".2f", "x"), _f(h["eq14"], ".2f", "x"),
                     _speed_cell(h), _f(ratio, ".2f")])
    tables.append(
        Table(
            "(d) Predicted vs measured speedup",
            ["Model", "Task", "Method", "Predicted (cost model)", "EESD eq. 14", "Measured", "Measured / predicted"],
            rows,
            "Predicted: per-step cost model from the profiled forward costs (profile.enabled); eq. 14: the EESD "
            "paper's closed form from v_d, r_d and the draft/target cost ratio alpha. '-': run without a profile.",
        )
    )
    # (e) significance
    rows = []
    for _, h in df.iterrows():
        if not isinstance(h["p_vs"], str) or h["p_vs"] == SELF:
            continue
        note = h["p_note"] if isinstance(h["p_note"], str) and h["p_note"] else ""
        rows.append([h["model"], h["task"], h["label"], h["p_vs"], str(int(h["p_n"])), _f(h["p_median_diff"], ".2f"),
                     _f(h["p_stat"], ".1f"), _p(h["p"]) + (f" ({note})" if note else "")])
    if rows:
        tables.append(
            Table(
                "(e) Paired Wilcoxon signed-rank tests on per-sample tokens/s",
                ["Model", "Task", "Method", "vs", "Pairs", "Median diff (tok/s)", "W", "p (two-sided)"],
                rows,
                "scipy.stats.wilcoxon defaults. Median diff > 0: the method is faster than the reference. "
                "The EESD paper reports p < 0.005 against all baselines.",
            )
        )
    # (f) repeats
    rep = df[df["runs"] > 1]
    if not rep.empty:
        rows = []
        for _, h in rep.iterrows():
            sps = [r.summary.get("speedup") for r in h["group"].runs]
            sps = [s for s in sps if s is not None]
            rows.append([h["model"], h["task"], h["label"], str(h["runs"]), ",".join(str(s) for s in h["seeds"]),
                         _speed(h["speedup"], h["speedup_std"]), _f(min(sps) if sps else None), _f(max(sps) if sps else None)])
        tables.append(
            Table("(f) Repeats (runs differing only in seed)", ["Model", "Task", "Method", "Runs", "Seeds", "Speedup mean ± std", "Min", "Max"], rows,
                  "std: sample standard deviation over the repeats' pooled speedups.")
        )
    return tables


def _md_cell(s) -> str:
    return str(s).replace("|", "\\|")


def render_md(tables: list[Table], runs: list[Run]) -> str:
    out = ["# specbench report", "", "Runs: " + footer_text(runs), ""]
    for t in tables:
        out += [f"## {t.title}", "", "| " + " | ".join(_md_cell(h) for h in t.header) + " |",
                "|" + "|".join("---" for _ in t.header) + "|"]
        out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
        if t.note:
            out += ["", t.note]
        out.append("")
    return "\n".join(out)


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
        "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "×": r"$\times$"}


def tex_escape(s) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(s))


def render_tex(tables: list[Table], runs: list[Run]) -> str:
    out = ["% specbench report; needs \\usepackage{booktabs}", "% " + footer_text(runs, sep="; ").replace("\n", " "), ""]
    for t in tables:
        out += ["\\begin{table}[ht]", "\\centering", "\\small",
                "\\begin{tabular}{l" + "r" * (len(t.header) - 1) + "}", "\\toprule",
                " & ".join(tex_escape(h) for h in t.header) + " \\\\", "\\midrule"]
        out += [" & ".join(tex_escape(c) for c in row) + " \\\\" for row in t.rows]
        out += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{tex_escape(t.title)}. {tex_escape(t.note)}}}", "\\end{table}", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- plots


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


def _runs_of(df: pd.DataFrame) -> list[Run]:
    return [r for g in df["group"] for r in g.runs]


def _finish(fig, df, path: Path, labels, written: list[Path]):
    import matplotlib.pyplot as plt

    width = max(50, int(fig.get_figwidth() * 15))  # 7.5 pt monospace: ~16 characters per inch
    text = "\n".join(textwrap.wrap(footer_text(_runs_of(df), labels=labels), width))
    n_lines = text.count("\n") + 1
    h = fig.get_figheight()
    bottom = (0.12 + 0.17 * n_lines) / h
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.text(0.01, 0.01, text, fontsize=7.5, color="0.25", va="bottom", ha="left", family="monospace")
    fig.savefig(path, dpi=120, bbox_inches="tight")  # keep outside legends and long footers
    plt.close(fig)
    written.append(path)


def _subplots(n, w=6.0, h=4.2, extra_h=0.8):
    import matplotlib.pyplot as plt

    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows + extra_h), squeeze=False)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat[:n]


def _skip(name, why):
    print(f"note: skipped plot {name}: {why}")


def plot_speedup_vs_k(df, out, labels, written):
    fixed = df[df["k"].notna()]
    series = fixed.groupby(["model", "task", "method"]).filter(lambda d: d["k"].nunique() >= 2)
    if series.empty:
        return _skip("speedup_vs_k", "no runs with control=fixed at two or more values of control.k")
    for model, dm in series.groupby("model"):
        tasks = sorted(dm["task"].unique())
        fig, axes = _subplots(len(tasks))
        for ax, task in zip(axes, tasks):
            for method, d in dm[dm["task"] == task].groupby("method"):
                d = d.sort_values("k")
                line = ax.errorbar(d["k"].astype(float), d["speedup"], yerr=d["speedup_std"].fillna(0).astype(float),
                                   marker="o", capsize=3, label=f"{method}+fixed")
                # adaptive controllers of the same method whose config matches the fixed-K runs outside control.*
                ref = _non_control(d["group"].iloc[0].first)
                adaptive = df[(df["model"] == model) & (df["task"] == task) & (df["method"] == method) & df["k"].isna()
                              & df["group"].map(lambda g: _non_control(g.first) == ref)]
                for i, (_, a) in enumerate(adaptive.iterrows()):
                    if _num(a["speedup"]) is not None:
                        ax.axhline(a["speedup"], ls=["--", ":", "-."][i % 3], color=line[0].get_color(), alpha=0.8,
                                   label=f"{a['label']} (adaptive)")
            ax.axhline(1.0, color="0.6", lw=0.8)
            ax.set_xlabel("draft length K (control=fixed)")
            ax.set_ylabel("speedup over AR (x)")
            ax.set_title(f"{task}: speedup vs K")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"Speedup vs draft length K, {model} (cf. EESD Fig. 3)")
        _finish(fig, dm, out / f"speedup_vs_k_{_slug(model)}.png", labels, written)


def _non_control(r: Run) -> dict:
    return {k: v for k, v in r.variant().items() if not k.startswith("control.")}


def plot_vs_n(df, out, labels, written):
    from matplotlib.ticker import MaxNLocator

    e = df[df["n_layers"].notna()]
    e = e.groupby(["model", "task", "controller"]).filter(lambda d: d["n_layers"].nunique() >= 2)
    if e.empty:
        return _skip("hm_speedup_vs_n", "no eesd runs at two or more values of method.n_layers")
    for model, dm in e.groupby("model"):
        keys = sorted(dm.groupby(["task", "controller"]).groups)
        fig, axes = _subplots(len(keys))
        for ax, (task, ctl) in zip(axes, keys):
            d = dm[(dm["task"] == task) & (dm["controller"] == ctl)].sort_values("n_layers")
            x = d["n_layers"].astype(float)
            ax.plot(x, d["hm"], "o-", color="tab:blue", label="HM")
            ax.set_xlabel("first-N layers (method.n_layers)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel("HM (x100)", color="tab:blue")
            ax2 = ax.twinx()
            ax2.errorbar(x, d["speedup"], yerr=d["speedup_std"].fillna(0).astype(float), fmt="s--", color="tab:red", capsize=3, label="speedup")
            ax2.set_ylabel("speedup over AR (x)", color="tab:red")
            ax.set_title(f"{task}, eesd+{ctl}")
            ax.grid(alpha=0.3)
        fig.suptitle(f"HM and speedup vs N, model {model} (cf. EESD Fig. 4)")
        _finish(fig, dm, out / f"hm_speedup_vs_n_{_slug(model)}.png", labels, written)


def plot_position_acceptance(df, out, labels, written):
    d = df[df["pos_rate"].map(lambda v: any(x is not None for x in v))]
    if d.empty:
        return _skip("acceptance_by_position", "no runs with drafting steps")
    for model, dm in d.groupby("model"):
        settings = list(dict.fromkeys(dm["setting"]))
        fig, axes = _subplots(len(settings))
        for ax, s in zip(axes, settings):
            for j, (_, h) in enumerate(dm[dm["setting"] == s].iterrows()):
                pts = [(i + 1, r) for i, r in enumerate(h["pos_rate"]) if r is not None]
                ax.plot([p for p, _ in pts], [r for _, r in pts], marker="osD^v<>"[j % 7], ls=["-", "--", ":", "-."][j % 4],
                        ms=5, alpha=0.85, label=h["label"])
            ax.set_xlabel("draft position (1 = first drafted token)")
            ax.set_ylabel("acceptance rate (accepted / drafted)")
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(_setting_name(*s), fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"Acceptance rate by draft position, model {model}")
        _finish(fig, dm, out / f"acceptance_by_position_{_slug(model)}.png", labels, written)


def plot_time_breakdown(df, out, labels, written):
    import matplotlib.pyplot as plt
    import numpy as np

    for model, dm in df.groupby("model"):
        settings = list(dict.fromkeys(dm["setting"]))
        heights = [1.2 + 0.38 * (1 + (dm["setting"] == s).sum()) for s in settings]
        fig, axes = plt.subplots(len(settings), 1, figsize=(11.0, sum(heights) + 1.3), squeeze=False,
                                 gridspec_kw={"height_ratios": heights})
        for ax, s in zip(axes[:, 0], settings):
            ds = dm[dm["setting"] == s]
            names = ["AR"] + list(ds["label"])
            left = np.zeros(len(names))
            for p, pname in PHASES:
                vals = np.array([mean_std(ds[f"ar_tps_{p}"])[0] or 0.0] + [v or 0.0 for v in ds[f"tps_{p}"]])
                ax.barh(range(len(names)), vals, left=left, label=pname)
                left += vals
            ax.set_yticks(range(len(names)))
            ax.set_yticklabels(names, fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel("seconds per sample")
            ax.set_title(_setting_name(*s), fontsize=10)
            ax.grid(axis="x", alpha=0.3)
        axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.suptitle(f"Time breakdown per sample, model {model} (cf. EESD Table 8)")
        _finish(fig, dm, out / f"time_breakdown_{_slug(model)}.png", labels, written)


def plot_categories(df, out, labels, written):
    import numpy as np

    d = df[df["per_category"].map(bool)]
    if d.empty:
        return _skip("speedup_by_category", "no runs with per-category results (e.g. task=mt_bench)")
    for (model, task), dm in d.groupby(["model", "task"]):
        cats = sorted({c for v in dm["per_category"] for c in v})
        fig, axes = _subplots(1, w=max(7.0, 1.1 * len(cats) + 2), h=4.6)
        ax = axes[0]
        width = 0.8 / len(dm)
        for i, (_, h) in enumerate(dm.iterrows()):
            ax.bar(np.arange(len(cats)) + i * width, [h["per_category"].get(c, np.nan) for c in cats], width, label=h["label"])
        ax.set_xticks(np.arange(len(cats)) + 0.4 - width / 2)
        ax.set_xticklabels(cats, rotation=30, ha="right")
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set_ylabel("speedup over AR (x)")
        ax.set_title(f"Speedup per {task} category, model {model}")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        _finish(fig, dm, out / f"speedup_by_category_{_slug(model)}_{_slug(task)}.png", labels, written)


def plot_predicted(df, out, labels, written):
    d = df[df["predicted"].notna() & df["speedup"].notna()]
    if d.empty:
        return _skip("predicted_vs_measured", "no runs with a predicted speedup (profile.enabled=true)")
    fig, axes = _subplots(1, w=11.0, h=6.0)
    ax = axes[0]
    markers = "osD^vP*X"
    for n, (_, h) in enumerate(d.iterrows()):
        xs = [r.summary.get("predicted_speedup") for r in h["group"].runs]
        ys = [r.summary.get("speedup") for r in h["group"].runs]
        multi = d[d["task"] == h["task"]]["setting"].nunique() > 1
        where = _setting_name(*h["setting"]) if multi else h["task"]
        # many runs: vary marker and colour together so no two legend entries look alike
        ax.scatter(xs, ys, s=40, marker=markers[n // 10 % len(markers)], label=f"{h['label']} / {where}")
    lim = [0, max(1.1, float(max(d["predicted"].max(), d["speedup"].max())) * 1.1)]
    ax.plot(lim, lim, "k--", lw=1, label="y = x")
    ax.set_xlim(lim)
    ax.set_ylim(lim)
    ax.set_xlabel("predicted speedup (cost model, x)")
    ax.set_ylabel("measured speedup (x)")
    ax.set_title("Predicted vs measured speedup (one point per run)")
    ax.grid(alpha=0.3)
    ax.set_aspect("equal")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # outside: never over the points
    _finish(fig, d, out / "predicted_vs_measured.png", labels, written)


def plot_speedup_vs_param(df, out, labels, written):
    """Any other numeric config key swept for one method+controller (control.gamma, method.tree_from_accuracies,
    method.k of SPACE, ...): speedup (and HM) against it."""
    found = False
    for (model, task, base), d in df.assign(base=df["label"].str.split(" [(]").str[0]).groupby(["model", "task", "base"]):
        runs = [g.first for g in d["group"]]
        vs = [r.variant() for r in runs]
        keys = sorted({k for v in vs for k in v})
        varying = [k for k in keys if len({json.dumps(v.get(k)) for v in vs}) > 1 and k not in ("control.k_max",)]
        if len(varying) != 1 or varying[0] in ("control.k", "method.n_layers") or len(d) < 2:
            continue
        key = varying[0]
        xs = [v.get(key) for v in vs]
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
            continue
        found = True
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        fig, axes = _subplots(1, w=6.5, h=4.6)
        ax = axes[0]
        ax.errorbar([xs[i] for i in order], [d["speedup"].iloc[i] for i in order],
                    yerr=[_num(d["speedup_std"].iloc[i]) or 0 for i in order], fmt="o-", capsize=3, color="tab:red", label="speedup")
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_xlabel(key)
        ax.set_ylabel("speedup over AR (x)", color="tab:red")
        hm = [d["hm"].iloc[i] for i in order]
        if any(_num(h) is not None for h in hm):
            ax2 = ax.twinx()
            ax2.plot([xs[i] for i in order], hm, "s--", color="tab:blue", label="HM")
            ax2.set_ylabel("HM (x100)", color="tab:blue")
        ax.set_title(f"{base} on {task}: speedup vs {key}, model {model}", fontsize=10)
        ax.grid(alpha=0.3)
        _finish(fig, d, out / f"speedup_vs_{_slug(key)}_{_slug(base)}_{_slug(task)}_{_slug(model)}.png", labels, written)
    if not found:
        _skip("speedup_vs_<parameter>", "no method+controller swept over a single other numeric config key")


def _slug(s) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(s))


# ----------------------------------------------------------------------------- entry


def report(dirs, out=None, baseline: str | None = None) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    dirs = [Path(d) for d in dirs]
    runs = find_runs(dirs)
    groups = build_groups(runs)
    labels = {r.path: g.label for g in groups for r in g.runs}
    if baseline not in (None, "ar") and not any(baseline in (g.label, g.first.method, g.label.split(" (")[0]) for g in groups):
        raise SpecBenchError(f"--baseline {baseline!r} matches no run; systems: " + ", ".join(sorted({g.label for g in groups})))
    df = group_frame(groups, baseline)
    out = Path(out) if out else dirs[0] / "report"
    out.mkdir(parents=True, exist_ok=True)
    tables = make_tables(df, baseline)
    tables += [Table(*t) for t in leaderboard_tables(df)]
    (out / "tables.md").write_text(render_md(tables, runs))
    (out / "tables.tex").write_text(render_tex(tables, runs))
    written: list[Path] = []
    for fn in (plot_speedup_vs_k, plot_vs_n, plot_speedup_vs_param, plot_position_acceptance, plot_time_breakdown, plot_categories, plot_predicted):
        fn(df, out, labels, written)
    if not plot_leaderboard(df, out, lambda fig, d, path: _finish(fig, d, path, labels, written)):
        _skip("spec_bench_leaderboard", "no task=spec_bench runs")
    print(f"report: {len(runs)} runs in {len(groups)} systems -> {out} (tables.md, tables.tex, {len(written)} plots)")
    return {"out": out, "runs": runs, "groups": groups, "frame": df, "tables": tables, "plots": written}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m specbench.report", description=__doc__.split("\n")[0])
    p.add_argument("dirs", nargs="+", help="results dirs searched recursively for run dirs (holding summary.json)")
    p.add_argument("--out", default=None, help="output dir (default: <first dir>/report)")
    p.add_argument("--baseline", default=None,
                   help="method (or system label) to test the others against, paired per sample; default: each run's own AR")
    a = p.parse_args(argv)
    try:
        report(a.dirs, a.out, a.baseline)
    except SpecBenchError as e:
        print(f"specbench: error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except OSError as e:  # e.g. a read-only output dir
        print(f"specbench: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
