"""Acceptance metrics: v_d, r_d and HM (EESD paper, appendix D, eqs. 11-12), tau, positions.

Definitions, for one generated sequence of L new tokens (docs/metrics.md says the same):
- v_d = N_right / N_all_draft (eq. 11), with N_all_draft = the sum over steps of `drafted`, the
  most draft tokens a step could accept: a chain's length, a *tree's depth* (Medusa, EAGLE-2), so
  for trees v_d is accepted tokens per unit of depth. `v_d_tokens` is appendix D's literal
  reading, N_all_draft = the tokens drafted (a tree's nodes; equal to v_d for chains);
- r_d = N_right / L: share of output tokens that came from the draft (eq. 12);
- HM = 2 v_d r_d / (v_d + r_d) x 100 (section 4.1);
- tau = mean tokens committed per decoding step (accepted drafts + the target's own token);
- mean_accepted = mean accepted draft tokens per step.
Per draft position i (1 = the first drafted token; a tree: depth i), `position_rates`:
- unconditional = accepted at i / steps that drafted a position i ("per draft");
- conditional = accepted at i / steps that drafted a position i and accepted positions 1..i-1
  (position i was reached); conditional at 1 = unconditional at 1.
`accepted_histogram`: steps by the number of draft tokens they kept (0, 1, ...).
Draft tokens cut off by EOS or max_new_tokens count as drafted but not as accepted.
"""

from __future__ import annotations

from specbench.metrics.steps import StepStats, as_steps


def harmonic_mean(v_d: float | None, r_d: float | None) -> float | None:
    if v_d is None or r_d is None:
        return None
    if v_d + r_d == 0:
        return 0.0
    return 2 * v_d * r_d / (v_d + r_d) * 100


def acceptance_metrics(steps: list[StepStats], n_tokens: int, n_sequences: int = 1) -> dict:
    """steps: one StepStats (or stored row) per decoding step; n_tokens: L over n_sequences
    generated sequences (each has one token from the prefill, not from a step)."""
    steps = as_steps(steps)
    n_steps = len(steps)
    drafted = sum(s.drafted for s in steps)
    right = sum(s.kept for s in steps)
    v_d = right / drafted if drafted else None
    r_d = right / n_tokens if n_tokens else None
    # appendix D's N_all_draft as tokens drafted: unknown for tree rows stored before it was recorded
    tokens = sum(s.draft_tokens for s in steps) if all(s.known_draft_tokens for s in steps) else None
    return {
        "steps": n_steps,
        "drafted": drafted,
        "accepted": right,
        "v_d": v_d,
        "draft_tokens": tokens,
        "v_d_tokens": right / tokens if tokens else None,
        "r_d": r_d,
        "hm": harmonic_mean(v_d, r_d) if drafted else None,
        # the prefill's token is not a decoding step
        "tau": (n_tokens - n_sequences) / n_steps if n_steps else None,
        "mean_accepted": right / n_steps if n_steps else None,
        "mean_drafted": drafted / n_steps if n_steps else None,
    }


def position_acceptance(steps: list[StepStats]) -> tuple[list[int], list[int]]:
    """Per draft position j (0-based): how often it was drafted and how often accepted (kept)."""
    steps = as_steps(steps)
    k = max((s.drafted for s in steps), default=0)
    drafted, accepted = [0] * k, [0] * k
    for s in steps:
        for j in range(s.drafted):
            drafted[j] += 1
            if j < s.kept:
                accepted[j] += 1
    return drafted, accepted


def position_reached(steps: list[StepStats]) -> list[int]:
    """Per draft position j (0-based): steps that drafted it with positions 0..j-1 all accepted."""
    steps = as_steps(steps)
    reached = [0] * max((s.drafted for s in steps), default=0)
    for s in steps:
        for j in range(min(s.drafted, s.kept + 1)):
            reached[j] += 1
    return reached


def position_rates(drafted: list[int], accepted: list[int], reached: list[int]) -> dict:
    """Both per-position acceptances (module docstring); None where the denominator is 0."""
    return {"unconditional": [a / d if d else None for d, a in zip(drafted, accepted)],
            "conditional": [a / r if r else None for r, a in zip(reached, accepted)]}


def accepted_histogram(steps: list[StepStats]) -> list[int]:
    """hist[n] = steps that kept n draft tokens (n = 0 .. the most kept)."""
    steps = as_steps(steps)
    hist = [0] * (max((s.kept for s in steps), default=-1) + 1)
    for s in steps:
        hist[s.kept] += 1
    return hist


def position_stats(steps: list[StepStats]) -> dict:
    """What a run records per position: the counts (they pool across runs) and the histogram."""
    drafted, accepted = position_acceptance(steps)
    return {"pos_drafted": drafted, "pos_accepted": accepted, "pos_reached": position_reached(steps),
            "accepted_hist": accepted_histogram(steps)}


def prefix_agreement(reference: list[list[int]], other: list[list[int]]) -> tuple[int, int]:
    """(tokens, reference tokens): how many of the reference's tokens the other outputs reproduce
    before their first difference, summed over generations (under greedy, after the first
    difference the two texts are no longer aligned, so later matches mean nothing)."""
    same = 0
    for ref, out in zip(reference, other):
        for a, b in zip(ref, out):
            if a != b:
                break
            same += 1
    return same, sum(len(r) for r in reference)
