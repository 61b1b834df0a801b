"""Draft heads over a vocabulary subset (method.draft_vocab, specbench/methods/draft_vocab.py):
the ranking is the training data's, the subset head computes the full head's logits for the
tokens it keeps, drafts only ever propose kept tokens, and greedy / sampled outputs stay AR's."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import ar_tokens, build, control, method_cfg, q4_tiny_model, run_values, tiny_model, train_settings
from test_every_method import method_config
from test_lossless import E2E_PROMPT, E2E_SAMPLING, exact_marginal_pvalue, exact_next

from specbench.core.errors import SpecBenchError
from specbench.methods import draft_vocab
from specbench.methods.draft_vocab import SubsetHead, rank_tokens, subset_ids
from specbench.kernels import ggml
from specbench.config.settings import merge

PROMPTS = [[5, 17, 99, 3, 42, 8], [40, 41, 42, 40, 41, 42, 40, 41]]
DRAFTING = ["eesd", "self_sd", "medusa"]


def ranking_file(tmp_path, ranked) -> str:
    path = tmp_path / "ranked.json"
    path.write_text(json.dumps(list(ranked)))
    return str(path)


def with_vocab(method: str, size: int, source: str):
    return merge(method_config(method), {"draft_vocab": {"size": size, "source": source}})


def test_ranking_counts_the_loss_tokens_only_ties_by_id():
    seqs = [([9, 9, 9, 1, 2, 2], 3), ([7, 2, 1], 1)]  # loss tokens: 1 2 2 | 2 1
    assert rank_tokens(seqs, 10)[:4] == [2, 1, 0, 3]  # 2 (x3), 1 (x2), then unseen by id; 9 and 7 are prompt only
    assert subset_ids([2, 1, 0, 3], 3, 10, keep=[5]).tolist() == [1, 2, 5]  # EOS kept, size exact
    assert subset_ids([2, 1, 0, 3], 2, 10, keep=[2]).tolist() == [1, 2]  # a kept id already ranked counts once


def test_distill_source_ranks_the_self_distillation_data(monkeypatch):
    """The subset is the training data's most frequent tokens (the data the trained parts saw)."""
    target = tiny_model()
    seqs = [([1, 2], 1)] + [([3, 200, 201, 200], 1)] * 3  # 200 (x6), 201 (x3), 2 (x1)
    seen = {}

    def fake_build(tgt, dcfg, data_dir, seed):
        seen.update(num_prompts=dcfg.num_prompts, seed=seed)
        return seqs

    monkeypatch.setattr(draft_vocab, "build_sequences", fake_build)
    values = run_values(train=train_settings(seed=3, data={"num_prompts": 7}))
    cfg = method_cfg("eesd", draft_vocab={"size": 4, "source": "distill"})
    ids, info = draft_vocab.vocab_subset(target, cfg, values)
    eos = sorted(target.tokenizer.eos_ids)
    assert ids.tolist() == sorted(eos + [200, 201, 2][: 4 - len(eos)])
    assert seen == {"num_prompts": 7, "seed": 3} and info["draft_vocab_source"] == "distill"


