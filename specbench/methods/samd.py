"""SAM-Decoding (Hu et al. 2024, "SAM Decoding: Speculative Decoding via Suffix Automaton", arXiv
2411.10666; authors' code github.com/hyx1999/SAM-Decoding, `samd/`): retrieval by suffix automata,
with an auxiliary drafter for the steps where retrieval finds too little.

Each step, with x the pending token (methods/sam.py):
1. the dynamic automaton (the prompt and the committed output) and the static corpus (the REST
   datastore's, `corpus`) each give their longest suffix match of the context ending in x;
2. the longer one, the static length lowered by `len_bias`, the dynamic one on a tie, if it reaches
   `len_threshold`: its continuation, at most `n_predicts` - 1 tokens, is the draft, a chain;
3. otherwise the auxiliary drafter proposes (`aux`, EAGLE-2 by default: its tree). The auxiliary is
   a registered method built on the same target (its settings: conf/method/<aux>.yaml with
   `aux_settings` over them), sharing this method's tokens, cache, generator and timer; its own
   draft state is kept in sync after *every* step, whichever source proposed (`SYNC`): EAGLE's head
   reads the target features of every committed token (the authors' Eagle2.update accumulates them
   until its next draft), Token Recycling recycles every verified row (the authors' update too).
The decode loop (methods/base.py) verifies: a retrieved chain with one-hot q (deterministic), the
auxiliary's proposal as the auxiliary would (its `verify_forward`: EAGLE-3 taps its layers there).

Each step's source is recorded (`draft_source` in the generation's `extra`, parallel to its steps;
the summary splits steps, drafted and accepted tokens by source). Deviations (docs/trainingfree_retrieval.md):
no padding of a short retrieved draft (the authors pad with token 0 to n_predicts and verify it);
an empty retrieved draft is a plain target step; the static corpus has no end token between entries.
"""

from __future__ import annotations

import os

import torch
from specbench.methods.datastore import load_or_build, parse_spec
from specbench.engine.verify import Proposal
from specbench.core.errors import SpecBenchError, choice_error
from specbench.methods.base import METHODS, SpeculativeMethod, register_method
from specbench.methods.eagle import Eagle
from specbench.methods.sam import AUX, DYNAMIC, CorpusIndex, SuffixAutomaton, choose
from specbench.methods.token_recycling import TokenRecycling
from specbench.config.settings import shipped

# drafters whose state SYNC keeps right when another source proposed (= schema.SAMD_AUX); not:
# ar (no draft), hf_assisted (its own loop), eesd (verification reuses its draft's cache entries),
# space and lookahead (verification layouts of their own), suffix (its run trie is completed in its
# own generate), samd
SUPPORTED_AUX = ("eagle", "eagle3", "hydra", "medusa", "pld", "rest", "self_sd", "token_recycling", "vanilla_sd")
SETTINGS = {"n_predicts": 2, "len_threshold": 0, "len_bias": None}  # integer settings, their minimum


def aux_config(cfg):
    """The auxiliary's method settings: conf/method/<aux>.yaml, `aux_settings` merged over it."""
    name = cfg.aux
    if name not in SUPPORTED_AUX:
        raise choice_error("method.aux", name, SUPPORTED_AUX)
    over = cfg.aux_settings or {}  # null: none
    if "name" in over:
        raise SpecBenchError("method.aux_settings.name is not allowed; choose the auxiliary with method.aux")
    return shipped("method", name, over)


def sync_backlog(aux: Eagle, proposed: bool, feed: list[int], args) -> None:
    """EAGLE-2/3: the head must read the features of every committed token: when it did not draft,
    this step's pairs join those it has not read yet."""
    if proposed:
        aux.after_verify(*args)
        return
    feats, toks = aux.backlog
    aux.after_verify(*args)
    new_feats, new_toks = aux.backlog
    aux.backlog = (torch.cat([feats, new_feats]), list(toks) + list(new_toks))


def sync_recycled(aux: TokenRecycling, proposed: bool, feed: list[int], args) -> None:
    """Token Recycling: every verified row's top-k, the retrieved chain's rows too."""
    if proposed:
        aux.after_verify(*args)
        return
    aux.recycle(torch.tensor(feed, dtype=torch.long, device=aux.adj.device), args[-1])


def sync_plain(aux, proposed: bool, feed: list[int], args) -> None:
    """Drafters whose after_verify reads only the committed tokens and kept rows (or nothing)."""
    aux.after_verify(*args)


def sync_rule(aux):
    if isinstance(aux, Eagle):
        return sync_backlog
    return sync_recycled if isinstance(aux, TokenRecycling) else sync_plain


