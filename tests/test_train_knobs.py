"""The two speed settings of training (session 54): `train.prefill_batch_size` (how many sequences
one forward of the teacher labels and of the feature prefill takes) and `train.matmul` (TF32 for
CUDA's float32 matmuls, in the optimisation only). Neither may change what the float64 tiny model
computes, and TF32 must not leak outside the optimisation loop (labels, features, decoding)."""

from __future__ import annotations

import pytest
import torch
from helpers import UNIT_TRAIN, run_settings, tiny_model, train_settings


from specbench.models.distill import teacher_labels
from specbench.train import features
from specbench.train.loop import cuda_matmul, train_loop

SEQS = [[1, 5, 9, 3, 7, 2], [4, 4, 8], [6, 2, 9, 9, 1, 3, 5, 7, 2], [3, 1]]


def test_labels_and_features_do_not_depend_on_the_prefill_batch(tmp_path, monkeypatch):
    """Right padding: a sequence's rows are the same whatever else shares its forward."""
    target = tiny_model()
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "a"))
    one = teacher_labels(target, [(s, 1) for s in SEQS], batch_size=1)
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "b"))
    four = teacher_labels(target, [(s, 1) for s in SEQS], batch_size=4)
    assert one == four and [len(x) for x in one] == [len(s) for s in SEQS]
    a = features.prefill(target, SEQS, [1, "final"], batch_size=1)
    b = features.prefill(target, SEQS, [1, "final"], batch_size=3)
    assert a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-12)


def test_tf32_holds_inside_the_optimisation_only():
    before = torch.backends.cuda.matmul.allow_tf32
    with pytest.raises(RuntimeError):
        with cuda_matmul("tf32"):
            assert torch.backends.cuda.matmul.allow_tf32
            raise RuntimeError("a failing step")
    assert torch.backends.cuda.matmul.allow_tf32 == before
    with cuda_matmul("float32"):
        assert not torch.backends.cuda.matmul.allow_tf32


@pytest.mark.parametrize("kind, on", [("tf32", True), ("float32", False)])
def test_train_loop_runs_its_steps_under_train_matmul(kind, on):
    seen = []
    p = torch.nn.Parameter(torch.ones(3))

    def loss_fn(ids, labels):
        seen.append(torch.backends.cuda.matmul.allow_tf32)
        return (p * p).sum(), (1, 1)

    tcfg = train_settings(**UNIT_TRAIN | {"lr": 0.1, "max_steps": 2, "epochs": None, "batch_size": 1, "max_len": 8,
                                          "seed": 0, "checkpoint_every": None, "eval_every": None, "matmul": kind})
    train_loop("part", [p], loss_fn, [([1, 2, 3, 4], 1)] * 2, tcfg, 0, "cpu")
    assert seen == [on, on] and not torch.backends.cuda.matmul.allow_tf32


@pytest.mark.parametrize("how", ["first", "spread"])
def test_train_cap_decides_which_sequences_the_trainer_gets(how, monkeypatch):
    """`train.cap` (session 58): the data lists its sources in blocks (generated GSM8K answers, general-domain
    ones, original answers); `first` keeps the head of that list, `spread` keeps every source's share, and the
    trainer gets what the setting says (a cap that ignored the setting would train a mix on GSM8K alone)."""
    from specbench.train import session
    data = [([i, i + 1], 1) for i in range(60)] + [([100 + i, 1], 1) for i in range(30)] + [([200 + i, 1], 1)
                                                                                        for i in range(10)]
    got = []
    monkeypatch.setattr(session, "load_sequences", lambda *a: (data, None))
    monkeypatch.setitem(session.TRAINERS, "probe", lambda target, cfg, seqs: got.append(seqs) or {})
    cfg = run_settings("method=eesd", "train.max_sequences=20", f"train.cap={how}")
    session.train_model(cfg, tiny_model(), trainer="probe")
    source = [0 if s[0] < 100 else 1 if s[0] < 200 else 2 for s, _ in got[0]]
    assert len(source) == 20
    counts = (source.count(0), source.count(1), source.count(2))
    assert counts == ((20, 0, 0) if how == "first" else (12, 6, 2))


def test_held_out_loss_counts_only_sequences_with_labels():
    """A held-out sequence whose answer lay past train.max_len added a loss of 0 to the mean, and a
    held-out set with no labelled token at all reported 'loss 0.000, agreement 0.000'."""
    import math
    from types import SimpleNamespace

    import torch

    from specbench.train.loop import eval_loss

    def loss_fn(ids, labels):  # a loss of 2 and one right of one counted where there is a label
        n = int((labels != -100).sum())
        return (torch.tensor(2.0), (n, n)) if n else (torch.tensor(0.0), (0, 0))

    tcfg = SimpleNamespace(max_len=8)
    labelled, unlabelled = ([1, 2, 3, 4], 2), ([1, 2, 3, 4], 4)  # (tokens, answer start): the second has no answer
    assert eval_loss(loss_fn, [labelled, unlabelled], tcfg, 0, "cpu") == (2.0, 1.0)
    assert all(math.isnan(x) for x in eval_loss(loss_fn, [unlabelled], tcfg, 0, "cpu"))


def test_resume_states_of_two_settings_are_two_files(tmp_path, monkeypatch):
    """One resume file an artifact: a run of another setting (a first-use training of the same part,
    a short trial) replaced an interrupted run's state, which then restarted from step 0."""
    from specbench.config.compose import compose
    from specbench.config.settings import of
    from specbench.train.resume import resume_for

    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))

    def path(*over):
        run = of(compose(["method=vanilla_sd", "model=tiny-llama", "train.checkpoint_every=7", *over]))
        return resume_for(run, "vanilla_draft", "tiny-key", {"n_layers": 1}, "draft").path

    long, short = path("train.max_steps=120"), path("train.max_steps=2")
    assert long != short and long == path("train.max_steps=120")  # stable for one setting
    assert path("train.max_steps=120", "train.max_minutes=5") == long  # how long a run may take: the same state
