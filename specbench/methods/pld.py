"""Prompt-lookup decoding: draft by matching the latest n-gram earlier in the sequence.

Training-free baseline (Saxena 2023; transformers' `prompt_lookup_num_tokens`). The draft is
the continuation of the most recent earlier occurrence of the last n tokens, trying n from
`max_ngram` down to `min_ngram`; no match means no draft (a plain target step). The draft is
deterministic, so under sampling q is one-hot and rejection sampling stays exact. The
controller still caps the length (fixed K by default; its confidence input is 1.0).
"""

from __future__ import annotations

from specbench.control import DraftInfo
from specbench.engine.verify import Proposal
from specbench.methods.base import SpeculativeMethod, register_method


def lookup(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    n_tok = len(tokens)
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        tail = tokens[-n:]
        # most recent earlier match first: recent context predicts best
        for start in range(n_tok - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                cont = tokens[start + n : start + n + k]
                if cont:
                    return cont
    return []


@register_method
class PromptLookup(SpeculativeMethod):
    name = "pld"
    drafts_on_device = False  # n-gram lookup in the host's token list (an H200 counted one sync per step)

    def propose(self, k_max: int):
        found = lookup(self.tokens, k_max, int(self.cfg.max_ngram), int(self.cfg.min_ngram))

        drafts: list[int] = []
        self.controller.begin_round()
        for tok in found:
            drafts.append(tok)
            with self.timer.phase("control"):
                if not self.controller.keep_drafting(DraftInfo(len(drafts), 1.0, None, self.target_hidden)):
                    break
        return Proposal(drafts)
