"""Nothing non-finite is trained on or cached (issue 42): a feature store holding NaN under a
valid header is computed again, not reused; the first loss or gradient that is not finite stops
the training before it changes a parameter, naming the step and the inputs; no checkpoint, resume
state or feature store holding NaN or infinity is ever written or resumed from."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specbench.models import artifacts
from specbench.core.errors import SpecBenchError
from specbench.train import features
from specbench.train import resume as resume_state
from specbench.train.eagle import train_eagle
from specbench.train.loop import train_loop
from tests.helpers import UNIT_TRAIN, tiny_model, train_settings
from tests.test_medusa import tiny_sequences, train_cfg

MCFG = {"name": "eagle", "top_k": 3, "depth": 3, "num_nodes": 8}


def poison(path, rows=slice(0, 5)):
    """NaN in some rows of a store, its header (metadata, shape, dtype) untouched."""
    with safe_open(str(path), framework="pt") as f:
        meta, feats = f.metadata(), f.get_tensor("features").clone()
    feats[rows] = float("nan")
    save_file({"features": feats}, str(path), metadata=meta)


def test_a_poisoned_feature_store_is_computed_again_not_trained_on(tmp_path, monkeypatch, capsys):
    """issue 42: a NaN-poisoned store (valid header) was reused; training logged loss=nan, exited 0
    and cached a checkpoint with NaN in 10 tensors."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    target = tiny_model()
    torch.manual_seed(0)
    train_eagle(target, train_cfg(MCFG, epochs=1), tiny_sequences())
    store = next((tmp_path / "features").glob("*.safetensors"))
    poison(store)
    capsys.readouterr()
    torch.manual_seed(0)
    res = train_eagle(target, train_cfg(MCFG, epochs=1), tiny_sequences())
    assert f"ignoring {store} (NaN or infinite values); recomputing" in capsys.readouterr().out
    state = artifacts.read_checkpoint(res["eagle"], "-")["state"]
    assert all(artifacts.all_finite(v) for v in state.values())
    assert all(math.isfinite(r["loss"]) for r in json.loads(Path(res["eagle"]).with_suffix(".log.json").read_text())["log"])
    with safe_open(str(store), framework="pt") as f:  # the store itself was replaced by a finite one
        assert artifacts.all_finite(f.get_tensor("features"))


def test_features_that_are_not_finite_as_computed_are_never_written(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(features, "prefill", lambda target, seqs, taps, batch_size=4: torch.full((sum(map(len, seqs)), 16), math.inf))
    tcfg = train_settings(max_len=32, feature_cache="float16")
    with pytest.raises(SpecBenchError, match=r"features at taps \['final'\] hold NaN or infinite values") as e:
        features.target_features(tiny_model(), tiny_sequences(3), ["final"], tcfg)
    assert "\n" not in str(e.value) and not list(tmp_path.rglob("*.safetensors"))


TCFG = train_settings(**UNIT_TRAIN | {"lr": 0.1, "max_steps": 4, "epochs": None, "batch_size": 1, "max_len": 8, "seed": 0,
                                     "checkpoint_every": 1})


def loop(tmp_path, poisoned_loss):
    """train_loop on one parameter, resume states every step; `poisoned_loss(p, step)`."""
    p = torch.nn.Parameter(torch.full((3,), 2.0))
    step = []

    def loss_fn(ids, labels):
        step.append(1)
        return poisoned_loss(p, len(step)), (1, 1)

    resume = resume_state.Resume(tmp_path / "part.x.resume.safetensors", {"k": 1})
    seqs = [([1, 2, 3, 4], 1)] * 4
    with pytest.raises(SpecBenchError) as e:
        train_loop("part", [p], loss_fn, seqs, TCFG, 0, "cpu", resume=resume,
                   inputs={"the target's features": "/cache/features/x.safetensors"})
    return str(e.value), p, resume


@pytest.mark.parametrize("what,poisoned", [
    ("the loss is nan", lambda p, s: (p * p).sum() * (math.nan if s == 3 else 1.0)),
    # a finite loss (0) whose gradient is infinite (d/dx x^0.5 at 0)
    ("the gradient norm is inf", lambda p, s: (p - p.detach()).pow(0.5).sum() if s == 3 else (p * p).sum()),
])
def test_the_first_non_finite_step_stops_the_training_before_it_changes_anything(tmp_path, what, poisoned):
    msg, p, resume = loop(tmp_path, poisoned)
    assert msg.startswith(f"training part stopped at step 3 of 4: {what}, not finite")
    assert "the target's features /cache/features/x.safetensors" in msg and "4 training sequences" in msg
    assert "\n" not in msg and "train.lr (now 0.1)" in msg
    assert artifacts.all_finite(p.detach())  # the parameters as step 2 left them
    meta, tensors = resume_state._read(resume.path)
    assert meta["step"] == 2 and all(artifacts.all_finite(t) for t in tensors.values())


def test_a_resume_state_holding_nan_is_not_resumed_from(tmp_path, capsys):
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p])
    resume = resume_state.Resume(tmp_path / "part.x.resume.safetensors", {"k": 1})
    with torch.no_grad():
        p[1] = math.nan
    resume_state.save(resume, "key", opt, [], {"step": 1, "labelled": 1, "log": []})
    assert resume_state.load(resume, "key", opt, []) is None
    assert "holds NaN or infinite values; starting from step 0" in capsys.readouterr().out


def test_no_checkpoint_holding_nan_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    state = {"a": torch.ones(2), "b": torch.tensor([1.0, math.nan]), "c": torch.tensor([math.inf])}
    with pytest.raises(SpecBenchError, match=r"NaN or infinite values in 2 tensors \('b' first\); no checkpoint written"):
        artifacts.save_checkpoint("eagle", "m", {"x": 1}, state, {"steps": 3, "train_sequences": 4})
    assert not list(tmp_path.rglob("*.safetensors"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_all_finite_sees_one_bad_value_anywhere(dtype):
    t = torch.randn(1000, 7).to(dtype)
    assert artifacts.all_finite(t) and artifacts.all_finite(torch.ones(0)) and artifacts.all_finite(torch.tensor([1, 2]))
    for value in (math.nan, math.inf, -math.inf):
        for at in ((0, 0), (999, 6), (500, 3)):
            bad = t.clone()
            bad[at] = value
            assert not artifacts.all_finite(bad) and not artifacts.all_finite(bad[at])
