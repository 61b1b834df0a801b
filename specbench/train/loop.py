"""The optimisation machinery every trainer shares: batches with loss masks, the AdamW loop with
its time budget, held-out evaluation, train/held-out split, settings and loss logs, LoRA."""

from __future__ import annotations

import json
import random
import time

import torch
from omegaconf import OmegaConf
from torch.nn import functional as F
from tqdm import tqdm

from specbench.errors import SpecBenchError
from specbench.models import ModelAdapter
from specbench.train.data import teacher_labels


def batches(sequences, tcfg, rng):
    """Mini-batches of whole sequences (lists), truncated to train.max_len tokens."""
    order = list(range(len(sequences)))
    rng.shuffle(order)
    bs = int(tcfg.batch_size)
    for i in range(0, len(order), bs):
        yield [sequences[j] for j in order[i : i + bs]]


def pad_batch(batch, max_len, pad_id, device):
    """ids [B, T] right-padded, labels [B, T] with -100 where no loss (prompt, padding).

    A sequence is (ids, loss_start) or (ids, loss_start, teacher): with teacher labels (the
    target's own greedy choice per position) the label at p is teacher[p], else the text's
    token at p+1."""
    width = min(max_len, max(len(s[0]) for s in batch))
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for b, item in enumerate(batch):
        seq, start = item[0][:width], item[1]
        ids[b, : len(seq)] = torch.tensor(seq)
        lo = max(0, start - 1)
        if len(seq) - 1 > lo:
            src = item[2][lo : len(seq) - 1] if len(item) > 2 else seq[lo + 1 :]
            labels[b, lo : len(seq) - 1] = torch.tensor(src)
    return ids.to(device), labels.to(device)


def train_loop(name, params, loss_fn, sequences, tcfg, pad_id, device, groups=None):
    """Shared optimisation loop: AdamW, time budget, progress bar, loss log. `groups`: AdamW
    parameter groups with their own lr (Medusa-2's differential rates); default one group."""
    opt = torch.optim.AdamW(groups or [p for p in params if p.requires_grad], lr=float(tcfg.lr), weight_decay=0.0)
    rng = random.Random(int(tcfg.seed))
    deadline = time.monotonic() + 60 * float(tcfg.max_minutes)
    log, step, labelled = [], 0, 0
    total = int(tcfg.epochs) * ((len(sequences) + int(tcfg.batch_size) - 1) // int(tcfg.batch_size))
    bar = tqdm(total=total, desc=f"train {name}", unit="batch")
    stopped = "epochs"
    with torch.enable_grad():
        for epoch in range(int(tcfg.epochs)):
            for batch in batches(sequences, tcfg, rng):
                if time.monotonic() > deadline:
                    stopped = "time"
                    break
                ids, labels = pad_batch(batch, int(tcfg.max_len), pad_id, device)
                loss, (_, counted) = loss_fn(ids, labels)
                labelled += counted
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                step += 1
                log.append({"step": step, "epoch": epoch, "loss": loss.item()})
                bar.update(1)
                bar.set_postfix(loss=f"{log[-1]['loss']:.3f}")
            if stopped == "time":
                break
    bar.close()
    if step == 0 or labelled == 0:  # never cache an untrained part as trained
        raise SpecBenchError(f"training {name} ran {step} steps over {labelled} labelled tokens ({len(sequences)} training "
                             f"sequences, train.epochs={tcfg.epochs}, train.max_minutes={tcfg.max_minutes}, "
                             f"train.max_len={tcfg.max_len}: answers past max_len carry no label); no checkpoint written")
    return log, stopped


@torch.no_grad()
def eval_loss(loss_fn, sequences, tcfg, pad_id, device, limit=64) -> tuple[float, float]:
    """Mean held-out loss and top-1 agreement with the labels (what acceptance depends on)."""
    losses, right, total = [], 0, 0
    for s in sequences[:limit]:
        loss, (r, t) = loss_fn(*pad_batch([s], int(tcfg.max_len), pad_id, device))
        losses.append(float(loss))
        right, total = right + r, total + t
    return sum(losses) / max(1, len(losses)), right / max(1, total)


def ce_loss(logits, labels):
    """Cross-entropy and (correct, counted) top-1 agreement on labelled positions."""
    flat, lab = logits.flatten(0, 1).float(), labels.flatten()
    keep = lab != -100
    if not keep.any():  # every labelled position was cut by max_len: no signal, not NaN
        return flat.sum() * 0.0, (0, 0)
    right = int(((flat.argmax(-1) == lab) & keep).sum())  # no boolean indexing: fixed shapes
    return F.cross_entropy(flat, lab, ignore_index=-100), (right, int(keep.sum()))


def with_labels(target: ModelAdapter, sequences, tcfg):
    """Attach the target's greedy labels when train.labels is `target` (see data.teacher_labels)."""
    mode = tcfg.get("labels", "text")
    if mode == "text":
        return sequences
    if mode != "target":
        raise SpecBenchError(f"unknown train.labels {mode!r}; allowed: target, text")

    return [(s, st, lab) for (s, st), lab in zip(sequences, teacher_labels(target, sequences))]


def split_held_out(sequences, tcfg):
    n_eval = max(1, int(len(sequences) * float(tcfg.eval_fraction)))
    rng = random.Random(int(tcfg.seed) + 1)
    seqs = list(sequences)
    rng.shuffle(seqs)
    return seqs[n_eval:], seqs[:n_eval]


def pad_id(target: ModelAdapter) -> int:
    return min(target.tokenizer.eos_ids) if target.tokenizer.eos_ids else 0


def run_settings(cfg, n_train, n_held, log, stopped, before, after) -> dict:
    return {
        "train": OmegaConf.to_container(cfg.train, resolve=True),
        "method": OmegaConf.to_container(cfg.method, resolve=True),
        "train_sequences": n_train,
        "held_out_sequences": n_held,
        "steps": len(log),
        "stopped_by": stopped,
        "held_out_loss_before": before[0],
        "held_out_loss_after": after[0],
        "held_out_agreement_before": before[1],
        "held_out_agreement_after": after[1],
    }


def write_log(path, log, settings) -> None:
    path.with_suffix(".log.json").write_text(json.dumps({"settings": settings, "log": log}, indent=1, default=str))


def loss_value(x) -> float:
    """eval_loss returns (loss, agreement) (or a bare loss in older versions)."""
    return float(x[0]) if isinstance(x, (tuple, list)) else float(x)


def agreement(logits, labels) -> tuple[int, int]:
    keep = labels != -100
    if not keep.any():
        return 0, 0
    return int(((logits.argmax(-1) == labels) & keep).sum()), int(keep.sum())  # fixed shapes


def apply_lora(ft: ModelAdapter, structure: dict):
    from peft import LoraConfig, get_peft_model

    names = {n.split(".")[-1] for n, m in ft.model.model.layers.named_modules() if isinstance(m, torch.nn.Linear)}
    if structure.get("lora_head"):  # Medusa-2's recipe adapts the LM head too (untie it from the embedding first)
        names.add("lm_head")
    conf = LoraConfig(r=structure["lora_r"], lora_alpha=structure["lora_alpha"],
                      lora_dropout=float(structure.get("lora_dropout", 0.0)), target_modules=sorted(names))
    return get_peft_model(ft.model, conf)
