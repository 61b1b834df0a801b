"""The runner's unmeasured warm-up."""

from __future__ import annotations

import copy

from specbench.methods.base import Method


def warm_up(methods: list[Method], prompt: list[int], max_new: int, eos_ids) -> None:
    """One unmeasured generation per method: first calls pay for allocation and kernel selection.
    A controller that keeps state across sequences (`reset_per_sequence: false`: Beta-TS's
    posterior, the adaptive threshold's gamma) must not carry what the warm-up taught it into the
    measured run, so each method gets its controller back as it was before, and the attributes it
    names in `run_state` too."""
    for m in methods:
        saved = copy.deepcopy(m.controller) if hasattr(m, "controller") else None
        # state a method carries from one sample to the next (SuffixDecoding's trie of its own
        # outputs) must not hold the warm-up's output: it is the first measured sample's opening
        kept = {a: copy.deepcopy(getattr(m, a)) for a in getattr(m, "run_state", ())}
        m.generate(prompt, max_new, eos_ids, 0)
        if saved is not None:
            m.controller = saved
        for a, v in kept.items():
            setattr(m, a, v)
