"""Held-out acceptance of trained drafts, per domain of the training data (issue 44).

    python bench/heldout_domains.py [--methods eagle3,eagle] [--limit N] [--json OUT] <the training command's overrides>
                                    [<method>:<override> ...: for that method only, e.g. eagle3:method.checkpoint=<file>]

The overrides are the training command's (model=..., train.data.*, train.seed, train.eval_fraction,
train.max_sequences, method.*): they name the self-distillation data in the cache (generate it
first with `python -m specbench.train ...`; this script never generates) and its held-out split,
the same sequences the trainer's curve reads. Every draft a run would load (`checkpoint: auto`:
the cache's, else the published one; or method.checkpoint=<path>) is scored on each domain's
held-out sequences, teacher-forced against the target's greedy labels:

- eagle3: top-1 agreement at depths 1..ttt_steps along the accepted path (train/eagle3.py
  ttt_eval), and the share of labels inside the draft vocabulary (a token outside it is never drafted);
- eagle: top-1 agreement at depth 1 (train/loop.py eval_loss);
- medusa (medusa1), hydra: each head's top-1 agreement, head k at "depth" k (the token k+1 places
  after the last verified one). Medusa's heads read the verified position's state only, so head k's
  top-1 is its own (train/medusa.py medusa_accuracy); Hydra's head k reads the text's tokens up to
  its position (teacher-forced, train/hydra.py head_top1), as EAGLE-3's depths read the accepted path.
- vanilla_sd: the draft's top-1 agreement at depth 1 (its training loss, trainers.vanilla_draft_loss);
- eesd: the exit layer's top-1 agreement at depth 1 (its training loss, trainers.eesd_loss);
- space: mask j's top-1 at "depth" j, at 4 seeded random cuts per sequence (train/space.py mask_top1);
  the fine-tuned model's own labels are the target's, so this is the candidates' accuracy against the
  base model's greedy text, not against the fine-tuned model's (which its AR baseline decodes);
  beside it, the fine-tuned model's own top-1 against those labels (how far SAR-SFT moved the model).

Domains are general_data.DOMAINS for ShareGPT prompts, gsm8k-math/-summary/-code for the GSM8K
templates and gsm8k-original for the train split's own answers. A draft trained on the GSM8K
recipe may have seen GSM8K train questions that are held out here; ShareGPT's never.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections import defaultdict

import torch

from specbench.config import settings
from specbench.config.compose import compose, validate
from specbench.core.errors import SpecBenchError
from specbench.models import load_model
from specbench.models.distill import domains_of, load_sequences, sequences_path


def interleave(lists: list[list]) -> list:
    return [x for row in itertools.zip_longest(*lists) for x in row if x is not None]


def held_out_by_domain(run, target, unseen_by: int | None = None):
    """(every sequence, {domain: held-out sequences}); `unseen_by`: also drop the held-out sequences that
    a run capped at train.max_sequences=unseen_by trained on, so drafts trained on different caps of the
    same data are scored on text none of them saw (that run's cap keeps the first N: train.cap=first; the split
    depends on the list only, not on labels)."""
    path = sequences_path(target, run.train.data, int(run.train.seed))
    if not path.is_file():
        raise SpecBenchError(f"no self-distillation data at {path}: generate it with `python -m specbench.train` and "
                             "these overrides first")
    from specbench.train.loop import split_held_out, with_labels
    from specbench.train.session import capped
    full = load_sequences(target, run.train.data, None, int(run.train.seed))[0]
    cap = run.train.max_sequences
    sequences = capped(full, int(cap), run.train.cap) if cap and len(full) > int(cap) else full
    domains = domains_of(target, run.train.data, int(run.train.seed)) or ["unknown"] * len(full)
    of_seq = {tuple(s): d for (s, _), d in zip(full, domains)}
    labelled = with_labels(target, sequences, run.train)
    train, held = split_held_out(labelled, run.train)
    every = train + held  # the trainer's list, in its order: the feature store's key
    if unseen_by:
        seen = {tuple(s) for s, *_ in split_held_out(full[:unseen_by], run.train)[0]}
        held = [s for s in held if tuple(s[0]) not in seen]
    groups = defaultdict(list)
    for s in held:
        groups[of_seq[tuple(s[0])]].append(s)
    groups = dict(sorted(groups.items()))
    from specbench.models.general_data import DOMAINS
    # round-robin over the domains, so that --limit takes an even mix, not the first domain's sequences
    pooled = {"general (pooled)": interleave([groups.get(d, []) for d in DOMAINS]),
              "gsm8k (pooled)": interleave([g for d, g in groups.items() if d.startswith("gsm8k")])}
    return every, groups | {k: v for k, v in pooled.items() if v}


def score_eagle3(run, target, every, groups, limit):
    from specbench.methods.eagle3_head import load_eagle3
    from specbench.train.eagle3 import feature_taps, ttt_eval
    from specbench.train.features import target_features
    from specbench.train.loop import pad_id
    head, info = load_eagle3(target, run.method)
    head.eval()
    store = target_features(target, every, feature_taps(head), run.train)
    in_vocab = set((torch.arange(len(head.d2t)) + head.d2t.cpu().long()).tolist())
    out = {}
    for name, held in groups.items():
        r = ttt_eval(target, head, held, run.train, int(run.method.ttt_steps), float(run.method.step_decay),
                     pad_id(target), limit=limit, store=store)
        labels = [t for s, st, lab in held[:limit] for t in lab[st - 1 : len(s) - 1]]
        out[name] = {"sequences": min(limit, len(held)), "acceptance_by_depth": [round(a, 4) for a in r["acceptance"]],
                     "labels_in_draft_vocab": round(sum(t in in_vocab for t in labels) / max(1, len(labels)), 4)}
    return out, info


def score_eagle(run, target, every, groups, limit):
    from specbench.methods.eagle_head import load_eagle
    from specbench.train.eagle import eagle_loss
    from specbench.train.features import target_features
    from specbench.train.loop import eval_loss, pad_id
    head, info = load_eagle(target, run.method)
    head.eval()
    store = target_features(target, every, ["final"], run.train)
    mcfg, pad, out = run.method, pad_id(target), {}
    for name, held in groups.items():
        loss_fn = lambda ids, labels: eagle_loss(target, head, ids, labels, float(mcfg.loss_reg), float(mcfg.loss_cls),  # noqa: E731
                                                 str(mcfg.cls_labels), store)
        _, agree = eval_loss(loss_fn, held, run.train, pad, target.device, limit=limit)
        out[name] = {"sequences": min(limit, len(held)), "acceptance_by_depth": [round(agree, 4)]}
    return out, info


def score_medusa(run, target, every, groups, limit):
    from specbench.methods.medusa import load_heads
    from specbench.train.loop import pad_id
    from specbench.train.medusa import medusa_accuracy
    if run.method.variant != "medusa1":
        raise SpecBenchError(f"medusa: held-out by domain scores medusa1 heads, not method.variant={run.method.variant}")
    heads, info = load_heads(target, run.method)
    heads.eval()
    out = {}
    for name, held in groups.items():
        acc = medusa_accuracy(target, heads, held, run.train, pad_id(target), ranks=1, limit=limit)
        out[name] = {"sequences": min(limit, len(held)), "acceptance_by_depth": [round(a[0], 4) for a in acc]}
    return out, info


def score_hydra(run, target, every, groups, limit):
    from specbench.methods.hydra_heads import load_heads
    from specbench.train.features import target_features
    from specbench.train.hydra import head_top1
    from specbench.train.loop import pad_id
    heads, info = load_heads(target, run.method)
    heads.eval()
    store = target_features(target, every, ["final"], run.train)
    out = {}
    for name, held in groups.items():
        acc = head_top1(target, heads, held, run.train, pad_id(target), limit=limit, store=store)
        out[name] = {"sequences": min(limit, len(held)), "acceptance_by_depth": [round(a, 4) for a in acc]}
    return out, info


def score_vanilla_sd(run, target, every, groups, limit):
    from specbench.methods.vanilla_sd import build_draft
    from specbench.train.loop import eval_loss, pad_id
    from specbench.train.trainers import vanilla_draft_loss
    draft, info = build_draft(target, run.method.draft)
    loss_fn, out = vanilla_draft_loss(draft), {}
    for name, held in groups.items():
        _, agree = eval_loss(loss_fn, held, run.train, pad_id(target), target.device, limit=limit)
        out[name] = {"sequences": min(limit, len(held)), "acceptance_by_depth": [round(agree, 4)]}
    return out, info


def score_eesd(run, target, every, groups, limit):
    from specbench.methods.eesd import load_early_exit
    from specbench.train.features import target_features
    from specbench.train.loop import eval_loss, pad_id
    from specbench.train.trainers import eesd_loss, eesd_taps
    exit_, info = load_early_exit(target, run.method)
    exit_.eval()
    store = target_features(target, every, eesd_taps(exit_.n_layers, False), run.train)
    out = {}
    for name, held in groups.items():
        _, agree = eval_loss(lambda ids, labels: eesd_loss(target, exit_, ids, labels, store), held, run.train,
                             pad_id(target), target.device, limit=limit)
        out[name] = {"sequences": min(limit, len(held)), "acceptance_by_depth": [round(agree, 4)]}
    return out, info


def score_space(run, target, every, groups, limit):
    from specbench.methods.space import load_space
    from specbench.train.loop import eval_loss, pad_id
    from specbench.train.space import mask_top1, space_loss
    ft, mask_embed, info = load_space(target, run.method)
    out, pad = {}, pad_id(target)
    for name, held in groups.items():
        acc = mask_top1(ft, mask_embed, held, run.train, info["k"], pad, limit=limit)
        # how far fine-tuning moved the model: its top-1 against the base target's greedy labels, no masks
        _, ar = eval_loss(lambda ids, labels: space_loss(ft, mask_embed, ids, labels), held, run.train, pad,
                          target.device, limit=limit)
        out[name] = {"sequences": min(limit, len(held)), "acceptance_by_depth": [round(a, 4) for a in acc],
                     "finetuned_agrees_with_target": round(ar, 4)}
    return out, info


SCORERS = {"eagle3": score_eagle3, "eagle": score_eagle, "medusa": score_medusa, "hydra": score_hydra,
           "vanilla_sd": score_vanilla_sd, "space": score_space, "eesd": score_eesd}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="eagle3,eagle")
    ap.add_argument("--limit", type=int, default=200, help="held-out sequences per domain at most")
    ap.add_argument("--json", help="write the table here too")
    ap.add_argument("--unseen-by", type=int, metavar="N",
                    help="drop held-out sequences a run at train.max_sequences=N of the same data trained on")
    args, overrides = ap.parse_known_args(argv)
    torch.set_grad_enabled(False)
    target, report = None, {}
    for m in args.methods.split(","):
        if m not in SCORERS:
            sys.exit(f"specbench: error: --methods {m!r}; allowed: {', '.join(SCORERS)}")
        mine = [o.split(":", 1)[1] if ":" in o.split("=", 1)[0] else o for o in overrides
                if not o.startswith("method=") and (":" not in o.split("=", 1)[0] or o.startswith(f"{m}:"))]
        cfg = compose([f"method={m}", *mine])
        validate(cfg)
        run = settings.of(cfg)
        if run.threads:
            torch.set_num_threads(int(run.threads))
        target = target or load_model(run.model)
        every, groups = held_out_by_domain(run, target, args.unseen_by)
        # the target's features of the scored sequences only (a store of their own, cached): the training store of
        # every sequence is reused only where it was made, and a CPU would otherwise prefill all of them first
        every = list({tuple(s[0]): s for held in groups.values() for s in held[: args.limit]}.values())
        report[m] = score(m, run, target, every, groups, args.limit)
    if args.json:
        save(args.json, argv, report)


def score(m: str, run, target, every, groups, limit) -> dict:
    """One method's part scored on each group, printed as a table; its entry of the report."""
    t0 = time.monotonic()
    scores, info = SCORERS[m](run, target, every, groups, limit)
    where = (run.method.draft if m == "vanilla_sd" else run.method).checkpoint
    print(f"\n{m} (checkpoint {where}; {time.monotonic() - t0:.0f} s)")
    print("| domain | held-out seqs | top-1 by depth | labels in draft vocab |\n|---|---:|---|---:|")
    for name, r in scores.items():
        print(f"| {name} | {r['sequences']} | {' '.join(f'{a:.3f}' for a in r['acceptance_by_depth'])} | "
              f"{r.get('labels_in_draft_vocab', '')} |" + (f" fine-tuned model agrees with the target: "
              f"{r['finetuned_agrees_with_target']:.3f}" if "finetuned_agrees_with_target" in r else ""), flush=True)
    return {"checkpoint": where, "info": {k: str(v) for k, v in info.items()}, "domains": scores}


def save(path: str, argv: list[str], report: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"argv": argv, "report": report}, f, indent=1)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SpecBenchError as e:
        sys.exit(f"specbench: error: {e}")
