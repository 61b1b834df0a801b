"""Token Recycling (Luo et al. 2024, arXiv 2408.08696; ACL 2025): draft trees from recycled candidates.

Every forward's logits hold, beside the token the target commits, the top-k tokens it also found
likely; Token Recycling keeps them. An adjacency matrix `adj` [V, k] stores, for each token t, the
top-k tokens the target last predicted right after t. A step's draft is a fixed tree template
expanded from the pending token by breadth-first lookups: the node with path (r1, ..., rd) carries
adj[token of (r1, ..., r_{d-1})][rd], i.e. rank rd among its *parent token's* stored successors (the
same choices format as Medusa's trees, but a rank indexes the parent's row, not a depth's head).
The tree is verified in one target forward with tree attention (engine/tree.py), and then every
row of that forward updates the row of the token it was fed: adj[fed token] = top-k(logits of that
row), accepted or not (the "recycling"). Drafts are deterministic, so sampling verifies them as
one-hot candidates (lossless multi-candidate rejection sampling, engine/tree.py).

Faithful to the authors' code (github.com/Luowaterbi/TokenRecycling, evaluation/inference_recycling.py):
k = 8, the template "2.2.2" (80 nodes + root, depth 6; model/recycling/tree_template_.py), the
matrix starts at zeros and is kept across prompts (their `adj_matrix` lives for the whole run,
warm-up included; `reset_per_sequence: true` gives a cold start per prompt), the prefill's logits do
not update it, and the top-k of the raw logits is stored. Deviation: a prefix of the template
(`max_nodes`) for CPUs where 81 verified rows cost too much (the template lists nodes by depth, so
any prefix is a tree). Device work per step: one gather per depth, one top-k and one scatter;
host reads: the node tokens once (the loop's verifier reads the argmax once more).
"""

from __future__ import annotations

import torch

from specbench.engine.tree import TokenTree
from specbench.engine.verify import Proposal
from specbench.core.errors import SpecBenchError
from specbench.methods.base import SpeculativeMethod, register_method

# the authors' template "2.2.2" (model/recycling/tree_template_.py): 8 + 21 + 25 + 15 + 8 + 3 nodes
TEMPLATES = {
    "2.2.2": [
        [0], [1], [2], [3], [4], [5], [6], [7],
        [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [1, 0], [1, 1], [1, 2], [1, 3],
        [2, 0], [2, 1], [2, 2], [3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0],
        [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4], [0, 0, 5], [0, 0, 6], [0, 0, 7], [0, 1, 0],
        [0, 1, 1], [0, 1, 2], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [0, 5, 0], [0, 6, 0], [0, 7, 0],
        [1, 0, 0], [1, 0, 1], [1, 1, 0], [2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0],
        [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 1, 1],
        [0, 0, 2, 0], [0, 0, 3, 0], [0, 0, 4, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0, 0],
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0],
        [0, 1, 0, 0, 0], [1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0],
    ],
}


def template_tree(tree, max_nodes: int | None, topk: int) -> TokenTree:
    """The template by name (or explicit paths), cut to its first `max_nodes` nodes."""
    if isinstance(tree, str):
        if tree not in TEMPLATES:
            raise SpecBenchError(f"method.tree={tree!r} is not a known template; expected one of {sorted(TEMPLATES)} or a list of paths")
        paths = TEMPLATES[tree]
    else:
        paths = [list(p) for p in tree]
    paths = paths[:max_nodes] if max_nodes else paths
    if not paths:
        raise SpecBenchError("method.tree has no nodes")
    if max(max(p) for p in paths) >= topk:
        raise SpecBenchError(f"method.tree uses rank {max(max(p) for p in paths)} but method.topk={topk} keeps ranks 0..{topk - 1}")
    try:
        return TokenTree.from_paths(paths)
    except ValueError as e:  # a path without its parent: not a tree
        raise SpecBenchError(f"method.tree: {e}") from None


@register_method
class TokenRecycling(SpeculativeMethod):
    name = "token_recycling"
    uses_controller = False  # the static template is the draft shape

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        self.topk = int(cfg.topk)
        if self.topk < 1:
            raise SpecBenchError(f"method.topk={self.topk} is not allowed; expected an integer >= 1")
        max_nodes = cfg.max_nodes
        if max_nodes is not None and int(max_nodes) < 1:
            raise SpecBenchError(f"method.max_nodes={max_nodes} is not allowed; expected an integer >= 1 or null")
        self.tree = template_tree(cfg.tree, None if max_nodes is None else int(max_nodes), self.topk)
        self.reset_per_sequence = bool(cfg.reset_per_sequence)
        dev = target.device
        # fixed for the run: the tree's mask and depths, each node's parent and rank, per-depth slices
        self.tree.mask, self.tree.depths = self.tree.mask.to(dev), self.tree.depths.to(dev)
        self.parent = torch.tensor(self.tree.parents[1:], dtype=torch.long, device=dev)
        self.rank = torch.tensor([p[-1] for p in self.tree.paths[1:]], dtype=torch.long, device=dev)
        depth = [len(p) for p in self.tree.paths]
        self.levels = [(depth.index(d), len(depth) - depth[::-1].index(d)) for d in range(1, self.tree.max_depth + 1)]
        self.adj = torch.zeros(target.vocab_size, self.topk, dtype=torch.long, device=dev)  # the authors' start
        self.node_ids: torch.Tensor | None = None

    def describe(self) -> dict:
        tree = self.cfg.tree
        return super().describe() | {"topk": self.topk, "tree": tree if isinstance(tree, str) else "custom",
                                     "tree_nodes": len(self.tree) - 1, "tree_depth": self.tree.max_depth,
                                     "reset_per_sequence": self.reset_per_sequence}

    def verify_widths(self) -> list[int]:
        return [len(self.tree)]

    def carries_state(self) -> bool:
        return not self.reset_per_sequence or super().carries_state()  # the adjacency matrix, run-long by default

    def prefill_draft(self, prompt: list[int]) -> None:
        if self.reset_per_sequence:
            self.adj.zero_()

    def expand(self, root: int) -> torch.Tensor:
        """Every node's token on the device: depth by depth, adj[parent's token, rank]."""
        ids = torch.empty(len(self.tree), dtype=torch.long, device=self.adj.device)
        ids[0] = root
        for lo, hi in self.levels:
            ids[lo:hi] = self.adj[ids[self.parent[lo - 1 : hi - 1]], self.rank[lo - 1 : hi - 1]]
        return ids

    def propose(self, k_max: int) -> Proposal:
        self.node_ids = self.expand(self.tokens[-1])
        return Proposal(self.node_ids[1:].tolist(), tree=self.tree)  # the step's one read of the draft

    def after_verify(self, prop, path, rows, hidden, logits) -> None:
        # recycle: each verified row's top-k becomes the successors of the token it was fed
        self.recycle(self.node_ids, logits)

    def recycle(self, fed: torch.Tensor, logits: torch.Tensor) -> None:
        self.adj[fed] = torch.topk(logits, self.topk, dim=-1).indices.to(self.adj.device)
