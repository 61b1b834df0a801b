"""The training recipe every trainer shares: budgets in steps and sequences that reproduce (same
setting + seed -> the same artifact bytes), resumable generation and training (an interrupted run
continues and ends with the uninterrupted run's exact bytes), safety caps that say so, the
learning-rate schedule, the held-out curve and its plot."""

import hashlib
import json
import math
import random
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from helpers import CONF, train_settings
from specbench.models import artifacts
from specbench.models import load_model
from specbench.config.settings import merge, of
from specbench.models import distill as data_mod
from specbench.train import loop
from specbench.train.session import train_model

BUDGET = ["train.data.num_prompts=4", "train.data.num_original=3", "train.data.max_new_tokens=8",
          "train.data.batch_size=2", "train.max_sequences=7", "train.batch_size=2", "train.max_len=1024",
          "train.eval_fraction=0.3", "train.max_steps=7", "train.warmup_steps=2", "train.checkpoint_every=2",
          "train.eval_every=3", "train.cali=false", "threads=1"]
METHODS = {"eesd": [], "eagle": [], "medusa2": ["method=medusa", "method.variant=medusa2", "method.num_heads=2"],
           "space": ["method.lora=true"], "eagle3": ["method=eagle3", "method.ttt_steps=3"],
           "hydra": ["method=hydra", "method.num_heads=2", "train.lr=1e-2"]}  # shared head: 7 steps at 1e-3 move no argmax


def cfg_for(data_dir, method, *extra):
    args = METHODS[method] or [f"method={method}"]
    if method == "space":
        args = ["method=space", *args]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=["model=tiny-llama", f"task.data_dir={data_dir}", *BUDGET, *args, *extra])


def train_in(cache: Path, monkeypatch, cfg) -> Path:
    """Train in the artifact cache `cache`; the artifact's path."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(cache))
    run = of(cfg)
    out = train_model(run, load_model(run.model))
    return Path(next(v for k, v in out.items() if k in ("eesd", "eagle", "medusa2", "space", "eagle3", "hydra")))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tensors(path: Path) -> dict:
    return artifacts._flatten(artifacts.read_checkpoint(path, "-")["state"])


def assert_same_state(a: Path, b: Path) -> None:
    ta, tb = tensors(a), tensors(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


@pytest.mark.ci  # CI only (docs/testing.md): trains every method twice, ~43 s of CPU
@pytest.mark.parametrize("method", sorted(METHODS))
def test_same_setting_and_seed_give_the_same_artifact_bytes(method, data_dir, tmp_path, monkeypatch):
    """Generation and training from an empty cache twice: the same bytes (so the same provenance
    hash), and a state dict that differs for another seed (the test can see a difference)."""
    cfg = cfg_for(data_dir, method)
    a, b = train_in(tmp_path / "a", monkeypatch, cfg), train_in(tmp_path / "b", monkeypatch, cfg)
    assert sha(a) == sha(b)
    assert_same_state(a, b)
    other = train_in(tmp_path / "c", monkeypatch, cfg_for(data_dir, method, "train.seed=1"))
    assert any(not torch.equal(x, y) for x, y in zip(tensors(a).values(), tensors(other).values()))


class Interrupt(Exception):
    pass


@pytest.mark.ci  # CI only (docs/testing.md): ~26 s of CPU
@pytest.mark.parametrize("method", sorted(METHODS))
def test_an_interrupted_training_resumes_to_the_same_bytes(method, data_dir, tmp_path, monkeypatch, capsys):
    """An exception at step 5 (of 7; resume states every 2 steps): the rerun resumes at step 4 and
    ends with exactly the uninterrupted run's artifact (bytes, hence its provenance hash)."""
    cfg = cfg_for(data_dir, method)
    whole = train_in(tmp_path / "whole", monkeypatch, cfg)
    real = loop.batch_at
    calls = {"n": 0}

    def failing(sequences, tcfg, step):
        calls["n"] += 1
        if step == 5:
            raise Interrupt()
        return real(sequences, tcfg, step)

    monkeypatch.setattr(loop, "batch_at", failing)
    with pytest.raises(Interrupt):
        train_in(tmp_path / "cut", monkeypatch, cfg)
    cache = tmp_path / "cut"
    states = list(cache.rglob("*.resume.safetensors"))
    assert states and not list(cache.rglob("*.log.json"))  # progress kept, nothing finished
    monkeypatch.setattr(loop, "batch_at", real)
    capsys.readouterr()
    resumed = train_in(cache, monkeypatch, cfg)
    assert "resuming at step 4 of 7" in capsys.readouterr().out
    assert sha(resumed) == sha(whole)
    assert_same_state(resumed, whole)
    assert not list(cache.rglob("*.resume.safetensors"))  # the finished artifact supersedes them
    log_a = json.loads(whole.with_suffix(".log.json").read_text())
    log_b = json.loads(resumed.with_suffix(".log.json").read_text())
    assert [r["loss"] for r in log_a["log"]] == [r["loss"] for r in log_b["log"]]


