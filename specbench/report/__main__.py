"""`python -m specbench.report DIR [DIR ...] [--out DIR] [--baseline METHOD]` (see cli.py)."""

from specbench.report.cli import main

main()
