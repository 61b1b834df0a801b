"""SuffixDecoding (Oliaro et al., arXiv 2411.04975; the authors' code: Snowflake's ArcticInference,
`arctic_inference/suffix_decoding`): speculation trees from suffix tries over the prompt and over
the method's own outputs.

Two tries with counts, each holding every suffix of its sequences cut at `max_depth` tokens:
- the per-request trie: this request's prompt and its output so far (arctic's local tree);
- the global trie: every output this method object generated in the run, the current one
  included as it grows (arctic's `add_active_response` feeds both). It never sees AR's outputs
  nor any reference text: only what this method itself committed (see `learn`). With
  `reset_per_sequence: true` it is emptied at every prompt.
A node's count is the number of positions whose next tokens spell its path, so
count(child) / count(node) is the frequency with which the path continued with the child's token.

Each step (arctic `SuffixTree.speculate`, the paper's section 4): the pattern is the last
`max_depth` tokens (pending token included). For every match length p, longest first, the trie
node of the pattern's last p tokens grows a speculation of at most
min(max_spec_tokens, floor(max_spec_factor * p + max_spec_offset)) tokens (the paper's adaptive
MAX_SPEC = alpha * p), where a node's probability is the product of count ratios along its path
(the paper's frequency score D) and nodes below `min_token_prob` are never added:
- `spec: tree` (`use_tree_spec=True`: the paper, and arctic's simulator that produced its figures):
  a tree grown greedily, most probable node first;
- `spec: path` (`use_tree_spec=False`: what vLLM and arctic's own vLLM runner call): one path, the
  most frequent child at every node.
The candidate with the highest score, the sum of its nodes' probabilities (the expected number of
accepted tokens), wins, per trie and then across the two tries (the per-request trie wins ties). The tree is verified in one target forward (greedy, or lossless
multi-candidate rejection sampling with one-hot drafts). Device work while drafting: none (the
tries are host data, as in the authors' CPU-side cache); host reads per step: the verifier's only.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from specbench.engine.verify import Proposal
from specbench.core.errors import SpecBenchError, choice_error
from specbench.methods.base import SpeculativeMethod, register_method
from specbench.methods.retrieval import token_tree


class Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count = 0
        self.children: dict[int, Node] = {}


@dataclass
class Candidate:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1: the root (the pending token)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0


class SuffixTrie:
    """Every suffix of every sequence added, cut at `max_depth` tokens, with counts."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = Node()
        self.active: dict[int, deque] = {}  # sequence id -> nodes of its suffixes still growing

    def extend(self, seq: int, tokens: list[int]) -> None:
        active = self.active.setdefault(seq, deque())
        for t in tokens:
            active.append(self.root)  # a suffix starts at this token
            if len(active) > self.max_depth:
                active.popleft()  # that suffix is max_depth tokens long: it stops growing
            self.root.count += 1
            for i, node in enumerate(active):
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = Node()
                child.count += 1
                active[i] = child

    def match(self, pattern: list[int]) -> Node | None:
        node = self.root
        for t in pattern:
            node = node.children.get(t)
            if node is None:
                return None
        return node

    def grow(self, node: Node, budget: int, min_prob: float) -> Candidate:
        """The speculation tree below `node`: most probable node first, at most `budget` nodes."""
        out = Candidate()
        heap, tie = [], 0  # (-prob, insertion order, node, parent index)

        def push(parent_node: Node, prob: float, parent: int):
            nonlocal tie
            for tok, child in parent_node.children.items():
                p = prob * child.count / parent_node.count
                if p >= min_prob:
                    heapq.heappush(heap, (-p, tie, tok, child, parent))
                    tie += 1

        push(node, 1.0, -1)
        while heap and len(out.tokens) < budget:
            neg, _, tok, child, parent = heapq.heappop(heap)
            out.tokens.append(tok)
            out.parents.append(parent)
            out.probs.append(-neg)
            out.score += -neg
            push(child, -neg, len(out.tokens) - 1)
        return out

    def grow_path(self, node: Node, budget: int, min_prob: float) -> Candidate:
        """arctic's `_speculate_path`: from `node`, follow the most frequent child (ties: the first
        added) while the path's probability stays >= `min_prob`, at most `budget` tokens."""
        out, prob = Candidate(), 1.0
        while len(out.tokens) < budget and node.children:
            tok, child = max(node.children.items(), key=lambda kv: kv[1].count)  # max keeps the first of equals
            prob *= child.count / node.count
            if prob < min_prob:
                break
            out.parents.append(len(out.tokens) - 1)
            out.tokens.append(tok)
            out.probs.append(prob)
            out.score += prob
            node = child
        return out

    def speculate(self, pattern: list[int], max_spec: int, factor: float, offset: float, min_prob: float,
                  tree: bool = True) -> Candidate:
        best = Candidate()
        pattern = pattern[-self.max_depth :]
        grow = self.grow if tree else self.grow_path
        for start in range(len(pattern)):  # longest match first; a shorter one must score higher
            node = self.match(pattern[start:])
            if node is None:
                continue
            p = len(pattern) - start
            cand = grow(node, max(0, min(max_spec, int(p * factor + offset + 1e-6))), min_prob)
            if cand.score > best.score:
                best, best.match_len = cand, p
        return best


