"""EESD: early-exiting speculative decoding (Liu et al. 2024), drafting with the first N layers.

Draft = the target's first N layers + one trainable transformer layer (initialised from the
target's last layer) + RMSNorm + head (eq. 1). Verification reuses what drafting computed: the
first N layers' KV entries and layer-N hidden states of the pending token and of the drafts
d1..d(k-1) are already there, so verification runs layers 0..N-1 on dk alone and layers N..L-1
over the k+1 positions. Greedy output still equals AR exactly; only the order in which the
same layer computations happen changes.

Choices where the paper is open, and why:
- head: `shared` (default) reuses the target's head, frozen: on a 135M model the tied 49k-vocab
  head is ~18% of a forward's cost and 113 MB, so a second copy buys little; `trained` copies it
  and trains it, as the paper does for LLaMA-2 (section 3.1).
- the early-exit layer's own KV cache covers every committed token: the prompt goes through it at
  prefill, and a token whose layer-N state was computed during verification (the last draft
  when all were accepted) is fed to it at the start of the next round.
- the paper gives no value of N for a 30-layer model; it suggests 5-10% of the layers, so the
  default is N=2 (6.7%); sweep it with method.n_layers.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from specbench.models.artifacts import apply_checkpoint, load_checkpoint
from specbench.control import DraftRef
from specbench.engine.cache import KVCache
from specbench.core.errors import SpecBenchError
from specbench.methods.base import SpeculativeMethod, register_method
from specbench.methods.draft_vocab import subset_head, vocab_subset
from specbench.models import ModelAdapter


class EarlyExit(nn.Module):
    """The trainable part: one decoder layer + norm (+ optionally its own head)."""

    def __init__(self, target: ModelAdapter, n_layers: int, head: str = "shared"):
        super().__init__()
        if not 1 <= n_layers < target.num_layers:
            raise SpecBenchError(
                f"EESD n_layers={n_layers} must be in [1, {target.num_layers - 1}] for the {target.num_layers}-layer model {target.name}"
            )
        if head not in ("shared", "trained"):
            raise SpecBenchError(f"unknown EESD head {head!r}; allowed: shared, trained")
        self.n_layers = n_layers
        self.head_mode = head
        self.layer = copy.deepcopy(target.layers[-1])
        self.norm = copy.deepcopy(target.norm)
        self.head = copy.deepcopy(target.lm_head) if head == "trained" else None
        for p in self.parameters():
            p.requires_grad_(True)
        # kept out of the module tree: the shared head is the target's, never trained or saved
        self.__dict__["_target_head"] = target.lm_head

    def structure(self) -> dict:
        return {"n_layers": self.n_layers, "head": self.head_mode}

    def logits(self, hidden_normed: torch.Tensor) -> torch.Tensor:
        return (self.head or self._target_head)(hidden_normed)

    def forward(self, target: ModelAdapter, h_n: torch.Tensor, cache: KVCache | None,
                head: nn.Module | None = None, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer-N hidden states [B, q, d] -> (logits [B, q, V], normed hidden [B, q, d]);
        `head` replaces the exit's head (a draft's vocabulary subset, methods/draft_vocab.py);
        `last_only`: the last row's only (q = 1), the others filling the cache."""
        h = self.advance(target, h_n, cache)
        h = h[:, -1:] if last_only else h
        return (self.logits if head is None else head)(h), h

    def advance(self, target: ModelAdapter, h_n: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """The exit layer over h_n (filling its cache), normed; no logits: on the embedded model the
        49k-row head costs a fifth of a target forward per row, and a prompt's rows need none."""
        return self.norm(target.run_layers(h_n, cache, layers=[self.layer], cache_offset=0))

    def trainable_state(self) -> dict:
        return self.state_dict()


def load_early_exit(target: ModelAdapter, cfg) -> tuple[EarlyExit, dict]:
    exit_ = EarlyExit(target, int(cfg.n_layers), cfg.head)
    where = cfg.checkpoint
    ckpt = load_checkpoint("eesd", target.key, exit_.structure(), where, required=not cfg.allow_untrained,
                           model_name=target.name)
    info = {"n_layers": exit_.n_layers, "head": exit_.head_mode, "exit_trained": ckpt is not None}
    return apply_checkpoint(exit_, ckpt, target, info), info


@register_method
class EESD(SpeculativeMethod):
    name = "eesd"
    verify_reuses_draft_entries = True  # layers 0..N-1 of the pending token and d1..d(k-1)

    def __init__(self, target, cfg, sampling, run):
        self.exit, self.info = load_early_exit(target, cfg)
        super().__init__(target, cfg, sampling, run)
        self.n = self.exit.n_layers
        ids, vocab_info = vocab_subset(target, cfg, run)
        self.info |= vocab_info
        self.draft_head = None if ids is None else subset_head(self.exit.head or target.lm_head, ids, target)

    def draft_ref(self) -> DraftRef:
        # a Cali-TS predictor is trained with one early-exit layer: the controller factory finds it by this
        return DraftRef(self.target.key, self.exit.structure(), self.target.device, self.target.hidden_size,
                        self.info.get("checkpoint"))

    def describe(self) -> dict:
        return super().describe() | {k: v for k, v in self.info.items() if k != "train_settings"}

    # -- prefill: lower layers -> early exit (its cache) and upper layers -> target logits --
    def start(self, prompt: list[int]) -> int:
        self.ecache = self.target.new_cache(1, "exit layer")
        self.backlog: list[torch.Tensor] = []  # layer-N states of committed tokens the exit layer has not seen
        return super().start(prompt)

    def prefill(self, ids: list[int]):
        t = self.target
        h_n = t.run_layers(t.embed(ids), self.cache, 0, self.n)
        self.exit.advance(t, h_n, self.ecache)  # the exit layer's cache of the prompt; its logits are never read
        h = t.norm(t.run_layers(h_n, self.cache, self.n))[:, -1:]
        return t.lm_head(h)[0], h[0]

    def propose(self, k_max: int):
        t = self.target
        self.h_drafts: list[torch.Tensor] = []  # layer-N states of [pending, d1, ..., d(k-1)]

        def next_draft(drafts):
            tok = drafts[-1] if drafts else self.tokens[-1]
            h_n = t.run_layers(t.embed([tok]), self.cache, 0, self.n)
            self.h_drafts.append(h_n)
            feed = torch.cat(self.backlog + [h_n], 1) if self.backlog else h_n
            self.backlog = []
            # catch-up rows (the backlog) fill the exit layer's cache only
            logits, hidden = self.exit(t, feed, self.ecache, head=self.draft_head, last_only=True)
            return logits[0, -1], hidden[0, -1]

        return self.draft_loop(k_max, next_draft)

    def verify_forward(self, prop, feed, mask, positions):
        """Layers 0..N-1 ran during drafting for the pending token and d1..d(k-1); run them on dk
        alone, then the upper layers over all k+1 (feed = [pending] + drafts, a chain)."""
        t = self.target
        h_last = t.run_layers(t.embed([feed[-1]]), self.cache, 0, self.n)
        h_n = torch.cat(self.h_drafts + [h_last], 1)
        self.h_verified = h_n
        h = t.norm(t.run_layers(h_n, self.cache, self.n))
        return t.lm_head(h)[0], h[0]

    def after_verify(self, prop, path, rows, hidden, logits) -> None:
        committed = len(self.tokens) - 1
        self.ecache.crop(committed)
        # tokens now in the lower layers' cache but not in the exit layer's: feed them next round
        missing = committed - self.ecache.length()
        if missing > 0:
            self.backlog = [self.h_verified[:, -missing:]]
