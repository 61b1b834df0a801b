"""REST and SuffixDecoding (methods/rest.py, methods/suffix.py, methods/datastore.py): lossless under
greedy (random prompts and settings) and sampling (exact marginals), and the invariants a plausible
bug breaks: the suffix array's order, REST's trie = the counted prefixes of the datastore's
continuations of the longest matching suffix, a speculation tree only spells what its trie saw, the
adaptive length rule, the global trie = this method's own outputs (never the warm-up's)."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from helpers import CONF, ar_tokens, build, method_cfg, run_cli, tiny_model
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_lossless import SETTINGS, TARGETS, check_lossless, prompts
from test_medusa import E2E_PROMPT, E2E_SAMPLING, check_sampling_matches_target
from test_trainingfree import top5

from specbench.methods import datastore
from specbench.tools import datastore as datastore_cli
from specbench.methods.datastore import Datastore, suffix_array
from specbench.core.errors import SpecBenchError
from specbench.methods.suffix import SuffixTrie
from specbench.run.warmup import warm_up

CORPUS = str(CONF.parent / "tests" / "data" / "retrieval_corpus.txt")
REPETITIVE = [40, 41, 42, 40, 41, 42, 40, 41, 7, 40, 41]
QA = [3 + b for b in b"Question: 2+2=? Answer:"]


def store(tokens) -> Datastore:
    t = np.asarray(tokens, dtype=np.int32)
    return Datastore(t, suffix_array(t), {})


def rest(target, sampling=None, **kw):
    kw = {"corpus": [CORPUS], "max_suffix": 16, "min_suffix": 2, "max_matches": 5000, "continuation_len": 10,
          "num_draft": 64, "cut": "paths"} | kw
    m = build("rest", target, method_cfg("rest", **kw), **({"sampling": sampling} if sampling else {}))
    return m


def suffix(target, sampling=None, **kw):
    kw = {"max_depth": 24, "max_spec_tokens": 24, "max_spec_factor": 1.0, "max_spec_offset": 0.0,
          "min_token_prob": 0.1, "spec": "tree"} | kw
    return build("suffix", target, method_cfg("suffix", **kw), **({"sampling": sampling} if sampling else {}))


def own_corpus(target) -> list[int]:
    """A datastore text the target agrees with (its own greedy outputs) and some that it does not."""
    return sum((p + ar_tokens(target, p, 30) for p in (REPETITIVE, QA)), []) + list(range(3, 60))


# -- the suffix array ------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), max_size=60))
def test_suffix_array_sorts_every_suffix(tokens):
    assert suffix_array(np.asarray(tokens, dtype=np.int64)).tolist() == sorted(range(len(tokens)), key=lambda i: tokens[i:])


# -- greedy: AR's tokens, whatever the settings ----------------------------------------------------
@settings(max_examples=30, **SETTINGS)
@given(target_name=st.sampled_from(list(TARGETS)), max_suffix=st.integers(1, 16), min_suffix=st.integers(1, 3),
       num_draft=st.integers(1, 64), cont=st.integers(1, 10), matches=st.integers(1, 50), cut=st.sampled_from(["paths", "nodes"]),
       prompt=prompts, seed=st.integers(0, 2**31 - 1), max_new=st.integers(1, 40), eos_at=st.one_of(st.none(), st.integers(0, 39)))
def test_rest_greedy_equals_ar(target_name, max_suffix, min_suffix, num_draft, cont, matches, cut, prompt, seed, max_new, eos_at):
    target = tiny_model(**TARGETS[target_name])
    m = rest(target, max_suffix=max(max_suffix, min_suffix), min_suffix=min_suffix, num_draft=num_draft,
             continuation_len=cont, max_matches=matches, cut=cut)
    m.datastore = store(own_corpus(target))
    check_lossless(target, m, prompt, max_new, seed, eos_at, cont)


@settings(max_examples=30, **SETTINGS)
@given(target_name=st.sampled_from(list(TARGETS)), depth=st.integers(1, 24), spec=st.integers(1, 24),
       factor=st.sampled_from([0.5, 1.0, 3.0]), offset=st.sampled_from([0.0, 2.0]), min_prob=st.sampled_from([0.0, 0.1, 0.5]),
       reset=st.booleans(), prompt=prompts, seed=st.integers(0, 2**31 - 1), max_new=st.integers(1, 40),
       eos_at=st.one_of(st.none(), st.integers(0, 39)))
def test_suffix_greedy_equals_ar(target_name, depth, spec, factor, offset, min_prob, reset, prompt, seed, max_new, eos_at):
    target = tiny_model(**TARGETS[target_name])
    m = suffix(target, max_depth=depth, max_spec_tokens=spec, max_spec_factor=factor, max_spec_offset=offset,
               min_token_prob=min_prob, reset_per_sequence=reset, spec="path" if seed % 2 else "tree")
    m.generate(REPETITIVE, 20, frozenset(), 0)  # an earlier output in the global trie (kept unless reset)
    check_lossless(target, m, prompt, max_new, seed, eos_at, spec)


@pytest.mark.parametrize("name, kw", [("rest", {}), ("rest", {"cut": "nodes"}), ("suffix", {}), ("suffix", {"spec": "path"})])
def test_acceptance_is_exercised(name, kw):
    target = tiny_model(init_std=0.1)
    m = rest(target, **kw) if name == "rest" else suffix(target, **kw)
    if name == "rest":
        m.datastore = store(own_corpus(target))
    accepted = 0
    for i, prompt in enumerate([REPETITIVE, QA, REPETITIVE]):  # the repeat: suffix decoding's global trie
        g = m.generate(prompt, 30, frozenset(), i)
        assert g.tokens == ar_tokens(target, prompt, 30)
        accepted += sum(s.accepted for s in g.steps)
    assert accepted >= 30


# -- sampling: the target's exact marginals (deterministic drafts, one-hot q) ----------------------
def sampleable_paths(target) -> list[list[int]]:
    """Every 3-token continuation of E2E_PROMPT the target can sample (top-5 each)."""
    return [[a, b, c] for a in top5(target, E2E_PROMPT) for b in top5(target, E2E_PROMPT + [a])
            for c in top5(target, E2E_PROMPT + [a, b])]


def test_rest_sampling_is_lossless_end_to_end():
    """The datastore holds, after the prompt's last tokens, every continuation the target can sample:
    the trie's candidates are accepted or rejected at every step."""
    target = tiny_model(init_std=0.1, num_layers=2)
    m = rest(target, sampling=E2E_SAMPLING)
    m.datastore = store(sum((E2E_PROMPT[-4:] + p for p in sampleable_paths(target)), []))
    assert check_sampling_matches_target(m, target) > 100


