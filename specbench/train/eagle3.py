"""Training EAGLE-3's draft (methods/eagle3_head.py) with the training-time test, as the authors'
eagle/traineagle3/cnets.py `Model.forward` does.

- Draft vocabulary: the `draft_vocab_size` most frequent loss tokens of the training sequences
  (EOS always kept; ties and unseen tokens by id: methods/draft_vocab.py's ranking), as d2t/t2d.
- Training-time test, `ttt_steps` steps over every position t at once (ttt_unroll). Step 0 row t
  reads (fc(target taps at t), x_(t+1)) at position t; step j reads (the draft's own step j-1
  output at row t, x_(t+1+j)) at position t + j, attending to step 0's rows <= t and to its own
  row at steps 1..j-1 (the authors' mask layout). That is exactly what decoding shows the draft
  at depth j of the tree along the accepted path (tests/test_eagle3.py compares both).
  Tokens are the data's (the accepted path's tokens), features the draft's own.
- Loss at step j: cross-entropy of the draft's distribution over its vocabulary against the
  target's distribution restricted to that vocabulary (renormalised) at position t+1+j, on
  labelled positions whose label is in the draft vocabulary (the authors' position mask:
  t2d[target argmax], = the label with train.labels=target), weighted step_decay**j (0.8).
  No feature regression. Reported agreement: step 0's top-1 (mapped to target ids) against the
  label, on every labelled position.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.nn import functional as F

from specbench.models.artifacts import save_checkpoint
from specbench.methods.draft_vocab import rank_tokens, subset_ids
from specbench.methods.eagle3_head import Eagle3Head, draft_size, lm_head_mode, load_eagle3, structure_of, tap_layers
from specbench.models import ModelAdapter
from specbench.train.features import target_features
from specbench.train.loop import eval_loss, pad_batch, pad_id, run_settings, split_held_out, train_loop, with_labels, write_log
from specbench.train.parts import checkpoint_part, first_use, init_record
from specbench.train.resume import resume_for
from specbench.train.trainers import trainer


class UnrollCache:
    """A KV cache for the unroll that keeps autograd's graph: entries are concatenated, never
    written in place (engine/cache.py's buffers are, which backward through several steps forbids)."""

    def __init__(self):
        self.keys, self.values = None, None

    def length(self, layer: int = 0) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    get_seq_length = length

    def update(self, key, value, layer_idx, *_, **__):
        self.keys = key if self.keys is None else torch.cat((self.keys, key), -2)
        self.values = value if self.values is None else torch.cat((self.values, value), -2)
        return self.keys, self.values


def ttt_mask(n: int, j: int, device=None) -> torch.Tensor | None:
    """[n, (j+1) n] for step j: step 0's rows causally, then each later step's own row only."""
    if j == 0:
        return None  # causal
    eye = torch.eye(n, dtype=torch.bool, device=device)
    return torch.cat([torch.ones(n, n, dtype=torch.bool, device=device).tril()] + [eye] * j, -1)


def shifted(x: torch.Tensor, by: int, n: int, fill) -> torch.Tensor:
    """x[:, by : by + n], right-padded with `fill` to n columns."""
    part = x[:, by: by + n]
    if part.shape[1] < n:
        part = torch.cat([part, part.new_full((x.shape[0], n - part.shape[1]), fill)], 1)
    return part


def ttt_unroll(head: Eagle3Head, taps: torch.Tensor, ids: torch.Tensor, steps: int, pad: int, record=None):
    """The draft's outputs at steps 0..steps-1 ([B, n, d] each, n = T-1) for taps [B, n, 3d] (target
    positions 0..T-2) and ids [B, T]. `record(j, features, tokens, positions, out)`: tests."""
    n = taps.shape[1]
    cache, h, outs = UnrollCache(), head.project(taps), []
    for j in range(steps):
        toks = shifted(ids, 1 + j, n, pad)
        pos = torch.arange(n, device=taps.device) + j
        out = head(h, toks, cache, positions=pos, tree_mask=ttt_mask(n, j, taps.device))
        if record is not None:
            record(j, h, toks, pos, out)
        outs.append(out)
        h = out
    return outs


def feature_taps(head: Eagle3Head) -> list:
    """What the loss reads of the target (features.py): the three layer inputs, the final-norm state."""
    return [*head.layers, "final"]


@torch.no_grad()
def target_side(target: ModelAdapter, head: Eagle3Head, ids: torch.Tensor, cached: torch.Tensor | None = None):
    """Taps [B, T-1, 3d] at positions 0..T-2 and the target's distribution over the draft
    vocabulary at every position [B, T, V'] (its head's rows of those ids: never a [B, T, V] tensor).
    `cached`: the batch's feature_taps from the feature cache (else the target runs here)."""
    if cached is None:
        h, taps = target.run_layers_tapped(target.embed(ids), None, head.layers)
        hn = target.norm(h)
    else:
        taps, hn = cached[..., : -target.hidden_size], cached[..., -target.hidden_size:]
    rows = head.target_ids()
    w = target.lm_head.weight[rows]
    bias = None if target.lm_head.bias is None else target.lm_head.bias[rows]
    p = torch.softmax(F.linear(hn, w, bias).float(), -1)
    return taps[:, :-1], p


def eagle3_loss(target: ModelAdapter, head: Eagle3Head, ids, labels, steps: int = 7, decay: float = 0.8, pad: int = 0,
                per_step: list | None = None, store=None):
    """(loss, (right, counted)): see the module doc. `per_step`: a list that receives (right,
    counted) of every unrolled step j (the held-out acceptance at tree depth j+1). `store`: the
    target's cached features (train/features.py), None: computed here."""
    taps, p = target_side(target, head, ids, store.batch(ids, labels) if store is not None else None)
    n = taps.shape[1]
    outs = ttt_unroll(head, taps, ids, steps, pad)
    total, right, counted = taps.new_zeros(()).float(), 0, 0
    for j, out in enumerate(outs):
        lab = shifted(labels, 1 + j, n, -100)  # the label of position t+1+j: what row t predicts at step j
        inside = lab != -100
        keep = inside & head.t2d[lab.clamp(min=0)]
        if j == 0 or per_step is not None:
            guess = head.target_ids()[head.draft_logits(out[inside]).argmax(-1)]
            r, c = int((guess == lab[inside]).sum()), int(inside.sum())
            right, counted = (r, c) if j == 0 else (right, counted)
            if per_step is not None:
                per_step.append((r, c))
        if keep.any():
            logq = F.log_softmax(head.draft_logits(out[keep]).float(), -1)
            pj = shifted_rows(p, 1 + j, n)[keep]
            total = total + decay ** j * -(pj * logq).sum(-1).mean()
    if counted == 0:
        return total + sum(o.sum() for o in outs) * 0.0, (0, 0)
    return total, (right, counted)


def shifted_rows(p: torch.Tensor, by: int, n: int) -> torch.Tensor:
    """p[:, by : by + n] zero-padded to n rows (padded rows are never kept)."""
    part = p[:, by: by + n]
    if part.shape[1] < n:
        part = torch.cat([part, part.new_zeros((p.shape[0], n - part.shape[1], p.shape[2]))], 1)
    return part


def ttt_eval(target: ModelAdapter, head: Eagle3Head, held, tcfg, steps: int, decay: float, pad: int,
             limit: int = 64, store=None) -> dict:
    """Held-out loss and the top-1 agreement of every unrolled step with its label (acceptance at
    depth j+1 along the accepted path), over at most `limit` sequences."""
    losses, right, count = [], [0] * steps, [0] * steps
    for s in held[:limit]:
        stats: list = []
        ids, labels = pad_batch([s], int(tcfg.max_len), pad, target.device)
        losses.append(float(eagle3_loss(target, head, ids, labels, steps, decay, pad, per_step=stats, store=store)[0]))
        for j, (r, c) in enumerate(stats):
            right[j], count[j] = right[j] + r, count[j] + c
    return {"loss": sum(losses) / max(1, len(losses)), "acceptance": [r / max(1, c) for r, c in zip(right, count)]}


def draft_vocabulary(target: ModelAdapter, sequences, size: int) -> torch.Tensor:
    """The `size` most frequent loss tokens (+ EOS), sorted target ids."""
    return subset_ids(rank_tokens(sequences, target.vocab_size), size, target.vocab_size,
                      keep=sorted(target.tokenizer.eos_ids or ()))


def start_from(target: ModelAdapter, head: Eagle3Head, mcfg, where, own_vocab: bool) -> dict:
    """train.init: start from a trained draft (`auto`: the one a run loads, the cache's or the
    published one; or a path) instead of the target's layers, to fine-tune it on other data.
    With lm_head=target the vocabulary maps are the new data's: the head's rows are the target's at
    them (init_from_target), and the fc and decoder layer do not depend on them; with a trained head
    the maps and the head are the draft's own."""
    old, info = load_eagle3(target, replace(mcfg, checkpoint=str(where), allow_untrained=False))
    keep = {"d2t", "t2d", "lm_head.weight"} if own_vocab else set()
    head.load_state_dict({k: v for k, v in old.state_dict().items() if k not in keep}, strict=False)
    return init_record("eagle3", target.key, structure_of(mcfg), where, info)


first_use("eagle3")(checkpoint_part("the EAGLE-3 draft", "eagle3", structure_of))


@trainer("eagle3")
def train_eagle3(target: ModelAdapter, cfg, sequences) -> dict:
    mcfg, tcfg = cfg.method, cfg.train
    layers = tap_layers(target.num_layers, mcfg.layers)
    head = Eagle3Head(target, layers, draft_vocabulary(target, sequences, draft_size(target, mcfg)))
    head.init_from_target()
    frozen = {"lm_head.weight"} if lm_head_mode(mcfg) == "target" else set()  # the target's rows: not trained, not saved
    start = start_from(target, head, mcfg, tcfg.init, own_vocab=bool(frozen)) if tcfg.init else None
    for name, p in head.named_parameters():
        p.requires_grad_(name not in frozen)
    head.train()
    train, held = split_held_out(with_labels(target, sequences, tcfg), tcfg)
    steps, decay, pad = int(mcfg.ttt_steps), float(mcfg.step_decay), pad_id(target)

    store = target_features(target, train + held, feature_taps(head), tcfg)

    def loss_fn(ids, labels):
        return eagle3_loss(target, head, ids, labels, steps, decay, pad, store=store)

    def held_out():  # acceptance by depth: step j's top-1 given the accepted path (the tree's depth j+1)
        return ttt_eval(target, head, held, tcfg, steps, decay, pad, store=store)

    before = eval_loss(loss_fn, held, tcfg, pad, target.device)
    log, stopped = train_loop("eagle3 draft", [p for p in head.parameters() if p.requires_grad], loss_fn, train, tcfg, pad, target.device,
                              resume=resume_for(cfg, "eagle3", target.key, structure_of(mcfg), "draft"),
                              eval_fn=held_out if held else None, inputs=store and store.inputs())
    after = eval_loss(loss_fn, held, tcfg, pad, target.device)
    head.eval()
    settings = run_settings(cfg, len(train), len(held), log, stopped, before, after) | {"layers": layers}
    settings |= {"init": start} if start else {}
    state = {k: v.detach().cpu() for k, v in head.state_dict().items() if k not in frozen}
    path = save_checkpoint("eagle3", target.key, structure_of(mcfg), state, settings)
    write_log(path, log, settings)
    print(f"eagle3: held-out loss {before[0]:.3f} -> {after[0]:.3f}, step-0 agreement {before[1]:.3f} -> {after[1]:.3f} "
          f"({stopped}); {path}")
    return {"eagle3": str(path), "held_out_loss": [before[0], after[0]], "held_out_agreement": [before[1], after[1]]}