SPECS = ("tree", "path")  # arctic's speculate(use_tree_spec=True | False)
SETTINGS = {"max_depth": (int, 1), "max_spec_tokens": (int, 1), "max_spec_factor": (float, 0.0),
            "max_spec_offset": (float, None), "min_token_prob": (float, 0.0)}


@register_method
class SuffixDecoding(SpeculativeMethod):
    name = "suffix"
    uses_controller = False  # the adaptive rule sets the tree's size
    run_state = ("global_trie", "n_outputs")  # the runner's warm-up leaves them as they were (run/warmup.py)

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        for key, (kind, lo) in SETTINGS.items():
            v = getattr(cfg, key)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or isinstance(v, int))
            if not ok or (lo is not None and v < lo) or (key == "min_token_prob" and v > 1):
                rule = "an integer >= 1" if kind is int else ("a number in [0, 1]" if key == "min_token_prob" else
                                                             "a number >= 0" if lo is not None else "a number")
                raise SpecBenchError(f"method.{key}={v} is not allowed; expected {rule}")
            setattr(self, key, kind(v))
        self.reset_per_sequence = bool(cfg.reset_per_sequence)
        self.spec = cfg.spec
        if self.spec not in SPECS:
            raise choice_error("method.spec", self.spec, SPECS)
        self.global_trie = SuffixTrie(self.max_depth)
        self.n_outputs = 0  # sequence ids of the global trie: one per generation
        self.source = ""  # which trie the last draft came from

    def describe(self) -> dict:
        return super().describe() | {k: getattr(self, k) for k in SETTINGS} | {"reset_per_sequence": self.reset_per_sequence,
                                                                                 "spec": self.spec}

    def verify_widths(self) -> list[int]:
        return [self.max_spec_tokens + 1]

    def prefill_draft(self, prompt: list[int]) -> None:
        if self.reset_per_sequence:
            self.global_trie = SuffixTrie(self.max_depth)
        self.local_trie = SuffixTrie(self.max_depth)
        self.local_trie.extend(0, prompt)
        self.n_outputs += 1
        self.learned = len(prompt)  # self.tokens[learned:] is output not yet in the tries

    def generate(self, prompt, max_new_tokens, eos_ids, seed):
        g = super().generate(prompt, max_new_tokens, eos_ids, seed)
        # the last step's tokens (up to EOS or the budget) complete this output in the global trie
        self.global_trie.extend(self.n_outputs, g.tokens[self.learned - len(prompt) :])
        return g

    def learn(self) -> None:
        """Add the tokens committed since the last draft (the method's own output) to both tries."""
        new = self.tokens[self.learned :]
        self.local_trie.extend(0, new)
        self.global_trie.extend(self.n_outputs, new)
        self.learned = len(self.tokens)

    def speculate(self) -> Candidate:
        args = (self.max_spec_tokens, self.max_spec_factor, self.max_spec_offset, self.min_token_prob, self.spec == "tree")
        local = self.local_trie.speculate(self.tokens, *args)
        glob = self.global_trie.speculate(self.tokens, *args)
        self.source = "global" if glob.score > local.score else "local"
        return glob if glob.score > local.score else local

    def propose(self, k_max: int) -> Proposal:
        self.learn()
        cand = self.speculate()
        if not cand.tokens:
            return Proposal([])
        tree, node_tokens = token_tree(cand.parents, cand.tokens, cand.probs)
        return Proposal(node_tokens, tree=tree)