def test_suffix_sampling_is_lossless_end_to_end():
    target = tiny_model(init_std=0.1, num_layers=2)
    m = suffix(target, sampling=E2E_SAMPLING, max_spec_tokens=30, max_spec_factor=6.0, min_token_prob=0.0)
    prefill_draft = m.prefill_draft
    paths = sampleable_paths(target)

    def seeded(prompt):  # earlier "outputs": every sampleable continuation after the prompt's tail
        prefill_draft(prompt)
        m.global_trie = SuffixTrie(m.max_depth)
        for i, p in enumerate(paths):
            m.global_trie.extend(-1 - i, E2E_PROMPT[-4:] + p)

    m.prefill_draft = seeded
    assert check_sampling_matches_target(m, target) > 100


# -- REST's invariants -----------------------------------------------------------------------------
def naive_trie(tokens: list[int], context: list[int], max_len: int, min_len: int, cont: int) -> Counter:
    """Every prefix of the continuations of the longest occurring context suffix, counted."""
    n = len(tokens)
    for L in range(min(max_len, len(context)), min_len - 1, -1):
        hits = [i for i in range(n - L + 1) if tokens[i : i + L] == context[-L:]]
        if hits:
            return Counter(tuple(tokens[i + L : i + L + d]) for i in hits for d in range(1, min(cont, n - i - L) + 1))
    return Counter()


def proposal_paths(prop) -> list[tuple[int, ...]]:
    """The token sequence from the root to every node of a proposed tree."""
    tree, toks = prop.tree, [None] + prop.tokens
    out = []
    for i in range(1, len(tree)):
        path, j = [], i
        while j > 0:
            path.append(toks[j])
            j = tree.parents[j]
        out.append(tuple(path[::-1]))
    return out