def test_the_distilled_data_a_ranking_read_joins_the_provenance(monkeypatch, tmp_path):
    """issue 42: a method's every input is in the run's identity; a draft vocabulary ranked from
    the self-distillation data names that file (or the journal of an unfinished generation)."""
    from specbench.run.provenance import artifact_provenance, file_sha256
    from specbench.models.distill import sequences_path

    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = tiny_model()
    values = run_values(train=train_settings(seed=3, data={"num_prompts": 7}))
    monkeypatch.setattr(draft_vocab, "build_sequences", lambda *a: [([3, 200, 201, 200], 1)])
    cfg = method_cfg("eesd", draft_vocab={"size": 4, "source": "distill"})
    journal = sequences_path(target, values.train.data, 3, finished=False)
    for path in (journal, sequences_path(target, values.train.data, 3)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("[]")
        _, info = draft_vocab.vocab_subset(target, cfg, values)
        assert info["draft_vocab_data"] == str(path)
        assert artifact_provenance({}, info)["draft_vocab_data"]["sha256"] == file_sha256(path)


@pytest.mark.parametrize("size, allowed", [(0, r"an integer >= 1 or null"), ("x", r"an integer >= 1 or null"),
                                           (10**6, r"an integer in \[1, 259\]")])
def test_bad_size_is_one_error_naming_the_range(size, allowed, tmp_path):
    """The settings refuse what no model allows; the method, what this model's vocabulary does not."""
    with pytest.raises(SpecBenchError, match=r"draft_vocab\.size=.* is not allowed; expected " + allowed):
        build("self_sd", tiny_model(), with_vocab("self_sd", size, ranking_file(tmp_path, [])))


@pytest.mark.parametrize("backend", ["eager", "ggml", "ggml_q8"])
def test_subset_head_returns_the_full_heads_logits_for_kept_tokens(backend):
    """Bit for bit on the block backends (same rows, same kernel); -inf for every other token."""
    if backend != "eager" and ggml.compiler() is None:
        pytest.skip("model.backend=ggml needs a C compiler")
    target = tiny_model() if backend == "eager" else q4_tiny_model(backend)
    ids = torch.tensor([0, 3, 17, 100, 258])
    sub = SubsetHead(target.lm_head, ids, backend)
    h = torch.randn(1, 3, target.hidden_size, dtype=target.dtype)
    with torch.no_grad():
        full, part = target.lm_head(h), sub(h)
    assert torch.equal(part[..., ids], full[..., ids])
    rest = torch.ones(target.vocab_size, dtype=torch.bool)
    rest[ids] = False
    assert torch.isneginf(part[..., rest]).all()


@pytest.mark.parametrize("method", DRAFTING)
def test_drafts_propose_only_kept_tokens_and_greedy_equals_ar(method, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = tiny_model()
    # a subset that holds some of the target's choices and not others: acceptance and rejection
    ar = [t for p in PROMPTS for t in ar_tokens(target, p, 24)]
    ranked = list(dict.fromkeys(ar))[::2] + list(range(target.vocab_size))
    m = build(method, target, with_vocab(method, 12, ranking_file(tmp_path, ranked)),
              ctrl=control("fixed", 4) if method != "medusa" else None)
    kept = set(subset_ids(ranked, 12, target.vocab_size, sorted(target.tokenizer.eos_ids)).tolist())
    proposed = []
    propose = m.propose

    def recording(k):
        prop = propose(k)
        proposed.extend(prop.tokens if prop.dtree is None else prop.dtree.tokens[prop.dtree.real[1:]].tolist())
        return prop

    monkeypatch.setattr(m, "propose", recording)
    for prompt in PROMPTS:
        with torch.no_grad():
            assert m.generate(prompt, 24, frozenset(), 0).tokens == ar_tokens(target, prompt, 24)
    assert proposed and set(proposed) <= kept, set(proposed) - kept
    assert m.describe()["draft_vocab"] == 12


@pytest.mark.skipif(ggml.compiler() is None, reason="model.backend=ggml needs a C compiler")
@pytest.mark.parametrize("method", DRAFTING)
def test_greedy_equals_ar_with_a_subset_on_ggml_q8(method, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = q4_tiny_model("ggml_q8")
    m = build(method, target, with_vocab(method, 40, ranking_file(tmp_path, range(100, 259))),
              ctrl=control("fixed", 4) if method != "medusa" else None)
    for prompt in PROMPTS:
        with torch.no_grad():
            assert m.generate(prompt, 24, frozenset(), 0).tokens == ar_tokens(target, prompt, 24)


def test_sampling_with_a_subset_keeps_the_target_distribution(tmp_path):
    """Self-SD drafting one token from a 6-token subset that misses some of the target's likely
    tokens: the first two sampled tokens still follow the target's exact marginals."""
    target = tiny_model(init_std=0.1, num_layers=2)
    first = exact_next(target, {(): 1.0})
    likely = [path[0] for path in sorted(first, key=first.get, reverse=True)]
    ranked = likely[1::2] + list(range(target.vocab_size))  # every other likely token is missing
    cfg = method_cfg("self_sd", skip={"source": "explicit", "attn": [1], "mlp": []},
                     draft_vocab={"size": 6, "source": ranking_file(tmp_path, ranked)})
    m = build("self_sd", target, cfg, E2E_SAMPLING, control("fixed", 1))
    outs, accepted = [], 0
    with torch.no_grad():
        for seed in range(600):
            g = m.generate(E2E_PROMPT, 3, frozenset(), seed)
            accepted += g.steps[0].accepted
            outs.append(g.tokens)
    assert 30 < accepted < 570  # both branches exercised
    for pos in (0, 1):
        assert exact_marginal_pvalue(target, outs, pos) > 1e-3, pos
