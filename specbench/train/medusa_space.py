"""Trainers for Medusa-1 heads and SPACE SAR-SFT, on the same self-distillation sequences.

- `medusa` (Medusa-1): frozen backbone; loss sum_k 0.8^k CE(head_k(h_t), y_{t+k+1}) on the loss
  region of each sequence. Per-head rank accuracies on the held-out sequences are stored in the
  checkpoint settings (`head_accuracy[k][r]`: how often head k+1's rank-r token is the right
  one; `head_top1`), which `tree_from_accuracies` turns into a sparse tree.
- `space` (SAR-SFT, eqs. 2-4): per sequence, with probability p_ar the plain AR loss; otherwise a
  random cut m inside the answer, the input y_<m followed by k mask tokens, AR loss up to y_m
  and the masks trained to predict y_(m+1)..y_(m+k) (mask j after y_(m-1) predicts the token j
  places after the one y_(m-1) predicts, which is what decoding reads from a mask group). Full
  fine-tuning of a copy of the model plus the [M] vector, or LoRA (peft) with `lora: true`
  (merged into the weights before saving). The checkpoint stores the full fine-tuned state.
"""

from __future__ import annotations

import random

import torch
from torch.nn import functional as F

from specbench.artifacts import save_checkpoint
from specbench.methods.medusa import MedusaHeads, medusa2_structure
from specbench.methods.space import MASK, MaskedEmbed, finetuned_copy, space_structure
from specbench.models import ModelAdapter
from specbench.train.parts import checkpoint_part, first_use
from specbench.train.trainers import (
    TRAINERS,
    _loop,
    _pad,
    _pad_id,
    _settings,
    _split,
    _write_log,
    eval_loss,
    trainer,
)

try:  # train.labels: text | target (the target's own greedy labels)
    from specbench.train.trainers import with_labels
except ImportError:  # older trainers module
    def with_labels(target, sequences, tcfg):
        return sequences


def _loss_only(x) -> float:
    """eval_loss returns (loss, agreement) (or a bare loss in older versions)."""
    return float(x[0]) if isinstance(x, (tuple, list)) else float(x)


def _agree(logits, labels) -> tuple[int, int]:
    keep = labels != -100
    if not keep.any():
        return 0, 0
    return int(((logits.argmax(-1) == labels) & keep).sum()), int(keep.sum())  # fixed shapes


# -- Medusa -----------------------------------------------------------------------------------
def medusa_loss(target: ModelAdapter, heads, ids, labels, decay: float = 0.8):
    """(loss, (right, counted) top-1 agreement of head 1). labels[p] is what position p should
    predict (text token p+1 or the target's greedy choice), so head k at p learns labels[p+k]."""
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
                agree = _agree(logits.detach(), tgt)
    loss = total if torch.is_tensor(total) else torch.zeros((), device=ids.device, requires_grad=True)
    return loss, agree


@torch.no_grad()
def medusa_accuracy(target, heads, sequences, tcfg, pad_id, ranks: int = 10, limit: int = 64) -> list[list[float]]:
    hits = torch.zeros(heads.num_heads, ranks, dtype=torch.float64)
    counts = torch.zeros(heads.num_heads, dtype=torch.float64)
    for s in sequences[:limit]:
        ids, labels = _pad([s], int(tcfg.max_len), pad_id, target.device)
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
    if cfg.method.get("variant", "medusa1") == "medusa2":  # the medusa trainer hands medusa2 to its own trainer
        return checkpoint_part("the Medusa-2 backbone + heads (joint training)", "medusa2", medusa2_structure, "medusa")(cfg, target)
    return checkpoint_part("the Medusa heads", "medusa",
                           lambda m: {"num_heads": int(m.num_heads), "share_head": bool(m.share_head)})(cfg, target)