def test_a_resume_state_of_another_setting_is_ignored(data_dir, tmp_path, monkeypatch, capsys):
    cfg = cfg_for(data_dir, "eagle")
    real = loop.batch_at
    monkeypatch.setattr(loop, "batch_at", lambda s, t, step: (_ for _ in ()).throw(Interrupt()) if step == 3 else real(s, t, step))
    with pytest.raises(Interrupt):
        train_in(tmp_path / "c", monkeypatch, cfg)
    monkeypatch.setattr(loop, "batch_at", real)
    capsys.readouterr()
    states = sorted((tmp_path / "c").rglob("*.resume.safetensors"))
    assert states
    other = train_in(tmp_path / "c", monkeypatch, cfg_for(data_dir, "eagle", "train.lr=0.002"))
    out = capsys.readouterr().out
    assert "resuming" not in out  # its own state (one file a setting): the interrupted run's is not read
    fresh = train_in(tmp_path / "d", monkeypatch, cfg_for(data_dir, "eagle", "train.lr=0.002"))
    assert sha(other) == sha(fresh)


@pytest.mark.ci  # CI only (docs/testing.md): ~12 s of CPU
@pytest.mark.parametrize("method", ["space", "medusa2"])
def test_evaluations_do_not_change_the_weights(method, data_dir, tmp_path, monkeypatch):
    """End to end: eval_every changes none of the weights (SPACE's held-out cuts come from their own
    Random, Medusa-2's LoRA dropout is off while evaluating; the loop's restore is tested below)."""
    a = train_in(tmp_path / "a", monkeypatch, cfg_for(data_dir, method, "train.eval_every=1"))
    b = train_in(tmp_path / "b", monkeypatch, cfg_for(data_dir, method, "train.eval_every=null"))
    assert_same_state(a, b)


def test_an_evaluation_leaves_the_training_randomness_alone(data_dir):
    """The loop's contract (loop._quiet_eval), tested with an evaluation that does draw randomness
    (the trainers' own evaluations draw none, so the test above passes without the restore): the
    weights a run ends with do not depend on train.eval_every."""
    tcfg = of(cfg_for(data_dir, "eagle")).train
    seqs = [([1, 2, 3, 4], 1)] * 6

    def run(every):
        torch.manual_seed(0)
        lin, rng = torch.nn.Linear(4, 4), random.Random(0)

        def loss_fn(ids, labels):  # dropout (torch's RNG) and a random cut (the trainer's own Random)
            x = torch.nn.functional.dropout(torch.ones(len(ids), 4), 0.5) * rng.random()
            return lin(x).pow(2).mean(), (1, 1)

        def evaluate():
            torch.rand(3), rng.random()
            return {"loss": 0.0, "acceptance": [0.0]}

        loop.train_loop("t", list(lin.parameters()), loss_fn, seqs, merge(tcfg, {"eval_every": every}), 0, "cpu",
                        eval_fn=evaluate, rngs=[rng])
        return lin.state_dict()

    a, b = run(1), run(None)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method,depths,extra", [("medusa2", 2, []), ("eagle3", 3, []), ("hydra", 2, []),
                                                ("space", 5, ["method.lr=5e-2"])])  # 7 steps at 1e-3 move no mask's argmax
