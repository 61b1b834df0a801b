"""The report's plots, one function each, `fn(frame, out_dir, labels, written)`; each saves a PNG per
model (task, setting) with data, with a footer naming the runs behind it, or says why it was skipped.
matplotlib is imported inside the functions so that loading the report does not load it (the CLI
selects the Agg backend first).
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path

import pandas as pd

from specbench.report.groups import PHASES, num
from specbench.report.leaderboard import plot_leaderboard
from specbench.report.load import Run, footer_text
from specbench.report.tables import setting_name
from specbench.core.stats import mean_std


def _runs_of(df: pd.DataFrame) -> list[Run]:
    return [r for g in df["group"] for r in g.runs]


def _finish(fig, df, path: Path, labels, written: list[Path], top: float = 1.0):
    import matplotlib.pyplot as plt

    width = max(50, int(fig.get_figwidth() * 15))  # 7.5 pt monospace: ~16 characters per inch
    text = "\n".join(textwrap.wrap(footer_text(_runs_of(df), labels=labels), width))
    n_lines = text.count("\n") + 1
    h = fig.get_figheight()
    bottom = (0.12 + 0.17 * n_lines) / h
    fig.tight_layout(rect=(0, bottom, 1, top))
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


def _short(label: str, n: int = 72) -> str:
    """A label cut to `n` characters (a Hydra tree or a file path in a label would take the figure)."""
    return label if len(label) <= n else label[: n - 1] + "…"


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
                    if num(a["speedup"]) is not None:
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
    from matplotlib.ticker import MaxNLocator

    d = df[df["pos_rate"].map(lambda v: any(x is not None for x in v))]
    if d.empty:
        return _skip("acceptance_by_position", "no runs with drafting steps")
    for model, dm in d.groupby("model"):
        settings = list(dict.fromkeys(dm["setting"]))
        if max((dm["setting"] == s).sum() for s in settings) > MAX_LINES:  # curves would hide each other
            _position_grid(dm, settings, model, out, labels, written)
            continue
        fig, axes = _subplots(len(settings))
        for ax, s in zip(axes, settings):
            for j, (_, h) in enumerate(dm[dm["setting"] == s].iterrows()):
                pts = [(i + 1, r) for i, r in enumerate(h["pos_rate"]) if r is not None]
                line = ax.plot([p for p, _ in pts], [r for _, r in pts], marker="osD^v<>"[j % 7], ls="-",
                               ms=5, alpha=0.85, label=f"{h['label']} (unconditional)")[0]
                cond = [(i + 1, r) for i, r in enumerate(h.get("pos_cond") or []) if r is not None]
                if cond:  # same colour and marker, hollow and dashed
                    ax.plot([p for p, _ in cond], [r for _, r in cond], marker="osD^v<>"[j % 7], ls="--", ms=5, alpha=0.85,
                            color=line.get_color(), mfc="none", label=f"{h['label']} (conditional)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # positions are whole numbers
            ax.set_xlabel("draft position i (1 = first drafted token; a tree: depth i)")
            ax.set_ylabel("accepted at i / drafts with a position i (solid)\n"
                          "accepted at i / drafts that reached i (dashed)", fontsize=8)
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(setting_name(*s), fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"Acceptance by draft position, unconditional and conditional, model {model}")
        _finish(fig, dm, out / f"acceptance_by_position_{_slug(model)}.png", labels, written)


MAX_LINES = 6  # systems per panel drawn as curves by plot_position_acceptance; more: a grid
GRID_POSITIONS = 10  # positions the grid shows (deeper ones are rarely drafted)


def _position_grid(dm, settings, model, out, labels, written):
    """Unconditional acceptance by position: one panel per setting, one row per system, written in each cell."""
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(dict.fromkeys(dm["label"]))
    longest = max(len(_short(n)) for n in names)
    fig, axes = plt.subplots(1, len(settings), sharey=True, squeeze=False,
                             figsize=(2.0 + 0.055 * longest + 5.0 * len(settings), 2.0 + 0.28 * len(names)))
    for ax, s in zip(axes[0], settings):
        grid = np.full((len(names), GRID_POSITIONS), np.nan)
        for _, h in dm[dm["setting"] == s].iterrows():
            for i, r in enumerate(h["pos_rate"][:GRID_POSITIONS]):
                grid[names.index(h["label"]), i] = np.nan if r is None else r
        ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="white" if v < 0.6 else "black")
        ax.set_xticks(range(GRID_POSITIONS))
        ax.set_xticklabels(range(1, GRID_POSITIONS + 1))
        ax.set_xlabel("draft position i (a tree: depth i)")
        ax.set_title(setting_name(*s), fontsize=9)
    axes[0, 0].set_yticks(range(len(names)))
    axes[0, 0].set_yticklabels([_short(n, 60) for n in names], fontsize=7)
    # each cell carries its number, so no colour bar (it would not fit tight_layout beside shared panels)
    fig.suptitle(f"Acceptance by draft position, model {model}: accepted at i / drafts with a position i "
                 "(dark 0 .. yellow 1; blank: never drafted there)")
    _finish(fig, dm, out / f"acceptance_by_position_{_slug(model)}.png", labels, written)


def plot_time_breakdown(df, out, labels, written):
    import matplotlib.pyplot as plt
    import numpy as np

    for model, dm in df.groupby("model"):
        # one panel per setting, side by side, one row per system (a system a setting lacks: an empty row)
        settings = list(dict.fromkeys(dm["setting"]))
        names = ["AR"] + list(dict.fromkeys(dm["label"]))
        row = {n: i for i, n in enumerate(names)}
        longest = max(len(_short(n)) for n in names)  # 8 pt labels: ~0.065 inch a character
        fig, axes = plt.subplots(1, len(settings), sharey=True, squeeze=False,
                                 figsize=(2.0 + 0.065 * longest + 3.6 * len(settings), 2.2 + 0.26 * len(names)))
        for ax, s in zip(axes[0], settings):
            ds = dm[dm["setting"] == s]
            rows = [0] + [row[n] for n in ds["label"]]
            left = np.zeros(len(rows))
            for p, pname in PHASES:
                vals = np.array([mean_std(ds[f"ar_tps_{p}"])[0] or 0.0] + [v or 0.0 for v in ds[f"tps_{p}"]])
                ax.barh(rows, vals, left=left, label=pname)
                left += vals
            ax.set_xlabel("seconds per sample")
            ax.set_title(setting_name(*s), fontsize=9)
            ax.grid(axis="x", alpha=0.3)
        first = axes[0, 0]
        first.set_yticks(range(len(names)))
        first.set_yticklabels([_short(n) for n in names], fontsize=8)
        first.invert_yaxis()  # shared: once
        handles, texts = first.get_legend_handles_labels()
        fig.legend(handles, texts, fontsize=8, ncol=len(PHASES), loc="upper center", bbox_to_anchor=(0.5, 0.995 - 0.45 / fig.get_figheight()))
        fig.suptitle(f"Time breakdown per sample, model {model} (cf. EESD Table 8)")
        _finish(fig, dm, out / f"time_breakdown_{_slug(model)}.png", labels, written, top=1 - 0.8 / fig.get_figheight())


def plot_categories(df, out, labels, written):
    import numpy as np

    d = df[df["per_category"].map(bool)]
    if d.empty:
        return _skip("speedup_by_category", "no runs with per-category results (e.g. task=mt_bench)")
    for (model, task), dm in d.groupby(["model", "task"]):
        cats = sorted({c for v in dm["per_category"] for c in v})
        if len(dm) > MAX_BARS:  # one bar per system and category stops being readable: a table of colours
            _category_grid(dm, cats, model, task, out, labels, written)
            continue
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


MAX_BARS = 8  # systems per category plot drawn as bars; more are drawn as a grid
MAX_POINT_LABELS = 20  # runs labelled one by one in predicted_vs_measured; more: by method and task


def _category_grid(dm, cats, model, task, out, labels, written):
    """Speedup per system (row) and category (column), coloured around 1.0 (red: slower than AR) and
    written in each cell."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    grid = np.array([[h["per_category"].get(c, np.nan) for c in cats] for _, h in dm.iterrows()], dtype=float)
    lo, hi = np.nanmin(grid), np.nanmax(grid)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.99), vmax=max(hi, 1.01))
    names = [_short(n) for n in dm["label"]]
    # the labels' width (7 pt: ~0.055 inch a character) comes on top of the cells'
    fig, ax = plt.subplots(figsize=(2.5 + 0.055 * max(map(len, names)) + 0.75 * len(cats), 1.6 + 0.3 * len(dm)))
    image = ax.imshow(grid, cmap="RdBu", norm=norm, aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if abs(norm(v) - 0.5) > 0.35 else "black")
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(cats, rotation=30, ha="right")
    ax.set_yticks(range(len(dm)))
    ax.set_yticklabels(names, fontsize=7)
    fig.colorbar(image, ax=ax, label="speedup over AR (x)", shrink=0.5, pad=0.02)
    ax.set_title(f"Speedup per {task} category, model {model}")
    _finish(fig, dm, out / f"speedup_by_category_{_slug(model)}_{_slug(task)}.png", labels, written)


