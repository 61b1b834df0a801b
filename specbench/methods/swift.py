"""SWIFT: on-the-fly self-speculative decoding (Xia, Li, Zhang, Du, Li, ICLR 2025; authors' code
github.com/hemingkx/SWIFT, model/swift/utils.py and evaluation_llama/inference_swift.py).

The draft is the target with some attention and MLP sub-layers skipped, as in Self-SD (the same
skipped forward, `self_sd.skipped_draft`, into the shared cache), but the skipped layer set is found
during inference instead of offline:

* optimisation phase: before a decoding step (after every `opt_interval`-th verification, once more
  than `context_window` + 1 tokens of the current output are in the cache) one candidate layer set is
  scored: the skipped model runs in one forward over the output's first `context_window` + 1 tokens,
  after the prompt's cache entries, and the score ("matchness") is the share of the next tokens it
  predicts greedily. `swift_search.py` proposes the candidates (random search, a Gaussian-process
  step every `bayes_interval`-th iteration), keeps the better set and stops the search (score above
  `max_score`, `max_tolerance_iter` iterations without improvement, or `max_opt_iter` iterations).
  Its time is the timer's `optimize` phase;
* acceleration: drafting stops once the draft's confidence in its token falls below 0.8 (the paper's
  early stop: conf/control/paper/swift.yaml = `threshold` with gamma 0.8, k_max 25, the authors'
  `swift_draft(max_step_draft=25, stop_threshold=0.8)`), and `verification: tree` (default; the
  authors' code and the paper's "dynamic verification") verifies, at every depth of the draft chain,
  the draft's top 3/5/8/10 tokens (confidence > 0.95 / > 0.8 / > 0.5 / else; under sampling 1/3/5/10)
  as siblings of the chain token, in one tree-masked target forward. `verification: chain` verifies
  the chain alone, as Self-SD does. Only the target's tokens are ever committed (the one decode loop).

State across samples: as in the authors' run (one process per task), the search state, its GP
observations and the layer set in use carry over from one sample to the next for the whole run; the
runner's warm-up leaves them as they were (`run_state`). Each generation records in `extra["swift"]`
the layer set in use from each step on, every optimisation iteration and the search's state at its end.
Host reads per step: one per draft token (its token, confidence and, for the tree, its top-10 in one
copy), the verification's, and one per optimisation iteration (its predictions).
"""

from __future__ import annotations

import numpy as np
import torch

from specbench.engine.sampling import probs, sample
from specbench.engine.tree import TokenTree
from specbench.engine.verify import Proposal
from specbench.core.errors import SpecBenchError, choice_error
from specbench.methods.base import SpeculativeMethod, register_method
from specbench.methods.self_sd import skipped_draft
from specbench.methods.swift_search import (
    SearchState,
    Settings,
    candidate,
    num_skipped,
    unified_init,
    update,
)
from specbench.models import LayerSkip

TOPK = 10  # the authors' TOPK: the most candidates one depth can have
CANDIDATES = {True: (3, 5, 8, 10), False: (1, 3, 5, 10)}  # greedy / sampling: get_choices_list's candidate_set
CONFIDENCE = (0.95, 0.8, 0.5)  # ... for confidence above each of these, else the last
VERIFICATION = ("tree", "chain")


def candidate_count(confidence: float, greedy: bool) -> int:
    sizes = CANDIDATES[greedy]
    return next((n for n, c in zip(sizes, CONFIDENCE) if confidence > c), sizes[-1])


def dynamic_tree(ranked: list[list[int]], confs: list[float], greedy: bool) -> tuple[TokenTree, list[int]]:
    """The authors' swift_choices: at depth d the chain node's children are the draft's top-n tokens
    at d (rank 0 = the chain token), n from the confidence at d."""
    tokens: dict[tuple[int, ...], int] = {}
    for d, (r, c) in enumerate(zip(ranked, confs)):
        for i in range(min(candidate_count(c, greedy), len(r))):
            tokens[(0,) * d + (i,)] = r[i]
    tree = TokenTree.from_paths(list(tokens))
    return tree, [tokens[p] for p in tree.paths[1:]]


def prompt_snapshot(target, cache, n: int):
    """A cache holding the first n entries of every layer of `cache` (the authors' clone of the
    prefilled cache): a copy, on each layer's device, in a cache of its own (under execution=graphs
    the run's static one for this role, not the target's)."""
    return target.new_cache(role="prompt snapshot").copy_prefix(cache, n)


