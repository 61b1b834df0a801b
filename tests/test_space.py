"""SPACE: greedy output equals AR on the same (fine-tuned) weights, SAR-SFT lowers the loss,
a checkpoint reloads to identical outputs, the runner's baseline contract."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import specbench.train.space  # noqa: F401 - registers the trainer
from specbench.engine.sampling import SamplingConfig
from specbench.core.errors import SpecBenchError
from specbench.methods.space import MASK, finetuned_copy
from specbench.models.artifacts import read_checkpoint
from specbench.train.space import mask_top1, sar_batch, sar_example, space_logits
from specbench.train.loop import apply_lora, pad_batch, pad_id
from specbench.train.trainers import TRAINERS
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
    ids, labels = pad_batch([(seq, 5)], 64, 2, "cpu")
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
    a = build("space", target, method_cfg(**mcfg))
    b = build("space", target, method_cfg(**mcfg))
    assert a.info["space_trained"]
    assert not torch.equal(a.finetuned_adapter.lm_head.weight, target.lm_head.weight)
    prompt = tiny_sequences(1, seed=5)[0][0][:10]
    ga = a.generate(prompt, 24, frozenset(), 0)
    assert ga.tokens == b.generate(prompt, 24, frozenset(), 0).tokens
    assert ga.tokens == ar_tokens(a.finetuned_adapter, prompt, 24)
    assert sum(st.accepted for st in ga.steps) > 0  # the masks learned to guess: candidates get accepted
    # the held-out scorer (bench/heldout_domains.py) sees it too: mask 1's top-1 rises over the untrained [M]
    seqs, tcfg = tiny_sequences(), SimpleNamespace(max_len=64)
    u = build("space", target, method_cfg("space", allow_untrained=True, k=3))
    trained = mask_top1(a.finetuned_adapter, a.mask_embed, seqs, tcfg, 3, pad_id(target))
    assert len(trained) == 3 and trained[0] > mask_top1(u.finetuned_adapter, u.mask_embed, seqs, tcfg, 3, pad_id(target))[0]


def test_lora_option_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = tiny_model()
    mcfg = {"name": "space", "k": 2, "p_ar": 0.5, "lora": True, "lora_r": 4, "lora_alpha": 8, "lr": 1e-2}
    res = TRAINERS["space"](target, train_cfg(mcfg, epochs=2), tiny_sequences(8))
    assert res["held_out_loss_after"] < res["held_out_loss_before"]
    m = build("space", target, method_cfg(**mcfg))
    prompt = [0, 5, 6, 7]
    assert m.generate(prompt, 12, frozenset(), 0).tokens == ar_tokens(m.finetuned_adapter, prompt, 12)

    # the checkpoint is the delta (LoRA factors + [M]), not the model, and loading it is peft's model
    state = read_checkpoint(Path(res["space"]), "")["state"]
    assert set(state) == {"lora", "mask_embedding"}
    assert all(k.endswith((".A", ".B")) and ".layers." in k for k in state["lora"])
    structure = {"k": 2, "lora": True, "lora_r": 4, "lora_alpha": 8}
    ref = finetuned_copy(target, "ref", structure)
    peft_model = apply_lora(ref, structure)
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            base = name.removeprefix("base_model.model.")
            module.lora_A["default"].weight.data.copy_(state["lora"][f"{base}.A"])
            module.lora_B["default"].weight.data.copy_(state["lora"][f"{base}.B"])
    ids = torch.tensor([[0, 5, 6, 7, MASK, MASK]])
    with torch.no_grad():
        want, got = space_logits(ref, m.mask_embed, ids), space_logits(m.finetuned_adapter, m.mask_embed, ids)
    assert not torch.allclose(got, space_logits(target, m.mask_embed, ids))  # the delta is applied
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


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


@pytest.mark.parametrize("k", [2, 3, 5])
def test_decode_layout_shows_the_model_its_training_layout(k):
    """Train and decode must show the model the same thing: in one decoding forward over
    [x, M*k, c1, M*k, ..., ck, M*k], the logits at c_g and at group g's masks equal those of the
    SAR-SFT training input [prompt, x, c1..cg, M*k] (causal, plain positions), for every g."""
    target = tiny_model()
    m = build("space", target, method_cfg("space", allow_untrained=True, k=k))
    ft = m.finetuned_adapter
    g = torch.Generator().manual_seed(k)
    prompt = torch.randint(3, 259, (6,), generator=g).tolist()
    x, *cands = torch.randint(3, 259, (k + 1,), generator=g).tolist()
    m.cache = ft.new_cache()
    m._forward(prompt)
    L = m.cache.length()
    ids = [x if kind == "x" else (cands[i - 1] if kind == "c" else MASK) for kind, i in m.layout]
    decode, _ = m._forward(ids, positions=L + m.pos, tree_mask=m.mask)
    seq = prompt + [x] + cands
    for grp in range(k + 1):
        cut = len(prompt) + 1 + grp
        row, _ = sar_example(seq + [0] * k, [0] * (len(seq) + k), cut, k)
        train = space_logits(ft, m.mask_embed, row)[0]
        torch.testing.assert_close(decode[m.real_idx[grp]], train[cut - 1], rtol=0, atol=1e-9)
        torch.testing.assert_close(decode[m.groups[grp]], train[cut:], rtol=0, atol=1e-9,
                                   msg=lambda s, grp=grp: f"k={k}, mask group {grp}: {s}")


def test_mask_rule_eq6_literal_selectable_and_lossless():
    from specbench.engine.tree import space_layout

    assert torch.equal(space_layout(2, rule="eq6")[1], space_layout(2)[1])  # the readings agree at k=2
    assert not torch.equal(space_layout(3, rule="eq6")[1], space_layout(3)[1])
    target = tiny_model()
    m = build("space", target, method_cfg("space", allow_untrained=True, k=5, mask_rule="eq6"))
    assert m.describe()["mask_rule"] == "eq6"
    assert m.generate([5, 6, 7], 16, frozenset(), 0).tokens == ar_tokens(target, [5, 6, 7], 16)
    with pytest.raises(SpecBenchError, match="method.mask_rule 'x'; allowed: eq6, group"):
        build("space", target, method_cfg("space", allow_untrained=True, k=2, mask_rule="x"))


def test_the_drift_scorer_counts_each_position_once_by_kind_and_sees_a_moved_model():
    """bench/finetune_drift.py: an unmoved copy agrees everywhere; a copy whose last layer moved does
    not; positions before start-1 are the prompt, the rest the answer, each counted once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("finetune_drift", Path(__file__).parents[1] / "bench/finetune_drift.py")
    fd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fd)
    assert [fd.bucket(x) for x in (0.0, 0.049, 0.05, 0.39, 0.4, 1.0)] == [0, 0, 1, 3, 4, 4]
    target = tiny_model()
    seqs = [(s, start, None) for s, start in tiny_sequences(4)]
    same = fd.drift(target, finetuned_copy(target, "same", {}), seqs, 64)
    n_prompt = sum(min(start - 1, len(s[:64]) - 1) for s, start, _ in seqs)
    n_all = sum(len(s[:64]) - 1 for s, _, _ in seqs)
    assert sum(c[1] for c in same["prompt"]) == n_prompt and sum(c[1] for c in same["answer"]) == n_all - n_prompt
    assert all(c[0] == c[1] for cells in same.values() for c in cells)
    moved = finetuned_copy(target, "moved", {})
    torch.manual_seed(1)
    with torch.no_grad():
        for p in moved.layers[-1].parameters():
            p.add_(torch.randn_like(p) * p.std())
    got = fd.drift(target, moved, seqs, 64)
    assert sum(c[0] for cells in got.values() for c in cells) < n_all


