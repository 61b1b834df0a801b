"""EAGLE-2's device tree grower (specbench/methods/eagle_tree.py) picks exactly what the host
grower it replaced picked (tests/eagle_host_tree.py): the same head calls (frontier tokens,
positions, tree masks, in the same order), the same candidates and scores, the same verified
tree and node tokens, on random draft logits coarse enough that ties are everywhere."""

import random

import pytest
import torch
from eagle_host_tree import DraftTree, host_draft_tree

from specbench.methods.eagle_tree import GrownTree, grow_tree, read_tree, select_nodes


def fake_head(seed: int, vocab: int, grid: float, d: int = 6):
    """A deterministic step: new feature from (parent feature, token), logits rounded to `grid`
    (grid 0: every logit equal, all ties). Records every call."""
    g = torch.Generator().manual_seed(seed)
    a, emb, b = torch.randn(d, d, generator=g), torch.randn(vocab, d, generator=g), torch.randn(d, vocab, generator=g)
    calls = []

    def step(feats, tokens, positions, mask):
        calls.append((tokens.tolist(), positions.tolist(), mask.tolist()))
        out = torch.tanh(feats @ a + emb[tokens])
        logits = torch.round(out @ b * grid) / grid if grid else torch.zeros(len(tokens), vocab)
        return logits, out

    root_feat = torch.randn(d, generator=g)
    root_logits = torch.round(root_feat @ b * grid) / grid if grid else torch.zeros(vocab)
    return step, calls, root_feat, root_logits


SETTINGS = [(k, depth, n) for k in (1, 2, 3, 4, 5) for depth in (0, 1, 2, 3, 5) for n in (1, 2, 4, 7, 15, 30, 200)]


@pytest.mark.parametrize("grid", [0, 0.5, 1, 4, 64])
def test_device_grower_picks_what_the_host_grower_picked(grid):
    rng = random.Random(grid)
    for i, (k, depth, n) in enumerate(SETTINGS):
        vocab = rng.choice([k, k + 1, 8, 12])
        step, host_calls, feat, logits = fake_head(i, vocab, grid)
        want_tree, want_nodes, cand = host_draft_tree(step, logits, feat, 9, k, depth, n, root_token=3)
        step, dev_calls, feat, logits = fake_head(i, vocab, grid)
        grown = grow_tree(step, logits, feat, 9, k, depth)
        tree, nodes = read_tree(grown, select_nodes(grown, n), 3)
        where = f"grid {grid}, top_k {k}, depth {depth}, num_nodes {n}, vocab {vocab}"
        assert dev_calls == host_calls, where  # same frontiers, positions and masks, in order
        assert grown.tokens.tolist() == cand.tokens and grown.parents.tolist() == cand.parents, where
        assert grown.scores.double().tolist() == cand.scores, where
        assert (tree.paths, nodes) == (want_tree.paths, want_nodes), where


def grown_from(cand: DraftTree) -> GrownTree:
    t = lambda xs, dtype=torch.long: torch.tensor(xs, dtype=dtype)  # noqa: E731
    return GrownTree(t(cand.tokens), t(cand.parents), t(cand.ranks), t(cand.scores, torch.float32), t(cand.depths),
                     levels=max(cand.depths))


def test_rerank_ties_and_ancestor_rule_on_random_scores():
    """Scores from a coarse grid in any order, children above their parents included: the host
    rule (take a node only after its parent) decides, and the device selection follows it."""
    rng = random.Random(0)
    for trial in range(400):
        cand, level = DraftTree(), [-1]
        for _ in range(rng.randint(1, 4)):
            nxt = []
            for p in level:
                for r in range(rng.randint(1, 3)):
                    score = rng.choice([0.0, -0.5, -1.0, -1.5, -2.0])
                    if trial % 2 == 0 and p >= 0:  # half the trials: EAGLE-2's monotone scores
                        score = cand.scores[p] + score
                    nxt.append(cand.add(rng.randint(0, 50), p, r, score))
            level = rng.sample(nxt, min(len(nxt), 3))
        n = rng.randint(1, len(cand.tokens) + 2)
        want = cand.rerank(7, n)
        tree, nodes = read_tree(grown_from(cand), select_nodes(grown_from(cand), n), 7)
        assert (tree.paths, nodes) == (want[0].paths, want[1]), (trial, n)


def test_rerank_is_a_tree_with_best_scores():
    cand = DraftTree()
    a, b = cand.add(10, -1, 0, -0.1), cand.add(11, -1, 1, -2.0)
    c, _ = cand.add(12, a, 0, -0.3), cand.add(13, a, 1, -0.3)  # a tie: both or the first
    cand.add(14, c, 0, -0.3)  # ties its parent: the shallower one goes first
    cand.add(15, b, 0, -2.5)
    tree, nodes = read_tree(grown_from(cand), select_nodes(grown_from(cand), 4), 7)
    assert nodes[0] == 7 and sorted(nodes[1:]) == [10, 12, 13, 14]
    assert tree.paths == [(), (0,), (0, 0), (0, 1), (0, 0, 0)]
