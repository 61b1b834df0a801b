"""Timing that does not perturb a GPU run: host syncs per decoding step, counted on CPU.

`torch.cuda` is mocked (is_available True; Event and synchronize counted). The fake events
refuse to be read before a synchronisation that followed their recording, as CUDA does, so
a timer that resolves early fails here too.
"""

from __future__ import annotations

import time

import pytest
import torch
from omegaconf import OmegaConf

from specbench.engine import timer as timer_mod
from specbench.engine.timer import PhaseTimer
from specbench.core.errors import SpecBenchError
from specbench.methods import base as base_mod
from tests.helpers import build, control, method_cfg, tiny_model


class FakeCuda:
    def __init__(self):
        self.syncs = 0  # torch.cuda.synchronize + Event.synchronize
        self.events = 0
        self.epoch = 0  # bumped by every synchronisation

    def synchronize(self, *_):
        self.syncs += 1
        self.epoch += 1

    def event_class(self):
        cuda = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = None

            def record(self, *_):
                cuda.events += 1
                self.t, self.epoch = time.perf_counter(), cuda.epoch

            def synchronize(self):
                cuda.synchronize()

            def elapsed_time(self, end):
                for ev in (self, end):
                    assert ev.t is not None and ev.epoch < cuda.epoch, "event read before a synchronize"
                return (end.t - self.t) * 1000.0

        return Event


@pytest.fixture
def fake_cuda(monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", cuda.synchronize)
    monkeypatch.setattr(torch.cuda, "Event", cuda.event_class())
    # the tiny model stays on the CPU; only the timer believes it is on a GPU
    monkeypatch.setattr(base_mod, "PhaseTimer", lambda device, mode="fine", devices=(): PhaseTimer("cuda", mode))
    return cuda


def _generate(name: str, mode: str, max_new: int = 40, **ctrl):
    target = tiny_model()
    m = build(name, target, method_cfg(name), ctrl=control(k=4, **ctrl), timing=mode)
    prompt = list(range(5, 25)) * 2
    return m.generate(prompt, max_new, frozenset(), seed=0)


@pytest.mark.parametrize("name", ["ar", "vanilla_sd", "pld", "self_sd"])
@pytest.mark.parametrize("mode", ["fine", "coarse"])
def test_no_sync_per_decoding_step(fake_cuda, name, mode):
    g = _generate(name, mode)
    assert len(g.steps if name != "ar" else g.tokens) > 5  # many decoding steps ran
    # one wait at start (earlier queued work not billed), one at stop (resolve): none per step
    assert fake_cuda.syncs == 2, f"{fake_cuda.syncs} synchronisations for one generation"
    if mode == "coarse":
        assert set(g.times) == {"wall"}
        assert fake_cuda.events == 2
    else:
        phases = sum(v for k, v in g.times.items() if k not in ("wall", "other"))
        assert phases <= g.times["wall"] + 1e-9
        assert g.times["verify"] > 0 and g.times["prefill"] > 0
        assert g.times["other"] == pytest.approx(g.times["wall"] - phases, abs=1e-9)
        if name != "ar":
            assert g.times["draft"] > 0


def test_syncs_do_not_grow_with_length(fake_cuda):
    _generate("vanilla_sd", "fine", max_new=10)
    short = fake_cuda.syncs
    fake_cuda.syncs = 0
    _generate("vanilla_sd", "fine", max_new=60)
    assert fake_cuda.syncs == short == 2


def test_event_timeline_matches_nesting(fake_cuda):
    t = PhaseTimer("cuda")
    t.start()
    with t.phase("draft"):
        time.sleep(0.01)
        with t.phase("control"):
            time.sleep(0.03)
    out = t.stop()
    assert fake_cuda.syncs == 2
    assert 0.03 <= out["control"] < out["wall"]
    assert 0.01 <= out["draft"] < 0.03  # inner time charged to the inner phase only


def test_unknown_timing_mode():
    with pytest.raises(SpecBenchError, match="unknown timing 'fast'; allowed: coarse, fine"):
        PhaseTimer("cpu", "fast")


def test_synced_now_cpu_needs_no_cuda():
    assert timer_mod.synced_now("cpu") > 0
    assert OmegaConf.load("conf/config.yaml").timing == "fine"


def test_coarse_run_end_to_end(tmp_path):
    from hydra import compose, initialize_config_dir

    from specbench.run.runner import run
    from tests.helpers import CONF

    before = torch.is_grad_enabled()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=tiny-llama", "method=pld", "task=jsonl", f"task.path={tmp_path / 'p.jsonl'}", "max_new_tokens=8",
            "timing=coarse", "profile.ks=[1,2]", "profile.reps=1", "profile.context=8", "progress=false",
            "warmup_tokens=2", f"run_dir={tmp_path / 'run'}"])
    (tmp_path / "p.jsonl").write_text('{"prompt": "abcabcabc"}\n{"prompt": "hello hello"}\n')
    s = run(cfg)
    torch.set_grad_enabled(before)
    assert set(s["method"]["times"]) == {"wall"} and set(s["ar"]["times"]) == {"wall"}
    assert s["speedup"] is not None and "predicted_speedup" not in s  # no draft time: no cost-model prediction
    assert "n/a (timing=coarse" in s["printed"]
    with pytest.raises(SpecBenchError, match="unknown timing 'fast'; allowed: coarse, fine"):
        run(OmegaConf.merge(cfg, {"timing": "fast", "run_dir": str(tmp_path / "other")}))
    assert not (tmp_path / "other").exists()  # refused before anything is written


def test_fingerprint_keeps_old_run_dirs_resumable():
    from specbench.config.identity import fingerprint

    base = OmegaConf.create({"seed": 0, "method": {"name": "pld"}, "task": {"name": "gsm8k"}})
    assert fingerprint(OmegaConf.merge(base, {"timing": "fine"})) == fingerprint(base)  # recorded before `timing` existed
    assert fingerprint(OmegaConf.merge(base, {"timing": "coarse"}))["timing"] == "coarse"
