"""EESD's trainer on the target-feature cache (specbench/train/features.py): the exit layer's loss
and the Cali-TS examples read the target's layer-n input and final-norm state from the store and
equal the live computation; an off-by-one tap or an un-normalised final state breaks them; the
trainer gives the same held-out loss with the cache on and off."""

import copy

import pytest
import torch

from specbench.methods.eesd import EarlyExit
from specbench.train import features
from specbench.train.loop import pad_batch
from specbench.train.trainers import cali_features, eesd_loss, eesd_taps
from tests.helpers import tiny_model, train_settings
from tests.test_eesd import _cfg
from tests.test_medusa import tiny_sequences

N = 2  # the exit after layer 2 of the tiny model's 4: taps 1 and 3 are both real layers


def target_and_exit():
    """A private tiny model whose final norm is not the identity (so a missing or doubled norm
    shows) and an exit layer on its first N layers."""
    target = copy.deepcopy(tiny_model())
    with torch.no_grad():
        target.norm.weight.copy_(torch.linspace(0.5, 1.5, target.hidden_size, dtype=target.dtype))
    torch.manual_seed(0)
    return target, EarlyExit(target, N)


def store_for(target, seqs, cali: bool, kind: str):
    tcfg = train_settings(max_len=32, feature_cache=kind)
    return features.target_features(target, seqs, eesd_taps(N, cali), tcfg)


@pytest.mark.parametrize("cali", [False, True])
@pytest.mark.parametrize("kind,tol", [("float16", 1e-3), ("float32", 1e-6)])
def test_cached_eesd_loss_equals_the_live_loss(cali, kind, tol):
    target, exit_ = target_and_exit()
    seqs = tiny_sequences(6, length=40)  # 41 tokens > max_len 32: stored cut, as batches are
    store = store_for(target, seqs, cali, kind)
    ids, lab = pad_batch(seqs[:4], 32, 0, "cpu")
    assert store.batch(ids, lab) is not None
    with torch.no_grad():
        live, live_agree = eesd_loss(target, exit_, ids, lab)
        cached, cached_agree = eesd_loss(target, exit_, ids, lab, store)
    assert float(live) > 0 and abs(float(cached) - float(live)) <= tol * abs(float(live))
    assert cached_agree[1] == live_agree[1] > 0
    # a batch whose rows are not stored is computed live, exactly
    other = tiny_sequences(2, seed=7, length=20)
    ids, lab = pad_batch([(s + [5], st) for s, st in other], 32, 0, "cpu")
    assert torch.equal(eesd_loss(target, exit_, ids, lab, store)[0], eesd_loss(target, exit_, ids, lab)[0])


@pytest.mark.parametrize("kind,tol", [("float16", 1e-2), ("float32", 1e-6)])
def test_cali_features_from_the_store_equal_the_live_ones(kind, tol):
    target, exit_ = target_and_exit()
    seqs = tiny_sequences(4, length=24)  # 25 tokens: stored whole
    store = store_for(target, seqs, True, kind)
    for seq, _ in seqs:
        live, cached = cali_features(target, exit_, seq), cali_features(target, exit_, seq, store)
        for a, b in zip(live[:2], cached[:2]):  # the target's and the draft's normed states
            assert a.shape == b.shape and float((a - b).abs().max()) <= tol * float(a.abs().max())
        if kind == "float32":  # greedy tokens: equal (float16 rounding may flip a near tie)
            assert torch.equal(live[2], cached[2]) and torch.equal(live[3], cached[3])


def test_cali_features_of_a_sequence_longer_than_the_store_are_live():
    target, exit_ = target_and_exit()
    seqs = tiny_sequences(3, length=40)  # cut at 32 in the store
    store = store_for(target, seqs, True, "float32")
    seq = seqs[0][0]
    assert store.sequence(seq) is None and store.sequence(seq[:32]) is not None
    for a, b in zip(cali_features(target, exit_, seq), cali_features(target, exit_, seq, store)):
        assert torch.equal(a, b)


def test_the_trainer_with_and_without_the_cache_agrees(tmp_path, monkeypatch, data_dir):
    from specbench.train.__main__ import train

    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(data_dir))
    out = {}
    for kind in ("null", "float32", "float16"):
        monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / kind))
        out[kind] = train(_cfg("eesd", [f"method.n_layers={N}", "train.lr=3e-3", f"train.feature_cache={kind}"]))
    assert not (tmp_path / "null" / "features").exists()
    assert len(list((tmp_path / "float16" / "features").glob("*.safetensors"))) == 1
    live = out["null"]
    assert live["held_out_loss"][1] < live["held_out_loss"][0]
    for kind, tol in (("float32", 1e-6), ("float16", 1e-3)):  # before and after training
        for a, b in zip(out[kind]["held_out_loss"], live["held_out_loss"]):
            assert abs(a - b) <= tol * abs(b), (kind, out[kind]["held_out_loss"], live["held_out_loss"])
        assert out[kind]["held_out_agreement"] == live["held_out_agreement"]
    assert out["float32"]["cali_held_out_accuracy"] == live["cali_held_out_accuracy"]


