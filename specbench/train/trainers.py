"""Trainers for the trainable parts, all on the same self-distillation data.

- `eesd`: the early-exit layer (+ norm, + head if not shared) on frozen first-N layers, then the
  Cali-TS predictor from draft/target agreement labels on the same data.
- `vanilla_sd`: the separate draft model (the target's first layers, a copy) distilled on the
  same data, so vanilla SD on the embedded model has a trained draft as the paper's does.

Each trainer shows a progress bar, writes a loss log next to its checkpoint, and stops at
`train.max_minutes` or after `train.epochs`, whichever comes first.
"""

from __future__ import annotations

import json
import random
import time

import torch
from torch.nn import functional as F
from tqdm import tqdm

from specbench.artifacts import checkpoint_path, save_checkpoint
from specbench.control.cali_ts import CaliPredictor
from specbench.errors import SpecBenchError
from specbench.methods.eesd import EarlyExit
from specbench.methods.vanilla_sd import draft_num_layers
from specbench.models import ModelAdapter, truncated_copy
from specbench.train.data import teacher_labels
from specbench.train.parts import Part, checkpoint_part, first_use, train_minutes

TRAINERS = {}


def trainer(name):
    def deco(fn):
        TRAINERS[name] = fn
        return fn

    return deco


def _batches(sequences, tcfg, rng):
    """Mini-batches of whole sequences (lists), truncated to train.max_len tokens."""
    order = list(range(len(sequences)))
    rng.shuffle(order)
    bs = int(tcfg.batch_size)
    for i in range(0, len(order), bs):
        yield [sequences[j] for j in order[i : i + bs]]


def _pad(batch, max_len, pad_id, device):
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


def _loop(name, params, loss_fn, sequences, tcfg, pad_id, device, groups=None):
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
            for batch in _batches(sequences, tcfg, rng):
                if time.monotonic() > deadline:
                    stopped = "time"
                    break
                ids, labels = _pad(batch, int(tcfg.max_len), pad_id, device)
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
        loss, (r, t) = loss_fn(*_pad([s], int(tcfg.max_len), pad_id, device))
        losses.append(float(loss))
        right, total = right + r, total + t
    return sum(losses) / max(1, len(losses)), right / max(1, total)


def _ce(logits, labels):
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


def _split(sequences, tcfg):
    n_eval = max(1, int(len(sequences) * float(tcfg.eval_fraction)))
    rng = random.Random(int(tcfg.seed) + 1)
    seqs = list(sequences)
    rng.shuffle(seqs)
    return seqs[n_eval:], seqs[:n_eval]


def _pad_id(target: ModelAdapter) -> int:
    return min(target.tokenizer.eos_ids) if target.tokenizer.eos_ids else 0


@first_use("eesd")
def eesd_parts(cfg, target):
    """The exit layer, and the Cali-TS predictor trained with it when Cali-TS is the controller."""
    structure = {"n_layers": int(cfg.method.n_layers), "head": cfg.method.get("head", "shared")}
    parts = checkpoint_part("the EESD exit layer", "eesd", lambda m: structure)(cfg, target)
    control = cfg.get("control") or {}
    if parts and control.get("name") == "cali_ts" and control.get("predictor") in (None, "auto"):
        parts.append(Part("the Cali-TS predictor", checkpoint_path("cali", target.key, structure), "eesd", train_minutes, "eesd"))
    return parts


@trainer("eesd")
def train_eesd(target: ModelAdapter, cfg, sequences) -> dict:

    mcfg, tcfg = cfg.method, cfg.train
    exit_ = EarlyExit(target, int(mcfg.n_layers), mcfg.get("head", "shared")).to(target.device)
    n = exit_.n_layers
    train, held = _split(with_labels(target, sequences, tcfg), tcfg)

    def loss_fn(ids, labels):
        with torch.no_grad():  # the first N layers are frozen: no graph through them
            h_n = target.run_layers(target.embed(ids), None, 0, n)
        logits, _ = exit_(target, h_n, None)
        return _ce(logits, labels)

    pad = _pad_id(target)
    before = eval_loss(loss_fn, held, tcfg, pad, target.device)
    log, stopped = _loop("eesd exit layer", list(exit_.parameters()), loss_fn, train, tcfg, pad, target.device)
    after = eval_loss(loss_fn, held, tcfg, pad, target.device)
    settings = _settings(cfg, len(train), len(held), log, stopped, before, after)
    path = save_checkpoint("eesd", target.key, exit_.structure(), exit_.trainable_state(), settings)
    _write_log(path, log, settings)
    print(f"eesd: held-out loss {before[0]:.3f} -> {after[0]:.3f}, agreement {before[1]:.3f} -> {after[1]:.3f} ({stopped}); {path}")
    result = {"eesd": str(path), "held_out_loss": [before[0], after[0]], "held_out_agreement": [before[1], after[1]]}
    if cfg.train.get("cali", True):
        result.update(train_cali(target, exit_, cfg, train, held))
    return result


def _settings(cfg, n_train, n_held, log, stopped, before, after) -> dict:
    from omegaconf import OmegaConf

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


def _write_log(path, log, settings) -> None:
    path.with_suffix(".log.json").write_text(json.dumps({"settings": settings, "log": log}, indent=1, default=str))


@torch.no_grad()
def cali_features(target: ModelAdapter, exit_, seq: list[int]):
    """Teacher-forced states of one sequence: (target's normed last hidden [T, d], draft's [T, d],
    target's greedy token [T], draft's greedy token [T]), row p computed from seq[:p+1]."""
    ids = torch.tensor([seq], device=target.device)
    n = exit_.n_layers
    h_n = target.run_layers(target.embed(ids), None, 0, n)
    d_logits, d_hidden = exit_(target, h_n, None)
    t_hidden = target.norm(target.run_layers(h_n, None, n))
    return t_hidden[0], d_hidden[0], target.lm_head(t_hidden).argmax(-1)[0], d_logits.argmax(-1)[0]


