"""Trainers for the trainable parts, all on the same self-distillation data.

- `eesd`: the early-exit layer (+ norm, + head if not shared) on frozen first-N layers, then the
  Cali-TS predictor from draft/target agreement labels on the same data. The target's side (the
  input of layer N; for Cali-TS also the final-norm state) comes from the feature cache
  (train/features.py, `train.feature_cache`): one prefill instead of the first N layers at every
  step and evaluation, and a whole target forward per sequence for the Cali-TS labels.
- `vanilla_sd`: the separate draft model (the target's first layers, a copy) distilled on the
  same data, so vanilla SD on the embedded model has a trained draft as the paper's does.

Each trainer shows a progress bar, writes a loss log (and held-out curve) next to its checkpoint,
runs the planned steps (train.max_steps / train.epochs) and resumes an interrupted run (loop.py).
"""

from __future__ import annotations

import random

import torch
from tqdm import tqdm

from specbench.config import settings
from specbench.models.artifacts import file_sha256, find_checkpoint, save_checkpoint
from specbench.control.cali_ts import CaliPredictor
from specbench.core.errors import SpecBenchError
from specbench.methods.eesd import EarlyExit
from specbench.methods.vanilla_sd import draft_num_layers
from specbench.models import ModelAdapter, truncated_copy
from specbench.train.features import target_features
from specbench.train.loop import (
    agreement,
    ce_loss,
    eval_loss,
    pad_id,
    run_settings,
    split_held_out,
    train_loop,
    with_labels,
    write_log,
)
from specbench.train.parts import Part, checkpoint_part, first_use, train_minutes
from specbench.train.resume import drop_states, resume_for

TRAINERS = {}


def trainer(name):
    def deco(fn):
        TRAINERS[name] = fn
        return fn

    return deco


@first_use("eesd")
def eesd_parts(cfg, target):
    """The exit layer, and the Cali-TS predictor trained with it when Cali-TS is the controller."""
    structure = {"n_layers": int(cfg.method.n_layers), "head": cfg.method.head}
    parts = checkpoint_part("the EESD exit layer", "eesd", lambda m: structure)(cfg, target)
    control = cfg.control
    if parts and control.name == "cali_ts" and control.predictor in (None, "auto"):
        # a published predictor counts as present, as the exit layer does (checkpoint_part)
        parts.append(Part("the Cali-TS predictor", find_checkpoint("cali", target.key, structure), "eesd", train_minutes, "eesd"))
    return parts


@trainer("eesd")
def train_eesd(target: ModelAdapter, cfg, sequences) -> dict:

    mcfg, tcfg = cfg.method, cfg.train
    exit_ = EarlyExit(target, int(mcfg.n_layers), mcfg.head).to(target.device)
    n = exit_.n_layers
    train, held = split_held_out(with_labels(target, sequences, tcfg), tcfg)

    cali, soft = bool(tcfg.cali), tcfg.distill == "soft"
    store = target_features(target, train + held, eesd_taps(n, cali or soft), tcfg)

    def loss_fn(ids, labels):
        return eesd_loss(target, exit_, ids, labels, store, soft)

    pad = pad_id(target)
    before = eval_loss(loss_fn, held, tcfg, pad, target.device)
    log, stopped = train_loop("eesd exit layer", list(exit_.parameters()), loss_fn, train, tcfg, pad, target.device,
                              resume=resume_for(cfg, "eesd", target.key, exit_.structure(), "exit"), held=held,
                              inputs=store and store.inputs())
    after = eval_loss(loss_fn, held, tcfg, pad, target.device)
    settings = run_settings(cfg, len(train), len(held), log, stopped, before, after)
    # the exit layer's resume state stays until the predictor is saved: a Ctrl-C in that stage, then the same
    # command, continues from it instead of training the exit layer again from step 0
    path = save_checkpoint("eesd", target.key, exit_.structure(), exit_.trainable_state(), settings, keep_resume=cali)
    write_log(path, log, settings)
    print(f"eesd: held-out loss {before[0]:.3f} -> {after[0]:.3f}, agreement {before[1]:.3f} -> {after[1]:.3f} ({stopped}); {path}")
    result = {"eesd": str(path), "held_out_loss": [before[0], after[0]], "held_out_agreement": [before[1], after[1]]}
    if cali:
        result.update(train_cali(target, exit_, cfg, train, held, store, path))
        if stopped != "train.max_minutes":
            drop_states(path)
    return result


