"""Thompson sampling with a Beta posterior (EESD, Liu et al., section 3.3 and Appendix A, Algorithm 2)."""

from __future__ import annotations

import torch
from scipy.special import betaincinv

from specbench.control.base import Controller, DraftInfo, check_round, register_controller
from specbench.errors import SpecBenchError


def bernoulli(rng: torch.Generator, p: float) -> bool:
    return torch.rand((), generator=rng).item() < p


@register_controller
class BetaTS(Controller):
    """After each draft token: theta ~ Beta(alpha, beta), chi ~ Bernoulli(theta); stop when chi = 0.

    (Drawing theta and then chi is, for one draw, the same in law as chi ~ Bernoulli(alpha/(alpha+beta));
    we draw both as the paper does and log the last theta.) theta comes from the inverse CDF of a
    uniform drawn from `self.rng`, so a seed fixes every decision.

    After verification (Algorithm 2, steps 18-21), with
        |Q_v| = n_accepted + 1   the tokens the round added to the output: the accepted drafts plus the
                                 target's own next token (t <- t + |Q_v| counts output tokens, and every
                                 round yields at least one, so |Q_v| >= 1)
        |Q_d| = n_drafted
        r = |Q_v| - 1 = n_accepted           successes: drafts that it paid to continue to
        n = min(|Q_v| + 1, |Q_d|)            trials the target got to check
        alpha += r;  beta += n - r
    so a round with every draft accepted adds no failure, one with only the last draft rejected adds
    one, and any earlier rejection adds two. n - r = min(2, n_drafted - n_accepted) is never negative
    for valid counts (check_round enforces n_accepted <= n_drafted); the max(0, .) only guards that.

    The posterior persists across the rounds of a sequence; `reset_per_sequence` (default True)
    restarts it from the prior Beta(alpha0, beta0) at each new sequence, False keeps it across samples.
    """

    name = "beta_ts"

    def __init__(self, alpha0: float = 1.0, beta0: float = 1.0, reset_per_sequence: bool = True,
                 k_max: int = 10, seed: int = 0, **kw):
        super().__init__(k_max=k_max, seed=seed, **kw)
        if float(alpha0) <= 0 or float(beta0) <= 0:
            raise SpecBenchError(f"control.alpha0 and control.beta0 must be > 0, got {alpha0}, {beta0}")
        self.alpha0, self.beta0 = float(alpha0), float(beta0)
        self.reset_per_sequence = bool(reset_per_sequence)
        self.alpha, self.beta, self.theta = self.alpha0, self.beta0, None

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        if self.reset_per_sequence:
            self.alpha, self.beta, self.theta = self.alpha0, self.beta0, None

    def keep_drafting(self, info: DraftInfo) -> bool:
        u = torch.rand((), dtype=torch.float64, generator=self.rng).item()
        self.theta = float(betaincinv(self.alpha, self.beta, u))
        return bernoulli(self.rng, self.theta)

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if not check_round(n_drafted, n_accepted):
            return
        q_v = n_accepted + 1
        r = q_v - 1
        n = min(q_v + 1, n_drafted)
        self.alpha += r
        self.beta += max(0, n - r)

    def state(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta, "theta": self.theta}