def cali_pair(feats, t: int, i: int) -> tuple[torch.Tensor, torch.Tensor, int, float]:
    """One predictor example, paired as at decode time (EESD eq. 5, `methods/base.py`
    draft_loop): t is the last verified token, whose target state H^T_t produced the pending
    token at t+1; draft token i is the draft's output at input position t+i (the pending token
    for i=1), so its state is H^D_(t+i), a gap of i. Label: that draft token equals the target's
    token there (on the committed sequence: draft token i is accepted, given 1..i-1 were)."""
    t_hidden, d_hidden, t_tok, d_tok = feats
    j = t + i
    return t_hidden[t], d_hidden[j], i, float(d_tok[j] == t_tok[j])


@torch.no_grad()
def cali_examples(target: ModelAdapter, exit_, sequences, max_i: int, per_seq: int, seed: int):
    """`cali_pair` examples at random (t, i) of each sequence's answer, stacked."""
    rng = random.Random(seed)
    th, dh, ii, lab = [], [], [], []
    for seq, start, *_ in tqdm(sequences, desc="cali-ts labels", unit="seq"):
        feats = cali_features(target, exit_, seq)
        T = len(seq)
        for _ in range(per_seq):
            t = rng.randrange(max(0, start - 1), T - 1)
            i = rng.randint(1, max_i)
            if t + i >= T:
                continue
            a, b, c, d = cali_pair(feats, t, i)
            th.append(a)
            dh.append(b)
            ii.append(c)
            lab.append(d)
    if not th:
        raise SpecBenchError(f"no Cali-TS training pairs from {len(sequences)} sequences (too short?); no checkpoint written")
    return torch.stack(th).float(), torch.stack(dh).float(), torch.tensor(ii), torch.tensor(lab)


def train_cali(target: ModelAdapter, exit_, cfg, train, held) -> dict:

    ccfg = cfg.train.cali_predictor
    exit_.eval()
    ex = cali_examples(target, exit_, train, int(ccfg.max_i), int(ccfg.pairs_per_sequence), int(cfg.train.seed))
    hx = cali_examples(target, exit_, held, int(ccfg.max_i), int(ccfg.pairs_per_sequence), int(cfg.train.seed) + 1)
    pred = CaliPredictor(target.hidden_size, int(ccfg.max_i))
    with torch.enable_grad():
        losses = pred.train_on(ex, epochs=int(ccfg.epochs), lr=float(ccfg.lr), batch_size=int(ccfg.batch_size),
                               seed=int(cfg.train.seed))
    with torch.no_grad():
        p = pred(hx[0], hx[1], hx[2])
        acc = float(((p > 0.5).float() == hx[3]).float().mean())
        base = float(hx[3].mean())
    settings = {"max_i": int(ccfg.max_i), "examples": len(ex[3]), "steps": len(losses), "train_sequences": len(train), "positive_rate": float(ex[3].mean()),
                "losses": losses, "held_out_accuracy": acc, "held_out_positive_rate": base}
    path = save_checkpoint("cali", target.key, exit_.structure(), pred.state_dict(), settings)
    print(f"cali-ts predictor: {len(ex[3])} examples, held-out accuracy {acc:.3f} (majority baseline {max(base, 1 - base):.3f}); {path}")
    return {"cali": str(path), "cali_held_out_accuracy": acc}


@first_use("vanilla_sd", "hf_assisted")
def draft_parts(cfg, target):
    """The distilled draft (both methods use the one checkpoint) unless another draft is given."""
    d = cfg.method.get("draft") or {}
    if d.get("source", "truncate") != "truncate" or cfg.method.get("mode", "assistant") != "assistant":
        return []
    n = draft_num_layers(d, target)
    return checkpoint_part("the distilled vanilla-SD draft", "vanilla_draft", lambda m: {"n_layers": n},
                           "vanilla_sd", "draft.checkpoint")(cfg, target)


@trainer("vanilla_sd")
def train_vanilla_draft(target: ModelAdapter, cfg, sequences) -> dict:
    dcfg, tcfg = cfg.method.draft, cfg.train
    n = draft_num_layers(dcfg, target)
    draft = truncated_copy(target, n)
    # embeddings and head stay frozen (tied, the target's): the layers and final norm learn
    trainable = [p for name, p in draft.model.named_parameters() if ".layers." in name or name.endswith("norm.weight")]
    for p in trainable:
        p.requires_grad_(True)
    train, held = _split(with_labels(target, sequences, tcfg), tcfg)

    def loss_fn(ids, labels):
        h = draft.run_layers(draft.embed(ids), None)
        return _ce(draft.head(h), labels)

    pad = _pad_id(target)
    before = eval_loss(loss_fn, held, tcfg, pad, target.device)
    log, stopped = _loop("vanilla draft", trainable, loss_fn, train, tcfg, pad, target.device)
    after = eval_loss(loss_fn, held, tcfg, pad, target.device)
    state = {k: v for k, v in draft.model.state_dict().items() if ".layers." in k or k.endswith("norm.weight")}
    settings = _settings(cfg, len(train), len(held), log, stopped, before, after)
    path = save_checkpoint("vanilla_draft", target.key, {"n_layers": n}, state, settings)
    _write_log(path, log, settings)
    print(f"vanilla draft: held-out loss {before[0]:.3f} -> {after[0]:.3f}, agreement {before[1]:.3f} -> {after[1]:.3f} ({stopped}); {path}")
    return {"vanilla_draft": str(path), "held_out_loss": [before[0], after[0]], "held_out_agreement": [before[1], after[1]]}
