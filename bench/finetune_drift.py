"""Where a fine-tuned copy of the target leaves the target's greedy choice (SPACE's SAR-SFT, issue 44).

    python bench/finetune_drift.py [--train N] [--json OUT] <the SPACE training command's overrides>
                                   [method.checkpoint=<file>]

SPACE decodes with its fine-tuned weights, so its output is lossless with respect to them, not to the
target. This scores how far they moved: at every position of the training data's held-out sequences
(and of the first N training sequences, to tell drift from overfitting), does the fine-tuned model's
argmax equal the target's? Positions are split into the answer (the labelled positions the AR loss
reads) and the prompt (never in any loss), and bucketed by the target's own top-1 minus top-2
probability there: a flip where the target is nearly tied is a small change of the model, a flip
where it is sure is a large one. The overrides name the cached self-distillation data and its split
(as bench/heldout_domains.py, which this reuses; it never generates data).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from heldout_domains import held_out_by_domain  # noqa: E402

from specbench.config import settings  # noqa: E402
from specbench.config.compose import compose, validate  # noqa: E402
from specbench.core.errors import SpecBenchError  # noqa: E402
from specbench.models import load_model  # noqa: E402

EDGES = [0.0, 0.05, 0.1, 0.2, 0.4, 1.0]


def bucket(margin: float) -> int:
    return next(i for i in range(len(EDGES) - 1) if margin < EDGES[i + 1] or i == len(EDGES) - 2)


def final_logits(model, ids: list[int]) -> torch.Tensor:
    return model.lm_head(model.norm(model.run_layers(model.embed(ids), None)))[0].float()


def drift(target, ft, sequences, max_len: int) -> dict:
    """{"answer"|"prompt": [[same, positions] per margin bucket]} over `sequences` ((ids, start, labels))."""
    out = {"answer": [[0, 0] for _ in EDGES[:-1]], "prompt": [[0, 0] for _ in EDGES[:-1]]}
    for ids, start, _ in sequences:
        ids = ids[:max_len]
        base, tuned = final_logits(target, ids), final_logits(ft, ids)
        top2 = base.softmax(-1).topk(2, -1).values
        margin = (top2[:, 0] - top2[:, 1]).tolist()
        same = (base.argmax(-1) == tuned.argmax(-1)).tolist()
        for t in range(len(ids) - 1):  # position t predicts token t+1; start-1 predicts the answer's first
            cell = out["answer" if t >= start - 1 else "prompt"][bucket(margin[t])]
            cell[0] += int(same[t])
            cell[1] += 1
    return out


def table(report: dict) -> str:
    heads = [f"[{EDGES[i]}, {EDGES[i + 1]})" for i in range(len(EDGES) - 1)]
    lines = ["| sequences | positions | agree / all | " + " | ".join(f"target's margin {h}" for h in heads) + " |",
             "|---|---|---:|" + "---:|" * len(heads)]
    for split, kinds in report.items():
        for kind, cells in kinds.items():
            same, n = sum(c[0] for c in cells), sum(c[1] for c in cells)
            row = " | ".join(f"{c[0] / c[1]:.3f} ({c[1]})" if c[1] else "-" for c in cells)
            lines.append(f"| {split} | {kind} | {same / max(n, 1):.3f} ({n}) | {row} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=60, help="training sequences scored too (0: none)")
    ap.add_argument("--json", help="write the counts here too")
    args, overrides = ap.parse_known_args(argv)
    torch.set_grad_enabled(False)
    cfg = compose(["method=space", *[o for o in overrides if not o.startswith("method=")]])
    validate(cfg)
    run = settings.of(cfg)
    if run.threads:
        torch.set_num_threads(int(run.threads))
    from specbench.methods.space import load_space

    target = load_model(run.model)
    every, groups = held_out_by_domain(run, target)
    held = [s for name, g in groups.items() if "pooled" not in name for s in g]
    held_ids = {tuple(s[0]) for s in held}
    train = [s for s in every if tuple(s[0]) not in held_ids][: args.train]
    ft, _, info = load_space(target, run.method)
    max_len = int(run.train.max_len)
    report = {f"held-out ({len(held)})": drift(target, ft, held, max_len)}
    if train:
        report[f"training ({len(train)})"] = drift(target, ft, train, max_len)
    print(f"SPACE checkpoint {info.get('checkpoint')}: the fine-tuned model's argmax against the target's, "
          "by the target's top-1 minus top-2 probability (share agreeing, positions)")
    print(table(report))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"argv": argv, "checkpoint": str(info.get("checkpoint")), "edges": EDGES, "report": report}, f,
                      indent=1)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SpecBenchError as e:
        sys.exit(f"specbench: error: {e}")
