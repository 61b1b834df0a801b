"""REST: retrieval-based speculative decoding (He et al., NAACL 2024; github.com/FasterDecoding/REST).

A datastore (specbench/methods/datastore.py: a corpus in the target's tokens and its suffix array) stands
in for the draft model. Each step:
1. the longest suffix of the context, pending token included, of at most `max_suffix` and at
   least `min_suffix` tokens that occurs in the datastore (the authors' `token_spans` = 16..2);
2. the `continuation_len` tokens after each of its first `max_matches` occurrences (in
   suffix-array order, as draftretriever's `search(k=5000, long=10)`);
3. every prefix of those continuations, counted, in a trie; the `num_draft` most frequent prefixes
   are kept (`choices=64`), which is still a trie (methods/retrieval.py); with `cut: paths` (default,
   the authors' `cut_to_choices`) they are then trimmed, whole paths at a time, until the paths'
   distinct-token counts sum to at most `num_draft`; `cut: nodes` keeps
   all `num_draft` (the paper's "the most frequent" read literally, the wider trie);
4. the trie, the pending token as its root, is verified as a tree in one target forward (greedy,
   or lossless multi-candidate rejection sampling with one-hot drafts: engine/tree.py).
No suffix found: no draft, a plain target step (the authors pad a dummy candidate instead).

Deviations, each explained in docs/trainingfree_retrieval.md: ties at the `num_draft` cut are
broken shorter-first, then first-seen, and ties in `cut_to_choices` deeper-first (draftretriever:
a heap's and a hash set's order, which vary per process); the suffix length is binary-searched
(same result: a suffix that occurs implies every shorter one does).
Device work: none while drafting (the datastore and the context are host data); host reads per
step: the verifier's argmax only.
"""

from __future__ import annotations

import os

import numpy as np

from specbench.methods.datastore import load_or_build, parse_spec
from specbench.engine.verify import Proposal
from specbench.core.errors import SpecBenchError, choice_error
from specbench.methods.base import SpeculativeMethod, register_method
from specbench.methods.retrieval import cut_paths, prefix_counts, token_tree, top_nodes

SETTINGS = {"max_suffix": 1, "min_suffix": 1, "max_matches": 1, "continuation_len": 1, "num_draft": 1}
CUTS = ("paths", "nodes")  # draftretriever's cut_to_choices | the num_draft most frequent prefixes, untrimmed


@register_method
class REST(SpeculativeMethod):
    name = "rest"
    uses_controller = False  # the trie is the draft shape

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        for key, lo in SETTINGS.items():
            v = getattr(cfg, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise SpecBenchError(f"method.{key}={v} is not allowed; expected an integer >= {lo}")
            setattr(self, key, int(v))
        self.cut = cfg.cut
        if self.cut not in CUTS:
            raise choice_error("method.cut", self.cut, CUTS)
        if self.min_suffix > self.max_suffix:
            raise SpecBenchError(f"method.min_suffix={self.min_suffix} is above method.max_suffix={self.max_suffix}")
        corpus = cfg.corpus
        corpus = [corpus] if isinstance(corpus, str) else list(corpus or [])
        data_dir = run.data_dir or os.environ.get("SPECBENCH_DATA_DIR")
        self.datastore, self.datastore_path = load_or_build(str(run.model_name), target.tokenizer, corpus, data_dir,
                                                            bool(cfg.build_missing))
        self.corpus_files = [parse_spec(c, data_dir)[0] for c in corpus]
        self.last_match: tuple[int, int, int] = (0, 0, 0)  # (suffix length, suffix-array rows lo, hi)

    def describe(self) -> dict:
        return super().describe() | {k: getattr(self, k) for k in SETTINGS} | {"cut": self.cut} | {
            "datastore": self.datastore_path.name, "datastore_tokens": len(self.datastore),
            "corpus": self.datastore.meta.get("corpus")}

    def inputs(self) -> dict:
        return {"corpus": self.corpus_files, "datastore": self.datastore_path}

    def verify_widths(self) -> list[int]:
        return [self.num_draft + 1]  # the largest trie and its root

    def retrieve(self, context: list[int]) -> np.ndarray:
        """[m, continuation_len] continuations of the longest matching suffix (-1: past the end)."""
        length, lo, hi = self.last_match = self.datastore.longest_suffix(context, self.max_suffix, self.min_suffix)
        if length == 0:
            return np.zeros((0, self.continuation_len), dtype=np.int64)
        return self.datastore.continuations(lo, hi, length, self.max_matches, self.continuation_len)

    def draft_trie(self, conts: np.ndarray) -> tuple[list[int], list[int], list[int]]:
        """(parents, tokens, counts) of the kept trie nodes, parents first (-1: the root)."""
        parent, token, count, depth = prefix_counts(conts)
        keep = top_nodes(parent, count, depth, self.num_draft)
        if self.cut == "paths":
            keep = cut_paths(parent, token, depth, count, keep, self.num_draft)
        new = {int(i): j for j, i in enumerate(keep)}
        return [new[int(parent[i])] if parent[i] >= 0 else -1 for i in keep], token[keep].tolist(), count[keep].tolist()

    def propose(self, k_max: int) -> Proposal:
        parents, tokens, counts = self.draft_trie(self.retrieve(self.tokens))
        if not tokens:
            return Proposal([])
        tree, node_tokens = token_tree(parents, tokens, counts)
        return Proposal(node_tokens, tree=tree)