def test_soft_targets_align_with_every_sar_row_and_do_not_pull_an_unmoved_copy():
    """train.distill=soft: at each labelled index of a SAR row (plain positions and masks alike) the
    target's distribution is the one its label was the argmax of; and on plain rows the soft loss of a
    copy equal to the target has zero gradient (CE to one's own distribution is minimal), so that term
    anchors the model instead of sharpening it towards the argmax, which moved the model (docs/training.md)."""
    import random

    from specbench.methods.space import MaskedEmbed
    from specbench.train.space import space_loss, target_distribution

    target = tiny_model()
    seqs = tiny_sequences(4)
    with torch.no_grad():
        teacher = [target_distribution(target, torch.tensor([s]))[0].argmax(-1).tolist() for s, _ in seqs]
    ids, labels = pad_batch([(s, st, t) for (s, st), t in zip(seqs, teacher)], 64, 2, "cpu")
    probs = target_distribution(target, ids)
    x, y = sar_batch(ids, labels, 3, 0.0, random.Random(0), 2)
    assert (x == MASK).any()
    keep = y != -100
    assert torch.equal(probs[:, : x.shape[1]][keep].argmax(-1), y[keep])

    ft = finetuned_copy(target, "soft", {})
    for p in ft.model.parameters():
        p.requires_grad_(True)
    with torch.enable_grad():  # an earlier test in the process may have turned it off
        loss, _ = space_loss(ft, MaskedEmbed(target, 0), ids, labels, probs)
        loss.backward()
    assert max(float(p.grad.abs().max()) for p in ft.model.parameters() if p.grad is not None) < 1e-6  # float32 rounding
    ft.model.zero_grad()
    with torch.enable_grad():
        hard, _ = space_loss(ft, MaskedEmbed(target, 0), ids, labels)
        hard.backward()  # the hard labels do pull it (towards a sharper argmax)
    assert max(float(p.grad.abs().max()) for p in ft.model.parameters() if p.grad is not None) > 1e-4