def test_the_curve_is_logged_against_steps(method, depths, extra, data_dir, tmp_path, monkeypatch):
    """Held-out acceptance per depth (Medusa/Hydra heads, EAGLE-3's unrolled steps, SPACE's masks) at steps 0, 3, 6, 7."""
    path = train_in(tmp_path, monkeypatch, cfg_for(data_dir, method, *extra))
    body = json.loads(path.with_suffix(".log.json").read_text())
    assert [p["step"] for p in body["curve"]] == [0, 3, 6, 7]
    assert all(len(p["acceptance"]) == depths and all(0 <= a <= 1 for a in p["acceptance"]) for p in body["curve"])
    assert body["curve"][-1]["acceptance"] != body["curve"][0]["acceptance"]  # the evaluation sees the training
    assert body["settings"]["data"]["sequences"] == 7 and body["settings"]["capped"] is False


def test_generation_resumes_from_its_journal(data_dir, tmp_path, monkeypatch, capsys):
    """Generation dies in its third batch: the two finished batches are kept; the rerun generates
    the rest and the data equal an uninterrupted generation's (also after a torn journal line)."""
    cfg = of(cfg_for(data_dir, "eagle", "train.data.num_prompts=6"))
    target = load_model(cfg.model)
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "whole"))
    whole, _ = data_mod.load_sequences(target, cfg.train.data, data_dir, 0)
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cut"))
    real, calls = data_mod.generate_batch, {"n": 0}

    def failing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(data_mod, "generate_batch", failing)
    with pytest.raises(KeyboardInterrupt):
        data_mod.load_sequences(target, cfg.train.data, data_dir, 0)
    journal = next((tmp_path / "cut").rglob("*.journal.jsonl"))
    assert len(journal.read_text().splitlines()) == 2
    with open(journal, "a") as f:
        f.write('{"batch": 2, "sequen')  # a crash while writing the third line
    monkeypatch.setattr(data_mod, "generate_batch", real)
    capsys.readouterr()
    again, stopped = data_mod.load_sequences(target, cfg.train.data, data_dir, 0)
    assert "2 of 3 batches done before" in capsys.readouterr().out
    assert stopped is None and [tuple(map(tuple, [s, [st]])) for s, st in again] == [tuple(map(tuple, [s, [st]])) for s, st in whole]
    assert not journal.exists()


class Clock:
    """time.monotonic advancing 20 s per call: a 1-minute cap stops after a step or two."""

    def __init__(self):
        self.t = 0.0

    def monotonic(self):
        self.t += 20.0
        return self.t


def test_a_safety_cap_that_stops_training_is_recorded_and_printed(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loop, "time", Clock())
    path = train_in(tmp_path, monkeypatch, cfg_for(data_dir, "eagle", "train.max_minutes=1"))
    settings = artifacts.checkpoint_meta(path)["settings"]
    assert settings["stopped_by"] == "train.max_minutes" and settings["capped"] is True and settings["steps"] < 7
    assert "stopped early by the safety cap train.max_minutes=1" in capsys.readouterr().out
    assert "safety cap" in artifacts.trained_summary(settings)


