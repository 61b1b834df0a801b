"""EAGLE-3 (Li et al. 2025, arXiv 2503.01840): EAGLE-2's dynamic draft tree over EAGLE-3's draft.

What changes from EAGLE-2 (methods/eagle.py, whose tree growth, rerank and verification run here
unchanged) is the head and what it reads (methods/eagle3_head.py):
- features: the target's hidden states at the input of three layers (low, middle, high),
  fused by `fc`, instead of the final-norm feature. The prefill and every verification forward
  tap them (ModelAdapter.forward_tapped); the accepted path's rows are the pairs the draft
  reads next step, as in EAGLE-2;
- inside the tree a node's feature is its parent's draft output (no fc), as in the authors'
  decoding and in training's unroll (train/eagle3.py: the training-time test feeds the same
  features at the same positions; tests/test_eagle3.py checks it);
- logits over the reduced draft vocabulary, mapped to target ids by d2t (-inf elsewhere), so
  a draft can only propose a token of its vocabulary. Verification uses the full target head:
  greedy output is AR's, and tree rejection sampling with q = 1 stays exact (siblings are
  distinct top-k tokens fixed before verification).

The draft's KV cache holds committed pairs only; tree entries are dropped after each step.
"""

from __future__ import annotations

from specbench.engine.transfer import take
from specbench.core.errors import SpecBenchError
from specbench.methods.base import register_method
from specbench.methods.eagle import Eagle
from specbench.methods.eagle3_head import load_eagle3


@register_method
class Eagle3(Eagle):
    name = "eagle3"
    load_head = staticmethod(load_eagle3)

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        if self.top_k > self.head.draft_vocab_size:
            raise SpecBenchError(f"eagle3 top_k={self.top_k} exceeds the draft vocabulary ({self.head.draft_vocab_size} tokens)")
        self.taps = None  # tapped features of the last verification forward [q, 3d]

    def prefill(self, ids: list[int]):
        self.dcache = self.target.new_cache(1, "draft head")
        logits, hidden, taps = self.target.forward_tapped(ids, self.cache, self.head.layers, last_only=True)
        self.prompt_feats = self.head.project(taps)  # Eagle.start pairs them with tokens 1..n
        return logits, hidden

    def verify_forward(self, prop, feed, mask, positions):
        logits, hidden, self.taps = self.target.forward_tapped(feed, self.cache, self.head.layers,
                                                               positions=positions, tree_mask=mask)
        return logits, hidden

    def after_verify(self, prop, path, rows, hidden, logits) -> None:
        self.backlog = (self.head.project(take(self.taps, rows)), self.tokens[-len(rows):])
