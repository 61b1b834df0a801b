"""Draft-length controllers: decide, token by token, whether the draft goes on.

Any drafting method uses any controller (EESD paper, Table 5). The method's draft loop is:

    ctrl.begin_round()
    while len(drafts) < min(ctrl.k_max, budget):
        token, info = draft one more token          # info: DraftInfo
        drafts.append(token)
        if not ctrl.keep_drafting(info): break
    ... verify ...
    ctrl.update(n_drafted, n_accepted)

so every round drafts at least one token, and never more than `k_max`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specbench.core.errors import SpecBenchError


@dataclass
class DraftInfo:
    """What a controller may look at after the i-th draft token of a round (i is 1-based)."""

    i: int
    confidence: float = 1.0  # probability the draft gave its own token (max prob under greedy)
    draft_hidden: torch.Tensor | None = None  # draft model's last hidden state at this token, [d]
    target_hidden: torch.Tensor | None = None  # target's last hidden state at the last verified token, [d]
    signal: float | None = None  # the value of the controller's `on_device` tensor for this token


@dataclass(frozen=True)
class DraftRef:
    """Which draft a controller serves, for controllers with parts trained per draft (Cali-TS's
    predictor is trained with one EESD early-exit layer): the target's key, the draft's structure
    as its checkpoint records it, and where tensors live."""

    model_key: str
    structure: dict
    device: Any = "cpu"
    hidden_size: int | None = None  # the width of the hidden states it hands the controller
    checkpoint: str | None = None  # the draft's trained file, where it has one (a predictor must be trained with it)


class Controller:
    name = "base"

    @classmethod
    def attach(cls, params: dict, draft: DraftRef | None) -> dict:
        """Constructor parameters completed with what this controller needs from the draft
        (a trained part); the factory calls it, so no method needs to know controller names."""
        return params

    def describe(self) -> dict:
        """Settings worth recording with the results, beyond name and k_max."""
        return {}

    def __init__(self, k_max: int, seed: int, **_: Any):
        if int(k_max) < 1:
            raise SpecBenchError(f"control.k_max must be >= 1, got {k_max}")
        self.k_max = int(k_max)
        self.seed = seed
        self.rng = torch.Generator().manual_seed(int(seed))

    def reset(self, seed: int | None = None) -> None:
        """Start of a new sequence (a sample's turn). Re-seeds the controller's own RNG."""
        if seed is not None:
            self.rng.manual_seed(int(seed))

    def begin_round(self) -> None:
        """Start of a drafting round."""

    def keep_drafting(self, info: DraftInfo) -> bool:
        """After the info.i-th draft token: draft another one?"""
        raise NotImplementedError

    def on_device(self, i: int, draft_hidden: torch.Tensor | None, target_hidden: torch.Tensor | None):
        """A one-element device tensor the controller needs for the i-th draft token, or None. The
        draft loop reads it in the same copy as the draft token (on a GPU a separate read per token
        would be one more wait per token) and hands its value over as `DraftInfo.signal`."""
        return None

    def update(self, n_drafted: int, n_accepted: int) -> None:
        """After verification: n_accepted of n_drafted draft tokens were accepted."""

    def state(self) -> dict:
        """Current parameters, for logging."""
        return {}

    # Cali-TS needs hidden states; methods only compute them when asked.
    needs_hidden = False


def check_round(n_drafted: int, n_accepted: int) -> bool:
    """For update(): False when the round drafted nothing (a budget of 0 at the sequence's end), so
    there is nothing to learn; raises on impossible counts, a method bug that would corrupt the posterior."""
    if not 0 <= n_accepted <= n_drafted:
        raise ValueError(f"bad round counts: n_accepted={n_accepted}, n_drafted={n_drafted}")
    return n_drafted > 0


CONTROLLERS: dict[str, type[Controller]] = {}


def register_controller(cls: type[Controller]) -> type[Controller]:
    CONTROLLERS[cls.name] = cls
    return cls
