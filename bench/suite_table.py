"""The per-suite table of the README and docs/measurements.md, read from a suite's run directories (bench/bench.py --out DIR).

    python bench/suite_table.py results/bench/selfdraft results/bench/heads

One row per run directory (<suite>/<task>/<run>/summary.json): AR tokens/s, the pooled speedup
and its bootstrap interval, the cost model's prediction (start-up profile / refit from the run's
own verify steps), v_d, the tokens each verification forward runs over (a tree: every node), tau, how many outputs equal AR's, and the cost split per committed token
in units of AR's time per token (draft + verify + prefill; with the rest, its sum is 1/speedup):
the term that makes a method lose; and the whole-run interference check (shared cores or not).
`decides`: each term's difference from AR's own split (AR's prefill and verify shares of its time
per token), the largest named first: what the speedup is won or lost on. `sources`: where a
method with several proposers (SAM-Decoding: retrieval from the generation so far, the static
corpus, the auxiliary drafter) drafted the tokens that were kept, as shares of them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specbench.core.table import markdown


def _f(x, spec=".2f") -> str:
    return "–" if x is None else format(x, spec)


def interference(s: dict) -> str:
    """The whole-run check (summary.shared_cores): 'ok' or 'shared', with what judged it."""
    sc = s.get("shared_cores")
    if not sc:
        return "–"
    flag = "shared" if sc.get("shared") else "ok"
    if sc.get("foreign_share") is not None:  # /proc/stat: others' share of our CPUs
        return f"{flag} ({100 * sc['foreign_share']:.1f}% others)"
    return f"{flag} (load {_f(sc.get('loadavg_1m_median'))})"


def verified_per_step(run_dir: Path) -> float | None:
    """Mean tokens the method's verification forwards ran over (a tree: every node; the k of T(k))."""
    if not (run_dir / "samples.jsonl").is_file():  # a leaderboard cell keeps its summary only
        return None
    rows = [st[3] for line in (run_dir / "samples.jsonl").read_text().splitlines()
            for st in json.loads(line)["method"].get("steps") or [] if len(st) > 3]
    return sum(rows) / len(rows) if rows else None


def partial_summary(run_dir: Path) -> dict:
    """A run stopped before its last sample (bench cells are time-boxed) has no summary.json: the
    runner's own aggregation over the samples it finished (nothing in them is partial: each line is
    one finished sample)."""
    from specbench.config.compose import compose
    from specbench.run.interference import shared_cores
    from specbench.config.settings import merge, of
    from specbench.run.summary import aggregate

    records = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    costs_file = run_dir / "forward_costs.json"
    costs = {int(k): v for k, v in json.loads(costs_file.read_text()).items()} if costs_file.is_file() else None
    # the run's recorded measure group over conf/config.yaml's (a run recorded before a key existed)
    measure = merge(of(compose([])).measure, json.loads((run_dir / "config.json").read_text()).get("measure") or {})
    s = aggregate(records, costs, measure.ci)
    s["shared_cores"] = shared_cores(records, measure)
    return s


def row(task: str, run: str, s: dict, verified: float | None = None) -> list[str]:
    ci = s.get("speedup_ci")
    acc, c = s.get("acceptance") or {}, s.get("cost_terms") or {}
    lossless = (s.get("meta") or {}).get("lossless", True)
    split = "–" if not c else f"{c.get('draft', 0):.2f} + {c.get('verify', 0):.2f} + {c.get('prefill', 0):.2f} = {c['total']:.2f}"
    if c and not any(c.get(k) for k in ("draft", "verify", "prefill")):  # transformers' own loop: not split
        split = f"not split = {c['total']:.2f}"
    return [task, run, _f(s["ar"]["tokens_per_s"], ".1f"),
            f"{_f(s['speedup'])}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""),
            f"{_f(s.get('predicted_speedup'))} / {_f(s.get('predicted_speedup_refit'))}",
            _f(acc.get("v_d")), _f(verified, ".1f"), _f(acc.get("tau")), f"{s['matches_ar']}/{s['samples']}" if lossless else "n/a", split,
            interference(s)]


def decides(s: dict) -> str:
    """Each cost term against AR's (units: AR's time per token); the largest change first."""
    c, ar = s.get("cost_terms") or {}, (s.get("ar") or {}).get("time_share") or {}
    if not c or not any(c.get(k) for k in ("draft", "verify", "prefill")):
        return "–"
    # every term the method's timer split out (SWIFT's `optimize`: its on-the-fly layer search)
    delta = {k: c[k] - ar.get(k, 0.0) for k in c if k != "total"}
    order = sorted(delta, key=lambda k: -abs(delta[k]))
    return ", ".join(f"{k} {delta[k]:+.2f}" for k in order if abs(delta[k]) >= 0.005) or "none"


def sources(s: dict) -> str:
    """Shares of the kept draft tokens by proposer (summary.draft_sources), or – for a single one."""
    src = s.get("draft_sources") or {}
    kept = sum(v.get("kept", 0) for v in src.values())
    if not kept:
        return "–"
    return " / ".join(f"{k} {100 * v.get('kept', 0) / kept:.0f}% ({v.get('steps', 0)} steps)" for k, v in sorted(src.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suites", nargs="+", help="suite directories (<out>/<suite>) or directories of run dirs")
    args = ap.parse_args()
    rows = []
    for suite in args.suites:
        # a suite's <task>/<run>/ dirs, or run dirs directly below (results/bench/eagle3/runs)
        # (a leaderboard cell, <task>/<row>/, keeps config.json and summary.json only)
        found = [*Path(suite).glob("*/*/samples.jsonl"), *Path(suite).glob("*/samples.jsonl"),
                 *Path(suite).glob("*/*/summary.json"), *Path(suite).glob("*/summary.json")]
        for path in sorted({p.parent / "samples.jsonl" for p in found}):
            d = path.parent
            summary = d / "summary.json"
            s = json.loads(summary.read_text()) if summary.is_file() else partial_summary(d)
            name = d.name if summary.is_file() else f"{d.name} (stopped after {s['samples']})"
            task = (json.loads((d / "config.json").read_text()).get("task") or {}).get("name", d.parent.name)
            rows.append(row(task, name, s, verified_per_step(d)) + [decides(s), sources(s)])
    print(markdown(["task", "run", "AR tok/s", "speedup [95% CI]", "predicted: profile / refit", "v_d", "verified / step", "tau", "=AR",
                    "draft + verify + prefill per token (AR = 1)", "interference", "decides (vs AR)", "sources of kept drafts"], rows))


if __name__ == "__main__":
    main()