@settings(max_examples=80, deadline=None)
@given(tokens=st.lists(st.integers(3, 6), min_size=1, max_size=80), context=st.lists(st.integers(3, 6), min_size=1, max_size=12),
       max_len=st.integers(1, 8), min_len=st.integers(1, 3), cont=st.integers(1, 6), num_draft=st.integers(1, 40))
def test_rest_trie_is_the_most_frequent_prefixes_of_the_longest_suffix_continuations(tokens, context, max_len, min_len, cont, num_draft):
    max_len = max(max_len, min_len)
    m = rest(tiny_model(), max_suffix=max_len, min_suffix=min_len, continuation_len=cont, num_draft=num_draft, cut="nodes")
    m.datastore = store(tokens)
    m.tokens = list(context)
    want = naive_trie(tokens, context, max_len, min_len, cont)
    prop = m.propose(0)
    got = proposal_paths(prop) if prop.tree is not None else []
    assert len(got) == len(set(got)) == min(num_draft, len(want))
    assert set(got) <= set(want)
    dropped = set(want) - set(got)
    if got and dropped:  # the kept nodes are the most frequent ones
        assert min(want[p] for p in got) >= max(want[p] for p in dropped)
    if len(want) <= num_draft:
        assert set(got) == set(want)
    for i in range(len(prop.tree or [])):  # children ranked by count, most frequent first
        kids = prop.tree.children[i]
        counts = [want[got[k - 1]] for k in kids]
        assert counts == sorted(counts, reverse=True)


def test_rest_keeps_the_most_frequent_branch_not_the_first_seen():
    m = rest(tiny_model(), min_suffix=1, max_suffix=1, continuation_len=2, num_draft=2, cut="nodes")
    m.datastore = store([1, 5, 8, 1, 9, 6, 1, 9, 6, 1, 9, 7])  # after 1: 5 once (first in order), 9 three times
    m.tokens = [1]
    prop = m.propose(0)
    assert proposal_paths(prop) == [(9,), (9, 6)]
    m.num_draft = 4
    assert proposal_paths(m.propose(0)) == [(9,), (5,), (9, 6), (5, 8)]  # rank 0: the more frequent; ties: first seen


def authors_cut_to_choices(paths: list[tuple[int, ...]], choices: int) -> list[tuple[int, ...]]:
    """draftretriever's cut_to_choices (DraftRetriever/src/lib.rs), restated: weigh each path by its
    distinct token values, stable-sort heaviest first, drop paths while the weights sum above `choices`."""
    count = sorted(((len(set(p)), paths.index(p)) for p in paths), key=lambda c: -c[0])
    total, remove = sum(c for c, _ in count), []
    for c, i in count:
        if total > choices:
            total -= c
            remove.append(i)
        else:
            break
    return [p for i, p in enumerate(paths) if i not in remove]


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(st.integers(3, 5), min_size=1, max_size=120), context=st.lists(st.integers(3, 5), min_size=1, max_size=6),
       cont=st.integers(1, 8), num_draft=st.integers(1, 48), seed=st.integers(0, 1000))
def test_rest_path_cut_is_the_authors_cut_to_choices(tokens, context, cont, num_draft, seed):
    """On the same retrieved continuations: the authors' cut of the `num_draft` most frequent prefixes
    (in the order that breaks its ties as ours does) keeps exactly our trie; in any other order of its
    ties it keeps as many nodes."""
    wide, cut = (rest(tiny_model(), min_suffix=1, continuation_len=cont, num_draft=num_draft, cut=c) for c in ("nodes", "paths"))
    for m in (wide, cut):
        m.datastore, m.tokens = store(tokens), list(context)
    kept = proposal_paths(cut.propose(0)) if cut.propose(0).tree is not None else []
    heap = proposal_paths(wide.propose(0)) if wide.propose(0).tree is not None else []
    rows = [tuple(t for t in r if t >= 0) for r in cut.retrieve(context).tolist()]
    count = {p: sum(r[: len(p)] == p for r in rows) for p in heap}
    first = {p: min(i for i, r in enumerate(rows) if r[: len(p)] == p) for p in heap}
    ours_order = sorted(heap, key=lambda p: (-len(p), count[p], -first[p]))  # deeper, rarer, later seen first
    assert sorted(authors_cut_to_choices(ours_order, num_draft)) == sorted(kept)
    assert sum(len(set(p)) for p in kept) <= num_draft
    shuffled = list(heap)
    np.random.default_rng(seed).shuffle(shuffled)
    assert len(authors_cut_to_choices(shuffled, num_draft)) == len(kept)