def test_a_run_the_cap_stopped_is_continued_by_a_rerun_to_the_same_bytes(data_dir, tmp_path, monkeypatch, capsys):
    """A lent GPU's call ends at its time cap: the capped artifact keeps a resume state at the step it
    stopped, and a rerun (no cap) continues from there to exactly the uninterrupted run's bytes."""
    cfg = cfg_for(data_dir, "eagle")
    whole = train_in(tmp_path / "whole", monkeypatch, cfg)
    real_time = loop.time
    monkeypatch.setattr(loop, "time", Clock())
    capped = train_in(tmp_path / "cut", monkeypatch, cfg_for(data_dir, "eagle", "train.max_minutes=1"))
    steps = artifacts.checkpoint_meta(capped)["settings"]["steps"]
    assert 0 < steps < 7 and list((tmp_path / "cut").rglob("*.resume.safetensors"))
    monkeypatch.setattr(loop, "time", real_time)
    capsys.readouterr()
    resumed = train_in(tmp_path / "cut", monkeypatch, cfg)
    assert f"resuming at step {steps} of 7" in capsys.readouterr().out
    assert sha(resumed) == sha(whole)
    assert not list((tmp_path / "cut").rglob("*.resume.safetensors"))  # finished: the state is gone


def test_the_plan_is_printed_with_an_estimate(data_dir, tmp_path, monkeypatch, capsys):
    train_in(tmp_path, monkeypatch, cfg_for(data_dir, "eesd"))
    err = capsys.readouterr()
    text = err.out + err.err
    assert "5 sequences, 7 steps of 2 (train.max_steps)" in text and "(an estimate, from the timed first step)" in text


def test_planned_steps_and_the_schedule():
    t = train_settings(batch_size=4, max_steps=None, epochs=2, warmup_steps=2, schedule="cosine")
    assert loop.planned_steps(10, t) == (6, "epochs")
    assert loop.planned_steps(10, merge(t, {"max_steps": 5})) == (5, "max_steps")
    assert loop.planned_steps(10, merge(t, {"max_steps": 50, "epochs": None})) == (50, "max_steps")
    factors = [loop.lr_factor(s, 10, t) for s in range(10)]
    assert factors[:2] == [0.5, 1.0]  # linear warm-up
    assert factors[2] == 1.0 and all(a > b for a, b in zip(factors[2:], factors[3:])) and 0 < factors[-1] < 0.05  # cosine decay to ~0
    assert math.isclose(loop.lr_factor(6, 10, t), 0.5)  # half-way through the decay
    assert [loop.lr_factor(s, 10, merge(t, {"schedule": "constant"})) for s in (2, 9)] == [1.0, 1.0]
    seqs = list(range(10))
    steps = [loop.batch_at(seqs, train_settings(batch_size=4, seed=0), s) for s in range(3)]
    assert sorted(x for b in steps for x in b) == seqs  # one epoch covers every sequence once


def test_curves_plot_and_refuse_bad_input(tmp_path, capsys):
    from specbench.train import curves

    log = tmp_path / "m.log.json"
    log.write_text(json.dumps({"settings": {"method": {"name": "medusa"}},
                               "curve": [{"step": 0, "acceptance": [0.1, 0.0]}, {"step": 4, "acceptance": [0.4, 0.2]}]}))
    out = curves.main([str(log), "-o", str(tmp_path / "c.png")])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the last three passed the shape check and were tracebacks (or, the last, a PNG of nothing)
    bads = ({"log": []}, {"curve": []}, {"settings": {"method": "eesd"}, "curve": [{"step": 1, "acceptance": [0.5]}]},
            {"curve": ["stepacceptance"]}, {"curve": [{"step": 1, "acceptance": 0.5}]}, {"curve": [{"step": "a", "acceptance": "x"}]})
    for bad in bads:
        log.write_text(json.dumps(bad))
        with pytest.raises(SystemExit) as e:
            curves.main([str(log), "-o", str(tmp_path / "d.png")])
        assert e.value.code == 2
    assert capsys.readouterr().err.count("specbench: error:") == len(bads) and not (tmp_path / "d.png").exists()
    (tmp_path / "dir.png").mkdir()
    log.write_text(json.dumps({"curve": [{"step": 0, "acceptance": [0.1]}]}))
    with pytest.raises(SystemExit):  # an IsADirectoryError after plotting, before
        curves.main([str(log), "-o", str(tmp_path / "dir.png")])
    assert "-o '" + str(tmp_path / "dir.png") + "' is a directory" in capsys.readouterr().err
