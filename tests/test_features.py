"""The target-feature cache (specbench/train/features.py): one prefill, reused; float16 on disk
keeps every trainer's loss within tolerance of the live computation; rows it does not hold are
computed live; a changed tap set or dtype is another file."""

import pytest
import torch

from specbench.methods.eagle3_head import Eagle3Head
from specbench.methods.eagle_head import EagleHead
from specbench.methods.hydra_heads import HydraHeads
from specbench.methods.medusa import MedusaHeads
from specbench.train import features
from specbench.train.eagle import eagle_loss
from specbench.train.eagle3 import eagle3_loss, feature_taps
from specbench.train.hydra import hydra_loss
from specbench.config.settings import merge
from specbench.train.loop import pad_batch
from specbench.train.medusa import medusa_loss
from tests.helpers import tiny_model, train_settings
from tests.test_medusa import tiny_sequences

TCFG = train_settings(max_len=32, feature_cache="float16")


def batch(seqs):
    return pad_batch(seqs, 32, 0, "cpu")


def parts(target):
    torch.manual_seed(0)
    e3 = Eagle3Head(target, [0, 1, 1], torch.arange(48))
    e3.init_from_target()
    return {
        "eagle3": (lambda s, ids, lab: eagle3_loss(target, e3, ids, lab, 3, 0.8, 0, store=s), feature_taps(e3)),
        "eagle": (lambda s, ids, lab: eagle_loss(target, EagleHead(target, True), ids, lab, store=s), ["final"]),
        "hydra": (lambda s, ids, lab: hydra_loss(target, HydraHeads(target, "hydra_pp", 2, 1, 0.0), ids, lab, True, s), ["final"]),
        "medusa": (lambda s, ids, lab: medusa_loss(target, MedusaHeads(target, 2, False), ids, lab, 0.8, s), ["final"]),
    }


@pytest.mark.parametrize("kind,tol", [("float16", 1e-3), ("float32", 1e-6)])
@pytest.mark.parametrize("which", ["eagle3", "eagle", "hydra", "medusa"])
def test_cached_loss_equals_the_live_loss(which, kind, tol):
    """The loss on cached features (float16: within 1e-3 relative) equals the live computation;
    sequences longer than max_len are cut as the training batches are."""
    target = tiny_model()
    seqs = tiny_sequences(6, length=40)  # 41 tokens > max_len 32
    loss_fn, taps = parts(target)[which]
    store = features.target_features(target, seqs, taps, merge(TCFG, {"feature_cache": kind}))
    ids, lab = batch(seqs[:4])
    assert store.batch(ids, lab) is not None
    torch.manual_seed(1)
    live = loss_fn(None, ids, lab)[0]
    torch.manual_seed(1)
    cached = loss_fn(store, ids, lab)[0]
    assert float(live) > 0 and abs(float(cached) - float(live)) <= tol * abs(float(live))


def test_computed_once_and_reused(monkeypatch, capsys):
    target = tiny_model()
    seqs = tiny_sequences(5)
    calls = []
    real = features.prefill
    monkeypatch.setattr(features, "prefill", lambda *a, **k: calls.append(1) or real(*a, **k))
    a = features.target_features(target, seqs, ["final"], TCFG)
    b = features.target_features(target, seqs, ["final"], TCFG)
    assert len(calls) == 1 and "reusing" in capsys.readouterr().out
    assert torch.equal(a.feats, b.feats)
    features.target_features(target, seqs, [0, "final"], TCFG)  # another tap set: another file
    features.target_features(target, seqs, ["final"], merge(TCFG, {"feature_cache": "float32"}))
    features.target_features(target, seqs[:4], ["final"], TCFG)  # other sequences
    assert len(calls) == 4
    assert features.target_features(target, seqs, ["final"], merge(TCFG, {"feature_cache": None})) is None


def test_a_row_not_stored_is_none_and_unlabelled_rows_are_zero():
    target = tiny_model()
    seqs = tiny_sequences(3)
    store = features.target_features(target, seqs, ["final"], TCFG)
    ids, lab = batch([seqs[0], ([1, 2, 3, 4, 5, 6], 2)])
    assert store.batch(ids, lab) is None
    ids, lab = batch([seqs[0], ([1, 2], 5)])  # no label: nothing read there
    out = store.batch(ids, lab)
    assert out is not None and not out[1].any() and out[0, :10].abs().sum() > 0


def test_a_damaged_cache_file_is_recomputed(capsys):
    target = tiny_model()
    seqs = tiny_sequences(3)
    a = features.target_features(target, seqs, ["final"], TCFG)
    path = next((features.cache_dir() / "features").glob("*.safetensors"))
    path.write_bytes(b"garbage")
    b = features.target_features(target, seqs, ["final"], TCFG)
    assert "ignoring" in capsys.readouterr().out and torch.equal(a.feats, b.feats)


def test_a_store_with_more_taps_serves_a_subset_without_a_prefill(monkeypatch, capsys):
    """EAGLE-3's store (layers + final) serves EAGLE-2/Hydra/Medusa's "final" and any one layer:
    the right columns, bit for bit what their own prefill stores; another dtype or other
    sequences do not qualify."""
    target = tiny_model()
    seqs = tiny_sequences(4)
    keys = [list(s[0][:32]) for s in seqs]
    features.target_features(target, seqs, [0, 1, "final"], TCFG)
    real = features.prefill
    calls = []
    monkeypatch.setattr(features, "prefill", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    for taps in (["final"], [1], ["final", 0]):
        got = features.target_features(target, seqs, taps, TCFG).feats
        assert torch.equal(got, real(target, keys, taps).to(torch.float16)), taps
    assert calls == []  # the references above call the real prefill directly; the store made none
    assert "columns of" in capsys.readouterr().out
    features.target_features(target, seqs, ["final"], merge(TCFG, {"feature_cache": "float32"}))
    features.target_features(target, seqs[:3], ["final"], TCFG)
    assert len(calls) == 2