def test_rest_path_cut_counts_distinct_tokens_not_length():
    """Paths whose tokens repeat weigh less than their length: (4, 4, 4) weighs 1, so it stays."""
    m = rest(tiny_model(), min_suffix=1, max_suffix=1, continuation_len=3, num_draft=4)
    m.datastore, m.tokens = store([1, 4, 4, 4, 1, 4, 4, 4]), [1]
    assert sorted(proposal_paths(m.propose(0))) == [(4,), (4, 4), (4, 4, 4)]
    m.datastore = store([1, 4, 5, 6, 1, 4, 5, 6])  # the same shape, distinct tokens: weights 1 + 2 + 3 > 4
    assert sorted(proposal_paths(m.propose(0))) == [(4,), (4, 5)]


def test_rest_reads_at_most_max_matches_occurrences():
    m = rest(tiny_model(), max_matches=3, continuation_len=1, num_draft=64)
    m.datastore = store([5, 7, 5, 8, 5, 9, 5, 10, 5, 11])  # the suffix [5] and 5 continuations
    m.tokens = [5]
    m.min_suffix = 1
    prop = m.propose(0)
    assert sorted(prop.tokens) == [7, 8, 9]  # the first 3 in suffix-array order: 5,7 < 5,8 < 5,9 ...


# -- SuffixDecoding's invariants -------------------------------------------------------------------
def trie_paths(node, prefix=()) -> dict:
    out = {}
    for t, c in node.children.items():
        out[prefix + (t,)] = c.count
        out |= trie_paths(c, prefix + (t,))
    return out


