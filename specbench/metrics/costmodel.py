"""Cost models that predict speedup from component costs and acceptance.

`predicted_speedup` uses what was measured in isolation or per phase: the target's cost for
one token T(1) and for a forward over k tokens T(k) (profiled at start-up), and the method's
mean draft cost per drafted token. For each decoding step s with k_s drafted tokens whose
verification ran over v_s tokens (a chain: k_s + 1; a tree: every node, e.g. Medusa's 64, not
its depth + 1; SPACE: its whole mask layout) the predicted time is k_s * c_draft + T(v_s); AR
needs L * T(1) for the same L tokens. The
gap between predicted and measured speedup is what the model leaves out: controller time,
harness overhead, prefill, and any verification savings a method has (EESD reuses its first N
layers, so its real verify cost is below T(k+1)).

`eq14_speedup` is the EESD paper's closed form (appendix D, eq. 14), which assumes a verify
costs the same as one target token: speedup = v_d / ((alpha - v_d) r_d + v_d), alpha = T_d/T_t.
"""

from __future__ import annotations

from specbench.metrics.steps import StepStats, as_steps


def interp_cost(costs: dict[int, float], k: int) -> float:
    """T(k) from a profile at some k values: linear between points, the lowest value below the
    profile, linear extrapolation of the last segment above it."""
    if k in costs:
        return costs[k]
    ks = sorted(costs)
    if k <= ks[0]:
        return costs[ks[0]]
    if k >= ks[-1]:
        hi, lo = ks[-1], ks[-2] if len(ks) > 1 else ks[-1]
        slope = (costs[hi] - costs[lo]) / (hi - lo) if hi != lo else 0.0
        return costs[hi] + slope * (k - hi)
    lo = max(x for x in ks if x < k)
    hi = min(x for x in ks if x > k)
    return costs[lo] + (costs[hi] - costs[lo]) * (k - lo) / (hi - lo)


def predicted_speedup(steps: list[StepStats], n_tokens: int, draft_cost: float,
                      forward_costs: dict[int, float], n_sequences: int = 1) -> float | None:
    if not steps or not forward_costs or n_tokens <= n_sequences:
        return None
    t1 = interp_cost(forward_costs, 1)
    method = sum(s.drafted * draft_cost + interp_cost(forward_costs, s.cost_tokens) for s in as_steps(steps))
    # both sides exclude the prefills and their first tokens
    return (n_tokens - n_sequences) * t1 / method if method > 0 else None


def cost_terms(times: dict[str, float], tokens: int, ar_seconds_per_token: float | None) -> dict[str, float] | None:
    """Where a method's time per generated token goes, in units of AR's measured time per token:
    each timed phase (draft, verify, prefill, control) plus `other` (the loop, sampling, Python)
    and their `total`, whose inverse is the speedup. Answers "which term makes it lose": e.g.
    draft 0.45 + verify 0.80 + other 0.30 = 1.55 -> 0.65x. None without phase times or AR."""
    wall = times.get("wall", 0.0)
    if not tokens or not wall or not ar_seconds_per_token or set(times) <= {"wall"}:
        return None
    unit = tokens * ar_seconds_per_token
    order = ["prefill", "draft", "verify", "control"]  # then any other phase, alphabetically
    keys = sorted((k for k in times if k != "wall"), key=lambda k: (order.index(k) if k in order else len(order), k))
    terms = {k: times[k] / unit for k in keys}
    terms["other"] = max(0.0, wall - sum(v for k, v in times.items() if k != "wall")) / unit
    terms["total"] = wall / unit
    return terms


def eq14_speedup(v_d: float | None, r_d: float | None, alpha: float | None) -> float | None:
    if v_d is None or r_d is None or alpha is None:
        return None
    denom = (alpha - v_d) * r_d + v_d
    return v_d / denom if denom > 0 else None
