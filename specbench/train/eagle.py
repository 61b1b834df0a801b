"""Training EAGLE's draft head on the self-distillation sequences (the same data as EESD).

Frozen target; per sequence the head reads the pairs (f_t, x_(t+1)) of `training_pairs` (the
pairs decoding feeds it) and is trained, on the loss region, with the paper's objective
L = w_reg L_reg + w_cls L_cls: smooth-L1 regression of its output to the target's next feature
f_(t+1), plus the classification term on the LM head's output at the draft's feature.

L_cls (`method.cls_labels`): `soft` (default) is the paper's equation and the authors' trainer:
the cross-entropy against the target's own distribution there, p = softmax(LM head(f_(t+1))),
i.e. -sum_v p(v) log q(v), averaged over the loss region. `hard` is cross-entropy against one
token (the target's greedy choice with `train.labels: target`, the text's next token with
`text`): it drops the target's uncertainty among its runners-up, which the tree's lower-ranked
branches draft; kept as an option (the prose's "next token" reading, and cheaper: no second LM
head pass per position). The authors also add uniform noise to the input features; not done here
(short CPU budgets).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.nn import functional as F

from specbench.models.artifacts import save_checkpoint
from specbench.core.errors import choice_error
from specbench.methods.eagle_head import EagleHead, load_eagle, training_pairs
from specbench.models import ModelAdapter
from specbench.train.features import target_features
from specbench.train.loop import (
    ce_loss,
    eval_loss,
    pad_id,
    run_settings,
    split_held_out,
    train_loop,
    with_labels,
    write_log,
)
from specbench.train.parts import checkpoint_part, first_use, init_record
from specbench.train.resume import resume_for
from specbench.train.trainers import trainer


CLS_LABELS = ("soft", "hard")


def soft_cross_entropy(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -sum_v p(v) log softmax(logits)(v) (the authors' `ploss`)."""
    return -(p * F.log_softmax(logits.float(), -1)).sum(-1).mean()


def eagle_loss(target: ModelAdapter, head: EagleHead, ids, labels, w_reg: float = 1.0, w_cls: float = 0.1,
               cls_labels: str = "soft", store=None):
    """(loss, (right, counted) top-1 agreement of the draft with the labels). `store`: the target's
    cached features (train/features.py), None: computed here."""
    with torch.no_grad():  # frozen target: no graph through it
        feats, toks, want = training_pairs(target, ids, store.batch(ids, labels) if store is not None else None)
    pred = head(feats, toks, None)
    lab = labels[:, 1:]  # the label of position t+1: what the draft's logits at pair t predict
    keep = lab != -100
    if not keep.any():
        return pred.sum() * 0.0, (0, 0)
    logits = head.logits(pred[keep])
    if cls_labels == "soft":
        with torch.no_grad():
            p = torch.softmax(target.lm_head(want[keep]).float(), -1)
        cls = soft_cross_entropy(logits, p)
        agree = (int((logits.argmax(-1) == lab[keep]).sum()), int(keep.sum()))
    else:
        cls, agree = ce_loss(logits.unsqueeze(0), lab[keep].unsqueeze(0))
    reg = F.smooth_l1_loss(pred[keep].float(), want[keep].float())
    return w_reg * reg + w_cls * cls, agree


first_use("eagle")(checkpoint_part("the EAGLE-2 draft head", "eagle", lambda m: {"layers": 1, "bias": bool(m.bias)}))


def start_from(target: ModelAdapter, head: EagleHead, mcfg, where) -> dict:
    """train.init: start from a trained head (`auto`: the one a run loads, the cache's or the published
    one; or a path) instead of the target's layer, to fine-tune it on other data (the head has no
    vocabulary of its own: it reads out through the target's LM head)."""
    old, info = load_eagle(target, replace(mcfg, checkpoint=str(where), allow_untrained=False))
    head.load_state_dict(old.state_dict())
    return init_record("eagle", target.key, head.structure(), where, info)


@trainer("eagle")
def train_eagle(target: ModelAdapter, cfg, sequences) -> dict:
    mcfg, tcfg = cfg.method, cfg.train
    head = EagleHead(target, bool(mcfg.bias))
    start = start_from(target, head, mcfg, tcfg.init) if tcfg.init else None
    for p in head.parameters():
        p.requires_grad_(True)
    head.train()
    train, held = split_held_out(with_labels(target, sequences, tcfg), tcfg)
    w_reg, w_cls = float(mcfg.loss_reg), float(mcfg.loss_cls)
    cls_labels = str(mcfg.cls_labels)
    if cls_labels not in CLS_LABELS:
        raise choice_error("eagle cls_labels", cls_labels, CLS_LABELS)

    store = target_features(target, train + held, ["final"], tcfg)

    def loss_fn(ids, labels):
        return eagle_loss(target, head, ids, labels, w_reg, w_cls, cls_labels, store)

    pad = pad_id(target)
    before = eval_loss(loss_fn, held, tcfg, pad, target.device)
    log, stopped = train_loop("eagle head", list(head.parameters()), loss_fn, train, tcfg, pad, target.device,
                              resume=resume_for(cfg, "eagle", target.key, head.structure(), "head"), held=held,
                              inputs=store and store.inputs())
    after = eval_loss(loss_fn, held, tcfg, pad, target.device)
    head.eval()
    settings = run_settings(cfg, len(train), len(held), log, stopped, before, after)
    settings |= {"init": start} if start else {}
    state = {k: v.detach().cpu() for k, v in head.state_dict().items()}
    path = save_checkpoint("eagle", target.key, head.structure(), state, settings)
    write_log(path, log, settings)
    print(f"eagle: held-out loss {before[0]:.3f} -> {after[0]:.3f}, agreement {before[1]:.3f} -> {after[1]:.3f} "
          f"({stopped}); {path}")
    return {"eagle": str(path), "held_out_loss": [before[0], after[0]], "held_out_agreement": [before[1], after[1]]}
