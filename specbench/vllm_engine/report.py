"""The vLLM batch sweep's report: `python -m specbench.vllm_engine.report DIR [DIR ...] [--out DIR]`.

Reads every finished engine=vllm run dir under DIR (summary.json with engine: vllm; read through
rundir.read_finished, so a run in progress, damaged or mixed is refused) and writes to --out (default
<first dir>/report/): vllm_tables.md (per method and batch size: AR and method throughput, speedup,
greedy equality with vLLM's AR, acceptance; then each method's crossover batch) and vllm_throughput.png
(throughput vs batch size with AR, and speedup vs batch size with the break-even line).
Each run's speedup is the ratio inside that run (AR and the method in one worker on the same prompts).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specbench.core import table
from specbench.core.errors import SpecBenchError
from specbench.run.rundir import moved_aside, read_finished


def _summaries(dirs):
    for d in map(Path, dirs):
        if not d.exists():
            raise SpecBenchError(f"results dir {d} does not exist")
        for s in sorted(d.rglob("summary.json")):
            if moved_aside(s.parent):
                continue
            try:
                summary = json.loads(s.read_text())
            except (ValueError, UnicodeDecodeError) as e:
                raise SpecBenchError(f"{s} is not valid JSON ({e})") from None
            if isinstance(summary, dict) and summary.get("engine") == "vllm" and summary.get("samples"):
                yield s.parent, summary


def has_runs(dirs) -> bool:
    return any(True for _ in _summaries(dirs))


def find_vllm_runs(dirs) -> list[tuple[Path, dict]]:
    out = []
    for path, summary in _summaries(dirs):
        read_finished(path, summary)  # refuses a run in progress, damaged or mixed
        out.append((path, summary))
    if not out:
        raise SpecBenchError("no engine=vllm run dirs (summary.json with engine: vllm) under " + ", ".join(map(str, dirs)))
    return out


def label(summary: dict) -> str:
    spec = summary["meta"].get("speculative_config") or {}
    k = spec.get("num_speculative_tokens")
    return summary["meta"]["method"] + (f" (k={k})" if k else "")


def _f(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def setting(summary: dict) -> tuple:
    """What runs must share to stand in one table and plot: the model, the task, its prompts, the length
    and the sampling (runs of two settings under one header read as one comparison)."""
    m = summary["meta"]
    return (m["model"], m["task"], m["prompts"], m["max_new_tokens"], json.dumps(m["sampling"], sort_keys=True))


def by_setting(runs) -> list[list]:
    groups: dict[tuple, list] = {}
    for r in runs:
        groups.setdefault(setting(r[1]), []).append(r)
    return list(groups.values())


def labels(runs) -> list[str]:
    """Each run's label; the run dir's name joins a label two runs of one setting share."""
    plain = [label(s) for _, s in runs]
    return [f"{x} [{p.name}]" if plain.count(x) > 1 else x for x, (p, _) in zip(plain, runs)]


def tables_md(runs) -> str:
    return "\n".join(_setting_md(group) for group in by_setting(runs))


def _setting_md(runs) -> str:
    cols = ["method", "batch", table.Column("AR tok/s", spec=".1f"), table.Column("method tok/s", spec=".1f"), "speedup", "=AR",
            "accept len", "accept by position", "CPU share AR/method"]
    names = labels(runs)
    rows = [[name, b["batch_size"], b["ar_tokens_per_s"], b["method_tokens_per_s"], _f(b["speedup"], ".3f") + "x",
             f"{b['matches_ar']}/{b['requests']}", _f(b["mean_accepted_length"]), " ".join(_f(p) for p in b["per_position"] or []),
             f"{_f(b.get('ar_cpu_share'))}/{_f(b.get('method_cpu_share'))}"]
            for name, (_, s) in zip(names, runs) for b in s["batches"]]
    cross = [[name, ", ".join(str(b["batch_size"]) for b in s["batches"]),
              s["crossover_batch"] if s["crossover_batch"] else "pays at every batch size measured"] for name, (_, s) in zip(names, runs)]
    m = runs[0][1]["meta"]
    head = (f"# vLLM: throughput vs batch size\n\nmodel {m['model']}, task {m['task']}, {m['prompts']} prompts, "
            f"max_new_tokens {m['max_new_tokens']}, sampling {m['sampling']}; runs: " + ", ".join(str(p) for p, _ in runs) + "\n\n")
    return (head + table.render(cols, rows, "markdown") + "\n\nspeedup: the method's tok/s over AR's in the same worker; "
            "=AR: requests whose tokens equal vLLM's AR; accept len: 1 + accepted / drafts; CPU share: vLLM's CPU time / (wall x "
            "its cores), well below 1 when other jobs took its cores while it was timed\n\n## Crossover (smallest batch size "
            "with speedup < 1)\n\n" + table.render(["method", "batch sizes", "crossover batch"], cross, "markdown") + "\n")


def plot(runs, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, (_, s) in zip(labels(runs), runs):
        bs = [b["batch_size"] for b in s["batches"]]
        line, = ax1.plot(bs, [b["method_tokens_per_s"] for b in s["batches"]], marker="o", label=name)
        ax1.plot(bs, [b["ar_tokens_per_s"] for b in s["batches"]], ls="--", color=line.get_color(), alpha=0.6,
                 label=f"AR (in the {name} run)")
        ax2.plot(bs, [b["speedup"] for b in s["batches"]], marker="o", color=line.get_color(), label=name)
    ax2.axhline(1.0, color="grey", lw=1)
    sizes = sorted({b["batch_size"] for _, s in runs for b in s["batches"]})
    for ax, ylabel in ((ax1, "output tokens/s"), (ax2, "speedup over AR")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.set_xlabel("batch size (requests decoded together)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    m = runs[0][1]["meta"]
    fig.suptitle(f"vLLM {m.get('worker', {}).get('vllm', '')}: {m['model']}, {m['task']}, {m['prompts']} prompts", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(dirs, out=None) -> Path:
    runs = find_vllm_runs(dirs)
    out = Path(out) if out else Path(dirs[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_tables.md").write_text(tables_md(runs))
    groups = by_setting(runs)
    # one plot a setting: vllm_throughput.png, or vllm_throughput_<n>.png in the tables' order when there are several
    names = ["vllm_throughput.png"] if len(groups) == 1 else [f"vllm_throughput_{i + 1}.png" for i in range(len(groups))]
    for group, name in zip(groups, names):
        plot(group, out / name)
    print(f"vllm report: {len(runs)} runs in {len(groups)} setting(s) -> {out} (vllm_tables.md, {', '.join(names)})")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m specbench.vllm_engine.report", description=__doc__.split("\n")[0])
    p.add_argument("dirs", nargs="+")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    try:
        report(a.dirs, a.out)
    except (SpecBenchError, OSError) as e:
        print(f"specbench: error: {e}", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