@register_method
class SWIFT(SpeculativeMethod):
    name = "swift"
    run_state = ("search",)  # the runner's warm-up leaves the search as it was (run/warmup.py)

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        self.settings = Settings.from_cfg(cfg)
        self.verification = cfg.verification
        if self.verification not in VERIFICATION:
            raise choice_error("method.verification", self.verification, VERIFICATION)
        if target.num_layers < 3:
            raise SpecBenchError(f"SWIFT keeps the first and the last layer: it needs >= 3 layers, {target.name} has {target.num_layers}")
        self.search = SearchState(skip=unified_init(target.num_layers))
        self.prompt_cache = None

    def describe(self) -> dict:
        s, n = self.settings, self.target.num_layers
        init = unified_init(n)
        return super().describe() | {"verification": self.verification} | {k: getattr(s, k) for k in s.__dataclass_fields__} | {
            "skipped_per_candidate": num_skipped(n, s.skip_ratio), "initial_attn": sorted(init.attn),
            "initial_mlp": sorted(init.mlp)}

    def verify_widths(self) -> list[int]:
        k = self.controller.k_max
        # the widest tree under the paper's early stop: every depth but the last above 0.8 (<= 5 tokens)
        return [(k - 1) * CANDIDATES[True][1] + TOPK + 1] if self.verification == "tree" else []

    # -- one generation ------------------------------------------------------------------------
    def generate(self, prompt, max_new_tokens, eos_ids, seed):
        self.log = {"layer_sets": [self._set_row(0, self.search.skip)], "iterations": []}
        g = super().generate(prompt, max_new_tokens, eos_ids, seed)
        st = self.search
        g.extra["swift"] = self.log | {"search": {"active": st.active, "best": st.best, "iterations": st.iters,
                                                  "tolerance": st.tolerance, "stopped": st.stopped}}
        return g

    @staticmethod
    def _set_row(step: int, skip: LayerSkip) -> list:
        return [step, sorted(skip.attn), sorted(skip.mlp)]

    def prefill_draft(self, prompt: list[int]) -> None:
        self.prompt_len, self.steps_done = len(prompt), 0
        if self.search.rng is None:  # the first measured generation seeds the run's search
            self.search.rng = np.random.default_rng(self.seed)
        self.prompt_cache = None
        if self.optimizing():
            with self.timer.phase("optimize"):
                self.prompt_cache = prompt_snapshot(self.target, self.cache, len(prompt))

    def after_verify(self, prop, path, rows, hidden, logits) -> None:
        self.steps_done += 1

    # -- the optimisation phase ------------------------------------------------------------------
    def optimizing(self) -> bool:
        return self.settings.optimize and self.search.active

    def due(self) -> bool:
        s = self.settings
        in_cache = len(self.tokens) - 1 - self.prompt_len
        return (self.optimizing() and self.prompt_cache is not None and self.steps_done >= 1
                and (self.steps_done - 1) % s.opt_interval == 0 and in_cache > s.context_window + 1)

    def matchness(self, skip: LayerSkip) -> float:
        """Share of the output's tokens 1..w the skipped model predicts from tokens 0..w-1 (one forward
        after the prompt's entries; its own entries are dropped again)."""
        n, w = self.prompt_len, self.settings.context_window
        window = self.tokens[n : n + w + 1]
        logits, _ = self.target.forward(window, self.prompt_cache, skip=skip)
        self.prompt_cache.crop(n)
        pred = logits[:-1].argmax(-1).tolist()  # the iteration's one read
        return sum(int(p == t) for p, t in zip(pred, window[1:])) / w

    def optimize_step(self) -> None:
        st, n = self.search, self.target.num_layers
        cand, point, kind = candidate(st, self.settings, n)
        score = self.matchness(cand)
        adopted = update(st, self.settings, cand, point, score)
        self.log["iterations"].append({"step": self.steps_done, "iter": st.iters, "kind": kind, "score": score,
                                       "adopted": adopted, "attn": sorted(cand.attn), "mlp": sorted(cand.mlp)})
        if adopted:
            self.log["layer_sets"].append(self._set_row(self.steps_done, cand))
        if not st.active:
            self.prompt_cache = None

    # -- drafting --------------------------------------------------------------------------------
    def propose(self, k_max: int) -> Proposal:
        if self.due():
            with self.timer.phase("optimize"):
                self.optimize_step()
        self.ranked: list[list[int]] = []
        self.confs: list[float] = []
        chain = self.draft_loop(k_max, skipped_draft(self, self.search.skip))
        if self.verification == "chain":
            return chain
        tree, nodes = dynamic_tree(self.ranked, self.confs, self.sampling.greedy)
        return Proposal(nodes, tree=tree)

    def draft_choice(self, logits: torch.Tensor, signal: torch.Tensor | None = None):
        """The base's choice plus, for the tree, the draft's top-10 tokens at this depth (chain token
        first), read in the same copy."""
        if self.verification == "chain":
            return super().draft_choice(logits, signal)
        extra = [] if signal is None else [signal.reshape(1)]
        if self.sampling.greedy:
            top = logits.topk(min(TOPK, logits.shape[-1]))  # ranked in the model's own dtype
            k = top.indices.shape[-1]
            conf_t = torch.softmax(logits.float(), -1).max()
            got = torch.cat([top.indices.to(torch.float64), conf_t.to(torch.float64).view(1)]
                            + [e.to(torch.float64) for e in extra]).tolist()
            ranked, conf, value, q = [int(t) for t in got[:k]], got[k], got[k + 1] if extra else None, None
        else:
            q = probs(logits, self.sampling)
            conf_t = torch.softmax(logits.float(), -1).max()
            host = torch.cat([q, conf_t.to(q.dtype).view(1)] + [e.to(q.dtype) for e in extra]).cpu()
            v = q.shape[-1]
            tok = sample(host[:v], self.gen)
            order = host[:v].topk(min(TOPK, v)).indices.tolist()
            ranked = [tok] + [t for t in order if t != tok][: TOPK - 1]
            conf, value = float(host[v]), float(host[v + 1]) if extra else None
        self.ranked.append(ranked)
        self.confs.append(conf)
        return ranked[0], conf, q, value
