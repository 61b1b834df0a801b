"""Table from whatever samples finished: runner.aggregate over each run's samples.jsonl.
Args: bench --out directories of `bench.py --suite fidelity`."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specbench.config.compose import compose  # noqa: E402
from specbench.run.runner import aggregate  # noqa: E402
from specbench.config.settings import of  # noqa: E402

print("| task | run | samples | speedup | v_d | r_d | HM | tau | =AR |")
print("|---|---|---|---|---|---|---|---|---|")
for d in sys.argv[1:]:
    for f in sorted(Path(d).glob("fidelity/*/*/samples.jsonl")):
        recs = []
        for line in f.read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        if not recs:
            continue
        s = aggregate(recs, None, of(compose([])).measure.ci, per_category=False)
        a = s.get("acceptance") or {}
        fmt = lambda x, p=".3f": "-" if x is None else format(x, p)  # noqa: E731
        print(f"| {f.parent.parent.name} | {f.parent.name} ({Path(d).name}) | {s['samples']} | {fmt(s['speedup'], '.2f')} | "
              f"{fmt(a.get('v_d'))} | {fmt(a.get('r_d'))} | {fmt(a.get('hm'), '.1f')} | {fmt(a.get('tau'), '.2f')} | "
              f"{s['matches_ar']}/{s['samples']} |")
