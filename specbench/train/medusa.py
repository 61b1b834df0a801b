"""Medusa-1 heads (Cai et al. 2024, frozen backbone) on the self-distillation sequences.

Loss sum_k 0.8^k CE(head_k(h_t), y_{t+k+1}) on the loss region of each sequence. Per-head rank
accuracies on the held-out sequences are stored in the checkpoint settings (`head_accuracy[k][r]`:
how often head k+1's rank-r token is the right one; `head_top1`), which `tree_from_accuracies`
turns into a sparse tree. Medusa-2 (joint training) is train/medusa2.py.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from specbench.models.artifacts import save_checkpoint
from specbench.methods.medusa import MedusaHeads, medusa2_structure
from specbench.models import ModelAdapter
from specbench.train.loop import (
    agreement,
    eval_loss,
    loss_value,
    pad_batch,
    pad_id,
    run_settings,
    split_held_out,
    train_loop,
    with_labels,
    write_log,
)
from specbench.train.features import target_features
from specbench.train.parts import checkpoint_part, first_use
from specbench.train.resume import resume_for
from specbench.train.trainers import TRAINERS, trainer


def medusa_loss(target: ModelAdapter, heads, ids, labels, decay: float = 0.8, store=None):
    """(loss, (right, counted) top-1 agreement of head 1). labels[p] is what position p should
    predict (text token p+1 or the target's greedy choice), so head k at p learns labels[p+k].
    `store`: the target's cached final-norm features (train/features.py), None: computed here."""
    h = store.batch(ids, labels) if store is not None else None
    if h is None:
        with torch.no_grad():  # frozen backbone (Medusa-1)
            h = target.norm(target.run_layers(target.embed(ids), None))
    return heads_loss(heads, h, ids, labels, decay)


def heads_loss(heads, h, ids, labels, decay: float = 0.8):
    """sum_k decay^k CE(head_k(h_p), labels[p+k]) over the final-norm hidden states h [B, T, d]
    (shared by Medusa-1, where h carries no graph, and Medusa-2, where it does)."""
    agree = (0, 0)
    total = 0.0
    T = ids.shape[1]
    for k in range(1, heads.num_heads + 1):
        if T <= k:
            break
        logits = heads.head(k - 1, h[:, : T - k])
        tgt = labels[:, k:]  # labels[p + k] = y_(p+k+1)
        if (tgt != -100).any():
            total = total + decay**k * F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten(), ignore_index=-100)
            if k == 1:
                agree = agreement(logits.detach(), tgt)
    loss = total if torch.is_tensor(total) else torch.zeros((), device=ids.device, requires_grad=True)
    return loss, agree


@torch.no_grad()
def medusa_accuracy(target, heads, sequences, tcfg, pad_id, ranks: int = 10, limit: int = 64) -> list[list[float]]:
    hits = torch.zeros(heads.num_heads, ranks, dtype=torch.float64)
    counts = torch.zeros(heads.num_heads, dtype=torch.float64)
    for s in sequences[:limit]:
        ids, labels = pad_batch([s], int(tcfg.max_len), pad_id, target.device)
        h = target.norm(target.run_layers(target.embed(ids), None))
        T = ids.shape[1]
        for k in range(1, heads.num_heads + 1):
            if T <= k:
                break
            tgt = labels[0, k:]
            valid = tgt != -100
            if not valid.any():
                continue
            r = min(ranks, target.vocab_size)
            top = torch.topk(heads.head(k - 1, h[0, : T - k]), r, dim=-1).indices[valid]
            hits[k - 1, :r] += (top == tgt[valid].unsqueeze(-1)).double().sum(0).cpu()
            counts[k - 1] += float(valid.sum())
    return (hits / counts.clamp_min(1).unsqueeze(-1)).tolist()


@first_use("medusa")
def medusa_parts(cfg, target):
    if cfg.method.variant == "medusa2":  # the medusa trainer hands medusa2 to its own trainer
        return checkpoint_part("the Medusa-2 backbone + heads (joint training)", "medusa2", medusa2_structure, "medusa")(cfg, target)
    return checkpoint_part("the Medusa heads", "medusa",
                           lambda m: {"num_heads": int(m.num_heads), "share_head": bool(m.share_head)})(cfg, target)


@trainer("medusa")
def train_medusa(target: ModelAdapter, cfg, sequences) -> dict:

    mcfg, tcfg = cfg.method, cfg.train
    if mcfg.variant == "medusa2":  # registered by specbench.train.medusa2 (it imports this module)
        return TRAINERS["medusa2"](target, cfg, sequences)
    heads = MedusaHeads(target, int(mcfg.num_heads), bool(mcfg.share_head))
    for p in heads.parameters():
        p.requires_grad_(True)
    heads.train()
    train, held = split_held_out(with_labels(target, sequences, tcfg), tcfg)
    decay = float(mcfg.loss_decay)

    store = target_features(target, train + held, ["final"], tcfg)

    def loss_fn(ids, labels):
        return medusa_loss(target, heads, ids, labels, decay, store)

    pad = pad_id(target)
    before = eval_loss(loss_fn, held, tcfg, pad, target.device)
    def acceptance():  # top-1 of head k against the target's token k+1 ahead: depth k of a chain
        return {"acceptance": [row[0] for row in medusa_accuracy(target, heads, held, tcfg, pad, ranks=1)]}

    log, stopped = train_loop("medusa heads", list(heads.parameters()), loss_fn, train, tcfg, pad, target.device,
                              resume=resume_for(cfg, "medusa", target.key, heads.structure(), "heads"), eval_fn=acceptance,
                              inputs=store and store.inputs())
    after = eval_loss(loss_fn, held, tcfg, pad, target.device)
    heads.eval()
    acc = medusa_accuracy(target, heads, held, tcfg, pad)
    settings = run_settings(cfg, len(train), len(held), log, stopped, before, after)
    settings |= {"head_accuracy": acc, "head_top1": [row[0] for row in acc]}
    state = {k: v.detach().cpu() for k, v in heads.state_dict().items()}
    path = save_checkpoint("medusa", target.key, heads.structure(), state, settings)
    write_log(path, log, settings)
    before, after = loss_value(before), loss_value(after)
    print(f"medusa: held-out loss {before:.3f} -> {after:.3f} ({stopped}); top-1 per head "
          + ", ".join(f"{a[0]:.3f}" for a in acc) + f"; checkpoint {path}")
    return {"medusa": str(path), "held_out_loss_before": before, "held_out_loss_after": after,
            "head_top1": [a[0] for a in acc]}


# -- SPACE ------------------------------------------------------------------------------------
