"""EAGLE-2 (Li et al. 2024): EAGLE's feature-level draft head with a dynamic draft tree.

One step, with x_n the pending token (chosen by the target, not yet fed to it):
1. The head catches up on the committed pairs (f_t, x_(t+1)) it has not seen (target features
   from the prefill or the previous verification; eagle_head.py), in its own one-layer KV cache.
   Its output at the last pair is the predicted feature of x_n: the tree's root.
2. Dynamic tree (EAGLE-2, section 4): the root's top-k tokens are the depth-1 nodes, each scored
   by its log draft probability. Then `depth` times: the current frontier (the k best nodes of
   the newest level) goes through the head in one call, each with its parent's predicted
   feature and a tree mask over the head's cached tree entries; each frontier node proposes its
   top-k children, scored by the accumulated confidence (sum of log draft probabilities along
   the path = log of their product); the k best children form the next frontier. Rerank: the
   `num_nodes` best-scored nodes of everything proposed are verified. A child never outscores
   its parent (log p <= 0) and ties go to the shallower node, so the selection is a tree.
   All of it runs on the device with fixed shapes (methods/eagle_tree.py, head-agnostic). Under
   greedy decoding the chosen nodes stay there: the proposal is a `DeviceTree` (token ids, parents,
   depths, ancestor mask, all device tensors), verified on the device, and the step's one read
   returns the accepted path (engine/tree.py verify_tree_greedy_device): no host round trip between
   draft and verify. Under sampling the chosen nodes come to the host in one read (the rejection
   walk draws from the seeded host generator), then the verification's.
3. The decode loop (methods/base.py) verifies root + nodes in one target forward with the tree
   mask; greedy or lossless tree rejection sampling picks the accepted path and the loop keeps
   that path's cache entries; the path's target features (computed by this forward) are the pairs
   the head reads next step. The head's tree entries are dropped: the next step uses real target
   features, as the authors' code does.

Sampling is lossless with `verify_tree_sampling` as is: its one-hot (q = 1) rule is exact when a
node's children are distinct tokens chosen without looking at the target's random draws. Here
they are the top-k of one draft distribution: deterministic given the context, and distinct.
(The authors' code verifies EAGLE-2 trees with the same q = 1 rule.)

`control=` does not apply: EAGLE-2's draft shape is set by its own `depth`, `top_k` and
`num_nodes` (the node budget), fixed per step, as in the paper; no controller is consulted.

StepResult.n_drafted is the tree's depth (the most tokens a step can accept), so acceptance by
position is acceptance by depth. Every step verifies `len(tree)` = num_nodes + 1 tokens: a cost
model must charge T(num_nodes + 1) per step, not T(depth + 1).
"""

from __future__ import annotations

import torch

from specbench.engine.transfer import take
from specbench.engine.tree import TokenTree
from specbench.engine.verify import Proposal
from specbench.core.errors import SpecBenchError
from specbench.methods.base import SpeculativeMethod, register_method
from specbench.methods.eagle_head import load_eagle
from specbench.methods.eagle_tree import GrownTree, device_tree, grow_tree, read_tree, select_nodes, topk_children


@register_method
class Eagle(SpeculativeMethod):
    name = "eagle"
    uses_controller = False
    load_head = staticmethod(load_eagle)  # (target, cfg) -> (head, info); EAGLE-3 brings its own head
    children = staticmethod(topk_children)  # how a frontier row proposes its children (eagle_tree.py)

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        self.head, self.info = self.load_head(target, cfg)
        self.top_k = min(int(cfg.top_k), target.vocab_size)
        self.depth = int(cfg.depth)
        self.num_nodes = int(cfg.num_nodes)
        for key, v, lo in (("top_k", self.top_k, 1), ("depth", self.depth, 0), ("num_nodes", self.num_nodes, 1)):
            if v < lo:
                raise SpecBenchError(f"eagle {key} must be >= {lo}, got {v}")
        self.record_pairs = False  # tests: keep every committed (feature, token) pair fed to the head
        self.fed: list[tuple[int, torch.Tensor, list[int]]] = []

    def describe(self) -> dict:
        d = super().describe() | {k: v for k, v in self.info.items() if k != "train_settings"}
        return d | {"top_k": self.top_k, "depth": self.depth, "num_nodes": self.num_nodes,
                    "controller": "none (EAGLE-2 tree: depth/top_k/num_nodes)"}

    def verify_widths(self) -> list[int]:
        return [self.num_nodes + 1]  # at most: the tree has fewer nodes when fewer were proposed

    # -- prefill: the head reads the target's features of every prompt position ---------------
    def prefill(self, ids: list[int]):
        t = self.target
        self.dcache = self.target.new_cache(1, "draft head")
        f = t.norm(t.run_layers(t.embed(ids), self.cache))
        self.prompt_feats = f[0]
        return t.lm_head(f[0, -1:]), f[0, -1:]

    def start(self, prompt: list[int]) -> int:
        tok = super().start(prompt)
        self.backlog = (self.prompt_feats, self.tokens[1:])  # pairs (f_t, x_(t+1)) for t = 0..len(prompt)-1
        return tok

    # -- one step: the loop verifies the tree and keeps the accepted path -----------------------
    def propose(self, k_max: int) -> Proposal:
        grown, chosen = self.grow()
        if self.sampling.greedy and self.verifier.acceptance == "auto":  # verified on the device: no read here
            return Proposal([], dtree=device_tree(grown, chosen))
        tree, nodes = read_tree(grown, chosen, self.tokens[-1])
        return Proposal(nodes[1:], tree=tree)

    def after_verify(self, prop, path, rows, hidden, logits) -> None:
        # the path's target features (computed by the verification) are what the head reads next
        self.backlog = (take(hidden, rows), self.tokens[-len(rows):])

    def catch_up(self) -> torch.Tensor:
        """Feed the committed pairs the head has not seen; return the root's predicted feature."""
        feats, toks = self.backlog
        if self.record_pairs:
            self.fed.append((self.dcache.length(), feats.detach().clone(), list(toks)))
        out = self.head(feats.unsqueeze(0), toks, self.dcache)
        return out[0, -1]

    def tree_step(self, feats: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor):
        """One frontier through the head (eagle_tree.Step): its draft logits and predicted features."""
        out = self.head(feats.unsqueeze(0), tokens, self.dcache, positions=positions, tree_mask=mask)[0]
        return self.head.logits(out), out

    def grow(self) -> tuple[GrownTree, torch.Tensor]:
        """Grow the tree on the device and rerank (eagle_tree.py): every candidate and the chosen ones."""
        root_feat = self.catch_up()
        base = self.dcache.length()  # = position of the pending token; node at depth d sits at base + d - 1
        grown = grow_tree(self.tree_step, self.head.logits(root_feat.unsqueeze(0))[0], root_feat, base, self.top_k,
                          self.depth, self.children)
        self.dcache.crop(base)  # the head's tree entries: the next step reads real target features
        return grown, select_nodes(grown, self.num_nodes)

    def draft_tree(self) -> tuple[TokenTree, list[int]]:
        """The chosen nodes read to the host once, as a TokenTree and its node tokens."""
        grown, chosen = self.grow()
        return read_tree(grown, chosen, self.tokens[-1])
