"""The optimisation machinery every trainer shares: batches with loss masks, the AdamW loop with its
step budget, schedule, resume states and held-out curve; train/held-out split, settings, logs, LoRA.
The recipe in words: docs/training.md."""

from __future__ import annotations

import contextvars
import json
from contextlib import contextmanager
import math
import random
import time
import warnings

import torch
from torch.nn import functional as F
from tqdm import tqdm

from specbench.config import settings
from specbench.core.errors import SpecBenchError
from specbench.models import ModelAdapter
from specbench.train import resume as resume_state
from specbench.models.distill import teacher_labels


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


def planned_steps(n: int, tcfg) -> tuple[int, str]:
    """(optimiser steps, the bound that sets them): train.max_steps and train.epochs (x batches per
    epoch), whichever is smaller; either may be null, not both."""
    per_epoch = math.ceil(n / int(tcfg.batch_size))
    bounds = [(int(tcfg.max_steps), "max_steps")] if tcfg.max_steps is not None else []
    bounds += [(int(tcfg.epochs) * per_epoch, "epochs")] if tcfg.epochs is not None else []
    if not bounds:
        raise SpecBenchError("train.max_steps and train.epochs are both null: set train.max_steps=N (optimiser steps)")
    return (min(bounds) if n else (0, bounds[0][1]))


def batch_at(sequences, tcfg, step: int) -> list:
    """The batch of optimiser step `step` (0-based): epoch e's order is a shuffle seeded by
    (train.seed, e), so any step's batch is known without replaying the ones before (resume)."""
    bs = int(tcfg.batch_size)
    per_epoch = math.ceil(len(sequences) / bs)
    epoch, i = divmod(step, per_epoch)
    order = list(range(len(sequences)))
    random.Random(int(tcfg.seed) * 1_000_003 + epoch).shuffle(order)
    return [sequences[j] for j in order[i * bs : (i + 1) * bs]]


def lr_factor(step: int, total: int, tcfg) -> float:
    """Learning-rate multiplier at step `step` of `total`: linear warm-up over train.warmup_steps,
    then constant or cosine decay to 0 at `total` (train.schedule)."""
    warm = int(tcfg.warmup_steps)
    if step < warm:
        return (step + 1) / warm
    if tcfg.schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def _due(step: int, every) -> bool:
    return bool(every) and step % int(every) == 0


def _quiet_eval(evaluate, rngs) -> dict:
    """An evaluation that leaves every RNG the training uses as it found it (the weights a run ends
    with do not depend on train.eval_every)."""
    torch_state, states = torch.get_rng_state(), [r.getstate() for r in rngs]
    try:
        with torch.no_grad():
            return evaluate()
    finally:
        torch.set_rng_state(torch_state)
        for r, s in zip(rngs, states):
            r.setstate(s)


def default_eval(loss_fn, held, tcfg, pad, device):
    """Held-out loss and top-1 agreement with the labels: depth-1 acceptance of a chain draft."""
    if not held:
        return None

    def evaluate():
        loss, agree = eval_loss(loss_fn, held, tcfg, pad, device)
        return {"loss": loss, "acceptance": [agree]}

    return evaluate


def train_loop(name, params, loss_fn, sequences, tcfg, *args, **kwargs):
    """_train_loop (below) with CUDA's matmul precision set by train.matmul for its duration."""
    with cuda_matmul(tcfg.matmul):
        return _train_loop(name, params, loss_fn, sequences, tcfg, *args, **kwargs)


