"""Medusa-2 (Cai et al. 2024, 3.2.2 and 3.3.2): the backbone fine-tuned jointly with the heads.

Loss L = L_LM + lambda0 * L_Medusa-1 (`heads_loss`, the Medusa-1 loss, now with a graph through
the backbone). With self-distilled data (`lm_loss: kl`, the default) L_LM is
KL(p_original || p_fine-tuned) on the loss region, so the backbone keeps its behaviour; `lm_loss:
ce` is the paper's cross-entropy on the labels (SFT data). The original model is the runner's
target itself (never modified); the paper gets it by turning the LoRA adapter off to save memory,
which on the models here is not needed and gives the same distribution.

Stages: warm-up (`warmup_epochs`) then joint training (the planned steps, `train.max_steps` /
`train.epochs`), a safety cap `train.max_minutes` (if set) shared in proportion to their steps. Differential learning rates: the heads'
rate is `heads_lr_ratio` x the backbone's (`method.lr`, else `train.lr`).

The paper's warm-up text contradicts itself: "In the first stage, we only train the backbone
model as MEDUSA-1 ... we first train the backbone model for a few epochs, then train the MEDUSA
heads together with the backbone". Medusa-1 is the frozen-backbone recipe and the cited idea
(Kumar et al. 2022, linear probing then fine-tuning) trains the new heads first, and the stated
reason (large head losses distort the backbone) only makes sense that way round: `warmup: heads`
(default) trains the heads on the Medusa-1 loss with the backbone frozen (no graph through it).
`warmup: backbone` is the literal reading: the backbone alone on L_LM, heads untouched.

lambda0 schedule (`lambda0_schedule`). For self-distilled data, the setting here, the paper (4.2)
drops the two-stage procedure: "we use a sine schedule for the theta_0 [sic: lambda0] to gradually
increase the value to its peak at the end of the training"; the authors' trainer multiplies the
heads' losses (never L_LM) by sin(pi/2 * step / max_steps). 3.2.2 instead calls lambda0 "the
weight of the backbone model's loss", which contradicts eq. 2 (lambda0 multiplies L_Medusa-1) and
defeats the purpose (the heads' loss would dominate early, when it is largest); that reading is
not implemented. Default `sine`: lambda0(s) = lambda0 * sin(pi/2 * (s+1)/S) at joint step s of the
S planned joint steps (train.max_steps, or `train.epochs` x batches), so the last planned step has the peak and the
first a small non-zero weight; `linear` ramps (s+1)/S; `constant` is lambda0 throughout (with
`warmup_epochs: 1`, the two-stage recipe of 3.2.2). A safety-cap stop ends the ramp short of
the peak, as the authors' max_steps-based ramp would. The default drops the warm-up epoch
(`warmup_epochs: 0`) as 4.2 does, so Medusa-2 runs exactly the planned steps,
the same budget as every other trainer.

Backbone (`backbone`). `lora` (default) is the paper's recipe (section 4, every Medusa-2 model):
LoRA r=32, alpha=16, dropout 0.05 on every linear map of the backbone *and the LM head*, the
adapter at 1e-4 (4.2, self-distillation) and the heads at 4x. A tied LM head (the embedded model's)
is untied first, so the embedding stays the original. The adapter is merged into the weights before
saving. `full` fine-tunes the whole backbone (the tied head, i.e. the embedding, with it) at the
same rate: no paper recipe, kept selectable. The checkpoint (kind `medusa2`) stores the full
fine-tuned model state and the heads' state, keyed by `methods.medusa.medusa2_structure`.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from specbench.config import settings
from specbench.models.artifacts import save_checkpoint
from specbench.core.errors import SpecBenchError
from specbench.methods.medusa import MedusaHeads, medusa2_structure
from specbench.methods.space import finetuned_copy, untie_lm_head
from specbench.models import ModelAdapter
from specbench.train.loop import (
    apply_lora,
    pad_batch,
    pad_id,
    run_settings,
    split_held_out,
    train_loop,
    with_labels,
    write_log,
)
from specbench.train.loop import planned_steps
from specbench.train.medusa import heads_loss, medusa_accuracy
from specbench.train.resume import resume_for
from specbench.train.trainers import trainer


def lm_loss(logits, ref_logits, labels, mode: str = "kl") -> torch.Tensor:
    """L_LM on the labelled positions: KL(p_original || p) or cross-entropy on the labels."""
    keep = labels != -100
    if not keep.any():
        return logits.sum() * 0.0
    if mode == "kl":
        logp, logq = F.log_softmax(logits[keep].float(), -1), F.log_softmax(ref_logits[keep].float(), -1)
        return F.kl_div(logp, logq, log_target=True, reduction="batchmean")  # sum q (log q - log p), per position
    return F.cross_entropy(logits[keep].float(), labels[keep])


def loss_parts(ft: ModelAdapter, original: ModelAdapter, heads, ids, labels, mode: str, decay: float, backbone: bool):
    """(L_LM, L_Medusa-1, head-1 agreement, backbone agreement with the original). `backbone`:
    False keeps the backbone out of the graph (heads warm-up) and skips L_LM."""
    with torch.set_grad_enabled(backbone and torch.is_grad_enabled()):
        h = ft.norm(ft.run_layers(ft.embed(ids), None))
    med, agree = heads_loss(heads, h, ids, labels, decay)
    if not backbone:
        return None, med, agree, (0, 0)
    logits = ft.lm_head(h)
    with torch.no_grad():
        ref = original.lm_head(original.norm(original.run_layers(original.embed(ids), None)))
    keep = labels != -100
    same = (int((logits[keep].argmax(-1) == ref[keep].argmax(-1)).sum()), int(keep.sum()))
    return lm_loss(logits, ref, labels, mode), med, agree, same


@torch.no_grad()
def held_out(parts, sequences, tcfg, pad_id, device, limit: int = 64) -> dict:
    lm, med, n, same, counted = 0.0, 0.0, 0, 0, 0
    for s in sequences[:limit]:
        a, b, _, (r, t) = parts(*pad_batch([s], int(tcfg.max_len), pad_id, device), True)
        lm, med, n, same, counted = lm + float(a), med + float(b), n + 1, same + r, counted + t
    n = max(1, n)
    return {"lm": lm / n, "medusa": med / n, "backbone_agreement": same / max(1, counted)}


SCHEDULES = ("constant", "linear", "sine")


def lambda0_at(step: int, total: int, peak: float, schedule: str) -> float:
    """The heads' loss weight at joint step `step` (0-based) of `total` planned steps."""
    if schedule == "constant":
        return peak
    frac = min(1.0, (step + 1) / max(1, total))
    return peak * (math.sin(math.pi / 2 * frac) if schedule == "sine" else frac)


