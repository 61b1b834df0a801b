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
from specbench.engine.tree import TokenTree, verify_tree_sampling, verify_tree_typical
from specbench.errors import choice_error

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
class Proposal:
    tokens: list[int]  # chain: d1..dk; tree: the tree's nodes 1..n (node 0 is the pending token)
    q: torch.Tensor | None = None  # chain: draft distributions [k, V]; None = deterministic drafts
    tree: TokenTree | None = None
    layout: Layout | None = None

    @property
    def depth(self) -> int:
        """The most draft tokens one step can accept (what acceptance by position counts)."""
        return self.tree.max_depth if self.tree is not None else len(self.tokens)


def verification_input(prop: Proposal, pending: int) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None, list[int]]:
    """(feed, attention mask or None = causal, position offsets or None = consecutive, rows)."""
    if prop.layout is not None:
        lay = prop.layout
        return lay.feed, lay.mask, lay.positions, lay.rows
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
