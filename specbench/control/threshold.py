"""Confidence-threshold draft exit (Self-Speculative Decoding, Zhang et al., section 3.3 / 3.4).

`threshold` keeps gamma fixed; `adaptive_threshold` moves it after each verification (eqs. 2-4,
Appendix K Algorithms 3/4) so that the acceptance rate tracks a target alpha.
"""

from __future__ import annotations

from specbench.control.base import Controller, DraftInfo, check_round, register_controller
from specbench.core.errors import SpecBenchError


@register_controller
class StaticThreshold(Controller):
    """Stop drafting as soon as the draft's confidence in its own token falls below gamma."""

    name = "threshold"

    def __init__(self, gamma: float, k_max: int, seed: int, **kw):
        super().__init__(k_max=k_max, seed=seed, **kw)
        if not 0.0 <= float(gamma) <= 1.0:
            raise SpecBenchError(f"control.gamma must be in [0, 1], got {gamma}")
        self.gamma0 = self.gamma = float(gamma)

    def keep_drafting(self, info: DraftInfo) -> bool:
        return info.confidence >= self.gamma

    def state(self) -> dict:
        return {"gamma": self.gamma}


@register_controller
class AdaptiveThreshold(StaticThreshold):
    """Self-SD's adaptive draft-exit threshold. After the e-th verification:

        AR_e = n_accepted / n_drafted
        AR   <- beta1 * AR + (1 - beta1) * AR_e      (beta1 taken as 0 when e = 1)
        g~    = gamma + epsilon  if AR <= alpha  else  gamma - epsilon
        gamma <- beta2 * gamma + (1 - beta2) * g~

    Defaults are the paper's (gamma0 0.6, epsilon 0.01, beta1 0.5, beta2 0.9). The target acceptance
    rate alpha is tuned per model and task in the paper (its Table 6: 0.70 to 0.90); 0.8 is our
    middle-of-the-range default. gamma is not clipped, as in the paper.

    `reset_per_sequence` (default False): the paper lets gamma evolve over thousands of rounds across
    a whole data set (its Figure 5), so by default gamma and AR carry over from one sample to the
    next (results then depend on sample order); True restarts them from gamma0 at every sequence.
    """

    name = "adaptive_threshold"

    def __init__(self, gamma: float, epsilon: float, beta1: float, beta2: float, alpha: float, reset_per_sequence: bool,
                 k_max: int, seed: int, **kw):
        super().__init__(gamma=gamma, k_max=k_max, seed=seed, **kw)
        for key, v in {"beta1": beta1, "beta2": beta2, "alpha": alpha}.items():
            if not 0.0 <= float(v) <= 1.0:
                raise SpecBenchError(f"control.{key} must be in [0, 1], got {v}")
        self.epsilon, self.beta1, self.beta2, self.alpha = float(epsilon), float(beta1), float(beta2), float(alpha)
        self.reset_per_sequence = bool(reset_per_sequence)
        self._restart()

    def _restart(self) -> None:
        self.gamma, self.ar, self.rounds = self.gamma0, 0.0, 0

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        if self.reset_per_sequence:
            self._restart()

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if not check_round(n_drafted, n_accepted):
            return
        self.rounds += 1
        beta1 = 0.0 if self.rounds == 1 else self.beta1
        self.ar = beta1 * self.ar + (1 - beta1) * n_accepted / n_drafted
        target = self.gamma + self.epsilon if self.ar <= self.alpha else self.gamma - self.epsilon
        self.gamma = self.beta2 * self.gamma + (1 - self.beta2) * target

    def state(self) -> dict:
        return {"gamma": self.gamma, "ar": self.ar, "rounds": self.rounds}
