"""Lookahead decoding (Fu et al., ICML 2024; authors' code: github.com/hao-ai-lab/LookaheadDecoding, `lade`).

One target forward per step carries two branches after the pending token x (column 0 below):
- the lookahead branch: a window of N-1 rows of width W holding Jacobi-iteration trajectories.
  Row 0 is [x, w_1, ..., w_{W-1}] (guesses for the next W-1 positions); row l >= 1 holds the
  previous iterations' outputs. The token at (row l, column j) sits at position offset l + j and
  sees row 0's columns 0..j and its own column's rows 1..l: exactly one token per position from x
  on, a causal sequence (`window_layout`). Its output is a guess for offset l + j + 1.
- the verification branch: up to G n-gram candidates (N-1 tokens each) from the pool whose key is
  x, merged into a trie (`pool_trie`), each node seeing x and its own prefix (positions offset =
  depth): a `TokenTree` verified like any tree (greedy, or lossless multi-candidate rejection
  sampling with one-hot drafts), so only the target's own tokens are ever committed.
After the step, the top row's outputs o_j give one N-gram per column, (row 0[j], row 1[j], ...,
row N-2[j], o_j), stored in the pool under its first token (an LRU list of at most G n-grams per
key); the window then moves one iteration on: row 0 <- [x', row 1[1:]], row l <- row l+1, top <-
o (the authors' ALWAYS_FWD_ONE: one position per step whatever was accepted). With
`pool_from_prompt` the pool also holds the prompt's n-grams and those ending at each committed token.

As in `lade` (decoding.py `jacobi_greedy_search_multilevel`): row 0 starts as random copies of
prompt tokens, W + N - 3 of them, and the first N - 2 steps fill the window (each feeds the rows it
has, drops every row's first column and adds the top row's outputs as a new row) before n-grams are
collected. Deviations: the pool is used during the fill too (lade waits; its mask code needed the
full window), candidates sharing a prefix are verified once (a trie: same accepted tokens, fewer
rows), the copies are drawn with a generator seeded by the sample's seed, and the n-grams of
committed tokens are the ones that end at each of them (lade's loop appends the last accepted
token once per accepted token).
Accept rule (`full_match_bonus`): lade compares a candidate with the target's choices and, for a
candidate matched to its end, commits its N-1 tokens but not the target's token after its last one
(its matching loop ends at gg = N-2, so max_hit <= N-2 and hits[:max_hit + 1] holds N-1 tokens; its
sampling loop likewise draws no token after a fully accepted n-gram). `false` (default) does the
same: every candidate token is fed, but only the first N-2 are verified as tree nodes, so a full
match commits N-2 tokens plus the target's token after them, which is the n-gram's last token. `true`
verifies all N-1 and commits the target's token after them too (N per step at most). Both lossless.
Host reads per step: the top row's argmax (here) and the verifier's argmax (the loop).
"""

from __future__ import annotations

import random

import torch

from specbench.engine.tree import TokenTree
from specbench.engine.verify import Layout, Proposal
from specbench.core.errors import SpecBenchError
from specbench.methods.base import SpeculativeMethod, register_method