@pytest.mark.parametrize("cali", [False, True])
def test_the_prefill_runs_past_layer_n_only_when_the_final_state_is_read(cali):
    target, _ = target_and_exit()
    ends = []
    real = target.run_layers
    target.run_layers = lambda h, cache, start=0, end=None, **kw: ends.append(end) or real(h, cache, start, end, **kw)
    store_for(target, tiny_sequences(2, length=10), cali, "float32")
    assert ends and (None in ends) == cali and all(e is None or e <= N for e in ends)


def test_eesd_loss_on_labelled_rows_equals_the_loss_over_every_row():
    """The trainer runs the head only where a label is (the answer): the same loss and agreement as
    the whole batch's logits, padding and prompt rows included, gave; a row picked out of place shows."""
    from specbench.train.loop import ce_loss

    target, exit_ = target_and_exit()
    seqs = tiny_sequences(5, length=30)
    ids, lab = pad_batch(seqs[:4] + [(seqs[4][0][:18], seqs[4][1])], 32, 0, "cpu")
    with torch.no_grad():
        h_n = target.run_layers(target.embed(ids), None, 0, N)
        full, full_agree = ce_loss(exit_(target, h_n, None)[0], lab)
        got, agree = eesd_loss(target, exit_, ids, lab)
    assert (lab == -100).any() and float(full) > 0
    torch.testing.assert_close(got, full, rtol=1e-9, atol=1e-12)
    assert agree == full_agree and agree[1] == int((lab != -100).sum())


@pytest.mark.parametrize("kind", [None, "float32"])
def test_the_soft_loss_is_the_cross_entropy_to_the_targets_whole_distribution(kind):
    """train.distill=soft: at each labelled position, -sum_v p_target(v) log p_exit(v), with p_target
    the target's own next-token distribution there (the full model, live or from the store's final
    state); the agreement still counts the labels."""
    target, exit_ = target_and_exit()
    seqs = tiny_sequences(4, length=24)
    ids, lab = pad_batch(seqs, 32, 0, "cpu")
    store = store_for(target, seqs, True, kind) if kind else None
    with torch.no_grad():
        got, agree = eesd_loss(target, exit_, ids, lab, store, soft=True)
        hard, hard_agree = eesd_loss(target, exit_, ids, lab, store)
        terms = []
        for b in range(ids.shape[0]):
            keep = lab[b] != -100
            t_logits, _ = target.forward(ids[b].tolist(), target.new_cache())
            h_n = target.run_layers(target.embed(ids[b : b + 1]), None, 0, N)
            d_logits, _ = exit_(target, h_n, None)
            p = torch.softmax(t_logits[keep], -1)
            terms.append(-(p * torch.log_softmax(d_logits[0][keep], -1)).sum(-1))
        want = torch.cat(terms).mean()
    assert abs(float(got) - float(want)) <= 1e-6 * float(want) and agree == hard_agree
    assert abs(float(got) - float(hard)) > 1e-3  # not the hard loss


def test_train_distill_soft_is_refused_by_the_trainers_that_do_not_read_it():
    from specbench.core.errors import SpecBenchError
    from specbench.train.session import train_model

    cfg = _cfg("medusa", ["train.distill=soft"])
    with pytest.raises(SpecBenchError, match="train.distill=.soft. is supported by eesd, space only, not medusa"):
        train_model(cfg, tiny_model())


def test_an_interrupted_cali_stage_resumes_the_finished_exit_layer(tmp_path, monkeypatch, data_dir):
    """Ctrl-C while the Cali-TS predictor was being trained, then 'run the same command to resume':
    the exit layer, finished and saved, was trained again from step 0 (its resume state had been
    dropped when it was saved). It is kept until the predictor is saved, and the rerun continues."""
    from specbench.train import loop, trainers
    from specbench.train.__main__ import train

    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(data_dir))
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    cfg = _cfg("eesd", [f"method.n_layers={N}", "train.checkpoint_every=1"])
    real_cali = trainers.train_cali

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainers, "train_cali", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    (exit_layer,) = [p for p in (tmp_path / "eesd").glob("*.safetensors") if ".resume." not in p.name]
    first = exit_layer.read_bytes()
    assert list((tmp_path / "eesd").glob("*.resume.safetensors"))  # kept: the command is not finished

    steps = []
    real_loop = loop._train_loop
    monkeypatch.setattr(loop, "_train_loop", lambda *a, **k: real_loop(*a, **k, on_resume=steps.append) if "on_resume" not in k
                        else real_loop(*a, **k))
    monkeypatch.setattr(trainers, "train_cali", real_cali)
    out = train(cfg)
    assert steps and steps[0] > 0, steps  # continued from its last state, not from step 0
    assert exit_layer.read_bytes() == first and "cali" in out
    assert not list((tmp_path / "eesd").glob("*.resume.safetensors"))  # done: dropped