def _stage_cfg(tcfg, bound: dict, share: float, lr: float):
    """A stage's train config: its step bound, its share of the safety cap (if any), its rate."""
    cap = tcfg.max_minutes
    return settings.merge(tcfg, bound | {"max_minutes": None if cap is None else float(cap) * share, "lr": lr})


@trainer("medusa2")
def train_medusa2(target: ModelAdapter, cfg, sequences) -> dict:
    mcfg, tcfg = cfg.method, cfg.train
    structure = medusa2_structure(mcfg)
    mode, warmup = str(mcfg.lm_loss), str(mcfg.warmup)
    if mode not in ("kl", "ce"):
        raise SpecBenchError(f"unknown medusa lm_loss {mode!r}; allowed: ce, kl")
    if warmup not in ("heads", "backbone"):
        raise SpecBenchError(f"unknown medusa warmup {warmup!r}; allowed: backbone, heads")
    lam0, decay = float(mcfg.lambda0), float(mcfg.loss_decay)
    schedule = str(mcfg.lambda0_schedule)
    if schedule not in SCHEDULES:
        raise SpecBenchError(f"unknown medusa lambda0_schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    lr_bb = float(mcfg.lr or tcfg.lr)
    lr_heads = lr_bb * float(mcfg.heads_lr_ratio)
    ft = finetuned_copy(target, "medusa2-training", structure)
    for p in ft.model.parameters():
        p.requires_grad_(False)
    peft_model = None
    if structure["lora"]:
        untie_lm_head(ft.model)  # the adapted head must not move the embedding with it
        peft_model = apply_lora(ft, structure)
        ft.lm_head = peft_model.base_model.model.lm_head  # the adapter held the bare head; train through the LoRA one
    # LoRA: only the adapters (get_peft_model marks them trainable); else the whole copy
    bb_params = list(ft.model.parameters()) if peft_model is None else [p for p in peft_model.parameters() if p.requires_grad]
    for p in bb_params:
        p.requires_grad_(False)  # frozen until the joint stage
    heads = MedusaHeads(ft, structure["num_heads"], structure["share_head"])
    head_params = list(heads.parameters())
    for p in head_params:
        p.requires_grad_(True)
    heads.train()
    train, held = split_held_out(with_labels(target, sequences, tcfg), tcfg)
    pad = pad_id(target)

    def parts(ids, labels, backbone):
        return loss_parts(ft, target, heads, ids, labels, mode, decay, backbone)

    def warm_loss(ids, labels):
        if warmup == "heads":
            _, med, agree, _ = parts(ids, labels, False)
            return med, agree
        lm, _, agree, _ = parts(ids, labels, True)
        return lm, agree

    n_warm = int(mcfg.warmup_epochs)
    warm_steps = n_warm * math.ceil(len(train) / int(tcfg.batch_size))
    joint_steps, lam_used = planned_steps(len(train), tcfg)[0], []

    def joint_loss(ids, labels):
        lm, med, agree, _ = parts(ids, labels, True)
        lam_used.append(lambda0_at(len(lam_used), joint_steps, lam0, schedule))
        return lm + lam_used[-1] * med, agree

    def acceptance():  # top-1 of head k against the target's token k+1 ahead (dropout off meanwhile)
        mode = ft.model.training
        ft.model.eval()
        try:
            return {"acceptance": [row[0] for row in medusa_accuracy(ft, heads, held, tcfg, pad, ranks=1)]}
        finally:
            ft.model.train(mode)

    def resumed(step):  # the heads' loss weight of the steps done before
        lam_used.extend(lambda0_at(i, joint_steps, lam0, schedule) for i in range(step))

    before = held_out(parts, held, tcfg, pad, target.device)
    total = max(1, warm_steps + joint_steps)
    if warmup == "backbone":
        for p in bb_params:
            p.requires_grad_(True)
        for p in head_params:
            p.requires_grad_(False)
    warm_params = head_params if warmup == "heads" else bb_params
    warm_lr = lr_heads if warmup == "heads" else lr_bb
    log, stopped = [], "epochs"
    if n_warm:  # a stage with 0 epochs is skipped (warm-up only, or no warm-up); both 0 is refused below
        log, stopped = train_loop(f"medusa2 warm-up ({warmup})", warm_params, warm_loss, train,
                                  _stage_cfg(tcfg, {"epochs": n_warm, "max_steps": None}, warm_steps / total, warm_lr),
                                  pad, target.device, resume=resume_for(cfg, "medusa2", target.key, structure, "warm-up"))
    for p in bb_params + head_params:
        p.requires_grad_(True)
    ft.model.train()
    groups = [{"params": bb_params, "lr": lr_bb}, {"params": head_params, "lr": lr_heads}]
    joint_log = []
    if joint_steps or not n_warm:  # with no stage at all the loop refuses the zero steps (nothing cached)
        joint_log, stopped = train_loop("medusa2 joint", bb_params + head_params, joint_loss, train,
                                        _stage_cfg(tcfg, {}, joint_steps / total, lr_bb), pad, target.device, groups,
                                        resume=resume_for(cfg, "medusa2", target.key, structure, "joint"),
                                        eval_fn=acceptance, on_resume=resumed)
    log = [r | {"stage": "warm-up"} for r in log] + [r | {"stage": "joint", "step": r["step"] + len(log), "lambda0": lam}
                                                        for r, lam in zip(joint_log, lam_used)]
    for p in bb_params + head_params:
        p.requires_grad_(False)
    if peft_model is not None:
        peft_model.merge_and_unload()
        ft.lm_head = ft.model.lm_head  # the merged head
        heads.__dict__["_target_head"] = ft.lm_head  # share_head: project through it, not the unloaded wrapper
    ft.model.eval()
    heads.eval()
    after = held_out(parts, held, tcfg, pad, target.device)
    acc = medusa_accuracy(ft, heads, held, tcfg, pad)
    settings = run_settings(cfg, len(train), len(held), log, stopped, (before["medusa"], None), (after["medusa"], None))
    settings |= {"head_accuracy": acc, "head_top1": [row[0] for row in acc], "lambda0": lam0, "lambda0_schedule": schedule,
                 "lambda0_last": lam_used[-1] if lam_used else None, "lm_loss": mode,
                 "warmup": warmup, "lr_backbone": lr_bb, "lr_heads": lr_heads, "backbone": "lora" if structure["lora"] else "full",
                 "held_out_before": before, "held_out_after": after}
    state = {"model": {n: v.detach().cpu() for n, v in ft.model.state_dict().items()},
             "heads": {k: v.detach().cpu() for k, v in heads.state_dict().items()}}
    path = save_checkpoint("medusa2", target.key, structure, state, settings)
    write_log(path, log, settings)
    print(f"medusa2: held-out L_LM ({mode}) {before['lm']:.4f} -> {after['lm']:.4f}, Medusa-1 loss "
          f"{before['medusa']:.3f} -> {after['medusa']:.3f}, backbone top-1 agreement with the original "
          f"{after['backbone_agreement']:.3f} ({stopped}); top-1 per head "
          + ", ".join(f"{a[0]:.3f}" for a in acc) + f"; checkpoint {path}")
    return {"medusa2": str(path), "held_out_before": before, "held_out_after": after, "head_top1": [a[0] for a in acc]}
