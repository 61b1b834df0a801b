"""SAM-Decoding (methods/samd.py, methods/sam.py): lossless under greedy (random prompts, settings and
auxiliary drafters) and sampling (exact marginals), and the invariants a plausible bug breaks: the
automata's matches and drafts against a re-statement of the authors' DynSAM / StaticSAM /
DraftModel.lookup (github.com/hyx1999/SAM-Decoding, samd/sam/*.py, samd/draft.py) on the same inputs,
the auxiliary kept in sync whichever source proposed, the per-step source split, bad settings."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CONF, ar_tokens, build, method_cfg, run_cli, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lossless import SETTINGS, TARGETS, check_lossless, prompts
from test_medusa import E2E_PROMPT, E2E_SAMPLING, check_sampling_matches_target
from test_retrieval import QA, REPETITIVE, own_corpus, sampleable_paths, store

from specbench.core.errors import SpecBenchError
from specbench.methods.eagle_head import training_pairs
from specbench.methods.sam import CorpusIndex, SuffixAutomaton, choose
from specbench.config.settings import merge
from specbench.run.summary import source_split

CORPUS = str(CONF.parent / "tests" / "data" / "retrieval_corpus.txt")
UNTRAINED = {"allow_untrained": True}
AUX = {  # what each auxiliary needs on the 4-layer tiny model (test_every_method.TINY's entries)
    "eagle": UNTRAINED, "eagle3": UNTRAINED, "hydra": UNTRAINED, "medusa": UNTRAINED | {"tree_from_accuracies": None, "sizes": [2, 2, 1, 1]},
    "vanilla_sd": {"draft": {"num_layers": 1, "checkpoint": None}}, "rest": {"corpus": [CORPUS]},
    "pld": {}, "self_sd": {}, "token_recycling": {},
}


def samd(target, aux="eagle", sampling=None, corpus_tokens=None, **kw):
    cfg = merge(method_cfg("samd", corpus=[CORPUS], aux=aux, aux_settings=AUX[aux]), kw)
    m = build("samd", target, cfg, **({"sampling": sampling} if sampling else {}))
    if corpus_tokens is not None:
        m.static = CorpusIndex(store(corpus_tokens))
    return m


# -- the authors' functions, re-stated (one object per state, a deep copy per clone, 1-based end
# positions over input_ids = [-1] + text, a draft padded with token 0 to n_predicts) ----------------
@dataclass
class State:
    next: dict = field(default_factory=dict)
    link: int = -1
    length: int = 0
    min_endpos: int = 0


class AuthorsSAM:
    def __init__(self, n_predicts: int, dynamic: bool):
        self.n_predicts, self.dynamic = n_predicts, dynamic
        self.states, self.input_ids = [State()], [-1]
        self.last = self.max_length = self.cur_index = self.cur_length = 0

    def add_state(self, token):
        self.max_length += 1
        self.states.append(State(length=self.max_length, min_endpos=self.max_length))
        cur, p = len(self.states) - 1, self.last
        while p != -1 and token not in self.states[p].next:
            self.states[p].next[token] = cur
            p = self.states[p].link
        if p == -1:
            self.states[cur].link = 0
        else:
            q = self.states[p].next[token]
            if self.states[p].length + 1 == self.states[q].length:
                self.states[cur].link = q
            else:
                self.states.append(copy.deepcopy(self.states[q]))
                clone = len(self.states) - 1
                self.states[clone].length = self.states[p].length + 1
                while p != -1 and self.states[p].next[token] == q:
                    self.states[p].next[token] = clone
                    p = self.states[p].link
                self.states[q].link = self.states[cur].link = clone
        self.last = cur

    def transfer(self, index, length, token):
        while index != 0 and token not in self.states[index].next:
            index = self.states[index].link
            length = self.states[index].length
        if token in self.states[index].next:
            return self.states[index].next[token], length + 1
        return 0, 0

    def add_tokens(self, tokens):  # the dynamic automaton's update; the static one is built with it
        for t in tokens:
            self.cur_index, self.cur_length = self.transfer(self.cur_index, self.cur_length, t)
            self.add_state(t)
        self.input_ids.extend(tokens)

    def transfer_tokens(self, tokens):  # the static automaton's update
        for t in tokens:
            self.cur_index, self.cur_length = self.transfer(self.cur_index, self.cur_length, t)

    def lookup(self, token):
        return self.transfer(self.cur_index, self.cur_length, token)

    def gen_draft(self, index, start_token):
        if self.dynamic and index != 0:  # to_anc: the static automaton's is commented out
            while self.states[index].link != 0 and self.n_predicts > self.max_length - self.states[index].min_endpos:
                index = self.states[index].link
        end = self.states[index].min_endpos
        pred = [start_token] + self.input_ids[end + 1 : end + self.n_predicts]
        return pred + [0] * (self.n_predicts - len(pred))


def authors_lookup(dyn: AuthorsSAM, static: AuthorsSAM, token: int, len_threshold: int, len_bias: int):
    """DraftModel.lookup: a sequence from the dynamic or the static automaton, or the auxiliary's
    tree (named by the automaton that drafted, or "aux")."""
    i_dyn, m_dyn = dyn.lookup(token)
    i_static, m_static = static.lookup(token)
    m_static -= len_bias
    if max(m_dyn, m_static) >= len_threshold:
        return ("dynamic", dyn.gen_draft(i_dyn, token)) if m_dyn >= m_static else ("static", static.gen_draft(i_static, token))
    return "aux", None


def chunks(text: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def longest_earlier(text: list[int], t: int) -> int:
    """The definition: the longest suffix of text + [t] that occurs in text."""
    seq = text + [t]
    return max((n for n in range(1, len(seq)) if any(seq[i : i + n] == seq[-n:] for i in range(len(text) - n + 1))), default=0)


def unpadded_equal(ours: list[int], authors: list[int]) -> bool:
    """Our draft is the authors' without its leading pending token and trailing 0 padding."""
    return authors[1 : 1 + len(ours)] == ours and not any(authors[1 + len(ours) :])


