"""Tables and plots from finished runs: `python -m specbench.report DIR [DIR ...] [--out DIR] [--baseline METHOD]`.

Finds every run dir (one holding summary.json) under the given dirs and writes to --out
(default `<first dir>/report/`):

  tables.md, tables.tex  the tables of tables.py (and leaderboard.py for task=spec_bench runs)
  *.png                  the plots of plots.py (only those with data; each skipped plot is named
                         with the reason)
  vllm_tables.md, vllm_throughput.png   engine=vllm runs (specbench/vllm_engine/report.py)

Runs are grouped into settings and systems, and repeats pooled, as groups.py describes; nothing
incompatible is ever averaged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbench.core.errors import SpecBenchError
from specbench.report.groups import build_groups, group_frame
from specbench.report.leaderboard import leaderboard_tables
from specbench.report.load import find_runs
from specbench.report.plots import plot_all
from specbench.report.tables import LATEX, MARKDOWN, make_tables, render
from specbench.vllm_engine import report as vllm_report


def report(dirs, out=None, baseline: str | None = None) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    dirs = [Path(d) for d in dirs]
    vllm = vllm_report.has_runs(dirs)
    runs = find_runs(dirs, allow_empty=vllm)  # every refusal before anything is written
    if not runs and baseline not in (None, "ar"):
        raise SpecBenchError(f"--baseline {baseline!r}: the runs under {', '.join(map(str, dirs))} are engine=vllm runs "
                             "only, which compare with vLLM's own AR; drop --baseline")
    groups = build_groups(runs) if runs else []
    if baseline not in (None, "ar") and not any(baseline in (g.label, g.first.method, g.label.split(" (")[0]) for g in groups):
        raise SpecBenchError(f"--baseline {baseline!r} matches no run; systems: " + ", ".join(sorted({g.label for g in groups})))
    out = Path(out) if out else dirs[0] / "report"
    earlier = _outputs(out)
    if vllm:  # engine=vllm runs: their own tables and plot (throughput vs batch size)
        vllm_report.report(dirs, out)
    if not runs:
        _stale(out, earlier)
        return {"out": out, "runs": [], "groups": [], "frame": None, "tables": [], "plots": []}
    labels = {r.path: g.label for g in groups for r in g.runs}
    df = group_frame(groups, baseline)
    out.mkdir(parents=True, exist_ok=True)
    tables = make_tables(df, baseline) + leaderboard_tables(df)
    (out / "tables.md").write_text(render(tables, runs, MARKDOWN))
    (out / "tables.tex").write_text(render(tables, runs, LATEX))
    written = plot_all(df, out, labels)
    print(f"report: {len(runs)} runs in {len(groups)} systems -> {out} (tables.md, tables.tex, {len(written)} plots)")
    _stale(out, earlier)
    return {"out": out, "runs": runs, "groups": groups, "frame": df, "tables": tables, "plots": written}


def _outputs(out: Path) -> dict[str, int]:
    """The report files already in `out` (tables, plots) and when each was written."""
    if not out.is_dir():
        return {}
    return {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.is_file() and p.suffix in (".md", ".tex", ".png")}


def _stale(out: Path, earlier: dict[str, int]) -> None:
    """A report into a folder an earlier one wrote leaves that one's plots of runs no longer read beside
    the new ones: say which, rather than delete files someone may keep."""
    now = _outputs(out)
    stale = sorted(n for n, t in earlier.items() if now.get(n) == t)
    if stale:
        print(f"note: {len(stale)} file(s) in {out} are from an earlier report, not this one: "
              + ", ".join(stale[:6]) + (", ..." if len(stale) > 6 else ""))


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
