"""SPACE SAR-SFT (Yi et al. 2024, eqs. 2-4) on the self-distillation sequences.

Per sequence, with probability p_ar the plain AR loss; otherwise a random cut m inside the answer,
the input y_<m followed by k mask tokens, AR loss up to y_m and the masks trained to predict
y_(m+1)..y_(m+k) (mask j after y_(m-1) predicts the token j places after the one y_(m-1) predicts,
which is what decoding reads from a mask group). Full fine-tuning of a copy of the model plus the
[M] vector (`lora: false`, the paper's; the checkpoint holds the whole fine-tuned state), or LoRA
(peft, `lora: true`, the default: the checkpoint holds only the LoRA factors, which loading merges
into a copy of the target, so the part ships at ~10 MB for the embedded model).
"""

from __future__ import annotations

import random

import torch
from torch.nn import functional as F

from specbench.config.settings import merge as merge_settings
from specbench.models.artifacts import save_checkpoint
from specbench.methods.space import MASK, MaskedEmbed, finetuned_copy, space_structure
from specbench.models import ModelAdapter
from specbench.train.loop import (
    agreement,
    apply_lora,
    eval_loss,
    lora_delta,
    loss_value,
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


def sar_example(row: list[int], lab: list[int], m: int, k: int) -> tuple[list[int], list[int]]:
    """One SAR-SFT example (eq. 2): the first m tokens, then k masks, all causal with plain
    positions; mask j predicts lab[m-1+j] = y_(m+j) (or the target's choice)."""
    return row[:m] + [MASK] * k, lab[:m] + [lab[m - 1 + j] for j in range(1, k + 1)]


def sar_batch(ids: torch.Tensor, labels: torch.Tensor, k: int, p_ar: float, rng: random.Random, pad_id: int):
    """Turn an AR batch (from `_pad`) into a SAR-SFT batch (eq. 2-4); mask ids are -1."""
    rows, labs = [], []
    for b in range(ids.shape[0]):
        row, lab = ids[b].tolist(), labels[b].tolist()
        valid = [p for p, v in enumerate(lab) if v != -100]
        # cut m: positions m-1 .. m-1+k must all carry a label (contiguous loss region)
        vs = set(valid)
        cuts = [p + 1 for p in valid if p + k in vs]
        if rng.random() < p_ar or not cuts:
            rows.append(row)
            labs.append(lab)
            continue
        r, lab_m = sar_example(row, lab, rng.choice(cuts), k)
        rows.append(r)
        labs.append(lab_m)
    width = max(len(r) for r in rows)
    out_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    out_lab = torch.full((len(rows), width), -100, dtype=torch.long)
    for b, (r, lab) in enumerate(zip(rows, labs)):
        out_ids[b, : len(r)] = torch.tensor(r)
        out_lab[b, : len(lab)] = torch.tensor(lab)
    return out_ids.to(ids.device), out_lab.to(ids.device)


def space_logits(ft: ModelAdapter, mask_embed, ids) -> torch.Tensor:
    """The training forward: causal, positions 0..T-1, no cache."""
    return ft.lm_head(ft.norm(ft.run_layers(mask_embed(ft, ids), None)))


def space_loss(ft: ModelAdapter, mask_embed, ids, labels, target_probs=None) -> torch.Tensor:
    """Cross-entropy to the labels, or with `target_probs` [B, >=T, V] (train.distill=soft) to the
    target's whole distribution at each labelled position; the agreement counts the labels either way."""
    logits = space_logits(ft, mask_embed, ids)
    keep = labels != -100
    if not keep.any():  # nothing to learn here (e.g. the answer lies past max_len): no NaN
        return logits.sum() * 0.0, (0, 0)
    if target_probs is None:
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
    else:
        p = target_probs[:, : ids.shape[1]][keep]
        loss = -(p * torch.log_softmax(logits[keep].float(), -1)).sum(-1).mean()
    return loss, agreement(logits.detach(), labels)


@torch.no_grad()
def target_distribution(target: ModelAdapter, ids: torch.Tensor) -> torch.Tensor:
    """The frozen target's next-token distribution at every position of the plain rows `ids`. Index i
    of a SAR row holds the target's choice at index i of the row it was cut from (plain position i
    before the cut; mask j sits at m+j-1 and predicts lab[m+j-1]), so these align with sar_batch's rows."""
    return torch.softmax(target.lm_head(target.norm(target.run_layers(target.embed(ids), None))).float(), -1)


@torch.no_grad()
def mask_top1(ft: ModelAdapter, mask_embed, held, tcfg, k: int, pad: int, limit: int = 64, cuts: int = 4,
              seed: int = 0) -> list[float]:
    """Held-out top-1 of mask j = 1..k against its label (the token j places after the one the last
    real position predicts): candidate j's own accuracy, as Medusa's head j. `cuts` random cuts per
    sequence (sar_batch's, p_ar 0), the same ones for every model (seeded)."""
    rng, hits, seen = random.Random(seed), [0] * k, [0] * k
    for s in held[:limit]:
        ids, labels = pad_batch([s], int(tcfg.max_len), pad, ft.device)
        for _ in range(cuts):
            x, y = sar_batch(ids, labels, k, 0.0, rng, pad)
            row = x[0].tolist()
            if MASK not in row:
                break  # no cut with k labelled positions after it
            m = row.index(MASK)
            right = (space_logits(ft, mask_embed, x)[0, m : m + k].argmax(-1) == y[0, m : m + k]).tolist()  # one read
            hits = [h + int(r) for h, r in zip(hits, right)]
            seen = [n + 1 for n in seen]
    return [h / max(1, n) for h, n in zip(hits, seen)]


first_use("space")(checkpoint_part("the SPACE SAR-SFT weights", "space", space_structure))


@trainer("space")
def train_space(target: ModelAdapter, cfg, sequences) -> dict:

    mcfg, tcfg = cfg.method, cfg.train
    structure = space_structure(mcfg)
    k, p_ar = structure["k"], float(mcfg.p_ar)
    ft = finetuned_copy(target, "space-training", structure)
    mask_embed = MaskedEmbed(target, int(tcfg.seed))
    mask_embed.vector.requires_grad_(True)
    peft_model = None
    if structure["lora"]:
        peft_model = apply_lora(ft, structure)  # injects LoRA modules in place; ft's layers see them
        params = [p for p in peft_model.parameters() if p.requires_grad]
    else:
        for p in ft.model.parameters():
            p.requires_grad_(True)
        params = list(ft.model.parameters())
    params.append(mask_embed.vector)
    ft.model.train()
    train, held = split_held_out(with_labels(target, sequences, tcfg), tcfg)
    pad = pad_id(target)
    train_rng = random.Random(int(tcfg.seed))  # the training cuts (saved with a resume state)
    state = {"rng": train_rng}

    soft = tcfg.distill == "soft"  # the AR rows' loss is then zero at the start: an anchor, not a pull to the argmax

    def loss_fn(ids, labels):
        probs = target_distribution(target, ids) if soft else None
        return space_loss(ft, mask_embed, *sar_batch(ids, labels, k, p_ar, state["rng"], pad), probs)

    def held_loss():
        state["rng"] = random.Random(int(tcfg.seed) + 7)  # the same cuts at every evaluation
        try:
            return eval_loss(loss_fn, held, tcfg, pad, target.device)
        finally:
            state["rng"] = train_rng

    def held_eval():
        # acceptance: each mask's top-1 (the candidates'); agreement: over every labelled position, which
        # is mostly plain AR rows, so it tells how far fine-tuning moves the model, not how well it drafts
        loss, agree = held_loss()
        return {"loss": loss, "acceptance": mask_top1(ft, mask_embed, held, tcfg, k, pad, cuts=1), "agreement": agree}

    # lr: the paper uses 5e-5 for 7B+ models; method.lr overrides train.lr

    tcfg_run = merge_settings(tcfg, {"lr": float(mcfg.lr)})
    before = held_loss()
    log, stopped = train_loop("space SAR-SFT", params, loss_fn, train, tcfg_run, pad, target.device,
                              resume=resume_for(cfg, "space", target.key, structure, "sar-sft"), eval_fn=held_eval,
                              rngs=[train_rng])
    after = held_loss()
    settings = run_settings(cfg, len(train), len(held), log, stopped, before, after)
    settings["p_ar"] = p_ar
    if peft_model is not None:  # the delta alone (~10 MB float16 for the embedded model, not its 270 MB)
        weights = {"lora": lora_delta(peft_model)}
    else:
        weights = {"model": {n: v.detach().cpu() for n, v in ft.model.state_dict().items()}}
    path = save_checkpoint("space", target.key, structure,
                           weights | {"mask_embedding": mask_embed.vector.detach().cpu()}, settings)
    write_log(path, log, settings)
    before, after = loss_value(before), loss_value(after)
    print(f"space: held-out SAR-SFT loss {before:.3f} -> {after:.3f} ({stopped}); checkpoint {path}")
    return {"space": str(path), "held_out_loss_before": before, "held_out_loss_after": after}
