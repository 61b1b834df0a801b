"""Method plugin interface, the shared speculative step, and the registry.

A method owns its caches and draft machinery; the generation loop in `Method.generate` owns
the stop conditions (EOS, max_new_tokens) and the timer. A speculative method implements
`propose` (draft up to k tokens, asking the controller after each one) and, when verification
is special (EESD reuses its first-N layers), `score`; `SpeculativeMethod.step` does the rest:
verify, commit, roll caches back to the accepted length, update the controller.

Cache invariant between steps: every cache holds the committed tokens except the last one,
`self.tokens[-1]`, which is pending (produced by the target, not yet fed back). Forward passes
always feed `tokens[cache_length:]`, so a cache that fell behind (a draft that never saw its
own last token) catches up on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specbench.control import DraftInfo, build_controller
from specbench.engine.sampling import SamplingConfig, next_token, probs, sample, verify_sampling
from specbench.engine.timer import PhaseTimer
from specbench.errors import SpecBenchError
from specbench.models import ModelAdapter


@dataclass
class StepResult:
    tokens: list[int]  # committed this step: accepted draft tokens, then the target's token
    n_drafted: int
    n_accepted: int


@dataclass
class Generation:
    tokens: list[int]  # new tokens only
    steps: list[tuple[int, int, int]] = field(default_factory=list)  # (drafted, accepted, accepted kept)
    # per step, parallel to `steps`: (whole step, its verify phase) in seconds; each verify is a
    # T(drafted + 1) sample at the real context (the cost-model refit and interference check use them)
    step_times: list[tuple[float, float]] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class Method:
    name = "base"
    lossless = True  # False where a paper's acceptance rule is lossy on purpose
    needs_training: str | None = None  # name of the trainable part, if any

    def __init__(self, target: ModelAdapter, cfg, sampling: SamplingConfig, ctx: dict | None = None):
        self.target = target
        self.cfg = cfg
        self.sampling = sampling
        self.ctx = ctx or {}
        run_cfg = self.ctx.get("cfg") or {}
        self.timing = str(run_cfg.get("timing", "fine"))  # engine/timer.py: fine | coarse
        self.timer = PhaseTimer(target.device, self.timing)
        self.gen: torch.Generator | None = None

    # -- one sequence ------------------------------------------------------------------------
    def start(self, prompt: list[int]) -> int:
        """Prefill the prompt and return the first new token."""
        raise NotImplementedError

    def step(self, budget: int) -> StepResult:
        """Produce between 1 and `budget` new tokens."""
        raise NotImplementedError

    def describe(self) -> dict:
        """Settings worth recording with the results."""
        return {"method": self.name, "lossless": self.lossless}

    def generate(self, prompt: list[int], max_new_tokens: int, eos_ids, seed: int) -> Generation:
        self.timer = PhaseTimer(self.target.device, self.timing)
        self.gen = torch.Generator().manual_seed(int(seed))
        self.seed = int(seed)
        self.timer.start()
        out = [self.start(prompt)]
        result = Generation(out)
        while len(out) < max_new_tokens and out[-1] not in eos_ids:
            self.timer.step_mark()
            r = self.step(max_new_tokens - len(out))
            new = r.tokens[: max_new_tokens - len(out)]
            for j, t in enumerate(new):
                if t in eos_ids:
                    new = new[: j + 1]
                    break
            result.steps.append((r.n_drafted, r.n_accepted, min(r.n_accepted, len(new))))
            out += new
        self.timer.step_mark()  # the last step's end
        result.times = self.timer.stop()
        result.step_times = self.timer.step_times
        return result


class ARMethod(Method):
    """Plain autoregressive decoding through the same engine path as every other method."""

    name = "ar"

    def start(self, prompt: list[int]) -> int:
        self.tokens = list(prompt)
        self.cache = self.target.new_cache()
        with self.timer.phase("prefill"):
            logits, _ = self.target.forward(self.tokens, self.cache, last_only=True)
            tok = next_token(logits[-1], self.sampling, self.gen)
        self.tokens.append(tok)
        return tok

    def step(self, budget: int) -> StepResult:
        with self.timer.phase("verify"):
            logits, _ = self.target.forward(self.tokens[self.cache.length() :], self.cache)
            tok = next_token(logits[-1], self.sampling, self.gen)
        self.tokens.append(tok)
        return StepResult([tok], 0, 0)


class SpeculativeMethod(ARMethod):
    """Draft, then verify with the full target in one forward, then roll back."""

    def __init__(self, target, cfg, sampling, ctx=None):
        super().__init__(target, cfg, sampling, ctx)
        control_cfg = (ctx or {}).get("control") or cfg.get("control") or {"name": "fixed", "k": 10}
        self.controller = build_controller(control_cfg, seed=int(cfg.get("seed", 0)), **self.controller_extras())
        self.target_hidden: torch.Tensor | None = None

    def controller_extras(self) -> dict:
        return {}

    def describe(self) -> dict:
        return super().describe() | {"controller": self.controller.name, "k_max": self.controller.k_max}

    # -- hooks -------------------------------------------------------------------------------
    def start(self, prompt: list[int]) -> int:
        self.tokens = list(prompt)
        self.cache = self.target.new_cache()
        self.controller.reset(self.seed)
        with self.timer.phase("prefill"):
            logits, hidden = self.prefill(self.tokens)
            self.target_hidden = hidden[-1]
            tok = next_token(logits[-1], self.sampling, self.gen)
        self.tokens.append(tok)
        return tok

    def prefill(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Target logits and hidden state at the prompt's last position; draft state set up."""
        logits, hidden = self.target.forward(ids, self.cache, last_only=True)
        self.prefill_draft(ids)
        return logits, hidden

    def prefill_draft(self, prompt: list[int]) -> None:
        """Bring the draft's own state up to the prompt (nothing for draft-free methods)."""

    def propose(self, k_max: int) -> tuple[list[int], torch.Tensor | None]:
        """Draft up to k_max tokens; return them and their processed draft distributions
        ([k, V]) or None when the draft is deterministic."""
        raise NotImplementedError

    def score(self, draft: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Target logits [k+1, V] and final hidden states [k+1, d] at the pending token and at
        each draft token."""
        feed = self.tokens[self.cache.length() :] + draft
        logits, hidden = self.target.forward(feed, self.cache)
        return logits[-len(draft) - 1 :], hidden[-len(draft) - 1 :]

    def rollback(self) -> None:
        """Drop cache entries past the committed tokens (the last one stays pending)."""
        self.cache.crop(len(self.tokens) - 1)

    # -- the shared step ---------------------------------------------------------------------
    def step(self, budget: int) -> StepResult:
        k_max = min(self.controller.k_max, budget - 1)
        if k_max < 1:  # one token left: a plain target step
            return super().step(budget)
        with self.timer.phase("draft"):
            draft, q = self.propose(k_max)
        with self.timer.phase("verify"):
            logits, hidden = self.score(draft)
            n, tok = verify_sampling(logits, draft, q, self.sampling, self.gen)
            self.tokens += draft[:n] + [tok]
            self.target_hidden = hidden[n]
            self.rollback()
        if draft:
            with self.timer.phase("control"):
                self.controller.update(len(draft), n)
        return StepResult(draft[:n] + [tok], len(draft), n)

    def draft_loop(self, k_max: int, next_draft) -> tuple[list[int], torch.Tensor | None]:
        """The controller-driven draft loop. `next_draft(drafts)` returns the draft logits
        ([V]) for the next token and the draft's hidden state there (or None)."""
        drafts: list[int] = []
        q_rows: list[torch.Tensor] = []
        self.controller.begin_round()
        while len(drafts) < k_max:
            logits, hidden = next_draft(drafts)
            conf_probs = torch.softmax(logits.float(), -1)
            if self.sampling.greedy:
                tok = int(conf_probs.argmax())
            else:
                q = probs(logits, self.sampling)
                tok = sample(q, self.gen)
                q_rows.append(q)
            drafts.append(tok)
            # a timer phase, not a wait: on CUDA it records events (engine/timer.py)
            with self.timer.phase("control"):
                # confidence = max draft probability (Self-SD's draft-exit rule, its Algorithm 4)
                info = DraftInfo(len(drafts), float(conf_probs.max()), hidden, self.target_hidden)
                if not self.controller.keep_drafting(info):
                    break
        return drafts, (torch.stack(q_rows) if q_rows else None)


METHODS: dict[str, type[Method]] = {"ar": ARMethod}


def register_method(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls


def require(cond: bool, message: str) -> None:
    if not cond:
        raise SpecBenchError(message)
