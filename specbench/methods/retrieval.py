"""Shared by the retrieval drafters (REST, SuffixDecoding): scored token tries -> a `TokenTree`.

A drafter hands over nodes as (parent, token, score), parent -1 = the root (the pending token),
each node after its parent. `token_tree` gives every node its path of child ranks (children ranked
by score, highest first, ties in the order given: the order the tree verifier tries them) and
returns the tree with its node tokens in the tree's node order.

`prefix_counts` is REST's trie: every distinct prefix of the retrieved continuations with the
number of continuations that start with it (draftretriever's `cnt`), computed with one numpy
`unique` per depth; `top_nodes` keeps the `n` most frequent, which is a trie because a prefix is
never less frequent than its extensions (ties: shorter first, so a kept node's parent is kept);
`cut_paths` then trims them as draftretriever's `cut_to_choices` does.
"""

from __future__ import annotations

import numpy as np

from specbench.engine.tree import TokenTree


def token_tree(parents: list[int], tokens: list[int], scores: list[float]) -> tuple[TokenTree, list[int]]:
    """(tree, node tokens for nodes 1..n) from nodes given parent-first (parent -1: the root)."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError(f"node {i} comes before its parent {p}")
        kids.setdefault(p, []).append(i)
    path: dict[int, tuple[int, ...]] = {-1: ()}
    for p in sorted(kids):  # parents before children, as the nodes come
        ranked = sorted(kids[p], key=lambda i: -scores[i])  # stable: ties keep their order
        for r, i in enumerate(ranked):
            path[i] = path[p] + (r,)
    tree = TokenTree.from_paths([path[i] for i in range(len(tokens))])
    token_of = {path[i]: tokens[i] for i in range(len(tokens))}
    return tree, [token_of[p] for p in tree.paths[1:]]


def prefix_counts(conts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every distinct prefix of the rows of `conts` ([m, L], -1 ends a row) as trie nodes:
    (parent index or -1, token, count, depth), parents before children."""
    m, length = conts.shape
    parent_of_row = np.full(m, -1, dtype=np.int64)  # the node each row has reached so far
    alive = np.ones(m, dtype=bool)
    out_parent, out_token, out_count, out_depth = [], [], [], []
    base = 0
    for d in range(length):
        alive &= conts[:, d] >= 0
        if not alive.any():
            break
        rows = np.nonzero(alive)[0]
        key = (parent_of_row[rows] + 1) * (1 << 32) + conts[rows, d]
        uniq, first, inv, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        order = np.argsort(first, kind="stable")  # first-seen order: draftretriever's row order
        new_index = np.empty(len(uniq), dtype=np.int64)
        new_index[order] = np.arange(len(uniq))
        out_parent.append(parent_of_row[rows][first[order]])
        out_token.append(conts[rows, d][first[order]])
        out_count.append(counts[order])
        out_depth.append(np.full(len(uniq), d + 1))
        parent_of_row[rows] = base + new_index[inv]
        base += len(uniq)
    if not out_parent:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z, z
    return tuple(np.concatenate(a) for a in (out_parent, out_token, out_count, out_depth))


def top_nodes(parent: np.ndarray, count: np.ndarray, depth: np.ndarray, n: int) -> np.ndarray:
    """Indices (ascending: parents first) of the n nodes with the highest counts, ties shorter first."""
    keep = np.lexsort((depth, -count))[:n]
    return np.sort(keep)


def cut_paths(parent: np.ndarray, token: np.ndarray, depth: np.ndarray, count: np.ndarray, keep: np.ndarray,
              choices: int) -> np.ndarray:
    """draftretriever's `cut_to_choices` (REST, DraftRetriever/src/lib.rs) on the kept nodes `keep`: each
    node is the path from the root to it, weighing the number of *distinct token values* on that path;
    paths are removed, heaviest first, until the weights sum to at most `choices`. The authors order
    equal weights by a hash set's iteration order (seeded per process); here deeper first (a child
    before its parent, so what stays is still a trie), then less frequent, then later seen. How many
    nodes stay does not depend on that order, only which ones."""
    distinct: dict[int, frozenset] = {}
    for i in keep.tolist():  # parents first
        p = int(parent[i])
        distinct[i] = (distinct[p] if p >= 0 else frozenset()) | {int(token[i])}
    order = sorted(distinct, key=lambda i: (-len(distinct[i]), -int(depth[i]), int(count[i]), -i))
    total = sum(len(v) for v in distinct.values())
    removed = set()
    for i in order:
        if total <= choices:
            break
        total -= len(distinct[i])
        removed.add(i)
    return np.array([i for i in keep.tolist() if i not in removed], dtype=np.int64)
