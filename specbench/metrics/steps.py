"""One decoding step's counts, as the metrics and the cost model read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepStats:
    drafted: int  # the most draft tokens the step could accept (a chain's length, a tree's depth)
    accepted: int  # draft tokens the target accepted
    kept: int  # of those, kept in the output (EOS or max_new_tokens may cut a step short)
    verified: int | None = None  # tokens the verification forward ran over (tree: every node)
    candidates: int | None = None  # draft tokens proposed (a tree's nodes); None: = drafted (a chain)

    @property
    def cost_tokens(self) -> int:
        """k of the T(k) this step's verification paid: a chain verifies drafted + 1 tokens."""
        return self.verified if self.verified is not None else self.drafted + 1

    @property
    def draft_tokens(self) -> int:
        """Tokens drafted (EESD appendix D's N_all_draft reading): a tree's nodes, a chain's length."""
        return self.drafted if self.candidates is None else self.candidates

    def row(self) -> list[int]:
        """The stored form (results JSON): [drafted, accepted, kept, verified, candidates]."""
        return [self.drafted, self.accepted, self.kept, self.cost_tokens, self.draft_tokens]

    @classmethod
    def of(cls, s) -> "StepStats":
        """From a stored row; rows written before `verified` existed have three entries, before
        `candidates` four (a tree's or layout's node count is then unknown: -1)."""
        if isinstance(s, StepStats):
            return s
        vals = [int(x) for x in s]
        if len(vals) == 4 and vals[3] != vals[0] + 1:
            vals.append(-1)  # a tree or layout step stored without its node count
        return cls(*vals)

    @property
    def known_draft_tokens(self) -> bool:
        return self.candidates is None or self.candidates >= 0


def as_steps(steps) -> list[StepStats]:
    return [StepStats.of(s) for s in steps]