def occurs(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


@pytest.mark.parametrize("factor, offset, spec, want", [(1.0, 0.0, 24, 10), (0.5, 0.0, 24, 5), (3.0, 0.0, 16, 16),
                                                         (0.5, 2.0, 24, 7), (0.01, 0.0, 24, 0)])
def test_adaptive_length_is_factor_times_match_length(factor, offset, spec, want):
    """A pattern of 10 distinct tokens seen once before, followed by 30 more: the longest match wins and
    speculates floor(factor * 10 + offset) tokens (capped at max_spec_tokens), the seen continuation."""
    trie = SuffixTrie(64)  # deep enough: at depth 24 a 10-token match could grow only 14 more
    trie.extend(0, list(range(1, 41)) + list(range(1, 11)))
    cand = trie.speculate(list(range(1, 11)), spec, factor, offset, 0.1)
    assert len(cand.tokens) == want and cand.tokens == list(range(11, 11 + want))
    assert cand.match_len == (10 if want else 0)
    assert cand.probs == [0.5] * want  # the pattern's own end counts as a stop: 1 of 2 continued


def test_speculation_probabilities_are_count_ratios():
    trie = SuffixTrie(8)
    for i, seq in enumerate([[1, 2, 3, 5], [1, 2, 3, 6], [1, 2, 4, 7]]):
        trie.extend(i, seq)
    cand = trie.speculate([9, 1, 2], 10, 10.0, 0.0, 0.0)
    assert cand.match_len == 2 and cand.tokens == [3, 4, 5, 6, 7] and cand.parents == [-1, -1, 0, 0, 1]
    assert cand.probs == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert trie.speculate([9, 1, 2], 10, 10.0, 0.0, 0.5).tokens == [3]  # min_token_prob prunes


def test_path_mode_drafts_one_path_the_most_frequent_continuation():
    """spec=path (arctic's `_speculate_path`, what vLLM calls): a chain, the most frequent child at every
    node while the path's probability stays >= min_token_prob; the tree grown from the same node holds it."""
    trie = SuffixTrie(8)
    for i, seq in enumerate([[1, 2, 3, 5, 8], [1, 2, 3, 6], [1, 2, 3, 6], [1, 2, 4, 7]]):
        trie.extend(i, seq)
    path = trie.speculate([9, 1, 2], 10, 10.0, 0.0, 0.0, tree=False)
    assert path.tokens == [3, 6] and path.parents == [-1, 0] and path.match_len == 2
    assert path.probs == pytest.approx([3 / 4, 3 / 4 * 2 / 3]) and path.score == pytest.approx(3 / 4 + 1 / 2)
    assert trie.speculate([9, 1, 2], 10, 10.0, 0.0, 0.6, tree=False).tokens == [3]  # 1/2 < 0.6 stops it
    tree = trie.speculate([9, 1, 2], 10, 10.0, 0.0, 0.0)
    assert len(tree.tokens) > 2 and tree.tokens[:1] == [3] and 6 in tree.tokens


@settings(max_examples=60, deadline=None)
@given(seqs=st.lists(st.lists(st.integers(3, 6), min_size=1, max_size=12), min_size=1, max_size=5),
       pattern=st.lists(st.integers(3, 6), min_size=1, max_size=4))
def test_path_mode_proposes_a_chain_of_most_frequent_children(seqs, pattern):
    m = suffix(tiny_model(), spec="path", max_depth=8, max_spec_tokens=8, max_spec_factor=4.0, min_token_prob=0.0)
    m.start(pattern)
    m.tokens = list(pattern)  # the pattern's last token pending (the model's first token would match nothing)
    for i, seq in enumerate(seqs):
        m.global_trie.extend(-1 - i, seq)
    cand = m.speculate()
    prop = m.propose(0)
    assume(prop.tree is not None)
    assert all(len(kids) <= 1 for kids in prop.tree.children)  # a single path
    trie = m.global_trie if m.source == "global" else m.local_trie
    node = trie.match(m.tokens[len(m.tokens) - cand.match_len :])
    for t in prop.tokens:  # each step: the most frequent child of the node before
        assert node.children[t].count == max(c.count for c in node.children.values())
        node = node.children[t]


def test_global_trie_holds_exactly_the_methods_own_outputs_and_drafts_only_what_it_saw():
    target = tiny_model(init_std=0.1)
    m = suffix(target, max_depth=6)
    warm_up([m], QA, 8, frozenset())  # the runner's warm-up leaves no trace
    assert m.global_trie.root.count == 0
    outputs, seen = [], []
    propose = m.propose

    def spy(k_max):
        prop = propose(k_max)
        seen.append((list(m.tokens), m.source, m.speculate().match_len, prop))
        return prop

    m.propose = spy
    for i, prompt in enumerate([REPETITIVE, QA, REPETITIVE]):
        seen.clear()
        outputs.append(m.generate(prompt, 25, frozenset(), i).tokens)
        for context, source, p, prop in seen:  # pattern + every drafted path occurs in the trie's sequences
            sources = [prompt + context[len(prompt):]] if source == "local" else outputs[:-1] + [context[len(prompt):]]
            for path in proposal_paths(prop) if prop.tree is not None else []:
                assert any(occurs(s, context[len(context) - p :] + list(path)) for s in sources), (source, path)
    ref = SuffixTrie(6)
    for i, out in enumerate(outputs):
        ref.extend(i, out)
    assert trie_paths(m.global_trie.root) == trie_paths(ref.root)  # no prompt, no AR, no warm-up tokens


# -- bad settings: one line ------------------------------------------------------------------------
@pytest.mark.parametrize("name, kw, words", [
    ("rest", {"max_suffix": 0}, "method.max_suffix=0"), ("rest", {"num_draft": 0}, "method.num_draft=0"),
    ("rest", {"min_suffix": 5, "max_suffix": 3}, "method.min_suffix=5 is above"),
    ("rest", {"cut": "heap"}, "unknown method.cut 'heap'; allowed: nodes, paths"),
    ("rest", {"corpus": ["/nonexistent.txt"]}, "'/nonexistent.txt' not found"), ("rest", {"corpus": []}, r"method.corpus=\[\] is not allowed; expected a non-empty list"),
    ("rest", {"corpus": [CORPUS], "build_missing": False}, "python -m specbench.tools.datastore"),
    ("suffix", {"max_depth": 0}, "method.max_depth=0"), ("suffix", {"min_token_prob": 2}, "method.min_token_prob=2"),
    ("suffix", {"spec": "dag"}, "unknown method.spec 'dag'; allowed: path, tree"),
    ("suffix", {"max_spec_factor": -1}, "method.max_spec_factor=-1"), ("suffix", {"max_spec_tokens": 1.5}, "method.max_spec_tokens=1.5"),
])
def test_bad_settings_are_one_line_errors(name, kw, words):
    with pytest.raises(SpecBenchError, match=words):
        rest(tiny_model(), **kw) if name == "rest" else suffix(tiny_model(), **kw)


@pytest.mark.slow
@pytest.mark.parametrize("args, line", [
    (["method=rest", "method.num_draft=0"], "method.num_draft=0 is not allowed; expected an integer >= 1"),
    (["method=rest", "method.corpus=[nope.txt]"], "datastore corpus file 'nope.txt' not found"),
    (["method=suffix", "method.min_token_prob=1.5"], "method.min_token_prob=1.5 is not allowed; expected a finite number >= 0 and <= 1"),
])
def test_bad_setting_on_the_command_line(args, line, tmp_path, data_dir):
    r = run_cli([*args, "model=tiny-llama", "task.num_samples=1", f"run_dir={tmp_path}/run"], data_dir)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and line in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_datastore_is_cached_and_a_damaged_one_is_one_line(tmp_path, capsys):
    target = tiny_model()
    ds, path = datastore.load_or_build("tiny-llama", target.tokenizer, [CORPUS])
    assert path.is_file() and ds.tokens.tolist() == target.tokenizer.encode(open(CORPUS).read())
    again, _ = datastore.load_or_build("tiny-llama", target.tokenizer, [CORPUS], build_missing=False)
    assert np.array_equal(again.sa, ds.sa)
    path.write_bytes(b"garbage")
    with pytest.raises(SpecBenchError, match=r"unreadable \(ValueError\); delete it"):
        datastore.load_or_build("tiny-llama", target.tokenizer, [CORPUS])
    assert datastore_cli.main(["--model", "nope", "--corpus", CORPUS]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["specbench: error: unknown model 'nope'; allowed: hf, smollm2-135m, tiny-llama"]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"q": "a"}\n')
    assert datastore_cli.main(["--model", "tiny-llama", "--corpus", str(jsonl)]) == 2
    assert datastore_cli.main(["--model", "tiny-llama", "--corpus", f"{jsonl}:missing"]) == 2
    assert "has no field 'missing'" in capsys.readouterr().err


def test_datastore_reads_jsonl_fields_joined(tmp_path):
    target = tiny_model()
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"q": "ab", "a": "cd"}\n{"q": "e", "a": "f"}\n')
    ds, _ = datastore.load_or_build("tiny-llama", target.tokenizer, [f"{jsonl}:q,a"])
    assert ds.tokens.tolist() == target.tokenizer.encode("ab\ncd") + target.tokenizer.encode("e\nf")
    assert ds.meta["entries"] == 2


def test_a_truncated_datastore_is_one_line_naming_it():
    """issue 42: a datastore cut short (a full disk, a copy interrupted) raised zipfile.BadZipFile."""
    target = tiny_model()
    _, path = datastore.load_or_build("tiny-llama", target.tokenizer, [CORPUS])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SpecBenchError, match=rf"datastore {re.escape(str(path))} is unreadable \(BadZipFile\); delete it"):
        datastore.load_or_build("tiny-llama", target.tokenizer, [CORPUS])


@pytest.mark.parametrize("line, words", [
    ('{"q": "b"', r"c.jsonl:2 is not a JSON record \("),  # a bare JSONDecodeError before
    ('["q"]', "c.jsonl:2 is a JSON list; expected an object"),
    (b'{"q": "caf\xe9"}', r"c.jsonl:2 is not a JSON record \("),  # not UTF-8
])
def test_a_malformed_corpus_line_is_one_line_naming_file_and_line(tmp_path, line, words):
    target = tiny_model()
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_bytes(b'{"q": "a"}\n' + (line if isinstance(line, bytes) else line.encode()) + b"\n")
    with pytest.raises(SpecBenchError, match=words):
        datastore.load_or_build("tiny-llama", target.tokenizer, [f"{jsonl}:q"])