# -- the automata against the authors' ------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(text=st.lists(st.integers(0, 3), min_size=2, max_size=70), cuts=st.lists(st.integers(1, 70), max_size=12),
       n_predicts=st.integers(2, 12))
def test_dynamic_automaton_is_the_authors(text, cuts, n_predicts):
    """Prompt = the first chunk, each later chunk = one step's committed tokens (its first token the
    pending one looked up): every match length (also = the definition) and every draft agree."""
    parts = chunks(text, cuts)
    ours, theirs = SuffixAutomaton(), AuthorsSAM(n_predicts, dynamic=True)
    ours.extend(parts[0])
    theirs.add_tokens(parts[0])
    for part in parts[1:]:
        state, length = ours.match(part[0])
        index, their_length = theirs.lookup(part[0])
        assert length == their_length == longest_earlier(ours.text, part[0])
        assert unpadded_equal(ours.draft(state, n_predicts), theirs.gen_draft(index, part[0]))
        ours.extend(part)
        theirs.add_tokens(part)


@settings(max_examples=100, deadline=None)
@given(corpus=st.lists(st.integers(0, 3), min_size=1, max_size=80), text=st.lists(st.integers(0, 3), min_size=2, max_size=40),
       cuts=st.lists(st.integers(1, 40), max_size=10), n_predicts=st.integers(2, 12))
def test_static_index_is_the_authors_automaton(corpus, text, cuts, n_predicts):
    """The suffix array with its bounded length search answers what the authors' static automaton does."""
    parts = chunks(text, cuts)
    ours, theirs = CorpusIndex(store(corpus)), AuthorsSAM(n_predicts, dynamic=False)
    theirs.add_tokens(corpus)
    theirs.cur_index = theirs.cur_length = 0  # StaticSAM.reset at every generation
    theirs.transfer_tokens(parts[0])
    context = list(parts[0])
    for part in parts[1:]:
        length, lo, hi = ours.match(context + [part[0]])
        index, their_length = theirs.lookup(part[0])
        assert length == their_length
        if length:
            assert unpadded_equal(ours.draft(length, lo, hi, n_predicts), theirs.gen_draft(index, part[0]))
        context += part
        theirs.transfer_tokens(part)


