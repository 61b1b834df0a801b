"""Token trees and group layouts for one-forward multi-candidate verification.

`TokenTree` (Medusa, section 3.1.2): node 0 is the root, the pending token (already chosen by the
target); every other node is a path of child ranks, e.g. (0, 1) = "rank-1 prediction of head 2
after the rank-0 prediction of head 1" (Medusa's sparse-tree "choices" format). Nodes are
ordered by depth, then lexicographically, as in Medusa's code. A forward over the node tokens
with `tree.mask` (each node sees itself and its ancestors, cached tokens always visible) and
positions `cache_length + tree.depths` gives every node the logits of a causal forward over its
own path (tests/test_tree.py checks this).

`space_layout(k)` (SPACE, eqs. 5-7): the interleaved input [x..., M*k, c1, M*k, ..., ck, M*k],
its attention mask (masks see their own group only; see the function for eq. 6's literal
reading) and position offsets (eq. 7).

Verification: `verify_tree_greedy` (longest path whose tokens equal the target's argmax) and
`verify_tree_sampling`, lossless multi-candidate rejection sampling (SpecInfer-style with
deterministic drafts, q = one-hot): at a node, the children are tried in order; child token x is
accepted with probability p'(x), where p' starts as the target's processed distribution at the
node and after each rejected child x becomes norm(max(0, p' - onehot(x))) = p' with x removed;
if every child is rejected, the next token is drawn from the final residual. For one-hot drafts
this is sampling without replacement, so the committed token at each depth follows p exactly.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

from specbench.engine.sampling import SamplingConfig, probs, sample
from specbench.engine.transfer import upload


@dataclass
class TokenTree:
    paths: list[tuple[int, ...]]  # node i's path (node 0: the root, ())
    parents: list[int] = field(init=False)
    depths: torch.Tensor = field(init=False)  # [n] long: position offset of each node
    mask: torch.Tensor = field(init=False)  # [n, n] bool: node i sees node j (ancestor or self)
    children: list[list[int]] = field(init=False)  # node -> child nodes in rank order
    retrieve: list[list[int]] = field(init=False)  # root-to-leaf node paths, one per leaf

    def __post_init__(self):
        paths = [tuple(int(c) for c in p) for p in self.paths]
        index = {p: i for i, p in enumerate(paths)}
        if not paths or paths[0] != ():
            raise ValueError("node 0 must be the root ()")
        if len(index) != len(paths):
            raise ValueError("duplicate paths in tree")
        n = len(paths)
        self.paths = paths
        self.parents = [-1] + [0] * (n - 1)
        for i, p in enumerate(paths[1:], 1):
            if p[:-1] not in index:
                raise ValueError(f"tree path {p} has no parent {p[:-1]} (every prefix of a path must be a node)")
            self.parents[i] = index[p[:-1]]
            if self.parents[i] >= i:
                raise ValueError("nodes must come after their parents")
        self.depths = torch.tensor([len(p) for p in paths], dtype=torch.long)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            j = i
            while j >= 0:
                mask[i, j] = True
                j = self.parents[j]
        self.mask = mask
        self.children = [[] for _ in range(n)]
        for i in range(1, n):
            self.children[self.parents[i]].append(i)
        for c in self.children:
            c.sort(key=lambda j: paths[j][-1])
        self.retrieve = []
        for i in range(n):
            if not self.children[i]:
                path, j = [], i
                while j >= 0:
                    path.append(j)
                    j = self.parents[j]
                self.retrieve.append(path[::-1])

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    def from_paths(cls, paths) -> "TokenTree":
        """Medusa's choices format, root implicit: [(0,), (1,), (0, 0), ...] (lists work too)."""
        ps = sorted({tuple(int(c) for c in p) for p in paths if len(p)}, key=lambda p: (len(p), p))
        return cls([()] + ps)

    @classmethod
    def cartesian(cls, sizes) -> "TokenTree":
        """Dense tree: top-s_k of head k after every node of depth k-1 (Medusa fig. 2)."""
        paths, level = [], [()]
        for s in sizes:
            level = [p + (r,) for p in level for r in range(int(s))]
            paths += level
        return cls.from_paths(paths)

    @classmethod
    def chain(cls, depth: int) -> "TokenTree":
        return cls.cartesian([1] * depth)

    @classmethod
    def from_accuracies(cls, acc, n_nodes: int) -> "TokenTree":
        """Sparse tree (Medusa 3.3.3) of n_nodes candidate nodes (root not counted), added one
        at a time by largest expected contribution to the accepted length: a node's value is
        the product of acc[depth-1][rank] along its path. acc[h][r]: accuracy of head h+1's
        rank-r prediction. Accuracies <= 1 make a child never better than its parent, so the
        greedy choice is always a valid (prefix-closed) tree."""
        acc = [[float(a) for a in row] for row in acc]
        chosen: list[tuple[int, ...]] = []
        heap = [(-acc[0][r], (r,)) for r in range(len(acc[0]))] if acc else []
        heapq.heapify(heap)
        while heap and len(chosen) < n_nodes:
            neg, p = heapq.heappop(heap)
            chosen.append(p)
            if len(p) < len(acc):
                for r in range(len(acc[len(p)])):
                    heapq.heappush(heap, (neg * acc[len(p)][r], p + (r,)))
        return cls.from_paths(chosen)

    # -- facts -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return max(len(p) for p in self.paths)  # from the paths: no device read

    def expected_length(self, acc) -> float:
        """Expected accepted candidate tokens per step under independent head accuracies."""
        total = 0.0
        for p in self.paths[1:]:
            v = 1.0
            for d, r in enumerate(p):
                v *= acc[d][r] if d < len(acc) and r < len(acc[d]) else 0.0
            total += v
        return total

    def node_tokens(self, root: int, ranked: list[list[int]]) -> list[int]:
        """Tokens of every node: root, then ranked[depth-1][rank] (Medusa: head d's top-r)."""
        return [root] + [int(ranked[len(p) - 1][p[-1]]) for p in self.paths[1:]]


