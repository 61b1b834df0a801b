"""Method plugin interface, the one decode loop, and the registry.

A method owns its draft machinery; the generation loop in `Method.generate` owns the stop
conditions (EOS, max_new_tokens) and the timer. A speculative method implements `propose` (a
chain, asking the controller after each token, or a tree or laid-out chain of candidates);
`SpeculativeMethod.step` does the rest for every method: verify (engine/verify.py), commit,
compact the target's cache to the accepted path, update the controller.

Cache invariant between steps: every cache holds the committed tokens except the last one,
`self.tokens[-1]`, which is pending (produced by the target, not yet fed back). Forward passes
always feed `tokens[cache_length:]`, so a cache that fell behind (a draft that never saw its
own last token) catches up on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specbench.control import DraftInfo, DraftRef, build_controller
from specbench.engine.sampling import SamplingConfig, next_token, probs, sample
from specbench.engine.timer import PhaseTimer
from specbench.engine.transfer import take, upload
from specbench.engine.tree import verify_tree_greedy_device
from specbench.engine.verify import Proposal, Verifier, verification_input
from specbench.core.errors import SpecBenchError
from specbench.metrics.steps import StepStats
from specbench.models import ModelAdapter
from specbench.models.graphs import CAPTURES
from specbench.config.settings import RunValues


@dataclass
class StepResult:
    tokens: list[int]  # committed this step: accepted draft tokens, then the target's token
    n_drafted: int  # the most draft tokens the step could accept (chain length, tree depth)
    n_accepted: int
    n_verified: int = 1  # tokens the verification forward ran over (AR: its one token)
    n_candidates: int | None = None  # draft tokens proposed (a tree's nodes); None: n_drafted (a chain)


@dataclass
class Generation:
    tokens: list[int]  # new tokens only
    steps: list[StepStats] = field(default_factory=list)
    # per step, parallel to `steps`: (whole step, its verify phase) in seconds; each verify is a
    # T(verified) sample at the real context (the cost-model refit and interference check use them)
    step_times: list[tuple[float, float]] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class Method:
    name = "base"
    run_state: tuple[str, ...] = ()  # attributes a generation leaves for the next one (run/warmup.py)
    lossless = True  # False where a paper's acceptance rule is lossy on purpose
    external_loop = False  # True for references whose library runs its own decode loop (hf_assisted)
    # methods that decode with changed weights (SPACE, Medusa-2) set this to that model: AR on it is
    # their lossless reference, and the runner also decodes with the original weights
    finetuned_adapter: ModelAdapter | None = None

    @property
    def baseline_weights(self) -> str:
        return "base" if self.finetuned_adapter is None else "fine-tuned"

    def carries_state(self) -> bool:
        """Whether a generation changes what the next one starts from (SuffixDecoding's trie of its own
        outputs, SWIFT's search, a controller kept across sequences): a sample measured again after
        a spike would then draft from its own first attempt, so the runner does not re-measure it."""
        controller = getattr(self, "controller", None)
        return bool(self.run_state) or not getattr(controller, "reset_per_sequence", True)

    def __init__(self, target: ModelAdapter, cfg, sampling: SamplingConfig, run: RunValues):
        """`cfg`: the method's own settings (specbench/config/settings.py); `run`: the few run-level
        values a method reads (timing, its controller's settings, the data dir, ...)."""
        self.target = target
        self.cfg = cfg
        self.sampling = sampling
        self.run = run
        self.timing = str(run.timing)  # engine/timer.py: fine | coarse
        self.timer = PhaseTimer(target.device, self.timing, getattr(target, "devices", ()))
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
        d = {"method": self.name, "lossless": self.lossless}
        return d if self.finetuned_adapter is None else d | {"baseline_weights": self.baseline_weights}

    def inputs(self) -> dict:
        """Files this method reads beyond its target's weights and the artifacts its describe()
        names (a corpus, a datastore): key -> path, or a list of paths. Their content hashes join the
        run's provenance (specbench/run/provenance.py), so resuming after one changed is refused."""
        return {}

    def verify_widths(self) -> list[int]:
        """Verification sizes the cost profile must measure beyond its k grid (a tree's nodes)."""
        return []

    def generate(self, prompt: list[int], max_new_tokens: int, eos_ids, seed: int) -> Generation:
        self.timer = PhaseTimer(self.target.device, self.timing, getattr(self.target, "devices", ()))
        self.gen = torch.Generator().manual_seed(int(seed))
        self.seed = int(seed)
        captures = CAPTURES[0]
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
            result.steps.append(StepStats(r.n_drafted, r.n_accepted, min(r.n_accepted, len(new)), r.n_verified, r.n_candidates))
            out += new
        self.timer.step_mark()  # the last step's end
        result.times = self.timer.stop()
        result.step_times = self.timer.step_times
        if CAPTURES[0] > captures:  # graphs captured inside this timed generation (models/graphs.py)
            result.extra["graph_captures"] = CAPTURES[0] - captures
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
    """The one decode loop of every drafting method: propose, verify, commit.

    A method implements `propose` (a chain, a tree or a laid-out chain of candidates: a
    `Proposal`, engine/verify.py) and, where its draft keeps state of its own, `after_verify`
    (roll its own caches back, keep what the verification computed for the next draft). It may
    replace `verify_forward` when it can verify more cheaply (EESD reuses its first N layers) or
    feeds the target something other than token ids (SPACE's mask embedding). `step` owns the rest:
    the target's forward over the proposal, the verifier (greedy / rejection / typical), the
    committed tokens, and the only place where the target's cache is rolled back or compacted.
    """

    uses_controller = True  # False: the method's draft shape is its own (Medusa's tree, EAGLE-2, SPACE)
    drafts_on_device = True  # False: the chain comes from the host's token history (PLD), no read per drafted token
    acceptance = "auto"  # engine/verify.py ACCEPTANCE
    # True where `verify_forward` builds on what drafting wrote into the target's cache (EESD's
    # lower layers); otherwise those entries are dropped before verification
    verify_reuses_draft_entries = False

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        self.controller = None
        if self.uses_controller:
            if run.control is None:
                raise SpecBenchError(f"method {self.name} drafts for a controller: its run values need the control settings")
            # seeded with each generation's seed by start() before any draw
            self.controller = build_controller(run.control, seed=0, draft=self.draft_ref())
        self.verifier = Verifier(self.acceptance, *self.typical_acceptance())
        self.lossless = self.verifier.lossless(sampling)
        self.target_hidden: torch.Tensor | None = None

    def typical_acceptance(self) -> tuple:
        """(epsilon, delta) of typical acceptance, for a method whose `acceptance` can be typical."""
        return ()

    def draft_ref(self) -> DraftRef | None:
        """What identifies this method's draft to a controller that has trained parts for it
        (Cali-TS's predictor is trained per EESD early-exit layer); None: nothing to attach."""
        return None

    def describe(self) -> dict:
        d = super().describe()
        if self.controller is not None:
            d |= {"controller": self.controller.name, "k_max": self.controller.k_max} | self.controller.describe()
        return d

    # -- hooks -------------------------------------------------------------------------------
    def start(self, prompt: list[int]) -> int:
        self.tokens = list(prompt)
        self.cache = self.target.new_cache()
        if self.controller is not None:
            self.controller.reset(self.seed)
        with self.timer.phase("prefill"):
            logits, hidden = self.prefill(self.tokens)
            self.cache.crop(len(prompt))  # a prefill may run more than the prompt (SPACE's masks)
            self.target_hidden = hidden[-1]
            tok = self.first_token(logits[-1])
        self.tokens.append(tok)
        return tok

    def first_token(self, logits: torch.Tensor) -> int:
        """The sequence's first new token, from the prefill's logits (a method whose paper picks it
        otherwise overrides this: Medusa's typical acceptance takes it greedily)."""
        return next_token(logits, self.sampling, self.gen)

    def prefill(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Target logits and final hidden state at the prompt's last position; draft state set up."""
        logits, hidden = self.target.forward(ids, self.cache, last_only=True)
        self.prefill_draft(ids)
        return logits, hidden

    def prefill_draft(self, prompt: list[int]) -> None:
        """Bring the draft's own state up to the prompt (nothing for draft-free methods)."""

    def propose(self, k_max: int) -> Proposal:
        """Candidates for this step; a chain holds at most k_max tokens."""
        raise NotImplementedError

    def verify_forward(self, prop: Proposal, feed: list[int], mask, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """Target logits and final hidden states [len(feed), ...] over `feed` after the committed
        tokens; `mask` (None: causal) among the fed tokens, `positions` absolute (None: in order)."""
        return self.target.forward(feed, self.cache, positions=positions, tree_mask=mask)

    def after_verify(self, prop: Proposal, path: list[int], rows: list[int], hidden: torch.Tensor,
                     logits: torch.Tensor) -> None:
        """The draft's own state after a step: `path` = accepted nodes (0 = the old pending token),
        `rows` = their indices in the verification forward, whose outputs are `hidden`/`logits`."""

    # -- the shared step ---------------------------------------------------------------------
    def draft_candidates(self, k_max: int) -> Proposal:
        """Propose, then forget whatever drafting wrote into the target's cache (Self-SD drafts
        through it): the verification recomputes those entries with every layer."""
        committed = len(self.tokens) - 1
        prop = self.propose(k_max)
        if not self.verify_reuses_draft_entries:
            self.cache.crop(committed)
        return prop

    def step(self, budget: int) -> StepResult:
        k_max = budget - 1
        if self.controller is not None:
            k_max = min(self.controller.k_max, k_max)
            if k_max < 1:  # one token left: a plain target step
                return super().step(budget)
        with self.timer.phase("draft"):
            prop = self.draft_candidates(k_max)
        with self.timer.phase("verify"):
            pending, L = self.tokens[-1], len(self.tokens) - 1  # L: committed tokens in the cache
            feed, mask, offsets, rows = verification_input(prop, pending)
            positions = None if offsets is None else L + upload(offsets, self.target.device)
            logits, hidden = self.verify_forward(prop, feed, mask, positions)
            node_logits = logits if prop.layout is None else take(logits, rows)  # a chain or tree: every row is a node
            if prop.dtree is not None:  # decided on the device, read once (greedy)
                path, tok, accepted, depth, candidates = verify_tree_greedy_device(prop.dtree, feed, node_logits)
            else:
                path, tok = self.verifier(prop, pending, node_logits, self.sampling, self.gen)
                accepted, depth, candidates = [prop.tokens[j - 1] for j in path[1:]], prop.depth, len(prop.tokens)
            kept = [rows[j] for j in path]
            self.cache.keep(L, kept)  # the one place the target's cache is rolled back
            self.tokens += accepted + [tok]
            self.target_hidden = hidden[kept[-1]]
            self.after_verify(prop, path, kept, hidden, logits)
        n = len(accepted)
        if self.controller is not None and prop.tokens:
            with self.timer.phase("control"):
                self.controller.update(len(prop.tokens), n)
        return StepResult(accepted + [tok], depth, n, len(feed), candidates)

    def draft_loop(self, k_max: int, next_draft) -> Proposal:
        """The controller-driven chain draft. `next_draft(drafts)` returns the draft logits
        ([V]) for the next token and the draft's hidden state there (or None)."""
        drafts: list[int] = []
        q_rows: list[torch.Tensor] = []
        self.controller.begin_round()
        while len(drafts) < k_max:
            logits, hidden = next_draft(drafts)
            signal = self.controller.on_device(len(drafts) + 1, hidden, self.target_hidden)
            tok, conf, q, value = self.draft_choice(logits, signal)
            if q is not None:
                q_rows.append(q)
            drafts.append(tok)
            # a timer phase, not a wait: on CUDA it records events (engine/timer.py)
            with self.timer.phase("control"):
                info = DraftInfo(len(drafts), conf, hidden, self.target_hidden, value)
                if not self.controller.keep_drafting(info):
                    break
        return Proposal(drafts, torch.stack(q_rows) if q_rows else None)

    def draft_choice(self, logits: torch.Tensor, signal: torch.Tensor | None = None):
        """(draft token, confidence, its processed distribution q or None under greedy, the value
        of `signal` or None) from draft logits [V], with one device-to-host read: the token, the
        confidence (the max draft probability, Self-SD's draft-exit rule, its Algorithm 4) and the
        controller's device-side signal (Cali-TS's predicted acceptance) come back together."""
        conf_probs = torch.softmax(logits.float(), -1)
        extra = [] if signal is None else [signal.reshape(1)]
        if self.sampling.greedy:
            best, arg = conf_probs.max(-1)
            # float64 holds any vocabulary index and the float32 max exactly
            got = torch.cat([arg.to(torch.float64).view(1), best.to(torch.float64).view(1)]
                            + [e.to(torch.float64) for e in extra]).tolist()
            return int(got[0]), got[1], None, got[2] if extra else None
        q = probs(logits, self.sampling)
        if not q.is_cuda:
            return sample(q, self.gen), float(conf_probs.max()), q, float(signal) if extra else None
        # the sampled row, the confidence and the signal: one copy
        host = torch.cat([q, conf_probs.max().to(q.dtype).view(1)] + [e.to(q.dtype) for e in extra]).cpu()
        v = q.shape[-1]
        return sample(host[:v], self.gen), float(host[v]), q, float(host[v + 1]) if extra else None


METHODS: dict[str, type[Method]] = {"ar": ARMethod}


def register_method(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls


def require(cond: bool, message: str) -> None:
    if not cond:
        raise SpecBenchError(message)
