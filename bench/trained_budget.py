"""Figures for results/bench/trained_budget.md: what each trained part learnt, and what it does in
the bench suites, read from the checkpoints' metadata and the suites' run directories.

    python bench/trained_budget.py [--model-key smollm2-135m] [--bench results/bench]

Prints markdown: (1) per trained part, the budget it saw (sequences, epochs, steps, stop reason)
and its held-out figures before/after; (2) per bench run of the trained methods, tau, acceptance
by draft position/depth, time shares, measured vs predicted speedup, and for runs on fine-tuned
weights the original weights' greedy agreement and task score.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specbench.models.artifacts import cache_dir, checkpoint_meta

KINDS = ("eesd", "cali", "medusa", "medusa2", "space", "eagle")
RUNS = {  # suite -> runs of trained methods worth the detailed table
    "fidelity": None, "firstuse": None, "heads": None,
    "selfdraft": ("eesd-fixed4", "eesd-beta_ts", "eesd-cali_ts"),
}


def _f(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def checkpoints(model_key: str) -> list[tuple[str, Path, dict]]:
    out = []
    for kind in KINDS:
        for path in sorted((cache_dir() / kind).glob(f"{model_key}*.safetensors")):
            meta = checkpoint_meta(path)
            if meta:
                out.append((kind, path, meta))
    return out


def training_table(model_key: str) -> str:
    rows = [("| part | structure | saved | train / held-out seqs | epochs x batch | steps | stopped by | "
             "held-out loss before -> after | agreement before -> after | head top-1 (held-out) |"),
            "|---|---|---|---|---|---|---|---|---|---|"]
    for kind, path, meta in checkpoints(model_key):
        s, st = meta["settings"], meta.get("structure", {})
        if kind == "cali":
            rows.append(f"| cali (Cali-TS predictor) | {json.dumps(st)} | {meta['saved']} | {s.get('train_sequences')} / - | "
                        f"- | {s.get('steps')} | - | {_f(s['losses'][0] if s.get('losses') else None)} -> "
                        f"{_f(s['losses'][-1] if s.get('losses') else None)} (train) | held-out accuracy "
                        f"{_f(s.get('held_out_accuracy'))} (majority {_f(max(s['held_out_positive_rate'], 1 - s['held_out_positive_rate']))}) | - |")
            continue
        t = s.get("train", {})
        if kind == "medusa2":
            b, a = s["held_out_before"], s["held_out_after"]
            loss = f"L_LM {_f(b['lm'], '.4f')} -> {_f(a['lm'], '.4f')}; Medusa {_f(b['medusa'])} -> {_f(a['medusa'])}"
            agree = f"backbone vs original {_f(b['backbone_agreement'])} -> {_f(a['backbone_agreement'])}"
        else:
            loss = f"{_f(s.get('held_out_loss_before'))} -> {_f(s.get('held_out_loss_after'))}"
            agree = f"{_f(s.get('held_out_agreement_before'))} -> {_f(s.get('held_out_agreement_after'))}"
        heads = " / ".join(_f(x) for x in s.get("head_top1", [])) or "-"
        rows.append(f"| {kind} | {json.dumps(st)} | {meta['saved']} | {s.get('train_sequences')} / {s.get('held_out_sequences')} | "
                    f"{t.get('epochs')} x {t.get('batch_size')} | {s.get('steps')} | {s.get('stopped_by')} | {loss} | {agree} | {heads} |")
    return "\n".join(rows)


def bench_rows(bench: Path) -> str:
    rows = [("| suite | task | run | n | speedup | predicted: profile / refit | tau | accepted/drafted by position | "
             "draft% / verify% / control% | =AR | original weights: agreement, score (fine-tuned score) |"),
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for suite, only in RUNS.items():
        for summ in sorted((bench / suite).glob("*/*/summary.json")):
            run, task = summ.parent.name, summ.parent.parent.name
            if only and run not in only:
                continue
            s = json.loads(summ.read_text())
            a, m = s.get("acceptance") or {}, s["method"]
            pos = " ".join(f"{acc / d:.2f}" if d else "-" for acc, d in zip(s.get("pos_accepted") or [], s.get("pos_drafted") or []))
            share = m.get("time_share", {})
            base = s.get("base") or {}
            orig = "-"
            if base:
                orig = f"{_f(base.get('agreement'))}, {json.dumps(base.get('quality') or {})} ({json.dumps(m.get('quality') or {})})"
            rows.append(f"| {suite} | {task} | {run} | {s['samples']} | {_f(s['speedup'], '.2f')} | "
                        f"{_f(s.get('predicted_speedup'), '.2f')} / {_f(s.get('predicted_speedup_refit'), '.2f')} | "
                        f"{_f(a.get('tau'), '.2f')} | {pos or '-'} | {100 * share.get('draft', 0):.0f} / "
                        f"{100 * share.get('verify', 0):.0f} / {100 * share.get('control', 0):.0f} | "
                        f"{s['matches_ar']}/{s['samples']} | {orig} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-key", default="smollm2-135m")
    ap.add_argument("--bench", default=str(Path(__file__).resolve().parents[1] / "results" / "bench"))
    args = ap.parse_args()
    print(f"## Trained parts ({cache_dir()}, model {args.model_key})\n")
    print(training_table(args.model_key))
    print("\n## Bench runs of the trained methods\n")
    print(bench_rows(Path(args.bench)))


if __name__ == "__main__":
    main()