# -- verification ---------------------------------------------------------------------------
def verify_tree_greedy(tree: TokenTree, node_tokens: list[int], logits: torch.Tensor) -> tuple[list[int], int]:
    """logits[i]: the target's logits at node i. Returns (accepted node path starting with the
    root, next token = the target's argmax after the path's last node)."""
    choice = logits.argmax(-1).tolist()
    path = [0]
    while True:
        want = choice[path[-1]]
        nxt = next((c for c in tree.children[path[-1]] if node_tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)


def verify_tree_greedy_device(tree, feed: torch.Tensor, logits: torch.Tensor) -> tuple[list[int], int, list[int], int, int]:
    """verify_tree_greedy on a DeviceTree (engine/verify.py), decided on the device and read once:
    (accepted node path from the root, next token, the path's draft tokens, the deepest real node's
    depth, the real candidates). A node is accepted when its token is the target's argmax at its
    parent and its parent is accepted; a parent's children are distinct tokens, so the accepted
    nodes are one path, and its deepest node is the only accepted node at its depth."""
    choice = logits.argmax(-1)
    ok = (feed == choice[tree.parents]) & tree.real
    ok[0] = True
    acc = ok
    for _ in range(tree.levels):
        acc = ok & acc[tree.parents]
    # a 1-element index, not a 0-dim one: indexing with a 0-dim tensor reads it to the host first
    best = torch.where(acc, tree.depths, -1).argmax().view(1)
    on_path = torch.where(tree.mask.index_select(0, best)[0], tree.depths, tree.depths.shape[0] + tree.levels)
    path = torch.sort(on_path, stable=True).indices[: tree.levels + 1]
    head = torch.cat([tree.depths.index_select(0, best), choice.index_select(0, best),
                      torch.where(tree.real, tree.depths, 0).max().view(1), (tree.real.sum() - 1).view(1)])
    got = torch.cat([head, path, feed[path]]).tolist()  # the step's one read
    d, width = got[0], path.shape[0]  # the path's slots: the depth bound + 1, or every node when fewer
    nodes, tokens = got[4 : 4 + d + 1], got[4 + width : 4 + width + d + 1]
    return nodes, got[1], tokens[1:], got[2], got[3]


def verify_tree_sampling(tree: TokenTree, node_tokens: list[int], logits: torch.Tensor, cfg: SamplingConfig,
                         generator: torch.Generator | None) -> tuple[list[int], int]:
    """Lossless multi-candidate rejection sampling with one-hot drafts (see module doc)."""
    if cfg.greedy:
        return verify_tree_greedy(tree, node_tokens, logits)
    path = [0]
    while True:
        node = path[-1]
        p = probs(logits[node], cfg).cpu().double()
        accepted = None
        for c in tree.children[node]:
            x = node_tokens[c]
            px = float(p[x])
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if px > 0 and u < px:
                accepted = c
                break
            p[x] = 0.0  # residual norm(max(0, p - onehot(x)))
            total = float(p.sum())
            if total <= 0:
                break
            p = p / total
        if accepted is None:
            return path, sample(p / p.sum(), generator)
        path.append(accepted)


def verify_tree_typical(tree: TokenTree, node_tokens: list[int], logits: torch.Tensor, temperature: float,
                        epsilon: float, delta: float) -> tuple[list[int], int]:
    """Medusa typical acceptance (3.3.1), lossy: a node's token is accepted if
    p(x) > min(epsilon, delta * exp(-H(p))) with p = softmax(logits / T) of its parent; the
    longest accepted path wins (ties: lower ranks first); the token after it is the target's
    greedy choice. At T = 0 there is no distribution to be typical of: greedy verification, as
    in Medusa's reference code (so the output then equals AR's)."""
    if temperature <= 0:
        return verify_tree_greedy(tree, node_tokens, logits)
    p = torch.softmax(logits.double() / temperature, -1)
    ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)
    thresh = torch.minimum(torch.full_like(ent, float(epsilon)), float(delta) * torch.exp(-ent))
    # every node's test and every node's argmax on the device, read in one copy (a read per node
    # would be a wait per node on a GPU); the parents' chain is walked on the host
    par = upload(tree.parents[1:], p.device, torch.long)
    passed = p[par, upload(node_tokens[1:], p.device, torch.long)] > thresh[par]
    got = torch.cat([passed.long(), logits.argmax(-1)]).tolist()
    typical, choice = got[: len(tree) - 1], got[len(tree) - 1 :]
    ok = [True] + [False] * (len(tree) - 1)
    best = [0]
    for i in range(1, len(tree)):
        ok[i] = ok[tree.parents[i]] and bool(typical[i - 1])
    for leaf_path in tree.retrieve:
        acc = []
        for j in leaf_path:
            if not ok[j]:
                break
            acc.append(j)
        if len(acc) > len(best):
            best = acc
    return best, choice[best[-1]]


