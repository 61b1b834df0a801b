"""Hydra (Ankner et al. 2024, arXiv 2402.05109): Medusa-style heads that are sequentially
dependent: head k sees the base feature and the embeddings of the tokens chosen on the path so far
(methods/hydra_heads.py). `variant: hydra_pp` (default) is Hydra++: a prefix-attention layer over
the context's features, 4-layer MLP heads, teacher distillation; `hydra` is plain Hydra (1-layer
heads on the final hidden state, next-token cross-entropy).

One step, with x_(t+1) the pending token (the tree's root):
1. The static tree (Medusa's "choices" format, `method.tree`) is grown level by level ON THE
   DEVICE: at depth d, one batched call of head d-1 over the level's parents (each row: base
   feature + its path's embeddings), top-k on the device, and the tree template's precomputed
   indices pick each node's token (its parent's rank-r token) and build the next level's rows
   (the parent's row + the child's embedding). The finished proposal is read once (one
   device-to-host read per step, plus the verification's).
2. The decode loop (methods/base.py) verifies the tree in one target forward (tree mask), keeps
   the accepted path's target cache entries, and hands back the path's final-norm hidden states.
3. Hydra++: those hidden states go through the prefix layer, appended to its own KV cache at the
   positions the target's cache gives them, so the prefix cache always holds exactly the committed
   tokens (never a rejected candidate: nothing to roll back, and the state equals a fresh prefill
   of the kept tokens; tests/test_hydra.py). Its output at the last one is the next step's base.

Sampling is lossless with the loop's tree rejection sampling: the candidates are the heads' top-k,
deterministic given the context, distinct among siblings (see engine/tree.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.engine.transfer import take
from specbench.engine.tree import TokenTree
from specbench.engine.verify import DeviceTree, Proposal
from specbench.core.errors import SpecBenchError
from specbench.methods.base import SpeculativeMethod, register_method
from specbench.methods.hydra_heads import load_heads
from specbench.methods.medusa import paths_tree


@dataclass
class Level:
    """Depth d of the tree template: what one head call produces and what the next one reads."""

    k: int  # top-k taken per parent row (the level's largest rank + 1)
    pick: torch.Tensor  # [nodes at depth d]: index into the flattened [parents, k] top-k
    grow_rows: torch.Tensor | None  # [next level's parents]: their parent's row in this level's input
    grow_nodes: torch.Tensor | None  # [next level's parents]: their position among this level's nodes


def build_levels(tree: TokenTree, device) -> list[Level]:
    """The tree's per-depth index tensors (on the device once, never per step). A level's input rows
    are the nodes of the previous depth that have children, in node order (the root for depth 1)."""
    rows = [0]  # node ids whose path embeddings form the current level's input rows
    levels = []
    for d in range(1, tree.max_depth + 1):
        nodes = [i for i, p in enumerate(tree.paths) if len(p) == d]
        k = max(tree.paths[i][-1] for i in nodes) + 1
        pick = [rows.index(tree.parents[i]) * k + tree.paths[i][-1] for i in nodes]
        nxt = [i for i in nodes if tree.children[i]]
        as_t = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        levels.append(Level(k, as_t(pick), as_t([rows.index(tree.parents[i]) for i in nxt]) if nxt else None,
                            as_t([nodes.index(i) for i in nxt]) if nxt else None))
        rows = nxt
    return levels


def build_tree(cfg, num_heads: int) -> TokenTree:
    paths = cfg.tree
    if not paths:
        raise SpecBenchError("hydra needs method.tree: candidate paths in Medusa's choices format, e.g. [[0],[1],[0,0]]")
    return paths_tree(paths, num_heads, "hydra")


@register_method
class Hydra(SpeculativeMethod):
    name = "hydra"
    uses_controller = False  # the tree is the draft shape

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        self.heads, self.info = load_heads(target, cfg)
        self.tree = build_tree(cfg, self.heads.num_heads)
        self.tree.mask, self.tree.depths = self.tree.mask.to(target.device), self.tree.depths.to(target.device)
        self.levels = build_levels(self.tree, target.device)
        self.record_inputs = False  # tests: keep each step's head inputs per depth
        self.recorded: list[list[torch.Tensor]] = []

    def describe(self) -> dict:
        d = super().describe() | {k: v for k, v in self.info.items() if k != "train_settings"}
        return d | {"tree_nodes": len(self.tree) - 1, "tree_depth": self.tree.max_depth,
                    "controller": "none (Hydra tree: method.tree)"}

    def verify_widths(self) -> list[int]:
        return [len(self.tree)]

    # -- the base feature the heads read --------------------------------------------------------
    def prefill(self, ids: list[int]):
        if not self.heads.prefix:
            return super().prefill(ids)
        t = self.target
        h = t.norm(t.run_layers(t.embed(ids), self.cache))  # every prompt position: the prefix layer reads them all
        self.pcache = self.target.new_cache(1, "prefix layer")
        self.base_feat = self.heads.base(h, self.pcache)[0, -1]
        return t.lm_head(h[0, -1:]), h[0, -1:]

    def after_verify(self, prop, path, rows, hidden, logits) -> None:
        if self.heads.prefix:  # the kept path's features, at the positions the target's cache gave them
            self.base_feat = self.heads.base(take(hidden, rows).unsqueeze(0), self.pcache)[0, -1]

    def base(self) -> torch.Tensor:
        return self.base_feat if self.heads.prefix else self.target_hidden

    # -- the tree, grown on the device ----------------------------------------------------------
    def choose(self, d: int, logits: torch.Tensor, k: int) -> torch.Tensor:
        """[rows, k] candidate tokens of head d (tests replace it to force a path)."""
        return torch.topk(logits, k, -1).indices

    def propose(self, k_max: int) -> Proposal:
        root = self.heads.embed([self.tokens[-1]])[0]  # [1, d]
        x = torch.cat([self.base().view(1, -1).to(root.dtype), root], -1)
        found, inputs = [], []
        for d, lv in enumerate(self.levels):
            inputs.append(x)
            top = self.choose(d, self.heads.head(d, x), lv.k).reshape(-1)[lv.pick]
            found.append(top)
            if lv.grow_rows is not None:
                x = torch.cat([x[lv.grow_rows], self.heads.embed(top[lv.grow_nodes])[0]], -1)
        if self.record_inputs:
            self.recorded.append(inputs)
        tokens = torch.cat(found)
        if self.sampling.greedy:  # verified on the device: no read before the verification
            if getattr(self, "_dtree", None) is None:
                self._dtree = DeviceTree.of(self.tree, torch.zeros_like(tokens))
            return Proposal([], dtree=self._dtree.with_tokens(tokens))
        return Proposal(tokens.tolist(), tree=self.tree)  # the one read of the proposal
