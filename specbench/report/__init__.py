"""Tables and plots from finished runs: `python -m specbench.report DIR [DIR ...] [--out DIR] [--baseline METHOD]`.

One module per job, data flowing one way (each imports only those above it):
  load.py         find and read run dirs (`find_runs`, `Run`), the footer describing a set of runs
  groups.py       settings, systems, repeats (`pool_repeats`), paired tests, the per-group frame
  tables.py       the tables (EESD layouts) and the one renderer for markdown and LaTeX
  leaderboard.py  Spec-Bench's leaderboard table and plot for task=spec_bench runs
  plots.py        the plots
  cli.py          `report(dirs, out, baseline)` and the command line (`main`)
  cells.py        the project's own leaderboard's spec and cells (results/leaderboard), checked against today's command
  board.py        its tables (`make leaderboard`) and the command that measures a cell
The public names are re-exported here.
"""

from specbench.report.cli import main, report
from specbench.report.groups import (
    PHASES,
    SELF,
    Group,
    build_groups,
    check_declared_repeats,
    group_frame,
    paired_test,
    pool_repeats,
    system_labels,
)
from specbench.report.leaderboard import leaderboard_tables, plot_leaderboard
from specbench.report.load import (
    NEUTRAL_KEYS,
    SETTING_KEYS,
    Run,
    find_runs,
    footer_text,
)
from specbench.report.plots import PLOTS, plot_all
from specbench.report.tables import (
    LATEX,
    MARKDOWN,
    Format,
    Table,
    make_tables,
    render,
    render_md,
    render_tex,
    tex_escape,
)

__all__ = [
    "LATEX", "MARKDOWN", "NEUTRAL_KEYS", "PHASES", "PLOTS", "SELF", "SETTING_KEYS", "Format", "Group", "Run", "Table",
    "build_groups", "check_declared_repeats", "find_runs", "footer_text", "group_frame", "leaderboard_tables", "main",
    "make_tables", "paired_test", "plot_all", "plot_leaderboard", "pool_repeats", "render", "render_md", "render_tex",
    "report", "system_labels", "tex_escape",
]