def eesd_taps(n: int, final: bool) -> list:
    """What the EESD trainer reads from the target (train/features.py taps): the input of layer n
    (the exit layer's input), and for the Cali-TS examples or the soft loss the final-norm state too."""
    return [n, "final"] if final else [n]


def eesd_loss(target: ModelAdapter, exit_, ids, labels, store=None, soft: bool = False):
    """Cross-entropy of the exit layer's logits and (right, counted) agreement with the labels.
    `soft` (train.distill=soft): the cross-entropy is to the target's whole next-token distribution
    instead of its label (the agreement still counts the label). `store`: the target's cached
    features (eesd_taps; the layer-n tap first), None or a row not stored: the frozen layers run here."""
    d = target.hidden_size
    feats = store.batch(ids, labels) if store is not None else None
    with torch.no_grad():  # the target's layers are frozen: no graph through them
        h_n = target.run_layers(target.embed(ids), None, 0, exit_.n_layers) if feats is None else feats[..., :d]
    # the 49k-row head over the labelled positions only (the answer, about half of each sequence):
    # the head is most of a step's cost, and the other rows' logits were never read
    keep = labels != -100
    h = exit_.norm(target.run_layers(h_n, None, layers=[exit_.layer], cache_offset=0))
    logits = exit_.logits(h[keep]).unsqueeze(0)
    if not soft or not keep.any():
        return ce_loss(logits, labels[keep].unsqueeze(0))
    agree = agreement(logits.detach(), labels[keep].unsqueeze(0))  # the hard cross-entropy is not computed
    with torch.no_grad():
        final = target.norm(target.run_layers(h_n, None, exit_.n_layers)) if feats is None or feats.shape[-1] == d \
            else feats[..., d:]
        p = torch.softmax(target.lm_head(final[keep]).float(), -1)
    return -(p * torch.log_softmax(logits[0].float(), -1)).sum(-1).mean(), agree


@torch.no_grad()
def cali_features(target: ModelAdapter, exit_, seq: list[int], store=None):
    """Teacher-forced states of one sequence: (target's normed last hidden [T, d], draft's [T, d],
    target's greedy token [T], draft's greedy token [T]), row p computed from seq[:p+1].
    `store` (taps eesd_taps(n, True)): the target's two states read from it when it holds the
    whole sequence; the draft's part is always computed (it is what was just trained)."""
    n, d = exit_.n_layers, target.hidden_size
    cached = store.sequence(seq) if store is not None else None
    if cached is not None:
        cached = cached.to(target.device).unsqueeze(0)
        h_n, t_hidden = cached[..., :d], cached[..., d:]
    else:
        ids = torch.tensor([seq], device=target.device)
        h_n = target.run_layers(target.embed(ids), None, 0, n)
        t_hidden = target.norm(target.run_layers(h_n, None, n))
    d_logits, d_hidden = exit_(target, h_n, None)
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
def cali_examples(target: ModelAdapter, exit_, sequences, max_i: int, per_seq: int, seed: int, store=None):
    """`cali_pair` examples at random (t, i) of each sequence's answer, stacked."""
    rng = random.Random(seed)
    th, dh, ii, lab = [], [], [], []
    for seq, start, *_ in tqdm(sequences, desc="cali-ts labels", unit="seq"):
        feats = cali_features(target, exit_, seq, store)
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


