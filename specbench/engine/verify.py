"""What a drafter proposes and the one verifier every method's candidates go through.

A `Proposal` is a chain of draft tokens, a `TokenTree` of them (Medusa, EAGLE-2) or a chain
whose verification input is an explicit layout (SPACE's interleaved mask groups). Whatever the
shape, verification is one target forward over `verification_input` followed by `verify`: it
returns the accepted path as node indices (0 = the pending token, node j >= 1 = `tokens[j-1]`)
and the target's next token, so the decode loop (methods/base.py) commits every proposer's
result and compacts the cache the same way.

Acceptance rules: `auto` = greedy at temperature 0, lossless rejection sampling otherwise (a
chain with draft distributions q: the standard min(1, p/q) test with residual resampling; a tree:
multi-candidate sampling with one-hot drafts, engine/tree.py); `typical` = Medusa's typical
acceptance (lossy above temperature 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.engine.sampling import SamplingConfig, verify_sampling
from specbench.engine.transfer import upload
from specbench.engine.tree import TokenTree, verify_tree_sampling, verify_tree_typical
from specbench.core.errors import choice_error

ACCEPTANCE = ("auto", "typical")


@dataclass
class Layout:
    """An explicit verification input (SPACE): `feed` after the cache, its attention `mask`,
    position offsets from the cache length, and the feed index of the pending token and of each
    candidate (`rows`), where the target's logits for them come out."""

    feed: list[int]
    mask: torch.Tensor
    positions: torch.Tensor
    rows: list[int]


@dataclass
class DeviceTree:
    """A token tree that stays on the device until it is verified (greedy): node 0 is the pending
    token, nodes 1..n the candidates, parents before children. Nothing about it is read to the host
    before the verification, whose one read returns the accepted path (engine/tree.py
    `verify_tree_greedy_device`): no host round trip between draft and verify. Padding nodes (a
    draft that proposed fewer than n) see only themselves, no node sees them, none is accepted."""

    tokens: torch.Tensor  # [n] long: the candidates' tokens
    parents: torch.Tensor  # [n + 1] long: each node's parent (the root's: 0; padding: itself)
    depths: torch.Tensor  # [n + 1] long: position offsets (root 0)
    mask: torch.Tensor  # [n + 1, n + 1] bool: ancestor or self
    real: torch.Tensor  # [n + 1] bool: not padding (the root is real)
    levels: int  # a bound on the depth (host-known): how far the device walk goes

    def with_tokens(self, tokens: torch.Tensor) -> "DeviceTree":
        """The same shape with other candidate tokens (a static tree's template, filled per step)."""
        return DeviceTree(tokens, self.parents, self.depths, self.mask, self.real, self.levels)

    @classmethod
    def of(cls, tree: TokenTree, tokens: torch.Tensor, pad: int = 0, levels: int | None = None) -> "DeviceTree":
        """A host tree's shape (uploaded) with device tokens [n] for nodes 1..n, and `pad` padding nodes;
        `levels`: the depth bound (default the tree's depth; a grown tree's bound may be deeper)."""
        n, dev = len(tree.paths) - 1, tokens.device
        parents = [0] + tree.parents[1:] + list(range(n + 1, n + 1 + pad))
        mask = torch.eye(n + 1 + pad, dtype=torch.bool)  # built from the host's parents (tree.mask may be on the device)
        for i in range(1, n + 1):
            j = parents[i]
            while True:
                mask[i, j] = True
                if j == 0:
                    break
                j = parents[j]
        depths = torch.tensor([len(p) for p in tree.paths] + [0] * pad)
        real = torch.arange(n + 1 + pad) <= n
        pads = torch.zeros(pad, dtype=torch.long, device=dev)
        return cls(torch.cat([tokens, pads]), upload(parents, dev, torch.long), upload(depths, dev), upload(mask, dev), upload(real, dev),
                   tree.max_depth if levels is None else levels)


@dataclass
class Proposal:
    tokens: list[int]  # chain: d1..dk; tree: the tree's nodes 1..n (node 0 is the pending token)
    q: torch.Tensor | None = None  # chain: draft distributions [k, V]; None = deterministic drafts
    tree: TokenTree | None = None
    layout: Layout | None = None
    dtree: DeviceTree | None = None  # a tree left on the device (greedy only); `tokens` is then empty

    @property
    def depth(self) -> int:
        """The most draft tokens one step can accept (what acceptance by position counts)."""
        return self.tree.max_depth if self.tree is not None else len(self.tokens)


def verification_input(prop: Proposal, pending: int) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None, list[int]]:
    """(feed, attention mask or None = causal, position offsets or None = consecutive, rows)."""
    if prop.layout is not None:
        lay = prop.layout
        return lay.feed, lay.mask, lay.positions, lay.rows
    if prop.dtree is not None:
        d = prop.dtree
        feed = torch.cat([upload([pending], d.tokens.device, torch.long), d.tokens])
        return feed, d.mask, d.depths, list(range(feed.shape[0]))
    feed = [pending] + list(prop.tokens)
    rows = list(range(len(feed)))
    if prop.tree is None:
        return feed, None, None, rows
    return feed, prop.tree.mask, prop.tree.depths, rows


@dataclass
class Verifier:
    acceptance: str = "auto"
    epsilon: float | None = None  # typical acceptance (Medusa 3.3.1): method.epsilon and method.delta
    delta: float | None = None

    def __post_init__(self):
        if self.acceptance not in ACCEPTANCE:
            raise choice_error("acceptance", self.acceptance, ACCEPTANCE)
        if self.acceptance == "typical" and None in (self.epsilon, self.delta):
            raise ValueError("typical acceptance needs its epsilon and delta")

    def lossless(self, sampling: SamplingConfig) -> bool:
        return self.acceptance != "typical" or sampling.greedy  # typical at T=0 is greedy

    def __call__(self, prop: Proposal, pending: int, logits: torch.Tensor, sampling: SamplingConfig,
                 generator: torch.Generator | None) -> tuple[list[int], int]:
        """logits[i]: the target's logits at node i (0: the pending token). Returns (accepted
        node path starting at 0, the next token)."""
        tree = prop.tree
        if self.acceptance == "typical":
            tree = tree or TokenTree.chain(len(prop.tokens))
            return verify_tree_typical(tree, [pending] + prop.tokens, logits, sampling.temperature,
                                       self.epsilon, self.delta)
        if tree is None:
            n, tok = verify_sampling(logits, prop.tokens, prop.q, sampling, generator)
            return list(range(n + 1)), tok
        return verify_tree_sampling(tree, [pending] + prop.tokens, logits, sampling, generator)
