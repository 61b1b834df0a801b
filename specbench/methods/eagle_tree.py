"""EAGLE-2's dynamic draft tree (Li et al. 2024, section 4), grown on the device.

Head-agnostic: `grow_tree` takes a `step(features [q, d], tokens [q], positions [q], mask [q, m+q])
-> (logits [q, V], new features [q, d])` that runs the draft head over one frontier (appending
to the head's own cache; `mask` covers the m tree entries cached by earlier calls, the committed
entries are always visible), so EAGLE-2 (methods/eagle.py) and heads built on it reuse it.

Every shape is fixed by (top_k, depth): level 1 is the root's top_k children; then `depth` times
the top_k best nodes of the newest level (the frontier) go through the head and each proposes its
top_k children, scored by the accumulated log draft probability (float32, as the host grower had
it). Candidates keep their creation order (level, then frontier position, then rank), which is
what ties fall back to. Nothing is read to the host while growing: on a GPU a read per level is
a queue drain per level. `select_nodes` reranks on the device and `read_tree` reads the chosen
nodes once (tokens, parents, ranks in one copy) to build the `TokenTree` the host verifier walks
(sampling), or `device_tree` hands them to the device verifier as they are (greedy, no read).

Selection is the host grower's rule exactly (tests/test_eagle_tree.py compares them): order by
(-score, depth, index); take a candidate if its parent is the root or was taken before it, until
`num_nodes` are taken. A child never outscores its parent (log p <= 0, ties go to the shallower
node), so normally that is the first `num_nodes` in order; the ancestor rule is kept for drafts
whose scores break that (a test's oracle, another head's scoring).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specbench.engine.tree import TokenTree
from specbench.engine.verify import DeviceTree

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class GrownTree:
    """Every proposed candidate (root excluded), in creation order, as device tensors."""

    tokens: torch.Tensor  # [N] long
    parents: torch.Tensor  # [N] long: candidate index, -1 = the root
    ranks: torch.Tensor  # [N] long: rank among its parent's top_k (unique per parent)
    scores: torch.Tensor  # [N] float32: accumulated log draft probability
    depths: torch.Tensor  # [N] long: 1 = a child of the root
    fed: list[torch.Tensor] = field(default_factory=list)  # per head call: the candidates fed, [q]
    levels: int = 0  # the deepest depth (known on the host: no read)

    def add_level(self, parents: torch.Tensor, scores: torch.Tensor, tokens: torch.Tensor, depth: int) -> torch.Tensor:
        """Children [q, k] of `parents` [q]; returns their candidate indices [q * k]."""
        q, k = scores.shape
        n = self.tokens.shape[0]
        dev = self.tokens.device
        self.tokens = torch.cat([self.tokens, tokens.reshape(-1).long()])
        self.parents = torch.cat([self.parents, parents.repeat_interleave(k)])
        self.ranks = torch.cat([self.ranks, torch.arange(k, device=dev).repeat(q)])
        self.scores = torch.cat([self.scores, scores.reshape(-1).float()])
        self.depths = torch.cat([self.depths, torch.full((q * k,), depth, dtype=torch.long, device=dev)])
        self.levels = max(self.levels, depth)
        return torch.arange(n, n + q * k, device=dev)


def topk_children(tree: GrownTree, parents: torch.Tensor, logits: torch.Tensor, parent_scores: torch.Tensor,
                  top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-2's expansion: each row's top_k tokens, scored parent score + log draft probability."""
    top = torch.topk(torch.log_softmax(logits.float(), -1), top_k, -1)
    return top.values + parent_scores.unsqueeze(-1), top.indices


