"""One decoding step's counts, as the metrics and the cost model read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepStats:
    drafted: int  # the most draft tokens the step could accept (a chain's length, a tree's depth)
    accepted: int  # draft tokens the target accepted
    kept: int  # of those, kept in the output (EOS or max_new_tokens may cut a step short)
    verified: int | None = None  # tokens the verification forward ran over (tree: every node)

    @property
    def cost_tokens(self) -> int:
        """k of the T(k) this step's verification paid: a chain verifies drafted + 1 tokens."""
        return self.verified if self.verified is not None else self.drafted + 1

    def row(self) -> list[int]:
        """The stored form (results JSON): [drafted, accepted, kept, verified]."""
        return [self.drafted, self.accepted, self.kept, self.cost_tokens]

    @classmethod
    def of(cls, s) -> "StepStats":
        """From a stored row; rows written before `verified` existed have three entries."""
        if isinstance(s, StepStats):
            return s
        return cls(*(int(x) for x in s))


def as_steps(steps) -> list[StepStats]:
    return [StepStats.of(s) for s in steps]