# -- SPACE -----------------------------------------------------------------------------------
SPACE_MASK_RULES = ("group", "eq6")


def space_layout(k: int, prefix: int = 1, rule: str = "group") -> tuple[list[tuple[str, int]], torch.Tensor, torch.Tensor]:
    """SPACE input of eq. 5 after `prefix` real tokens x (in decoding: the pending token):
    [x_1..x_prefix, M*k (group 0), c_1, M*k (group 1), ..., c_k, M*k (group k)].

    Returns (layout, mask [q, q] bool, position offsets [q] long). layout[i] is ("x", j) for
    the j-th prefix token, ("c", i) for candidate c_i (1-based) and ("m", g) for a mask token
    of group g. Mask: i sees j <= i if j is not a mask, or if both are masks of the same group
    (the paper's text and Fig. 3). Eq. 6 literally says "masks less than k apart", which equals
    the group rule only for k <= 2: groups are one candidate apart, so for k >= 3 a mask would
    also see the previous group's last masks, an input SAR-SFT training never shows the model.
    rule="eq6" keeps that literal reading (selectable as `method.mask_rule=eq6`).
    Positions (eq. 7): row sum of the mask minus one, so group g's mask j sits where it sits in
    the training input [x, c_1..c_g, M*k] (tests/test_space.py checks the logits agree)."""
    layout: list[tuple[str, int]] = [("x", j) for j in range(prefix)]
    layout += [("m", 0)] * k
    for i in range(1, k + 1):
        layout.append(("c", i))
        layout += [("m", i)] * k
    q = len(layout)
    is_m = torch.tensor([kind == "m" for kind, _ in layout])
    group = torch.tensor([g if kind == "m" else -1 for kind, g in layout])
    same_group = is_m.view(-1, 1) & (group.view(-1, 1) == group.view(1, -1))
    causal = torch.ones(q, q, dtype=torch.bool).tril()
    if rule == "eq6":
        near = torch.arange(q).view(-1, 1) - torch.arange(q).view(1, -1) < k
        same_group = is_m.view(-1, 1) & is_m.view(1, -1) & near
    elif rule != "group":
        raise ValueError(f"unknown SPACE mask rule {rule!r}")
    mask = causal & (~is_m.view(1, -1) | same_group)
    positions = mask.sum(-1).long() - 1
    return layout, mask, positions


def space_indices(layout: list[tuple[str, int]], k: int) -> tuple[list[int], list[list[int]]]:
    """(index of the last prefix token then of c_1..c_k, mask indices of groups 0..k)."""
    real = [max(i for i, (kind, _) in enumerate(layout) if kind == "x")]
    real += [i for i, (kind, _) in enumerate(layout) if kind == "c"]
    groups = [[i for i, (kind, g) in enumerate(layout) if kind == "m" and g == grp] for grp in range(k + 1)]
    return real, groups