def plot_predicted(df, out, labels, written):
    import matplotlib

    d = df[df["predicted"].notna() & df["speedup"].notna()]
    if d.empty:
        return _skip("predicted_vs_measured", "no runs with a predicted speedup (profile.enabled=true)")
    fig, axes = _subplots(1, w=11.0, h=6.0)
    ax = axes[0]
    markers = "osD^vP*X"
    many = len(d) > MAX_POINT_LABELS
    colours = matplotlib.colormaps["tab20"]
    bases = sorted({lab.split(" (")[0] for lab in d["label"]})
    wheres = []
    for n, (_, h) in enumerate(d.iterrows()):
        xs = [r.summary.get("predicted_speedup") for r in h["group"].runs]
        ys = [r.summary.get("speedup") for r in h["group"].runs]
        multi = d[d["task"] == h["task"]]["setting"].nunique() > 1
        where = setting_name(*h["setting"]) if multi else h["task"]
        if many:  # a legend entry per run would outgrow the plot: colour = method, marker = task
            wheres += [where] if where not in wheres else []
            ax.scatter(xs, ys, s=30, color=colours(bases.index(h["label"].split(" (")[0]) % 20),
                       marker=markers[wheres.index(where) % len(markers)])
        else:  # vary marker and colour together so no two legend entries look alike
            ax.scatter(xs, ys, s=40, marker=markers[n // 10 % len(markers)], label=f"{_short(h['label'])} / {where}")
    if many:
        for i, b in enumerate(bases):
            ax.scatter([], [], s=30, color=colours(i % 20), marker="o", label=b)
        for i, w in enumerate(wheres):
            ax.scatter([], [], s=30, color="0.4", marker=markers[i % len(markers)], label=w)
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
                    yerr=[num(d["speedup_std"].iloc[i]) or 0 for i in order], fmt="o-", capsize=3, color="tab:red", label="speedup")
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_xlabel(key)
        ax.set_ylabel("speedup over AR (x)", color="tab:red")
        hm = [d["hm"].iloc[i] for i in order]
        if any(num(h) is not None for h in hm):
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


# in the order they are drawn, before the Spec-Bench leaderboard plot
PLOTS = (plot_speedup_vs_k, plot_vs_n, plot_speedup_vs_param, plot_position_acceptance, plot_time_breakdown, plot_categories,
         plot_predicted)


def plot_all(df: pd.DataFrame, out: Path, labels: dict) -> list[Path]:
    """Every plot with data into `out`; returns the files written."""
    written: list[Path] = []
    for fn in PLOTS:
        fn(df, out, labels, written)
    if not plot_leaderboard(df, out, lambda fig, d, path: _finish(fig, d, path, labels, written)):
        _skip("spec_bench_leaderboard", "no task=spec_bench runs")
    return written
