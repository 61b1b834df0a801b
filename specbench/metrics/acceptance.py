"""Acceptance metrics: v_d, r_d and HM (EESD paper, appendix D, eqs. 11-12), tau, positions.

Definitions, for one generated sequence of L new tokens:
- v_d = N_right / N_all_draft: share of drafted tokens the target accepted (eq. 11);
- r_d = N_right / L: share of output tokens that came from the draft (eq. 12);
- HM = 2 v_d r_d / (v_d + r_d) x 100 (section 4.1);
- tau = mean tokens committed per decoding step (accepted drafts + the target's own token);
- mean_accepted = mean accepted draft tokens per step.
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
    return {
        "steps": n_steps,
        "drafted": drafted,
        "accepted": right,
        "v_d": v_d,
        "r_d": r_d,
        "hm": harmonic_mean(v_d, r_d) if drafted else None,
        # the prefill's token is not a decoding step
        "tau": (n_tokens - n_sequences) / n_steps if n_steps else None,
        "mean_accepted": right / n_steps if n_steps else None,
        "mean_drafted": drafted / n_steps if n_steps else None,
    }


def position_acceptance(steps: list[StepStats]) -> tuple[list[int], list[int]]:
    """Per draft position j (0-based): how often it was drafted and how often accepted."""
    steps = as_steps(steps)
    k = max((s.drafted for s in steps), default=0)
    drafted, accepted = [0] * k, [0] * k
    for s in steps:
        for j in range(s.drafted):
            drafted[j] += 1
            if j < s.kept:
                accepted[j] += 1
    return drafted, accepted


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