def grow_tree(step: Step, root_logits: torch.Tensor, root_feat: torch.Tensor, start: int, top_k: int, depth: int,
              children=topk_children) -> GrownTree:
    """The whole candidate tree, no host read. root_logits [V] / root_feat [d]: the head's
    distribution and predicted feature at the pending token, which sits at position `start`
    of the head's cache (a node at depth j is fed at `start + j - 1`)."""
    dev = root_feat.device
    none = torch.empty(0, dtype=torch.long, device=dev)
    tree = GrownTree(none, none, none, torch.empty(0, dtype=torch.float32, device=dev), none)
    root = torch.full((1,), -1, dtype=torch.long, device=dev)
    scores, tokens = children(tree, root, root_logits.view(1, -1), torch.zeros(1, dtype=torch.float32, device=dev),
                              top_k)
    newest = tree.add_level(root, scores, tokens, 1)
    eye = torch.eye(top_k, dtype=torch.bool, device=dev)
    mask = feats = None
    for level in range(1, depth + 1):
        # the top_k best of the newest level; a stable sort keeps creation order among ties
        sel = torch.sort(tree.scores[newest], descending=True, stable=True).indices[:top_k]
        front = newest[sel]
        if mask is None:  # level 1: every parent is the root, no tree entry cached yet
            mask, inputs = eye, root_feat.expand(top_k, -1)
        else:  # the parent is the previous frontier's row sel // top_k (children in (row, rank) order)
            mask = torch.cat([mask[sel // top_k], eye], 1)
            inputs = feats[sel // top_k]
        pos = torch.full((top_k,), start + level - 1, dtype=torch.long, device=dev)
        logits, feats = step(inputs, tree.tokens[front], pos, mask)
        tree.fed.append(front)
        scores, tokens = children(tree, front, logits, tree.scores[front], top_k)
        newest = tree.add_level(front, scores, tokens, level + 1)
    return tree


def select_nodes(tree: GrownTree, num_nodes: int) -> torch.Tensor:
    """[min(num_nodes, N)] chosen candidate indices in rerank order, -1 where fewer were taken."""
    n_all = tree.tokens.shape[0]
    dev = tree.tokens.device
    order = torch.sort(tree.depths, stable=True).indices  # (-score, depth, index): two stable sorts
    order = order[torch.sort(tree.scores[order], descending=True, stable=True).indices]
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(n_all, device=dev))
    par = tree.parents.clamp_min(0)
    is_root_child = tree.parents < 0
    ok = is_root_child  # taken if its parent was taken earlier: one level per pass
    for _ in range(tree.levels - 1):
        ok = is_root_child | (ok[par] & (rank[par] < rank))
    ok_sorted = ok[order]
    take = ok_sorted & (ok_sorted.long().cumsum(0) <= num_nodes)
    key = torch.where(take, torch.arange(n_all, device=dev), torch.arange(n_all, 2 * n_all, device=dev))
    first = torch.sort(key).indices[: min(num_nodes, n_all)]
    return torch.where(take[first], order[first], torch.full_like(first, -1))


def read_tree(tree: GrownTree, chosen: torch.Tensor, root_token: int) -> tuple[TokenTree, list[int]]:
    """The chosen nodes as a TokenTree and its node tokens (root first): the step's one read."""
    c = chosen.clamp_min(0)
    rows = torch.stack([chosen, tree.tokens[c], tree.parents[c], tree.ranks[c]]).tolist()
    info = {i: (tok, par, r) for i, tok, par, r in zip(*rows) if i >= 0}
    token_of = {}
    for i, (tok, _, _) in info.items():
        path, j = [], i
        while j >= 0:  # every ancestor of a chosen node is chosen, and was created before it
            path.append(info[j][2])
            j = info[j][1] if info[j][1] < j else -1  # (bounded even for values that break that)
        token_of[tuple(reversed(path))] = tok
    out = TokenTree.from_paths(list(token_of))
    return out, [root_token] + [token_of[p] for p in out.paths[1:]]


def device_tree(tree: GrownTree, chosen: torch.Tensor) -> DeviceTree:
    """The chosen nodes as a DeviceTree, nothing read: node j + 1 is chosen[j] (rerank order, in
    which every parent comes before its children); a -1 (fewer candidates than num_nodes) is a
    padding node. The tree mask (ancestor or self) is built one level per pass."""
    n, n_all = chosen.shape[0], tree.tokens.shape[0]
    dev = chosen.device
    real = chosen >= 0
    c = chosen.clamp_min(0)
    nodes = torch.arange(1, n + 1, device=dev)
    node_of = torch.zeros(n_all + 1, dtype=torch.long, device=dev)  # candidate -> its node (slot n_all: padding)
    node_of.scatter_(0, torch.where(real, c, n_all), nodes)
    parent = tree.parents[c]
    parents = torch.where(real & (parent >= 0), node_of[parent.clamp_min(0)], torch.where(real, 0, nodes))
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    parents = torch.cat([zero, parents])
    depths = torch.cat([zero, torch.where(real, tree.depths[c], 0)])
    mask = torch.eye(n + 1, dtype=torch.bool, device=dev)
    for _ in range(tree.levels):
        mask = mask | mask[parents]
    return DeviceTree(tree.tokens[c], parents, depths, mask, torch.cat([real.new_ones(1), real]), tree.levels)