def window_layout(rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask [Q, Q] bool, position offsets [Q]) of a lookahead window, Q = rows * width, index
    l * width + j for (row l, column j); row 0 column 0 is the pending token. Built per step, not
    cached: a cached tensor would outlive the tensor mode it was made under (fake CUDA in the
    sync-budget test), and it is a few hundred booleans."""
    q = rows * width
    row = torch.arange(q) // width
    col = torch.arange(q) % width
    r_i, c_i = row.view(-1, 1), col.view(-1, 1)
    r_j, c_j = row.view(1, -1), col.view(1, -1)
    sees_row0 = (r_j == 0) & (c_j <= c_i)  # row 0 up to my column: x, w_1.., causal
    sees_column = (r_j >= 1) & (r_j <= r_i) & (c_j == c_i)  # my column's earlier iterations, and me
    return sees_row0 | sees_column, row + col


def pool_trie(grams: list[tuple[int, ...]]) -> tuple[TokenTree, list[int]]:
    """The candidates as a trie (first-seen order = rank order) and its node tokens (nodes 1..n)."""
    node_of: dict[tuple, tuple[int, ...]] = {}  # (parent path, token) -> rank path
    children: dict[tuple[int, ...], int] = {(): 0}
    token: dict[tuple[int, ...], int] = {}
    for gram in grams:
        path: tuple[int, ...] = ()
        for t in gram:
            if (path, t) not in node_of:
                child = path + (children[path],)
                children[path] += 1
                node_of[(path, t)], children[child], token[child] = child, 0, t
            path = node_of[(path, t)]
    tree = TokenTree.from_paths(list(token))
    return tree, [token[p] for p in tree.paths[1:]]


def remember(pool: dict, key: int, gram: tuple[int, ...], cap: int) -> None:
    """Add an n-gram under its key, least recently added first out (lade's GUESS_SET_SIZE policy)."""
    grams = pool.setdefault(key, [])
    if gram in grams:
        grams.remove(gram)
    elif len(grams) >= cap:
        grams.pop(0)
    grams.append(gram)


@register_method
class Lookahead(SpeculativeMethod):
    name = "lookahead"
    uses_controller = False  # W, N and G fix the step's shape

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        self.W, self.N, self.G = int(cfg.window), int(cfg.ngram), int(cfg.guess)
        for key, v, lo in (("window", self.W, 1), ("ngram", self.N, 3), ("guess", self.G, 1)):
            if v < lo:
                raise SpecBenchError(f"method.{key}={v} is not allowed; expected an integer >= {lo}")
        self.pool_from_prompt = bool(cfg.pool_from_prompt)
        self.full_match_bonus = cfg.full_match_bonus
        if not isinstance(self.full_match_bonus, bool):
            raise SpecBenchError(f"method.full_match_bonus={self.full_match_bonus} is not allowed; expected true or false")

    def describe(self) -> dict:
        return super().describe() | {"window": self.W, "ngram": self.N, "guess": self.G, "pool_from_prompt": self.pool_from_prompt,
                                     "full_match_bonus": self.full_match_bonus}

    def verify_widths(self) -> list[int]:
        # the full window alone (no candidate) and with G candidates of N-1 tokens (no shared prefix)
        return [(self.N - 1) * self.W, (self.N - 1) * (self.W + self.G)]

    # -- state ---------------------------------------------------------------------------------
    def prefill_draft(self, prompt: list[int]) -> None:
        rng = random.Random(self.seed)
        # row 0's guesses (lade: random copies of prompt tokens); rows 1.. come from the forwards
        self.rows: list[list[int]] = [[rng.choice(prompt) for _ in range(self.W + self.N - 3)]]
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        if self.pool_from_prompt:
            for i in range(len(prompt) - self.N + 1):
                remember(self.pool, prompt[i], tuple(prompt[i + 1 : i + self.N]), self.G)

    @property
    def width(self) -> int:
        return len(self.rows[0]) + 1  # row 0 holds the pending token too

    def propose(self, k_max: int) -> Proposal:
        x = self.tokens[-1]
        tree, cand = pool_trie(self.pool.get(x, []))
        wmask, wpos = window_layout(len(self.rows), self.width)
        a, n = wmask.shape[0], len(cand)
        mask = torch.zeros(a + n, a + n, dtype=torch.bool)
        mask[:a, :a] = wmask
        mask[a:, 0] = True  # every candidate sees the pending token
        mask[a:, a:] = tree.mask[1:, 1:]
        positions = torch.cat([wpos, tree.depths[1:]])
        feed = [x] + [t for r in self.rows for t in r] + cand
        if not self.full_match_bonus:  # lade: every candidate token is fed, the last one never committed
            n = sum(len(p) <= self.N - 2 for p in tree.paths[1:])  # nodes come depth by depth
            tree = TokenTree(tree.paths[: n + 1])
        rows = [0] + list(range(a, a + n))  # tree node i >= 1 is candidate i - 1
        return Proposal(cand[:n], tree=tree, layout=Layout(feed, mask, positions, rows))

    def after_verify(self, prop, path, rows, hidden, logits) -> None:
        x = prop.layout.feed[0]
        top = len(self.rows) - 1
        w = self.width
        out = logits[top * w : (top + 1) * w].argmax(-1).tolist()  # the step's one read of the window
        if top == self.N - 2:  # a full window: collect its n-grams, then one Jacobi iteration on
            first = [x] + self.rows[0]
            for j in range(w):
                remember(self.pool, first[j], tuple(self.rows[l][j] for l in range(1, top + 1)) + (out[j],), self.G)
            self.rows = [self.rows[1][1:]] + self.rows[2:] + [out]
        else:  # filling: every row loses its first column (one position on), the outputs become a row
            self.rows = [r[1:] for r in self.rows] + [out[1:]]
        if self.pool_from_prompt:  # the n-grams that end at each committed token
            t, n_new = self.tokens, len(path)
            for i in range(max(len(t) - n_new, self.N - 1), len(t)):
                remember(self.pool, t[i - self.N + 1], tuple(t[i - self.N + 2 : i + 1]), self.G)