@pytest.mark.parametrize("aux, bias", [("eagle", 2), ("pld", 12)])
def test_every_proposal_is_the_authors_lookup(aux, bias):
    """End to end on the tiny model: each step's source and retrieved chain are what the authors'
    DraftModel.lookup returns for the same history (their automata fed as their SamdModel feeds them).
    With bias 12 the (dynamic, static) lengths include ties after the bias, (24, 36), and a static match
    that only wins unbiased, (0, 12)."""
    target = tiny_model(init_std=0.1)
    corpus = own_corpus(target)
    m = samd(target, aux, corpus_tokens=corpus, n_predicts=8, len_threshold=3, len_bias=bias)
    seen, propose = [], m.propose

    def spy(k_max):
        prop = propose(k_max)
        seen.append((list(m.tokens), k_max, m.sources[-1], list(prop.tokens)))
        return prop

    m.propose = spy
    sources = Counter()
    for i, prompt in enumerate([REPETITIVE, QA, [5, 17, 99, 3, 42, 8]]):
        seen.clear()
        g = m.generate(prompt, 40, frozenset(), i)
        assert g.tokens == ar_tokens(target, prompt, 40)
        dyn, static = AuthorsSAM(8, dynamic=True), AuthorsSAM(8, dynamic=False)
        static.add_tokens(corpus)
        static.cur_index = static.cur_length = 0
        fed = 0
        for tokens, k_max, source, drafted in seen:
            new, fed = tokens[fed:-1], len(tokens) - 1
            dyn.add_tokens(new)
            static.transfer_tokens(new)
            kind, draft = authors_lookup(dyn, static, tokens[-1], 3, bias)
            assert kind == source, (tokens, source)
            if kind != "aux":
                assert drafted == draft[1:][: len(drafted)] and (len(drafted) == k_max or not any(draft[1 + len(drafted) :]))
            sources[source] += 1
    assert set(sources) == {"dynamic", "static", "aux"}, sources  # every source was exercised


def test_choose_prefers_dynamic_on_ties_and_lowers_static_by_the_bias():
    assert choose(5, 10, 5, 5) == "dynamic"  # 5 >= 10 - 5
    assert choose(5, 11, 5, 5) == "static"
    assert choose(4, 9, 5, 5) == "aux"
    assert choose(0, None, 5, -100) == "aux"  # no corpus: never static, whatever the bias


# -- the auxiliary kept in sync --------------------------------------------------------------------
def test_eagle_head_reads_every_committed_pair_whichever_source_drafted():
    """The pairs fed to the head, step after step, are contiguous and are the training pairs of the
    final sequence: those of retrieved steps are read at the next EAGLE draft, none skipped."""
    target = tiny_model(init_std=0.1)
    m = samd(target, "eagle", corpus_tokens=own_corpus(target), len_threshold=2, len_bias=0)
    m.aux.record_pairs = True
    prompt = [5, 17, 99, 3, 42, 8]  # drafts alternate: EAGLE, the dynamic automaton, EAGLE, ...
    g = m.generate(prompt, 40, frozenset(), 0)
    assert g.tokens == ar_tokens(target, prompt, 40)
    runs = [s for a, s in zip(g.extra["draft_source"], g.extra["draft_source"][1:]) if a != "aux" and s == "aux"]
    assert len(runs) >= 2, g.extra["draft_source"]  # EAGLE drafted after retrieved steps
    feats, toks, _ = training_pairs(target, torch.tensor([prompt + g.tokens]))
    covered = 0
    for start, f, tk in m.aux.fed:
        assert start == covered  # contiguous: no committed pair skipped or fed twice
        assert tk == toks[0, start : start + len(tk)].tolist()
        torch.testing.assert_close(f, feats[0, start : start + len(tk)], rtol=0, atol=1e-10)
        covered = start + len(tk)
    assert covered > len(prompt)


