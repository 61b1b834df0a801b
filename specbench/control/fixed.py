"""Fixed draft length K: the classic speculative-decoding baseline."""

from __future__ import annotations

from specbench.control.base import Controller, DraftInfo, register_controller
from specbench.core.errors import SpecBenchError


@register_controller
class FixedK(Controller):
    """Draft exactly K tokens per round (fewer only when the sequence's budget runs out)."""

    name = "fixed"

    def __init__(self, k: int, k_max: int, seed: int, **kw):
        if int(k) < 1:
            raise SpecBenchError(f"control.k must be >= 1, got {k}")
        k_max = int(k_max)  # conf/control/fixed.yaml: ${.k}, the cap follows K
        # A silent cap would report results for a K that was never run.
        if int(k) > k_max:
            raise SpecBenchError(f"control.k={k} exceeds control.k_max={k_max}; raise control.k_max too")
        super().__init__(k_max=k_max, seed=seed, **kw)
        self.k = int(k)

    def keep_drafting(self, info: DraftInfo) -> bool:
        return info.i < self.k

    def state(self) -> dict:
        return {"k": self.k}
