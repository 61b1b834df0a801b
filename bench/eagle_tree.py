"""Figures of an EAGLE-2 or EAGLE-3 run directory, with a cost model that charges the tree it verifies.

    python bench/eagle_tree.py results/runs/smollm2-135m/mt_bench/eagle-fixed

Prints tau, acceptance by depth, the time breakdown, the measured speedup, a chain prediction
(T(depth + 1) per step, as for a chain of `depth` drafts: what the runner charged before it
charged every verified token) and the tree prediction charging T(num_nodes + 1), as the runner
now does: a step verifies every node of the tree.
Both predictions use the run's own start-up forward-cost profile and its measured draft time.
Reads only samples.jsonl, so it also works on a run that is still going or was stopped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specbench.metrics import position_acceptance  # noqa: E402
from specbench.metrics.acceptance import as_steps  # noqa: E402
from specbench.metrics.costmodel import interp_cost  # noqa: E402


def main(run_dir: Path) -> None:
    cfg = json.loads((run_dir / "config.json").read_text())
    costs = {int(k): v for k, v in json.loads((run_dir / "forward_costs.json").read_text()).items()}
    recs = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines() if line.strip()]
    steps = [s for r in recs for s in r["method"]["steps"]]
    n_seq = sum(len(r["method"]["tokens"]) for r in recs)
    new = sum(r["method"]["new_tokens"] for r in recs)
    times: dict[str, float] = {}
    for r in recs:
        for k, v in r["method"]["times"].items():
            times[k] = times.get(k, 0.0) + v
    ar_tok = sum(r["ar"]["new_tokens"] for r in recs)
    ar_wall = sum(r["ar"]["wall"] for r in recs)
    measured = (new / times["wall"]) / (ar_tok / ar_wall)
    nodes = int(cfg["method"]["num_nodes"]) + 1
    t1 = interp_cost(costs, 1)
    draft_per_step = times.get("draft", 0.0) / len(steps)
    chain = sum(draft_per_step + interp_cost(costs, s.drafted + 1) for s in as_steps(steps))
    tree = len(steps) * (draft_per_step + interp_cost(costs, nodes))
    drafted, accepted = position_acceptance(steps)
    print(f"run: {run_dir}")
    print(f"samples {len(recs)}, sequences {n_seq}, new tokens {new}, steps {len(steps)}, matches AR "
          f"{sum(bool(r['matches_ar']) for r in recs)}/{len(recs)}")
    print(f"tau (tokens per step) {(new - n_seq) / len(steps):.3f}; tree: {nodes} tokens verified per step")
    print("acceptance by depth (accepted / steps reaching that depth): "
          + " ".join(f"d{j + 1}={a / max(1, d):.3f}" for j, (d, a) in enumerate(zip(drafted, accepted))))
    print("time share: " + ", ".join(f"{k} {v / times['wall'] * 100:.1f}%" for k, v in sorted(times.items()) if k != "wall"))
    print(f"T(1) {t1 * 1e3:.1f} ms, T({nodes}) {interp_cost(costs, nodes) * 1e3:.1f} ms, draft per step "
          f"{draft_per_step * 1e3:.1f} ms")
    print(f"speedup measured {measured:.3f}; predicted (chain, T(depth+1)) {(new - n_seq) * t1 / chain:.3f}; "
          f"predicted (tree, T(nodes), as the runner) {(new - n_seq) * t1 / tree:.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
