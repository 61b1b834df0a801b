"""SPACE: greedy output equals AR on the same (fine-tuned) weights, SAR-SFT lowers the loss,
a checkpoint reloads to identical outputs, the runner's baseline contract."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from omegaconf import OmegaConf

import specbench.train.medusa_space  # noqa: F401 - registers the trainers
from specbench.engine.sampling import SamplingConfig
from specbench.errors import SpecBenchError
from specbench.methods.space import MASK
from specbench.train.medusa_space import sar_batch
from specbench.train.trainers import TRAINERS, _pad
from tests.helpers import ar_tokens, build, method_cfg, tiny_model
from tests.test_medusa import tiny_sequences, train_cfg

prompts = st.lists(st.integers(3, 258), min_size=1, max_size=12)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(prompt=prompts, k=st.sampled_from([1, 2, 3, 5]))
def test_greedy_equals_ar_untrained(prompt, k):
    target = tiny_model()
    m = build("space", target, method_cfg("space", allow_untrained=True, k=k))
    assert m.lossless and m.baseline_weights == "fine-tuned"
    out = m.generate(prompt, 16, frozenset(), 0).tokens
    # untrained: the copy has the target's weights, so AR on either agrees
    assert out == ar_tokens(m.finetuned_adapter, prompt, 16) == ar_tokens(target, prompt, 16)


def test_missing_checkpoint_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(SpecBenchError, match="python -m specbench.train method=space"):
        build("space", tiny_model(), method_cfg("space"))


def test_sar_batch_layout():
    import random

    seq = list(range(3, 23))
    ids, labels = _pad([(seq, 5)], 64, 2, "cpu")
    out_ids, out_lab = sar_batch(ids, labels, 3, 0.0, random.Random(0), 2)
    row, lab = out_ids[0].tolist(), out_lab[0].tolist()
    m = row.index(MASK)
    assert row[:m] == seq[:m] and row[m:] == [MASK] * 3
    assert lab[m - 1] == seq[m] and lab[m:] == seq[m + 1 : m + 4]  # masks predict y_(m+1)..y_(m+k)


def test_train_lowers_loss_reload_identical_greedy_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    target = tiny_model()
    before_w = target.lm_head.weight.clone()
    mcfg = {"name": "space", "k": 3, "p_ar": 0.5, "lora": False, "lr": 3e-3}
    res = TRAINERS["space"](target, train_cfg(mcfg, epochs=8), tiny_sequences())
    assert res["held_out_loss_after"] < res["held_out_loss_before"]
    assert torch.equal(target.lm_head.weight, before_w)  # the shared target is untouched
    a = build("space", target, OmegaConf.create(mcfg))
    b = build("space", target, OmegaConf.create(mcfg))
    assert a.info["space_trained"]
    assert not torch.equal(a.finetuned_adapter.lm_head.weight, target.lm_head.weight)
    prompt = tiny_sequences(1, seed=5)[0][0][:10]
    ga = a.generate(prompt, 24, frozenset(), 0)
    assert ga.tokens == b.generate(prompt, 24, frozenset(), 0).tokens
    assert ga.tokens == ar_tokens(a.finetuned_adapter, prompt, 24)
    assert sum(st[1] for st in ga.steps) > 0  # the masks learned to guess: candidates get accepted


def test_lora_option_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = tiny_model()
    mcfg = {"name": "space", "k": 2, "p_ar": 0.5, "lora": True, "lora_r": 4, "lora_alpha": 8, "lr": 1e-2}
    res = TRAINERS["space"](target, train_cfg(mcfg, epochs=2), tiny_sequences(8))
    assert res["held_out_loss_after"] < res["held_out_loss_before"]
    m = build("space", target, OmegaConf.create(mcfg))
    prompt = [0, 5, 6, 7]
    assert m.generate(prompt, 12, frozenset(), 0).tokens == ar_tokens(m.finetuned_adapter, prompt, 12)


def test_sampling_runs_and_is_seeded():
    m = build("space", tiny_model(), method_cfg("space", allow_untrained=True, k=2), sampling=SamplingConfig(temperature=0.8))
    a = m.generate([5, 6], 10, frozenset(), 3).tokens
    assert a == m.generate([5, 6], 10, frozenset(), 3).tokens and len(a) == 10


def test_space_rejection_sampling_is_lossless_end_to_end():
    from tests.test_medusa import E2E_SAMPLING, check_sampling_matches_target

    target = tiny_model(init_std=0.1, num_layers=2)
    m = build("space", target, method_cfg("space", allow_untrained=True, k=2), sampling=E2E_SAMPLING)
    acc = check_sampling_matches_target(m, m.finetuned_adapter)
    assert acc > 20
