"""The report's tables: `make_tables(frame)` -> `Table`s, rendered in markdown and LaTeX by specbench.core.table.

  (a) method x task, HM and speedup (EESD Table 1 layout), one table per model
  (b) v_d / r_d / HM / tau / inference time / tokens/s / speedup / p-value (EESD Table 10),
      one table per model, task and setting
  (c) time breakdown drafting / verification / sampling (= controller) / other (EESD Table 8)
  (d) predicted (cost model, eq. 14) vs measured speedup
  (e) paired Wilcoxon signed-rank tests on per-sample tokens/s
  (f) repeats (runs differing only in seed): speedup mean ± std
The Spec-Bench leaderboard tables (leaderboard.py) are `Table`s too and go through the same `render`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from specbench.core import table
from specbench.report.groups import PHASES, SELF, natural_key, num
from specbench.report.load import Run, footer_text
from specbench.core.stats import mean_std
from specbench.core.table import tex_escape


def _f(x, spec=".2f", suffix=""):
    x = num(x)
    return "-" if x is None else format(x, spec) + suffix


def _speed(mean, std):
    if num(mean) is None:
        return "-"
    return f"{mean:.2f}x" + (f" ± {std:.2f}" if num(std) is not None else "")


def _speed_cell(h) -> str:
    """Speedup with its bootstrap CI and the number of samples behind it."""
    ci = h["speedup_ci"]
    ci_text = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if isinstance(ci, tuple) else ""
    # a run that shared its cores (interference.shared_cores): its figures are not a quiet machine's
    shared = " (shared cores)" if h.get("shared_cores") else ""
    return _speed(h["speedup"], h["speedup_std"]) + ci_text + shared + f" n={h['n']}"


def _p(p, note=None):
    if num(p) is None:
        return "n/a"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


# sampling filters that leave the distribution unchanged: not worth a word in a label
NO_FILTER = {"top_k": (0, None), "top_p": (1.0, None)}


def sampling_name(sampling) -> str:
    """'greedy', or 'T=0.7' plus only the filters that do something ('T=0.7, top_p=0.9')."""
    s = json.loads(sampling) if sampling else {}
    t = s.get("temperature", 0.0)
    if not t:
        return "greedy"
    extra = [f"{k}={v}" for k, v in s.items() if k != "temperature" and v not in NO_FILTER.get(k, ())]
    return ", ".join([f"T={t}"] + extra)


def setting_name(model, task, mnt, sampling) -> str:
    return f"{task}, max_new_tokens={mnt}, {sampling_name(sampling)}"


def column_names(settings: list[tuple]) -> dict[tuple, str]:
    """Short column names for table (a): the task, plus only what tells apart that task's settings
    (the sampling or the length), so headers stay readable; the rest goes in the legend."""
    names = {}
    for s in settings:
        same_task = [o for o in settings if o[1] == s[1]]
        parts = []
        if len({o[2] for o in same_task}) > 1:
            parts.append(f"{s[2]} tokens")
        if len({sampling_name(o[3]) for o in same_task}) > 1:
            parts.append(sampling_name(s[3]))
        names[s] = s[1] + (f" ({', '.join(parts)})" if parts else "")
    return names


def settings_legend(settings: list[tuple], names: dict[tuple, str]) -> str:
    """One line saying what length and sampling every column of table (a) ran with."""
    full = {s: f"max_new_tokens={s[2]}, {sampling_name(s[3])}" for s in settings}
    if len(set(full.values())) == 1:
        return f"All columns: {next(iter(full.values()))}."
    return "Columns: " + "; ".join(f"{names[s]}: {full[s]}" for s in settings) + "."


# the paper's columns; the phases after them (e.g. transformers' own generate) only where a run has them
PAPER_PHASES = 5


def shown_phases(ds: pd.DataFrame) -> list[tuple[str, str]]:
    """Table (c)'s phase columns: the paper's always, an extra one only if some run spent time in it."""
    return PHASES[:PAPER_PHASES] + [(p, n) for p, n in PHASES[PAPER_PHASES:] if any(num(v) for v in ds[f"t_{p}"])]


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
        col_names = column_names(settings)
        header = ["Method"] + [h for s in settings for h in (f"{col_names[s]} HM", f"{col_names[s]} Speedup")]
        rows = []
        for label in sorted(dm["label"].unique(), key=natural_key):
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
                settings_legend(settings, col_names) + " "
                "HM: harmonic mean of v_d and r_d (x100). Speedup: method tokens/s over AR tokens/s measured in the "
                "same run (pooled over samples); ± is the std over repeats (seeds) where there are several; [lo, hi]: "
                "95% bootstrap CI over samples (all repeats pooled); n: samples behind the cell.",
            )
        )
    # (b) detailed per setting (EESD Table 10) and (c) time breakdown (EESD Table 8)
    vs = "AR (same run)" if baseline in (None, "ar") else baseline
    for setting, ds in df.groupby("setting", sort=False):
        model = setting[0]
        name = setting_name(*setting)
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
        phases = shown_phases(ds)
        rows = []
        for _, h in ds.iterrows():
            total = sum(h[f"t_{p}"] or 0 for p, _ in PHASES)
            cells = [h["label"]]
            for p, _ in phases:
                v = h[f"t_{p}"] or 0.0
                cells.append(f"{v:.3f}s ({100 * v / total:.0f}%)" if total else f"{v:.3f}s")
            cells.append(_f(h["t_wall"], ".3f", "s"))
            rows.append(cells)
        tables.append(
            Table(
                f"(c) Time breakdown of the method, model {model}, {name} (EESD Table 8 layout)",
                ["Method"] + [n for _, n in phases] + ["Total"],
                rows,
                "Seconds summed over all samples of a run (mean over repeats). Sampling (control) is the controller's "
                "time (the paper's 'Sampling' column: Thompson sampling / threshold updates); Other is wall time no "
                "phase claimed. Prefill is listed apart (the paper does not separate it).",
            )
        )
    # (d) predicted vs measured
    rows = []
    for _, h in df.iterrows():
        ratio = h["speedup"] / h["predicted"] if num(h["predicted"]) and num(h["speedup"]) else None
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


@dataclass(frozen=True)
class Format:
    """How one output format lays out a document of tables; the tables themselves are drawn by
    specbench.core.table (the renderer shared with the bench scripts and the end-of-run summary)."""

    table: Callable[[list[str], list[list[str]]], str]  # table.markdown or table.latex
    head: Callable[[list[Run]], list[str]]  # document preamble
    open: Callable[[Table], list[str]]  # lines before the table
    close: Callable[[Table], list[str]]  # lines after it


MARKDOWN = Format(
    table=table.markdown,
    head=lambda runs: ["# specbench report", "", "Runs: " + footer_text(runs), ""],
    open=lambda t: [f"## {t.title}", ""],
    close=lambda t: (["", t.note] if t.note else []) + [""],
)

LATEX = Format(
    table=table.latex,
    head=lambda runs: ["% specbench report; needs \\usepackage{booktabs}", "% " + footer_text(runs, sep="; ").replace("\n", " "), ""],
    open=lambda t: ["\\begin{table}[ht]", "\\centering", "\\small"],
    close=lambda t: [f"\\caption{{{tex_escape(t.title)}. {tex_escape(t.note)}}}", "\\end{table}", ""],
)


def render(tables: list[Table], runs: list[Run], fmt: Format = MARKDOWN) -> str:
    """Every table in `fmt` (MARKDOWN or LATEX), after a preamble describing `runs`."""
    out = fmt.head(runs)
    for t in tables:
        out += fmt.open(t) + [fmt.table(t.header, t.rows)] + fmt.close(t)
    return "\n".join(out)


def render_md(tables: list[Table], runs: list[Run]) -> str:
    return render(tables, runs, MARKDOWN)


def render_tex(tables: list[Table], runs: list[Run]) -> str:
    return render(tables, runs, LATEX)
