"""SAM-Decoding's retrieval (Hu et al. 2024, arXiv 2411.10666; authors' code github.com/hyx1999/SAM-Decoding,
`samd/sam/dyn_sam.py`, `static_sam.py`, `samd/draft.py`): the longest suffix of the text that occurs in
the text before it (dynamic) or in a corpus (static), and the tokens that followed its occurrence.

Dynamic: a suffix automaton over the committed tokens (the prompt and the generation so far), grown
as tokens are committed, with a cursor: the state and length of the longest suffix of the committed
text that occurred in the text before its last token (the authors' `cur_index`/`cur_length`, moved
by one transition per token before that token is added). A lookup moves it once more by the pending
token. The draft is what followed the state's *first* occurrence (`min_endpos`), after stepping to
shorter suffixes (suffix links) while fewer than `n_predicts` tokens follow it (the authors' `to_anc`).

Static: the corpus is the REST datastore's (specbench/methods/datastore.py: the target's tokens, no separator
between entries) and its suffix array answers what the authors' static automaton does: the longest
suffix of the context (pending token included) found in the corpus, and the continuation of that
suffix's first occurrence. The length is binary-searched, bounded by the last match plus the tokens
committed since (a match grows by at most one per token), so a step costs O(log) suffix-array
searches; no automaton over a million-token corpus is held in Python objects. tests/test_samd.py
checks both against a re-statement of the authors' automata on the same inputs.

`choose` is the authors' `DraftModel.lookup` rule: the static length is lowered by `len_bias`; the
longer of the two drafts when it reaches `len_threshold` (the dynamic one on a tie), else the
auxiliary drafter's.
"""

from __future__ import annotations

DYNAMIC, STATIC, AUX = "dynamic", "static", "aux"


class SuffixAutomaton:
    """The dynamic automaton: states as parallel lists, `first` = the first end position (1-based)."""

    def __init__(self):
        self.next: list[dict[int, int]] = [{}]
        self.link = [-1]
        self.length = [0]
        self.first = [0]
        self.text: list[int] = []
        self.last = 0
        self.cur, self.cur_len = 0, 0  # the cursor: longest suffix seen before its last token

    def _new(self, length: int, first: int, nxt: dict, link: int) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.first.append(first)
        return len(self.length) - 1

    def _add(self, t: int) -> None:
        """The standard online construction (Blumer et al.), one token."""
        n = len(self.text)
        cur = self._new(n, n, {}, 0)
        p = self.last
        while p != -1 and t not in self.next[p]:
            self.next[p][t] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][t]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:  # split q: the clone keeps q's first end position and transitions
                clone = self._new(self.length[p] + 1, self.first[q], dict(self.next[q]), self.link[q])
                while p != -1 and self.next[p].get(t) == q:
                    self.next[p][t] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def walk(self, state: int, length: int, t: int) -> tuple[int, int]:
        """Extend the match (state, length) by token t, dropping to shorter suffixes as needed."""
        while state != 0 and t not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        if t in self.next[state]:
            return self.next[state][t], length + 1
        return 0, 0

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            self.cur, self.cur_len = self.walk(self.cur, self.cur_len, t)
            self.text.append(t)
            self._add(t)

    def match(self, t: int) -> tuple[int, int]:
        """(state, length) of the longest suffix of text + [t] that occurs in text."""
        return self.walk(self.cur, self.cur_len, t)

    def draft(self, state: int, n_predicts: int) -> list[int]:
        """At most n_predicts - 1 tokens after the state's first occurrence (the pending token is the
        authors' n_predicts-th); a shorter suffix with an earlier occurrence when too few follow."""
        n = len(self.text)
        if state != 0:
            while self.link[state] != 0 and n - self.first[state] < n_predicts:
                state = self.link[state]
        end = self.first[state]
        return self.text[end : end + n_predicts - 1]


class CorpusIndex:
    """The static side over a Datastore: the longest matching suffix, tracked across a generation."""

    def __init__(self, datastore):
        self.store = datastore
        self.reset()

    def reset(self) -> None:
        self.matched, self.seen = 0, 0  # the last match's length and the context length it was for

    def match(self, context: list[int]) -> tuple[int, int, int]:
        """(length, lo, hi) of the longest suffix of `context` in the corpus (suffix-array rows
        lo..hi); `context` extends the one of the previous call since `reset`."""
        bound = self.matched + len(context) - self.seen if self.seen else len(context)
        length, lo, hi = self.store.longest_suffix(context, min(bound, len(context)), 1) if bound else (0, 0, 0)
        self.matched, self.seen = length, len(context)
        return length, lo, hi

    def draft(self, length: int, lo: int, hi: int, n_predicts: int) -> list[int]:
        """At most n_predicts - 1 corpus tokens after the match's first occurrence."""
        # no match (a negative len_bias can pick one): the authors' root state, the corpus' start
        start = int(self.store.sa[lo:hi].min()) + length if hi > lo else 0
        return self.store.tokens[start : start + n_predicts - 1].tolist()


def choose(dynamic: int, static: int | None, len_threshold: int, len_bias: int) -> str:
    """Which drafter proposes: the authors' DraftModel.lookup on the two match lengths (static None:
    no corpus; the authors' NullStaticSAM would draft garbage if a negative bias ever picked it)."""
    static = float("-inf") if static is None else static - len_bias
    if max(dynamic, static) >= len_threshold:
        return DYNAMIC if dynamic >= static else STATIC
    return AUX