@trainer("medusa")
def train_medusa(target: ModelAdapter, cfg, sequences) -> dict:

    mcfg, tcfg = cfg.method, cfg.train
    if mcfg.get("variant", "medusa1") == "medusa2":  # registered by specbench.train.medusa2 (it imports this module)
        return TRAINERS["medusa2"](target, cfg, sequences)
    heads = MedusaHeads(target, int(mcfg.get("num_heads", 4)), bool(mcfg.get("share_head", False)))
    for p in heads.parameters():
        p.requires_grad_(True)
    heads.train()
    train, held = _split(with_labels(target, sequences, tcfg), tcfg)
    decay = float(mcfg.get("loss_decay", 0.8))

    def loss_fn(ids, labels):
        return medusa_loss(target, heads, ids, labels, decay)

    pad = _pad_id(target)
    before = eval_loss(loss_fn, held, tcfg, pad, target.device)
    log, stopped = _loop("medusa heads", list(heads.parameters()), loss_fn, train, tcfg, pad, target.device)
    after = eval_loss(loss_fn, held, tcfg, pad, target.device)
    heads.eval()
    acc = medusa_accuracy(target, heads, held, tcfg, pad)
    settings = _settings(cfg, len(train), len(held), log, stopped, before, after)
    settings |= {"head_accuracy": acc, "head_top1": [row[0] for row in acc]}
    state = {k: v.detach().cpu() for k, v in heads.state_dict().items()}
    path = save_checkpoint("medusa", target.key, heads.structure(), state, settings)
    _write_log(path, log, settings)
    before, after = _loss_only(before), _loss_only(after)
    print(f"medusa: held-out loss {before:.3f} -> {after:.3f} ({stopped}); top-1 per head "
          + ", ".join(f"{a[0]:.3f}" for a in acc) + f"; checkpoint {path}")
    return {"medusa": str(path), "held_out_loss_before": before, "held_out_loss_after": after,
            "head_top1": [a[0] for a in acc]}


# -- SPACE ------------------------------------------------------------------------------------
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


def space_loss(ft: ModelAdapter, mask_embed, ids, labels) -> torch.Tensor:
    logits = space_logits(ft, mask_embed, ids)
    if not (labels != -100).any():  # nothing to learn here (e.g. the answer lies past max_len): no NaN
        return logits.sum() * 0.0, (0, 0)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
    return loss, _agree(logits.detach(), labels)


def _apply_lora(ft: ModelAdapter, structure: dict):
    from peft import LoraConfig, get_peft_model

    names = {n.split(".")[-1] for n, m in ft.model.model.layers.named_modules() if isinstance(m, torch.nn.Linear)}
    conf = LoraConfig(r=structure["lora_r"], lora_alpha=structure["lora_alpha"], lora_dropout=0.0,
                      target_modules=sorted(names))
    return get_peft_model(ft.model, conf)


first_use("space")(checkpoint_part("the SPACE SAR-SFT weights", "space", space_structure))


@trainer("space")
def train_space(target: ModelAdapter, cfg, sequences) -> dict:

    mcfg, tcfg = cfg.method, cfg.train
    structure = space_structure(mcfg)
    k, p_ar = structure["k"], float(mcfg.get("p_ar", 0.5))
    ft = finetuned_copy(target, "space-training", structure)
    mask_embed = MaskedEmbed(target, int(tcfg.seed))
    mask_embed.vector.requires_grad_(True)
    peft_model = None
    if structure["lora"]:
        peft_model = _apply_lora(ft, structure)  # injects LoRA modules in place; ft's layers see them
        params = [p for p in peft_model.parameters() if p.requires_grad]
    else:
        for p in ft.model.parameters():
            p.requires_grad_(True)
        params = list(ft.model.parameters())
    params.append(mask_embed.vector)
    ft.model.train()
    train, held = _split(with_labels(target, sequences, tcfg), tcfg)
    pad = _pad_id(target)
    state = {"rng": random.Random(int(tcfg.seed))}

    def loss_fn(ids, labels):
        return space_loss(ft, mask_embed, *sar_batch(ids, labels, k, p_ar, state["rng"], pad))

    def held_loss():
        state["rng"] = random.Random(int(tcfg.seed) + 7)  # the same cuts before and after
        out = eval_loss(loss_fn, held, tcfg, pad, target.device)
        state["rng"] = random.Random(int(tcfg.seed))
        return out

    # lr: the paper uses 5e-5 for 7B+ models; method.lr overrides train.lr
    from omegaconf import OmegaConf

    tcfg_run = OmegaConf.merge(tcfg, {"lr": float(mcfg.get("lr", tcfg.lr))})
    before = held_loss()
    log, stopped = _loop("space SAR-SFT", params, loss_fn, train, tcfg_run, pad, target.device)
    after = held_loss()
    if peft_model is not None:
        peft_model.merge_and_unload()
    ft.model.eval()
    settings = _settings(cfg, len(train), len(held), log, stopped, before, after)
    settings["p_ar"] = p_ar
    model_state = {n: v.detach().cpu() for n, v in ft.model.state_dict().items()}
    path = save_checkpoint("space", target.key, structure,
                           {"model": model_state, "mask_embedding": mask_embed.vector.detach().cpu()}, settings)
    _write_log(path, log, settings)
    before, after = _loss_only(before), _loss_only(after)
    print(f"space: held-out SAR-SFT loss {before:.3f} -> {after:.3f} ({stopped}); checkpoint {path}")
    return {"space": str(path), "held_out_loss_before": before, "held_out_loss_after": after}