def train_cali(target: ModelAdapter, exit_, cfg, train, held, store=None, exit_path=None) -> dict:
    """`exit_path`: the exit layer's file, whose hash the predictor records (control/cali_ts.py refuses
    to pair the predictor with another exit layer)."""

    ccfg = cfg.train.cali_predictor
    exit_.eval()
    ex = cali_examples(target, exit_, train, int(ccfg.max_i), int(ccfg.pairs_per_sequence), int(cfg.train.seed), store)
    hx = cali_examples(target, exit_, held, int(ccfg.max_i), int(ccfg.pairs_per_sequence), int(cfg.train.seed) + 1, store)
    pred = CaliPredictor(target.hidden_size, int(ccfg.max_i))
    with torch.enable_grad():
        losses = pred.train_on(ex, epochs=int(ccfg.epochs), lr=float(ccfg.lr), batch_size=int(ccfg.batch_size),
                               seed=int(cfg.train.seed))
    with torch.no_grad():
        p = pred(hx[0], hx[1], hx[2])
        acc = float(((p > 0.5).float() == hx[3]).float().mean())
        base = float(hx[3].mean())
    settings = {"max_i": int(ccfg.max_i), "examples": len(ex[3]), "steps": len(losses), "train_sequences": len(train), "positive_rate": float(ex[3].mean()),
                "losses": losses, "held_out_accuracy": acc, "held_out_positive_rate": base,
                "exit_layer_sha256": file_sha256(exit_path) if exit_path else None}
    path = save_checkpoint("cali", target.key, exit_.structure(), pred.state_dict(), settings)
    print(f"cali-ts predictor: {len(ex[3])} examples, held-out accuracy {acc:.3f} (majority baseline {max(base, 1 - base):.3f}); {path}")
    return {"cali": str(path), "cali_held_out_accuracy": acc}


@first_use("vanilla_sd", "hf_assisted")
def draft_parts(cfg, target):
    """The distilled draft (both methods use the one checkpoint) unless another draft is given."""
    d = cfg.method.draft
    if d.source != "truncate" or (settings.has(cfg.method, "mode") and cfg.method.mode != "assistant"):
        return []
    n = draft_num_layers(d, target)
    return checkpoint_part("the distilled vanilla-SD draft", "vanilla_draft", lambda m: {"n_layers": n},
                           "vanilla_sd", "draft.checkpoint")(cfg, target)


def vanilla_draft_loss(draft: ModelAdapter):
    """The draft's next-token loss on its own cache-free forward (what training and scoring read)."""
    def loss_fn(ids, labels):
        return ce_loss(draft.head(draft.run_layers(draft.embed(ids), None)), labels)
    return loss_fn


@trainer("vanilla_sd")
def train_vanilla_draft(target: ModelAdapter, cfg, sequences) -> dict:
    dcfg, tcfg = cfg.method.draft, cfg.train
    n = draft_num_layers(dcfg, target)
    draft = truncated_copy(target, n)
    # embeddings and head stay frozen (tied, the target's): the layers and final norm learn
    trainable = [p for name, p in draft.model.named_parameters() if ".layers." in name or name.endswith("norm.weight")]
    for p in trainable:
        p.requires_grad_(True)
    train, held = split_held_out(with_labels(target, sequences, tcfg), tcfg)
    loss_fn = vanilla_draft_loss(draft)
    pad = pad_id(target)
    before = eval_loss(loss_fn, held, tcfg, pad, target.device)
    log, stopped = train_loop("vanilla draft", trainable, loss_fn, train, tcfg, pad, target.device,
                              resume=resume_for(cfg, "vanilla_draft", target.key, {"n_layers": n}, "draft"), held=held)
    after = eval_loss(loss_fn, held, tcfg, pad, target.device)
    state = {k: v for k, v in draft.model.state_dict().items() if ".layers." in k or k.endswith("norm.weight")}
    settings = run_settings(cfg, len(train), len(held), log, stopped, before, after)
    path = save_checkpoint("vanilla_draft", target.key, {"n_layers": n}, state, settings)
    write_log(path, log, settings)
    print(f"vanilla draft: held-out loss {before[0]:.3f} -> {after[0]:.3f}, agreement {before[1]:.3f} -> {after[1]:.3f} ({stopped}); {path}")
    return {"vanilla_draft": str(path), "held_out_loss": [before[0], after[0]], "held_out_agreement": [before[1], after[1]]}