def test_token_recycling_recycles_every_verified_row_of_a_retrieved_chain():
    target = tiny_model(init_std=0.1)
    m = samd(target, "token_recycling", corpus_tokens=own_corpus(target), len_threshold=2, len_bias=0)
    calls, recycle = [], m.aux.recycle
    m.aux.recycle = lambda fed, logits: (calls.append((fed.tolist(), logits.shape[0])), recycle(fed, logits))
    verified, propose = [], m.propose

    def spy(k_max):
        prop = propose(k_max)
        verified.append([m.tokens[-1]] + list(prop.tokens) if m.sources[-1] != "aux" else None)
        return prop

    m.propose = spy
    g = m.generate(REPETITIVE, 40, frozenset(), 0)
    assert g.tokens == ar_tokens(target, REPETITIVE, 40)
    assert len(calls) == len(g.steps)  # a recycle per verification forward, whoever drafted
    chains = [(feed, c) for feed, c in zip(verified, calls) if feed is not None]
    assert chains and all(fed == feed and rows == len(feed) for feed, (fed, rows) in chains)


# -- lossless ----------------------------------------------------------------------------------------
@settings(max_examples=30, **SETTINGS)
@given(target_name=st.sampled_from(list(TARGETS)), aux=st.sampled_from(["eagle", "token_recycling", "pld", "vanilla_sd"]),
       n_predicts=st.integers(2, 40), threshold=st.integers(0, 6), bias=st.integers(-3, 6), prompt=prompts,
       seed=st.integers(0, 2**31 - 1), max_new=st.integers(1, 40), eos_at=st.one_of(st.none(), st.integers(0, 39)))
def test_greedy_equals_ar(target_name, aux, n_predicts, threshold, bias, prompt, seed, max_new, eos_at):
    target = tiny_model(**TARGETS[target_name])
    m = samd(target, aux, corpus_tokens=own_corpus(target), n_predicts=n_predicts, len_threshold=threshold, len_bias=bias)
    check_lossless(target, m, prompt, max_new, seed, eos_at, 81)  # the longest: Token Recycling's tree depth, a chain


