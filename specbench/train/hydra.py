"""Hydra heads (Ankner et al. 2024) on the self-distillation sequences, frozen target.

Head k at position t reads `teacher_forced_inputs` (the base feature at t and the embeddings of the
text's tokens t+1 .. t+k+1: what decoding feeds when the tree path equals them) and learns the token
at t+k+2, on the loss region of each sequence:
- hydra_pp (Hydra++, the authors' recipe: lm_loss_weight 0, teacher_loss_weight 1): teacher
  distillation, KL(p_target || q_head) against the target's full distribution at position t+k+1
  (the authors' CrossEntropyLoss with soft targets; the same gradient), summed over heads;
- hydra (plain): cross-entropy against the label there (`train.labels`: the target's greedy token
  or the text's), summed over heads.
Per-head top-1 agreement on the held-out sequences is stored in the checkpoint (`head_top1`).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from specbench.models.artifacts import save_checkpoint
from specbench.methods.hydra_heads import HydraHeads, structure_of, teacher_forced_inputs
from specbench.models import ModelAdapter
from specbench.train.features import target_features
from specbench.train.loop import (
    eval_loss,
    pad_batch,
    pad_id,
    run_settings,
    split_held_out,
    train_loop,
    with_labels,
    write_log,
)
from specbench.train.parts import checkpoint_part, first_use
from specbench.train.resume import resume_for
from specbench.train.trainers import trainer

first_use("hydra")(checkpoint_part("the Hydra heads", "hydra", structure_of))


def head_rows(heads: HydraHeads, target: ModelAdapter, ids, labels, store=None):
    """Per head k: (its inputs on the loss region [N, d(k+2)], the target's final-norm hidden
    state at the position whose next token it predicts [N, d], that token's label [N]).
    `store`: the target's cached features (train/features.py), None: computed here."""
    h, inputs = teacher_forced_inputs(heads, target, ids, store.batch(ids, labels) if store is not None else None)
    out = []
    for k, x in enumerate(inputs):
        n = x.shape[1]
        lab = labels[:, k + 1 : k + 1 + n]  # labels[p] = the token after p; head k at t predicts p = t+k+1's
        keep = lab != -100
        out.append((x[keep], h[:, k + 1 : k + 1 + n][keep], lab[keep]))
    return out


def hydra_loss(target: ModelAdapter, heads: HydraHeads, ids, labels, distill: bool, store=None):
    """(loss, (right, counted) top-1 agreement of head 1 with the labels)."""
    total, agree = None, (0, 0)
    for k, (x, h, lab) in enumerate(head_rows(heads, target, ids, labels, store)):
        if not len(lab):
            continue
        logits = heads.head(k, x).float()
        if distill:
            with torch.no_grad():
                p_log = torch.log_softmax(target.lm_head(h).float(), -1)
            loss = F.kl_div(torch.log_softmax(logits, -1), p_log, log_target=True, reduction="batchmean")
        else:
            loss = F.cross_entropy(logits, lab)
        total = loss if total is None else total + loss
        if k == 0:
            agree = (int((logits.argmax(-1) == lab).sum()), len(lab))
    if total is None:  # every labelled position was cut by max_len: no signal
        total = sum(p.sum() for p in heads.parameters() if p.requires_grad) * 0.0
    return total, agree


@torch.no_grad()
def head_top1(target, heads, sequences, tcfg, pad, limit: int = 64, store=None) -> list[float]:
    """How often head k's top-1 equals the label (teacher-forced), per head, on `sequences`."""
    right = [0] * heads.num_heads
    count = [0] * heads.num_heads
    for s in sequences[:limit]:
        ids, labels = pad_batch([s], int(tcfg.max_len), pad, target.device)
        for k, (x, _, lab) in enumerate(head_rows(heads, target, ids, labels, store)):
            if len(lab):
                right[k] += int((heads.head(k, x).argmax(-1) == lab).sum())
                count[k] += len(lab)
    return [r / max(1, c) for r, c in zip(right, count)]


@trainer("hydra")
def train_hydra(target: ModelAdapter, cfg, sequences) -> dict:
    mcfg, tcfg = cfg.method, cfg.train
    s = structure_of(mcfg)
    dropout = float(mcfg.dropout) if s["variant"] == "hydra_pp" else 0.0
    heads = HydraHeads(target, s["variant"], s["num_heads"], s["num_layers"], dropout, share_head=s["share_head"])
    for p in heads.parameters():
        p.requires_grad_(True)
    train, held = split_held_out(with_labels(target, sequences, tcfg), tcfg)
    distill = s["variant"] == "hydra_pp"

    store = target_features(target, train + held, ["final"], tcfg)

    def loss_fn(ids, labels):
        return hydra_loss(target, heads, ids, labels, distill, store)

    pad = pad_id(target)

    def held_out():  # per-head top-1 (depth k of a chain), without dropout; train() again after
        heads.eval()
        try:
            return {"loss": eval_loss(loss_fn, held, tcfg, pad, target.device)[0],
                    "acceptance": head_top1(target, heads, held, tcfg, pad, store=store)}
        finally:
            heads.train()

    heads.eval()
    before = eval_loss(loss_fn, held, tcfg, pad, target.device)
    heads.train()
    log, stopped = train_loop("hydra heads", list(heads.parameters()), loss_fn, train, tcfg, pad, target.device,
                              resume=resume_for(cfg, "hydra", target.key, heads.structure(), "heads"),
                              eval_fn=held_out if held else None, inputs=store and store.inputs())
    heads.eval()
    after = eval_loss(loss_fn, held, tcfg, pad, target.device)
    top1 = head_top1(target, heads, held, tcfg, pad, store=store)
    settings = run_settings(cfg, len(train), len(held), log, stopped, before, after) | {"head_top1": top1}
    state = {k: v.detach().cpu() for k, v in heads.state_dict().items()}
    path = save_checkpoint("hydra", target.key, heads.structure(), state, settings)
    write_log(path, log, settings)
    print(f"hydra ({s['variant']}): held-out loss {before[0]:.3f} -> {after[0]:.3f} ({stopped}); top-1 per head "
          + ", ".join(f"{a:.3f}" for a in top1) + f"; checkpoint {path}")
    return {"hydra": str(path), "held_out_loss": [before[0], after[0]], "head_top1": top1}
