"""Thompson sampling with a Beta posterior (EESD, Liu et al., section 3.3 and Appendix A, Algorithm 2)."""

from __future__ import annotations

import torch
from scipy.special import betaincinv

from specbench.control.base import Controller, DraftInfo, check_round, register_controller
from specbench.core.errors import SpecBenchError, choice_error


def bernoulli(rng: torch.Generator, p: float) -> bool:
    return torch.rand((), generator=rng).item() < p


COUNTS = ("consistent", "paper_output", "paper_subset")
ALPHA_FLOOR = 1e-3


def round_counts(n_drafted: int, n_accepted: int, counts: str = "consistent") -> tuple[int, int]:
    """(successes r, trials n) a verified round adds to the posterior; see BetaTS."""
    a, k = n_accepted, n_drafted
    if counts == "consistent":
        return a, min(a + 1, k)
    if counts == "paper_output":
        return a, min(a + 2, k)
    if counts == "paper_subset":
        return a - 1, min(a + 1, k)
    raise choice_error("control.counts", counts, COUNTS)


@register_controller
class BetaTS(Controller):
    """After each draft token: theta ~ Beta(alpha, beta), chi ~ Bernoulli(theta); stop when chi = 0.

    (Drawing theta and then chi is, for one draw, the same in law as chi ~ Bernoulli(alpha/(alpha+beta));
    we draw both as the paper does and log the last theta.) theta comes from the inverse CDF of a
    uniform drawn from `self.rng`, so a seed fixes every decision.

    After verification: alpha += r, beta += n - r, with (r, n) from `round_counts` by `counts`
    (a = n_accepted, k = n_drafted):
      - "consistent" (default): r = a, n = min(a + 1, k). theta is the chance that a draft token is
        accepted given the ones before it were; a round is a run of such Bernoulli trials that stops
        at the first rejection or at k, so it observes a successes and one failure if a < k. Its
        likelihood is theta^a (1 - theta)^[a < k], exactly the Beta update, so the posterior mean
        converges to the true per-token acceptance.
      - "paper_output": Algorithm 2, steps 18-21, r = |Q_v| - 1, n = min(|Q_v| + 1, |Q_d|), reading
        |Q_v| = a + 1 as the tokens the round added to the output (the accepted drafts plus the
        target's own token; step 17's t <- t + |Q_v| counts output tokens). Gives r = a,
        n = min(a + 2, k): two failures for every round rejected before its last draft, so the
        posterior mean settles below the true rate (simulated: 0.3 -> 0.27, 0.6 -> 0.51, 0.85 -> 0.77).
      - "paper_subset": the same steps reading step 15's Q_v subset-of Q_d literally, |Q_v| = a:
        r = a - 1 (-1 when nothing is accepted), n = min(a + 1, k). alpha is kept >= ALPHA_FLOOR so
        the posterior stays a Beta; it collapses towards 0 whatever theta (tests/test_controllers.py).
    The algorithm's two readings disagree with each other and with its own Bernoulli model; the
    default is the reading consistent with that model (docs/methods.md, "Draft-length controllers").

    The posterior persists across the rounds of a sequence; `reset_per_sequence` (default True)
    restarts it from the prior Beta(alpha0, beta0) at each new sequence, False keeps it across samples.
    """

    name = "beta_ts"

    def __init__(self, alpha0: float, beta0: float, reset_per_sequence: bool, counts: str, k_max: int, seed: int, **kw):
        super().__init__(k_max=k_max, seed=seed, **kw)
        if float(alpha0) <= 0 or float(beta0) <= 0:
            raise SpecBenchError(f"control.alpha0 and control.beta0 must be > 0, got {alpha0}, {beta0}")
        self.alpha0, self.beta0 = float(alpha0), float(beta0)
        if counts not in COUNTS:
            raise choice_error("control.counts", counts, COUNTS)
        self.counts = counts
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
        r, n = round_counts(n_drafted, n_accepted, self.counts)
        self.alpha = max(ALPHA_FLOOR, self.alpha + r)
        self.beta += n - r

    def state(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta, "theta": self.theta}
