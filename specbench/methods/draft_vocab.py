"""Draft heads over a frequency-ranked subset of the vocabulary (`method.draft_vocab`).

A self-drafting method pays the LM head for every draft token: on SmolLM2-135M the tied
49,152 x 576 head is ~21% of the weights (~27% of the bytes a decoding step reads on the `ggml*`
backends, where it is Q8_0 and the layers Q4_1), though only ~8% of a one-token step's time
there (results/bench/draftvocab_coverage.md: the rest is attention, norms and Python). Most of
its rows are tokens the model almost never writes. With `draft_vocab.size = V'` the draft computes logits only for the V' tokens most
frequent in the training data and treats every other token as impossible (-inf), so it can only
propose one of them. Verification still uses the full head, so greedy output is still exactly
AR's and rejection sampling still preserves the target distribution (the draft distribution q is
any distribution; here it is renormalised over the V' tokens); only acceptance can fall, when the
target's choice lies outside the subset.

The subset's rows are copied from the head and run on the target's backend, so on `ggml*` they
are the same Q8_0 blocks computed by the same kernel: a kept token's draft logit is bit for bit
the full head's (tested). Where the full head's argmax is in the subset the draft proposes the
same token; confidence-based controllers see the maximum of the softmax over the subset, which
can only be higher than over the full vocabulary.

Ranking source (`draft_vocab.source`): `distill`, the loss tokens of the self-distillation data
the trained parts learn from (specbench/models/distill.py; the run's `train.data` settings, reused
from the cache or generated as training would), or a JSON file holding a list of token ids, most
frequent first. Ties are broken by token id; tokens never seen follow by id; EOS ids are always
kept (a draft that cannot propose the end of a reply loses the last step of every answer).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from specbench.core.errors import SpecBenchError
from specbench.models import ModelAdapter, apply_backend, backend_of
from specbench.config.settings import RunValues
from specbench.models.distill import build_sequences, sequences_path


def rank_tokens(sequences, vocab_size: int) -> list[int]:
    """Every token id, most frequent first among the loss tokens (seq[start:]) of `sequences`,
    ties and unseen tokens by id."""
    counts = Counter(t for seq, start in sequences for t in seq[start:] if 0 <= t < vocab_size)
    return sorted(range(vocab_size), key=lambda t: (-counts.get(t, 0), t))


def subset_ids(ranked: list[int], size: int, vocab_size: int, keep=()) -> torch.Tensor:
    """`keep` (EOS) and the most frequent other ids of `ranked`, `size` in all, sorted."""
    keep = [t for t in dict.fromkeys(keep) if 0 <= t < vocab_size][:size]
    chosen = keep + [t for t in ranked if t not in keep][: size - len(keep)]
    return torch.tensor(sorted(chosen), dtype=torch.long)


class SubsetHead(nn.Module):
    """`head` restricted to rows `ids`: h [..., d] -> logits [..., V] with -inf outside `ids`."""

    def __init__(self, head: nn.Linear, ids: torch.Tensor, backend: str):
        super().__init__()
        w = head.weight
        self.vocab_size = w.shape[0]
        self.sub = nn.Linear(w.shape[1], len(ids), bias=head.bias is not None, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            self.sub.weight.copy_(w[ids.to(w.device)])
            if head.bias is not None:
                self.sub.bias.copy_(head.bias[ids.to(w.device)])
        self.sub.requires_grad_(False)
        self.register_buffer("ids", ids.to(w.device), persistent=False)
        apply_backend(self.sub, backend)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        small = self.sub(h)
        out = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.ids, small)


def _ranking(target: ModelAdapter, vcfg, run: RunValues) -> tuple[list[int], str]:
    source = str(vcfg.source)
    if source == "distill":
        if run.train is None:
            raise SpecBenchError("method.draft_vocab.source=distill needs the run's train config; give a ranked token file instead")
        data_dir = run.data_dir or os.environ.get("SPECBENCH_DATA_DIR")
        sequences = build_sequences(target, run.train.data, data_dir, int(run.train.seed))
        return rank_tokens(sequences, target.vocab_size), "distill"
    path = Path(source).expanduser()
    if not path.is_file():
        raise SpecBenchError(f"method.draft_vocab.source={source!r} is neither 'distill' nor a file (a JSON list of token ids)")
    try:
        ranked = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SpecBenchError(f"method.draft_vocab.source={source!r}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(ranked, list) or not all(isinstance(t, int) and 0 <= t < target.vocab_size for t in ranked):
        raise SpecBenchError(f"method.draft_vocab.source={source!r}: expected a JSON list of token ids in [0, {target.vocab_size})")
    seen = set(ranked)
    return list(dict.fromkeys(ranked)) + [t for t in range(target.vocab_size) if t not in seen], str(path)


def vocab_subset(target: ModelAdapter, cfg, run: RunValues) -> tuple[torch.Tensor | None, dict]:
    """The draft's token ids (None: the full vocabulary) and what to record about them; `cfg`: the
    method's settings (its `draft_vocab`), `run`: the run values (train data for source=distill)."""
    vcfg = cfg.draft_vocab
    size = vcfg.size
    if size is None:
        return None, {}
    V = target.vocab_size
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= V:
        raise SpecBenchError(f"method.draft_vocab.size={size!r} is not allowed; expected an integer in [1, {V}] or null")
    if size == V:
        return None, {"draft_vocab": V}
    ranked, source = _ranking(target, vcfg, run)
    ids = subset_ids(ranked, size, V, keep=sorted(target.tokenizer.eos_ids or ()))
    return ids, {"draft_vocab": len(ids), "draft_vocab_source": source} | _data_file(target, source, run)


def _data_file(target: ModelAdapter, source: str, run: RunValues) -> dict:
    """The file a distilled ranking was read from, named in describe() so that its hash joins the
    run's provenance: data regenerated between two sessions of one run gives another subset."""
    if source != "distill":
        return {}  # the ranked file is `source` itself, a path in describe() already
    for finished in (True, False):  # a generation a safety cap stopped is still in its journal
        path = sequences_path(target, run.train.data, int(run.train.seed), finished)
        if path.is_file():
            return {"draft_vocab_data": str(path)}
    return {}


def subset_head(head: nn.Linear, ids: torch.Tensor | None, target: ModelAdapter) -> nn.Module:
    """`head` itself for the full vocabulary, else its SubsetHead on the target's backend."""
    return head if ids is None else SubsetHead(head, ids, backend_of(target.model))