@register_method
class SAMDecoding(SpeculativeMethod):
    name = "samd"
    uses_controller = False  # a retrieved chain is n_predicts - 1 long; the auxiliary brings its own controller
    run_state = ("aux_run_state",)  # the runner's warm-up leaves the auxiliary's run-long state as it was

    def __init__(self, target, cfg, sampling, run):
        super().__init__(target, cfg, sampling, run)
        for key, lo in SETTINGS.items():
            v = getattr(cfg, key)
            if not isinstance(v, int) or isinstance(v, bool) or (lo is not None and v < lo):
                at_least = f" >= {lo}" if lo is not None else ""
                raise SpecBenchError(f"method.{key}={v} is not allowed; expected an integer{at_least}")
            setattr(self, key, v)
        self.static, self.datastore_path, self.corpus_files = None, None, []
        corpus = list(cfg.corpus or [])
        if corpus:
            data_dir = run.data_dir or os.environ.get("SPECBENCH_DATA_DIR")
            self.corpus_files = [parse_spec(c, data_dir)[0] for c in corpus]
            store, self.datastore_path = load_or_build(str(run.model_name), target.tokenizer, corpus, data_dir,
                                                       bool(cfg.build_missing))
            self.static = CorpusIndex(store)
        self.aux = METHODS[str(cfg.aux)](target, aux_config(cfg), sampling, run)
        if self.aux.finetuned_adapter is not None:  # it would decode with other weights than ours
            raise SpecBenchError(f"method.aux={self.aux.name} with changed weights (medusa variant medusa2) is not supported")
        self.sync = sync_rule(self.aux)
        self.sources: list[str] = []  # per step: dynamic | static | aux (methods/sam.py)
        self.aux_proposed = False

    def inputs(self) -> dict:
        """The static corpus and its datastore (as REST's), and the auxiliary's own inputs: a resume
        after one changed is refused (run/provenance.py)."""
        own = {"corpus": self.corpus_files, "datastore": self.datastore_path} if self.static is not None else {}
        return own | {f"aux_{k}": v for k, v in self.aux.inputs().items()}

    def describe(self) -> dict:
        aux = {k: v for k, v in self.aux.describe().items() if k not in ("method", "lossless")}
        static = None if self.static is None else {
            "datastore": self.datastore_path.name, "tokens": len(self.static.store), "corpus": self.static.store.meta.get("corpus")}
        return super().describe() | {k: getattr(self, k) for k in SETTINGS} | {
            "static": static, "aux": self.aux.name, "aux_settings": aux}

    def verify_widths(self) -> list[int]:
        return sorted({self.n_predicts} | set(self.aux.verify_widths()))

    def carries_state(self) -> bool:
        return self.aux.carries_state()  # the automata are rebuilt per sequence; the auxiliary may carry state

    @property
    def aux_run_state(self) -> dict:
        names = ("controller",) + tuple(getattr(self.aux, "run_state", ()))
        return {a: getattr(self.aux, a) for a in names}

    @aux_run_state.setter
    def aux_run_state(self, saved: dict) -> None:
        for a, v in saved.items():
            setattr(self.aux, a, v)

    # -- one sequence: the auxiliary prefills (target and its own draft state), the automata follow
    def generate(self, prompt, max_new_tokens, eos_ids, seed):
        self.sources = []
        g = super().generate(prompt, max_new_tokens, eos_ids, seed)
        g.extra["draft_source"] = self.sources[: len(g.steps)]
        return g

    def start(self, prompt: list[int]) -> int:
        aux = self.aux
        aux.seed, aux.gen, aux.timer = self.seed, self.gen, self.timer
        tok = aux.start(prompt)
        self.tokens, self.cache, self.target_hidden = aux.tokens, aux.cache, aux.target_hidden
        with self.timer.phase("prefill"):
            self.dynamic = SuffixAutomaton()
            self.dynamic.extend(prompt)
            if self.static is not None:
                self.static.reset()
        return tok

    def propose(self, k_max: int) -> Proposal:
        pending = self.tokens[-1]
        state, dyn_len = self.dynamic.match(pending)
        static = self.static.match(self.tokens) if self.static is not None else None
        source = choose(dyn_len, None if static is None else static[0], self.len_threshold, self.len_bias)
        self.sources.append(source)
        self.aux_proposed = source == AUX
        if source == AUX:
            return self.aux.propose(k_max)
        if source == DYNAMIC:
            draft = self.dynamic.draft(state, self.n_predicts)
        else:
            draft = self.static.draft(*static, self.n_predicts)
        return Proposal(draft[:k_max])  # deterministic: one-hot q under sampling

    def verify_forward(self, prop, feed, mask, positions):
        return self.aux.verify_forward(prop, feed, mask, positions)

    def after_verify(self, prop, path, rows, hidden, logits) -> None:
        self.dynamic.extend(self.tokens[len(self.dynamic.text) : -1])  # the committed tokens it has not seen
        aux = self.aux
        aux.target_hidden = self.target_hidden
        feed = [self.tokens[-len(path) - 1]] + list(prop.tokens)  # what was verified: the old pending token first
        self.sync(aux, self.aux_proposed, feed, (prop, path, rows, hidden, logits))
        if self.aux_proposed and aux.controller is not None and prop.tokens:
            with self.timer.phase("control"):
                aux.controller.update(len(prop.tokens), len(path) - 1)

