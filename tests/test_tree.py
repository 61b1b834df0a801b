"""Token trees (Medusa fig. 2), the SPACE layout (fig. 3) and tree-masked forwards."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specbench.engine.sampling import SamplingConfig
from specbench.engine.tree import TokenTree, space_layout, verify_tree_greedy, verify_tree_sampling
from tests.helpers import tiny_model


def test_medusa_figure2_mask():
    t = TokenTree.cartesian([2, 3])
    # root, head-1 top-2, then head-2 top-3 after each
    assert t.paths == [(), (0,), (1,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    expected = torch.tensor([
        # r  a  b aa ab ac ba bb bc
        [1, 0, 0, 0, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0, 0, 0, 0],  # (0,)
        [1, 0, 1, 0, 0, 0, 0, 0, 0],  # (1,)
        [1, 1, 0, 1, 0, 0, 0, 0, 0],  # (0,0)
        [1, 1, 0, 0, 1, 0, 0, 0, 0],  # (0,1)
        [1, 1, 0, 0, 0, 1, 0, 0, 0],  # (0,2)
        [1, 0, 1, 0, 0, 0, 1, 0, 0],  # (1,0)
        [1, 0, 1, 0, 0, 0, 0, 1, 0],  # (1,1)
        [1, 0, 1, 0, 0, 0, 0, 0, 1],  # (1,2)
    ], dtype=torch.bool)
    assert torch.equal(t.mask, expected)
    assert t.depths.tolist() == [0, 1, 1, 2, 2, 2, 2, 2, 2]
    assert t.parents == [-1, 0, 0, 1, 1, 1, 2, 2, 2]
    assert t.retrieve == [[0, 1, 3], [0, 1, 4], [0, 1, 5], [0, 2, 6], [0, 2, 7], [0, 2, 8]]
    assert len(t) - 1 == 2 + 2 * 3  # sum_k prod_i s_i


def test_sparse_tree_and_accuracies():
    t = TokenTree.from_paths([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    assert t.parents == [-1, 0, 0, 1, 1, 3]
    acc = [[0.6, 0.2, 0.1], [0.5, 0.1], [0.4]]
    s = TokenTree.from_accuracies(acc, 4)
    # values: (0)=.6, (0,0)=.3, (1)=.2, (0,0,0)=.12, (0,1)=.06, (2)=.1
    assert s.paths == [(), (0,), (1,), (0, 0), (0, 0, 0)]
    assert abs(s.expected_length(acc) - (0.6 + 0.2 + 0.3 + 0.12)) < 1e-12
    # greedy choice beats any other tree of the same size on this objective
    assert s.expected_length(acc) >= TokenTree.cartesian([2, 1]).expected_length(acc)


def test_space_figure3_layout_mask_positions():
    # "LLMs are [M] [M] auto [M] [M] model [M] [M]"
    layout, mask, pos = space_layout(2, prefix=2)
    assert layout == [("x", 0), ("x", 1), ("m", 0), ("m", 0), ("c", 1), ("m", 1), ("m", 1), ("c", 2), ("m", 2), ("m", 2)]
    expected = torch.tensor([
        # LLMs are M  M auto M  M model M  M
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # LLMs
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # are
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],  # [M]
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # [M]
        [1, 1, 0, 0, 1, 0, 0, 0, 0, 0],  # auto
        [1, 1, 0, 0, 1, 1, 0, 0, 0, 0],  # [M]
        [1, 1, 0, 0, 1, 1, 1, 0, 0, 0],  # [M]
        [1, 1, 0, 0, 1, 0, 0, 1, 0, 0],  # model
        [1, 1, 0, 0, 1, 0, 0, 1, 1, 0],  # [M]
        [1, 1, 0, 0, 1, 0, 0, 1, 1, 1],  # [M]
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)
    assert pos.tolist() == [0, 1, 2, 3, 2, 3, 4, 3, 4, 5]
    assert len(layout) - 2 == 2 * (2 + 2)  # k(k+2) extra tokens


def test_space_k3_mask_positions_by_hand():
    """Paper's rule (section 3.2, Fig. 3): a mask sees the real tokens before it and the masks of
    its own group up to itself; real tokens see only earlier real tokens. Position = visible - 1."""
    layout, mask, pos = space_layout(3, prefix=1)
    # 0:x  1-3:M(g0)  4:c1  5-7:M(g1)  8:c2  9-11:M(g2)  12:c3  13-15:M(g3)
    sees = [
        {0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3},
        {0, 4}, {0, 4, 5}, {0, 4, 5, 6}, {0, 4, 5, 6, 7},
        {0, 4, 8}, {0, 4, 8, 9}, {0, 4, 8, 9, 10}, {0, 4, 8, 9, 10, 11},
        {0, 4, 8, 12}, {0, 4, 8, 12, 13}, {0, 4, 8, 12, 13, 14}, {0, 4, 8, 12, 13, 14, 15},
    ]
    expected = torch.zeros(16, 16, dtype=torch.bool)
    for i, js in enumerate(sees):
        expected[i, sorted(js)] = True
    assert [kind for kind, _ in layout] == ["x"] + (["m"] * 3 + ["c"]) * 3 + ["m"] * 3
    assert torch.equal(mask, expected)
    assert pos.tolist() == [0, 1, 2, 3, 1, 2, 3, 4, 2, 3, 4, 5, 3, 4, 5, 6]


def test_tree_forward_matches_causal_paths():
    target = tiny_model()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 259, (7,), generator=g).tolist()
    tree = TokenTree.from_paths([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 1, 0]])
    tokens = torch.randint(3, 259, (len(tree),), generator=g).tolist()
    cache = target.new_cache()
    target.forward(prompt, cache)
    L = cache.length()
    logits, _ = target.forward(tokens, cache, positions=L + tree.depths, tree_mask=tree.mask)
    for i in range(len(tree)):
        path = [j for j in range(len(tree)) if tree.mask[i, j]]
        ref, _ = target.forward(prompt + [tokens[j] for j in path], target.new_cache())
        assert torch.allclose(logits[i], ref[-1], atol=1e-9, rtol=0)
    # keep() on one path then a causal step equals a fresh forward of that path
    path = tree.retrieve[0]
    cache.keep(L, path)
    nxt, _ = target.forward([5], cache)
    ref, _ = target.forward(prompt + [tokens[j] for j in path] + [5], target.new_cache())
    assert torch.allclose(nxt[-1], ref[-1], atol=1e-9, rtol=0)


def test_verify_tree_greedy_and_sampling_distribution():
    tree = TokenTree.cartesian([2, 2])
    V = 4
    logits = torch.full((len(tree), V), -10.0, dtype=torch.float64)
    tokens = [0, 1, 2, 3, 1, 0, 1]  # (0,)=1 (1,)=2 (0,0)=3 (0,1)=1 (1,0)=0 (1,1)=1
    logits[0, 2] = 5  # root -> 2 = node 2
    logits[2, 1] = 5  # node 2 -> 1 = node 6
    logits[6, 3] = 5
    assert verify_tree_greedy(tree, tokens, logits) == ([0, 2, 6], 3)
    # sampling: the first committed token after the root follows p exactly
    logits = torch.randn(len(tree), V, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    cfg = SamplingConfig(temperature=1.0)
    p = torch.softmax(logits[0], -1)
    gen = torch.Generator().manual_seed(2)
    counts = torch.zeros(V)
    n = 4000
    for _ in range(n):
        path, tok = verify_tree_sampling(tree, tokens, logits, cfg, gen)
        first = tokens[path[1]] if len(path) > 1 else tok
        counts[first] += 1
    assert torch.allclose(counts / n, p.float(), atol=0.03)


def test_typical_acceptance_at_temperature_zero_is_greedy():
    """Medusa (3.3.1 and its reference code): at temperature 0 candidates are checked against the
    target's argmax; a T=1 softmax would accept a plausible non-argmax token here."""
    from specbench.engine.tree import verify_tree_typical

    tree = TokenTree.chain(1)
    logits = torch.log(torch.tensor([[0.5, 0.45, 0.05], [0.1, 0.1, 0.8]], dtype=torch.float64))
    nodes = [2, 1]  # root, then the candidate: token 1, not the argmax 0
    assert verify_tree_typical(tree, nodes, logits, 0.0, 0.09, 0.3) == verify_tree_greedy(tree, nodes, logits) == ([0], 0)
    assert verify_tree_typical(tree, nodes, logits, 1.0, 0.09, 0.3) == ([0, 1], 2)  # sampling: typical accepts it


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 3))
def test_the_device_verifier_accepts_the_host_verifiers_path(seed, pad):
    """verify_tree_greedy_device (one read, decided on the device) against verify_tree_greedy on
    random trees, tokens and logits made to accept paths of every length; padding is never taken."""
    import random

    from specbench.engine.tree import verify_tree_greedy_device
    from specbench.engine.verify import DeviceTree

    rng = random.Random(seed)
    paths = {()}
    for _ in range(rng.randint(1, 14)):
        parent = rng.choice(sorted(paths))
        if len(parent) < 4:
            paths.add(parent + (len([p for p in paths if p[:-1] == parent and len(p) == len(parent) + 1]),))
    tree = TokenTree.from_paths(sorted(paths))
    vocab = 12
    # siblings distinct; the target's argmax at a node is one of its children's tokens half of the time
    tokens = [rng.randrange(vocab)]
    for p in tree.paths[1:]:
        taken = {tokens[c] for c in tree.children[tree.parents[tree.paths.index(p)]] if c < len(tokens)}
        tokens.append(rng.choice([t for t in range(vocab) if t not in taken]))
    logits = torch.randn(len(tree) + pad, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    for i in range(len(tree)):
        kids = tree.children[i]
        if kids and rng.random() < 0.7:
            logits[i, tokens[rng.choice(kids)]] += 100.0
    want_path, want_tok = verify_tree_greedy(tree, tokens, logits[: len(tree)])
    dtree = DeviceTree.of(tree, torch.tensor(tokens[1:]), pad, tree.max_depth + rng.randint(0, 3))
    feed = torch.cat([torch.tensor(tokens[:1]), dtree.tokens])
    path, tok, accepted, depth, cands = verify_tree_greedy_device(dtree, feed, logits)
    assert (path, tok) == (want_path, want_tok)
    assert accepted == [tokens[j] for j in want_path[1:]] and depth == tree.max_depth and cands == len(tree) - 1