@contextmanager
def cuda_matmul(kind: str):
    """train.matmul: `tf32` lets CUDA's float32 matmuls use TF32 tensor cores for the optimisation and
    its held-out evaluations only (the labels and features are computed before, in float32); the
    previous setting comes back after. CPU matmuls are untouched either way."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _train_loop(name, params, loss_fn, sequences, tcfg, pad_id, device, groups=None, *, resume=None, held=None,
                eval_fn=None, rngs=(), on_resume=None, inputs=None):
    """Shared optimisation loop: AdamW, planned steps (planned_steps), learning-rate schedule,
    progress bar, loss log. `groups`: AdamW parameter groups with their own lr (Medusa-2's
    differential rates); default one group. Keyword arguments (all optional):
    resume: a resume.Resume: the state is saved every train.checkpoint_every steps and at the end,
        and a saved state of the same setting is continued from;
    held / eval_fn: held-out sequences (evaluated with loss_fn) or a function () -> {"loss",
        "acceptance": [per depth]}, run at step 0, every train.eval_every steps and at the end;
        logged as the step's "held_out" (step 0: the first step's "held_out_start");
    rngs: random.Random objects loss_fn draws from (saved with the state, untouched by evaluations);
    on_resume: called with the step a resumed run continues from;
    inputs: what the loss reads besides the sequences ({what: path}, a FeatureStore's inputs()).
    train.max_minutes (null by default) is a safety cap: reaching it stops early and says so.
    A loss or gradient that is not finite stops the training at once, before the step changes a
    parameter or a resume state is saved: one line naming the step and the inputs."""
    opt = torch.optim.AdamW(groups or [p for p in params if p.requires_grad], lr=float(tcfg.lr), weight_decay=0.0)
    base_lrs = [g["lr"] for g in opt.param_groups]
    total, bound = planned_steps(len(sequences), tcfg)
    evaluate = eval_fn or default_eval(loss_fn, held, tcfg, pad_id, device)
    every = tcfg.eval_every if evaluate else None
    key = resume_state.full_key(resume, sequences, resume_state.opt_params(opt)) if resume else None
    meta = resume_state.load(resume, key, opt, rngs) if resume else None
    log, labelled, start = (meta["log"], meta["labelled"], meta["step"]) if meta else ([], 0, 0)
    if meta:
        print(f"train {name}: resuming at step {start} of {total} ({resume.path})", flush=True)
        if on_resume:
            on_resume(start)
    cap = tcfg.max_minutes
    deadline = time.monotonic() + 60 * float(cap) if cap is not None else None
    t_eval = time.monotonic()
    first_eval = _quiet_eval(evaluate, rngs) if every and start == 0 else None
    t_eval = time.monotonic() - t_eval
    stopped = bound
    bar = tqdm(total=total, initial=start, desc=f"train {name}", unit="step")
    with torch.enable_grad():
        for s in range(start, total):
            if deadline is not None and time.monotonic() > deadline:
                stopped = "train.max_minutes"
                if resume and log:  # a rerun (a second lent call, a larger cap) continues from here
                    resume_state.save(resume, key, opt, rngs, {"step": s, "labelled": labelled, "log": log})
                break
            t0 = time.monotonic()
            for g, lr in zip(opt.param_groups, base_lrs):
                g["lr"] = lr * lr_factor(s, total, tcfg)
            ids, labels = pad_batch(batch_at(sequences, tcfg, s), int(tcfg.max_len), pad_id, device)
            loss, (_, counted) = loss_fn(ids, labels)
            labelled += counted
            opt.zero_grad()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
            # one host read per step, as before, now ahead of the step: a NaN never reaches a parameter
            value, norm = torch.stack([loss.detach(), norm.to(loss.device, loss.dtype)]).tolist()
            if not (math.isfinite(value) and math.isfinite(norm)):
                bar.close()
                raise SpecBenchError(_not_finite(name, s, total, value, norm, len(sequences), tcfg, inputs,
                                                 resume.path if meta else None))
            opt.step()
            record = {"step": s + 1, "epoch": s // math.ceil(len(sequences) / int(tcfg.batch_size)),
                      "loss": value, "lr": opt.param_groups[0]["lr"]}
            if first_eval is not None:
                record["held_out_start"], first_eval = first_eval, None
            if every and (_due(s + 1, every) or s + 1 == total):
                record["held_out"] = _quiet_eval(evaluate, rngs)
            log.append(record)
            if s == start:
                _print_plan(name, len(sequences), total - start, tcfg, bound, time.monotonic() - t0,
                            t_eval, every, resumed=start)
            if resume and (_due(s + 1, tcfg.checkpoint_every) or s + 1 == total):
                resume_state.save(resume, key, opt, rngs, {"step": s + 1, "labelled": labelled, "log": log})
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.3f}")
    bar.close()
    if stopped == "train.max_minutes":
        print(f"train {name}: stopped early by the safety cap train.max_minutes={cap} after {len(log)} of {total} "
              "steps (recorded in the artifact's settings)", flush=True)
    if not log or labelled == 0:  # never cache an untrained part as trained
        raise SpecBenchError(f"training {name} ran {len(log)} steps over {labelled} labelled tokens ({len(sequences)} training "
                             f"sequences, train.max_steps={tcfg.max_steps}, train.epochs={tcfg.epochs}, "
                             f"train.max_minutes={cap}, train.max_len={tcfg.max_len}: answers past max_len carry no label); "
                             "no checkpoint written")
    return log, stopped


def _not_finite(name, step, total, loss, norm, n, tcfg, inputs, resumed_from) -> str:
    what = f"the loss is {loss}" if not math.isfinite(loss) else f"the gradient norm is {norm}"
    read = [f"{k} {v}" for k, v in (inputs or {}).items()] + [f"{n} training sequences"]
    read += [f"the resume state {resumed_from}"] if resumed_from else []
    return (f"training {name} stopped at step {step + 1} of {total}: {what}, not finite; stopped before the step "
            f"changed a parameter, no checkpoint written. It read {', '.join(read)}: delete a damaged input and "
            f"rerun; a diverging loss wants a lower train.lr (now {tcfg.lr})")


def _print_plan(name, n, steps, tcfg, bound, t_step, t_eval, every, resumed: int) -> None:
    evals = (steps // int(every) + 1) if every else 0
    minutes = (steps * t_step + evals * t_eval) / 60
    again = f" (resumed at step {resumed})" if resumed else ""
    tqdm.write(f"train {name}: {n} sequences, {steps} steps of {int(tcfg.batch_size)} (train.{bound}){again}; "
               f"estimated ~{minutes:.1f} min on this machine (an estimate, from the timed first step)")


@torch.no_grad()
def eval_loss(loss_fn, sequences, tcfg, pad_id, device, limit=64) -> tuple[float, float]:
    """Mean held-out loss and top-1 agreement with the labels (what acceptance depends on), over the
    sequences with labelled tokens: one whose answer lies past train.max_len has no loss (its 0 pulled
    the mean down), and none at all gives nan, not a 0.000 that reads as a measurement."""
    losses, right, total = [], 0, 0
    for s in sequences[:limit]:
        loss, (r, t) = loss_fn(*pad_batch([s], int(tcfg.max_len), pad_id, device))
        if t:
            losses.append(float(loss))
        right, total = right + r, total + t
    if not total:
        return float("nan"), float("nan")
    return sum(losses) / len(losses), right / total


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
    mode = tcfg.labels
    if mode == "text":
        return sequences
    if mode != "target":
        raise SpecBenchError(f"unknown train.labels {mode!r}; allowed: target, text")

    labels = teacher_labels(target, sequences, int(tcfg.prefill_batch_size))
    return [(s, st, lab) for (s, st), lab in zip(sequences, labels)]


def split_held_out(sequences, tcfg):
    n_eval = max(1, int(len(sequences) * float(tcfg.eval_fraction)))
    rng = random.Random(int(tcfg.seed) + 1)
    seqs = list(sequences)
    rng.shuffle(seqs)
    return seqs[n_eval:], seqs[:n_eval]


def pad_id(target: ModelAdapter) -> int:
    return min(target.tokenizer.eos_ids) if target.tokenizer.eos_ids else 0


# what the session trains on (specbench/train/session.py sets it): the data's size, hash and whether a
# safety cap cut its generation short; every trainer's run_settings records it
DATA: contextvars.ContextVar = contextvars.ContextVar("specbench_train_data", default=None)


def run_settings(cfg, n_train, n_held, log, stopped, before, after) -> dict:
    """The artifact's settings. Deterministic (no times, no paths): the same setting trained again,
    or resumed, gives the same bytes, hence the same provenance hash."""
    data = DATA.get()
    return {
        "train": settings.record(cfg.train),
        "method": settings.record(cfg.method),
        "train_sequences": n_train,
        "held_out_sequences": n_held,
        "steps": len(log),
        "stopped_by": stopped,
        "capped": str(stopped).startswith("train.") or bool(data and data.get("stopped_by")),
        **({"data": data} if data else {}),
        "held_out_loss_before": before[0],
        "held_out_loss_after": after[0],
        "held_out_agreement_before": before[1],
        "held_out_agreement_after": after[1],
    }


def curve(log) -> list[dict]:
    """The held-out evaluations of a log, by optimiser step: [{"step", "loss", "acceptance"}]."""
    out = []
    for r in log:
        if "held_out_start" in r:
            out.append({"step": r["step"] - 1, **r["held_out_start"]})
        if "held_out" in r:
            out.append({"step": r["step"], **r["held_out"]})
    return out


def write_log(path, log, settings) -> None:
    """The training log next to the artifact: settings, per-step losses, the held-out curve."""
    body = {"settings": settings, "log": log, "curve": curve(log)}
    path.with_suffix(".log.json").write_text(json.dumps(body, indent=1, default=str))


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
    with warnings.catch_warnings():
        # peft (0.21.2, the newest) reads `model.is_gradient_checkpointing`, which transformers 5.24 deprecates
        # (FutureWarning: use `is_activation_checkpointing`); not our call, and our copy is never checkpointed
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(ft.model, conf)


def lora_delta(peft_model) -> dict:
    """The trained LoRA factors of `apply_lora`'s model, named by the adapted module in the plain
    model (`<module>.A` [r, in], `<module>.B` [out, r]): what `methods.space.merge_lora` adds back
    onto a copy of the target. A few MB where the merged model is the whole target."""
    out = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            base = name.removeprefix("base_model.model.")
            out[f"{base}.A"] = module.lora_A["default"].weight.detach().cpu()
            out[f"{base}.B"] = module.lora_B["default"].weight.detach().cpu()
    return out
