"""The host-side EAGLE-2 tree grower specbench had before the tree moved to the device
(specbench/methods/eagle.py at ea3b558, one read per level), kept as the reference the device
grower must match pick for pick: the same algorithm, with the head call replaced by the same
`step(features, tokens, positions, mask) -> (logits, features)` the device grower takes."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specbench.engine.tree import TokenTree


@dataclass
class DraftTree:
    """Candidates proposed while growing the tree (root excluded)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # candidate index, -1 = root
    ranks: list[int] = field(default_factory=list)  # rank among the parent's top-k (unique per parent)
    scores: list[float] = field(default_factory=list)  # accumulated log draft probability
    depths: list[int] = field(default_factory=list)

    def add(self, token: int, parent: int, rank: int, score: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.ranks.append(rank)
        self.scores.append(float(score))
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        return len(self.tokens) - 1

    def path(self, c: int) -> tuple[int, ...]:
        out = []
        while c >= 0:
            out.append(self.ranks[c])
            c = self.parents[c]
        return tuple(reversed(out))

    def rerank(self, root: int, n: int) -> tuple[TokenTree, list[int]]:
        """The n best candidates as a TokenTree and its node tokens (root first)."""
        order = sorted(range(len(self.tokens)), key=lambda c: (-self.scores[c], self.depths[c], c))
        chosen: set[int] = set()
        for c in order:
            if len(chosen) == n:
                break
            if self.parents[c] < 0 or self.parents[c] in chosen:  # keep it a tree even under odd ties
                chosen.add(c)
        token_of = {self.path(c): self.tokens[c] for c in chosen}
        tree = TokenTree.from_paths(list(token_of))
        return tree, [root] + [token_of[p] for p in tree.paths[1:]]


def expand(cand: DraftTree, parent: list[int], logits: torch.Tensor, base, top_k: int) -> list[int]:
    logp = torch.log_softmax(logits.float(), -1)
    top = torch.topk(logp, top_k, -1)
    cu, ids = torch.stack([(top.values + base).double(), top.indices.double()]).tolist()
    return [cand.add(int(ids[i][r]), p, r, cu[i][r]) for i, p in enumerate(parent) for r in range(top_k)]


def frontier_mask(cand: DraftTree, frontier: list[int], slot: dict[int, int]) -> torch.Tensor:
    q, m = len(frontier), len(slot)
    mask = torch.zeros(q, m + q, dtype=torch.bool)
    for i, c in enumerate(frontier):
        mask[i, m + i] = True
        a = cand.parents[c]
        while a >= 0:
            mask[i, slot[a]] = True
            a = cand.parents[a]
    return mask


def host_draft_tree(step, root_logits, root_feat, start, top_k, depth, num_nodes, root_token):
    """(TokenTree, node tokens, the DraftTree): the old `Eagle.draft_tree` after `catch_up`."""
    cand = DraftTree()
    frontier = expand(cand, [-1], root_logits.view(1, -1), 0.0, top_k)
    feat_of = {-1: root_feat}
    slot: dict[int, int] = {}
    for _ in range(depth):
        frontier = sorted(frontier, key=lambda c: -cand.scores[c])[:top_k]
        mask = frontier_mask(cand, frontier, slot)
        feats = torch.stack([feat_of[cand.parents[c]] for c in frontier])
        pos = torch.full((len(frontier),), start + cand.depths[frontier[0]] - 1)
        logits, out = step(feats, torch.tensor([cand.tokens[c] for c in frontier]), pos, mask)
        for i, c in enumerate(frontier):
            slot[c] = len(slot)
            feat_of[c] = out[i]
        scores = torch.tensor([cand.scores[c] for c in frontier], dtype=torch.float32)
        frontier = expand(cand, frontier, logits, scores.unsqueeze(-1), top_k)
    tree, nodes = cand.rerank(root_token, num_nodes)
    return tree, nodes, cand
