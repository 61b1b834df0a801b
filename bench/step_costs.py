"""Each run's cost per verify step, in AR decoding steps (the summary's `per verify step` line,
specbench.run.summary.step_line), for every run dir under the folders given: what the drafts cost, what
the one verify forward over them costs, and the tokens a step commits. Two hosts' tables side by side say
whether a row loses on its acceptance or on the machine's forward cost by width.

    python bench/step_costs.py results/leaderboard/amd-epyc-family-23-model-49 results/leaderboard/intel-r-xeon-r-processor
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specbench.core.table import markdown
from specbench.run.summary import step_line


def main(folders: list[str]) -> None:
    for folder in folders:
        rows = []
        for f in sorted(Path(folder).glob("**/summary.json")):
            s = json.loads(f.read_text())
            line = step_line(s)
            if line and ".old-" not in f.parent.name:
                rows.append([f.parent.name, s["meta"]["task"], f"{s['speedup']:.2f}x", line.split(": ", 1)[1]])
        print(f"{folder}\n\n" + markdown(["run", "task", "speedup", "per verify step, in AR decoding steps"], rows) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("specbench: error: give one or more folders of run dirs, e.g. results/leaderboard/intel-r-xeon-r-processor",
              file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1:])
