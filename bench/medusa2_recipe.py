"""Medusa-2's two backbone recipes (`method.backbone=lora|full`) at one budget: the figures of
results/bench/medusa2_recipe.md, read from the training logs and the run directories.

    python bench/medusa2_recipe.py results/bench/medusa2_recipe

Layout of DIR: train/<recipe>.log.json (the `.log.json` written next to each checkpoint) and
<task>/<recipe>/summary.json (`python -m specbench ... run_dir=DIR/<task>/<recipe>`). Prints
markdown: (1) what each recipe's training did (optimiser steps, held-out KL, backbone agreement
with the original, per-head top-1); (2) per task and recipe, the quality cost (how much of the
fine-tuned AR's greedy output the original weights reproduce, task scores) and the acceptance
(tau, v_d, both per-position rates, the accepted-length histogram), with =AR and the speedup.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specbench.metrics.acceptance import position_rates
from specbench.run.rundir import _record
from specbench.run.summary import aggregate
from specbench.core.table import markdown



def default_ci():
    """conf/config.yaml's measure.ci (the runner's own, for a run stopped before its summary)."""
    from specbench.config.compose import compose
    from specbench.config.settings import of

    return of(compose([])).measure.ci

def _f(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def _rates(xs) -> str:
    return " ".join(_f(x, ".2f") for x in xs)


def train_row(recipe: str, log: dict) -> list[str]:
    s, steps = log["settings"], log["log"]
    before, after = s["held_out_before"], s["held_out_after"]
    joint = sum(1 for r in steps if r.get("stage") == "joint")
    return [recipe, f"{len(steps)} ({joint} joint), stopped by {s['stopped_by']}",
            f"{s['train_sequences']} / {s['held_out_sequences']}", f"{s['lr_backbone']:g} / {s['lr_heads']:g}",
            f"{s['lambda0_schedule']}, last {_f(s.get('lambda0_last'), '.4f')}",
            # held-out L_LM is a KL: below 0 is float noise
            f"{max(0.0, before['lm']):.4f} -> {max(0.0, after['lm']):.4f}", f"{before['medusa']:.2f} -> {after['medusa']:.2f}",
            _f(after["backbone_agreement"]), " / ".join(_f(x) for x in s["head_top1"])]


def quality(s: dict) -> str:
    """Task scores of the fine-tuned AR and of the original weights (AR base), where the task has one."""
    ar, base = s["ar"].get("quality") or {}, (s.get("base") or {}).get("quality") or {}
    return ", ".join(f"{k} {ar[k]:.2f} / {_f(base.get(k), '.2f')}" for k in sorted(ar)) or "none"


def run_row(task: str, recipe: str, s: dict) -> list[str]:
    acc, base = s.get("acceptance") or {}, s.get("base") or {}
    rates = position_rates(s["pos_drafted"], s["pos_accepted"], s["pos_reached"])
    return [task, recipe, f"{s['matches_ar']}/{s['samples']}", _f(base.get("agreement")), quality(s),
            _f(acc.get("tau"), ".2f"), _f(acc.get("v_d")), _rates(rates["unconditional"]), _rates(rates["conditional"]),
            " ".join(str(n) for n in s["accepted_hist"]), f"{_f(s['speedup'], '.2f')}x"]


def run_summary(run: Path) -> tuple[dict, str] | None:
    """summary.json, or (a run stopped before its end) the samples it stored, pooled the same way
    and labelled partial; None where no sample finished."""
    if (run / "summary.json").is_file():
        return json.loads((run / "summary.json").read_text()), ""
    lines = (run / "samples.jsonl").read_bytes().splitlines() if (run / "samples.jsonl").is_file() else []
    records = [r for r in map(_record, lines) if r is not None]
    if not records:
        return None
    want = OmegaConf.load(run / "config.yaml").task.num_samples  # config.json (the fingerprint) leaves it out
    return aggregate(records, None, default_ci()), f" (partial: {len(records)} of {want} samples)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    args = ap.parse_args()
    logs = sorted((args.dir / "train").glob("*.log.json"))
    print(markdown(["recipe", "optimiser steps", "train / held-out seqs", "lr backbone / heads", "lambda0",
                    "held-out KL(orig || ft)", "held-out Medusa-1 loss", "backbone top-1 = original",
                    "per-head top-1"],
                   [train_row(p.name.removesuffix(".log.json"), json.loads(p.read_text())) for p in logs]))
    print()
    rows = []
    for run in sorted(p.parent for p in args.dir.glob("*/*/config.json")):
        found = run_summary(run)
        if found:
            rows.append(run_row(run.parent.name, run.name + found[1], found[0]))
    print(markdown(["task", "recipe", "=AR", "original reproduces AR", "score AR / AR base", "tau", "v_d",
                    "by position, unconditional", "by position, conditional", "accepted-length histogram (0, 1, ...)",
                    "speedup"], rows))


if __name__ == "__main__":
    main()
