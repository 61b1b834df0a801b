"""Spec-Bench's leaderboard layout for `task=spec_bench` runs: rows methods, columns categories + overall.

Part of `python -m specbench.report` (tables.md / tables.tex and `spec_bench_leaderboard_*.png`).
One table per model and setting (max_new_tokens, sampling): speedup per category, #mean accepted
tokens (tau) and overall speedup, methods sorted by overall speedup as Spec-Bench sorts them; a
second table gives tau per category. Values are means over repeats (runs differing only in seed),
as Spec-Bench reports the mean over 3 runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from specbench.report.tables import Table
from specbench.tasks.spec_bench import COLUMNS

TASK = "spec_bench"
NAMES = dict(COLUMNS)


def _categories(d: pd.DataFrame) -> list[str]:
    seen = {c for v in d["per_category"] for c in v}
    known = [c for c, _ in COLUMNS if c in seen]
    return known + sorted(seen - set(known))


def _cat_tau(row, cat: str):
    vals = []
    for r in row["group"].runs:
        acc = ((r.summary.get("per_category") or {}).get(cat) or {}).get("acceptance") or {}
        if acc.get("tau") is not None:
            vals.append(acc["tau"])
    return sum(vals) / len(vals) if vals else None


def _x(v, spec=".2f", suffix=""):
    return "-" if v is None or v != v else format(v, spec) + suffix


def _settings(df: pd.DataFrame):
    d = df[(df["task"] == TASK) & df["per_category"].map(bool)]
    for (model, setting), dm in d.groupby(["model", d["setting"].map(json.dumps)], sort=True):
        yield model, json.loads(setting), dm.sort_values("speedup", ascending=False, na_position="last")


def leaderboard_tables(df: pd.DataFrame) -> list[Table]:
    """Two tables (speedup, tau per category) per model and setting."""
    out = []
    if df.empty:
        return out
    for model, (_, _, mnt, sampling), dm in _settings(df):
        cats = _categories(dm)
        samp = json.loads(sampling or "{}")
        where = f"model {model}, max_new_tokens={mnt}, " + ("greedy" if not samp.get("temperature") else f"T={samp['temperature']}")
        header = ["Models"] + [NAMES.get(c, c) for c in cats]
        rows = [[h["label"]] + [_x(h["per_category"].get(c), suffix="x") for c in cats] + [_x(h["tau"]), _x(h["speedup"], suffix="x")]
                for _, h in dm.iterrows()]
        out.append(Table(f"Spec-Bench leaderboard, {where}", header + ["#Mean Accepted Tokens", "Overall"], rows,
                         "Speedup over AR per category (pooled tokens/s ratio, mean over repeats); "
                         "#Mean Accepted Tokens = tau (tokens per target forward, 1.00 for AR)."))
        tau_rows = [[h["label"]] + [_x(_cat_tau(h, c)) for c in cats] + [_x(h["tau"])] for _, h in dm.iterrows()]
        out.append(Table(f"Spec-Bench tau per category, {where}", header + ["Overall"], tau_rows, "tau: mean accepted tokens per step."))
    return out


def plot_leaderboard(df: pd.DataFrame, out: Path, finish: Callable) -> bool:
    """Grouped bars per category (+ Overall), one bar per method; `finish(fig, frame, path)` saves."""
    import matplotlib.pyplot as plt
    import numpy as np

    found = False
    for model, setting, dm in _settings(df) if not df.empty else []:
        found = True
        cats = _categories(dm)
        cols = cats + ["overall"]
        fig, ax = plt.subplots(figsize=(max(8.0, 1.3 * len(cols) + 3), 4.8))
        width = 0.8 / len(dm)
        for i, (_, h) in enumerate(dm.iterrows()):
            vals = [h["per_category"].get(c, np.nan) for c in cats] + [h["speedup"]]
            ax.bar(np.arange(len(cols)) + i * width, [np.nan if v is None else v for v in vals], width, label=h["label"])
        ax.set_xticks(np.arange(len(cols)) + 0.4 - width / 2)
        ax.set_xticklabels([NAMES.get(c, c.capitalize()) for c in cols], rotation=20, ha="right")
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set_ylabel("speedup over AR (x)")
        ax.set_title(f"Spec-Bench: speedup per category, model {model}")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(axis="y", alpha=0.3)
        slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{model}_{setting[2]}")
        finish(fig, dm, out / f"spec_bench_leaderboard_{slug}.png")
    return found