@pytest.mark.parametrize("aux", sorted(AUX))
def test_every_auxiliary_greedy_equals_ar(aux, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = tiny_model(init_std=0.1)
    m = samd(target, aux, corpus_tokens=own_corpus(target), len_threshold=3)
    for i, prompt in enumerate([REPETITIVE, QA]):
        g = m.generate(prompt, 30, frozenset(), i)
        assert g.tokens == ar_tokens(target, prompt, 30)
        assert len(g.extra["draft_source"]) == len(g.steps)


@pytest.mark.parametrize("threshold, source", [(4, "static"), (6, "aux")])
def test_sampling_is_lossless_end_to_end(threshold, source):
    """The corpus holds, after the prompt's last tokens, every continuation the target can sample.
    Threshold 4: the first step's match (the prompt's 4-token tail + the first token) retrieves a
    static chain, accepted or rejected; 6: it is too short, the auxiliary drafts (a sampled chain,
    with q). Either way the drafting source's tokens are the ones accepted."""
    target = tiny_model(init_std=0.1, num_layers=2)
    corpus = sum((E2E_PROMPT[-4:] + p for p in sampleable_paths(target)), [])
    m = samd(target, "vanilla_sd", sampling=E2E_SAMPLING, corpus_tokens=corpus, len_threshold=threshold, len_bias=0)
    accepted, generate = Counter(), m.generate

    def counted(*a):
        g = generate(*a)
        accepted.update({src: s.kept for src, s in zip(g.extra["draft_source"], g.steps)})
        return g

    m.generate = counted
    assert check_sampling_matches_target(m, target) > 100
    assert accepted[source] > 100, accepted


# -- the per-step split ------------------------------------------------------------------------------
def test_source_split_counts_steps_and_tokens_per_source():
    rec = {"method": {"draft_source": ["dynamic", "aux", "dynamic"], "steps": [[5, 3, 3, 6, 5], [4, 1, 1, 16, 15], [2, 2, 1, 3, 2]]}}
    assert source_split([rec, {"method": {"steps": [[1, 1, 1, 2, 1]]}}]) == {
        "dynamic": {"steps": 2, "drafted": 7, "accepted": 5, "kept": 4}, "aux": {"steps": 1, "drafted": 15, "accepted": 1, "kept": 1}}


# -- bad settings: one line ----------------------------------------------------------------------------
@pytest.mark.parametrize("kw, words", [
    ({"aux": "suffix"}, "unknown method.aux 'suffix'; allowed: eagle"), ({"aux": "samd"}, "unknown method.aux 'samd'"),
    ({"n_predicts": 1}, "method.n_predicts=1"), ({"len_threshold": -1}, "method.len_threshold=-1"),
    ({"aux_settings": {"name": "pld"}}, "aux_settings.name"), ({"aux": "medusa", "aux_settings": AUX["medusa"] | {"variant": "medusa2"}}, "medusa2"),
    ({"corpus": ["no/such.txt"]}, "'no/such.txt' not found"),
])
def test_bad_settings_are_one_line_errors(kw, words, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(SpecBenchError, match=words):
        build("samd", tiny_model(), merge(method_cfg("samd", corpus=[CORPUS], aux_settings=UNTRAINED), kw))


@pytest.mark.slow
@pytest.mark.parametrize("args, line", [
    (["method.aux=bogus"], "unknown method.aux 'bogus'; allowed: eagle, eagle3, hydra, medusa, pld, rest, self_sd, token_recycling, vanilla_sd"),
    (["+method.aux_settings.top_kk=3"], "unknown key 'method.aux_settings.top_kk' for the auxiliary method.aux=eagle; allowed: "),
    (["+method.aux_settings.top_k=0"], "method.aux_settings.top_k=0 is not allowed; expected an integer >= 1"),
    (["method.n_predicts=1"], "method.n_predicts=1 is not allowed; expected an integer >= 2"),
])
def test_bad_setting_on_the_command_line(args, line, tmp_path, data_dir):
    r = run_cli(["method=samd", *args, "model=tiny-llama", "task.num_samples=1", f"run_dir={tmp_path}/run"], data_dir)
    assert r.returncode == 2, r.stderr
    got = r.stderr.strip().splitlines()
    assert len(got) == 1 and got[0].startswith("specbench: error: " + line), got
    assert not (tmp_path / "run").exists()


def test_datastore_tokens_are_the_rest_corpus():
    m = samd(tiny_model())
    assert np.array_equal(m.static.store.tokens, np.asarray(tiny_model().tokenizer.encode(Path(CORPUS).read_text())))


def test_first_use_trains_the_auxiliarys_part_with_its_settings(tmp_path, data_dir, monkeypatch):
    """From an empty cache: the part missing is EAGLE's head, trained as method=eagle trains it (the
    trainer reads the auxiliary's settings, recorded in the checkpoint), then found."""
    from test_firstuse import cfg_for

    from specbench.run import firstuse
    from specbench.models.artifacts import checkpoint_meta
    from specbench.models import load_model
    from specbench.config.settings import of

    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cache"))
    cfg = cfg_for(tmp_path, data_dir, "method=samd")
    target = load_model(of(cfg).model)
    missing = firstuse.missing_parts(of(cfg), target)
    assert [(p.train, p.method.name) for p in missing] == [("eagle", "eagle")]
    assert firstuse.ensure_trained(of(cfg), target) == missing
    assert not firstuse.missing_parts(of(cfg), target)
    assert checkpoint_meta(missing[0].path)["settings"]["method"]["name"] == "eagle"
