"""Trustworthy numbers on a noisy machine: a stall injected into one profile point and into one
sample's method steps must not move the reported speedup or the prediction.

Time here is a fake clock (specbench.engine.timer.clock replaced) that advances only when a
model forward runs, by a fixed cost per token and layer, so a run is exactly reproducible and
the undisturbed run is the reference; stalls are extra fake seconds added to chosen forwards.
"""

import json

import pytest
import torch
from hydra import compose, initialize_config_dir

import specbench.engine.timer as timer_mod
import specbench.run.runner as runner
from helpers import CONF, run_settings, tiny_model
from specbench.tools.calibrate import main as calibrate_main
from specbench.run.interference import StepHistory, run_checked
from specbench.models.adapter import ModelAdapter
from specbench.run.profiling import profile_forward, refit_costs, suspects
from specbench.core.stats import pooled_speedup_ci
from specbench.run.summary import aggregate

N = 5
STALLED_SAMPLE = 3  # the run's first samples are not judged (no history yet)
STALL_K = 11


class FakeTime:
    """Fake seconds: a forward over q tokens through L layers costs (2 + q) * L milliseconds."""

    def __init__(self):
        self.t = 0.0
        self.profiling = False
        self.profile_stalls = 0  # forwards over STALL_K tokens still to stall while profiling
        self.method_stall = 0.0  # extra seconds per forward while the method generates
        self.in_method = False

    def __call__(self) -> float:
        return self.t

    def charge(self, adapter: ModelAdapter, n_ids: int) -> None:
        self.t += (2 + n_ids) * adapter.num_layers * 1e-3
        if self.profiling and n_ids == STALL_K and self.profile_stalls > 0:
            self.profile_stalls -= 1
            self.t += 3.0  # the T(11) = 3.41 s next to T(8) = 0.086 s
        if self.in_method:
            self.t += self.method_stall


@pytest.fixture
def fake_time(monkeypatch):
    fake = FakeTime()
    real_forward = ModelAdapter.forward

    def forward(self, ids, cache, *a, **kw):
        fake.charge(self, len(ids))
        return real_forward(self, ids, cache, *a, **kw)

    monkeypatch.setattr(timer_mod, "clock", fake)
    monkeypatch.setattr(ModelAdapter, "forward", forward)
    return fake


@pytest.fixture(autouse=True)
def keep_grad_mode():
    before = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(before)


def make_cfg(run_dir, data_dir, *extra):
    overrides = [
        "model=tiny-llama", "method=vanilla_sd", "method.draft.checkpoint=null", "method.draft.num_layers=1",
        "control.k=4", "task=gsm8k", f"task.num_samples={N}", f"task.data_dir={data_dir}", "max_new_tokens=24",
        "warmup_tokens=2", f"run_dir={run_dir}", "progress=false", "threads=1", "profile.reps=3", *extra,
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


def run_with_stalls(tmp_path, data_dir, monkeypatch, fake, stall: bool, *extra) -> dict:
    """One benchmark run; with `stall`, the first profile round of k=11 and the first attempt
    at sample STALLED_SAMPLE's method generation are slowed down."""
    real_profile, real_generation, real_sample = runner.profile_forward, runner.run_generation, runner.run_sample
    attempts = {}

    def profile(*a, **kw):
        fake.profiling, fake.profile_stalls = True, (4 if stall else 0)  # warm-up + 3 reps of the first round
        try:
            return real_profile(*a, **kw)
        finally:
            fake.profiling = False

    def sample(index, *a, **kw):
        attempts[index] = attempts.get(index, 0) + 1
        fake.method_stall = 0.2 if stall and index == STALLED_SAMPLE and attempts[index] == 1 else 0.0
        return real_sample(index, *a, **kw)

    def generation(method, *a, **kw):
        fake.in_method = method.name != "ar"
        try:
            return real_generation(method, *a, **kw)
        finally:
            fake.in_method = False

    monkeypatch.setattr(runner, "profile_forward", profile)
    monkeypatch.setattr(runner, "run_sample", sample)
    monkeypatch.setattr(runner, "run_generation", generation)
    summary = runner.run(make_cfg(tmp_path / ("stalled" if stall else "clean"), data_dir, *extra))
    monkeypatch.setattr(runner, "profile_forward", real_profile)
    monkeypatch.setattr(runner, "run_sample", real_sample)
    monkeypatch.setattr(runner, "run_generation", real_generation)
    summary["records"] = [json.loads(line) for line in (tmp_path / ("stalled" if stall else "clean") / "samples.jsonl").open()]
    return summary


def close(a, b, tol=0.02):
    return a is not None and b is not None and abs(a - b) <= tol * abs(b)


def test_stalls_in_profile_and_sample_do_not_move_the_figures(tmp_path, data_dir, monkeypatch, fake_time):
    clean = run_with_stalls(tmp_path, data_dir, monkeypatch, fake_time, stall=False)
    stalled = run_with_stalls(tmp_path, data_dir, monkeypatch, fake_time, stall=True)
    # the profile: the stalled point was re-measured and now matches the undisturbed profile
    prof = stalled["meta"]["profile"]
    assert prof["remeasured"] == {str(STALL_K): 1} and prof["non_monotone"] == []
    for k, v in clean["meta"]["forward_costs"].items():
        assert close(stalled["meta"]["forward_costs"][k], v), k
    # the sample: re-measured, and the record says so
    rec = stalled["records"][STALLED_SAMPLE]
    assert rec["interference"]["attempts"] == 2 and not rec["interference"]["spiked"]
    assert rec["interference"]["history"][0]["excess"]["method"] > 1.5
    assert all(r["interference"]["attempts"] == 1 for r in clean["records"])
    assert all(set(r["load"]) >= {"loadavg_1m", "cpu_s", "wall_s", "cpu_per_wall"} for r in stalled["records"])
    # the figures stay where the undisturbed run put them
    for key in ("speedup", "speedup_per_sample_median", "predicted_speedup", "predicted_speedup_refit"):
        assert close(stalled[key], clean[key]), (key, stalled[key], clean[key])
    assert stalled["interference"]["remeasured"] == 1 and stalled["interference"]["spiked"] == 0
    assert "pooled" in stalled["printed"] and "CI" in stalled["printed"] and "median per sample" in stalled["printed"]


def test_without_the_safeguards_the_stalls_move_the_figures(tmp_path, data_dir, monkeypatch, fake_time):
    """The same stalls with re-measurement switched off: what the old harness reported."""
    clean = run_with_stalls(tmp_path, data_dir, monkeypatch, fake_time, stall=False)
    off = ("profile.max_remeasure=0", "measure.max_retries=0")
    stalled = run_with_stalls(tmp_path, data_dir, monkeypatch, fake_time, True, *off)
    assert stalled["meta"]["forward_costs"][STALL_K] > 10 * clean["meta"]["forward_costs"][STALL_K]
    assert stalled["meta"]["profile"]["non_monotone"] == [STALL_K]  # reported even when not corrected
    assert not close(stalled["speedup"], clean["speedup"], 0.3)
    rec = stalled["records"][STALLED_SAMPLE]
    assert rec["interference"]["spiked"] and rec["interference"]["attempts"] == 1  # flagged, not hidden
    assert stalled["interference"]["spiked"] == 1
    # the refitted T(k) (medians over the run's verify steps) shrugs off both stalls
    for k, v in clean["refit_costs"].items():
        assert close(stalled["refit_costs"][k], v, 0.05), k


def test_profile_remeasures_only_points_above_a_later_one(fake_time, monkeypatch):
    target = tiny_model()
    fake_time.profiling, fake_time.profile_stalls = True, 2  # warm-up and one of three reps: the median holds
    p = profile_forward(target, [1, 4, STALL_K, 16], context=20, reps=3)
    assert p.remeasured == {} and p.spread[STALL_K] > 10  # the spread shows the stall
    fake_time.profile_stalls = 4  # the median is hit: re-measured
    p = profile_forward(target, [1, 4, STALL_K, 16], context=20, reps=3)
    assert p.remeasured == {STALL_K: 1} and p.costs[STALL_K] < p.costs[16]
    assert p.costs == pytest.approx({k: (2 + k) * 4e-3 for k in (1, 4, STALL_K, 16)})


def test_suspects():
    assert suspects({1: 1.0, 2: 1.05, 4: 1.0, 8: 1.2}, 0.1) == []  # within tolerance
    assert suspects({1: 1.0, 2: 1.6, 4: 1.7, 8: 40.0, 16: 2.0}, 0.1) == [8]
    assert suspects({1: 1.0, 4: 1.9, 8: 1.5}, 0.1) == [4]  # a dip is judged by the point above it


def test_bootstrap_ci_is_seeded_and_brackets_the_pooled_ratio():
    pairs = [(10, 1.0, 10, 0.5 + 0.1 * i) for i in range(10)]
    a = pooled_speedup_ci(pairs, seed=1)
    assert a == pooled_speedup_ci(pairs, seed=1)
    pooled = 100 / sum(0.5 + 0.1 * i for i in range(10)) / 10
    assert a[0] < pooled < a[1]
    wide = pooled_speedup_ci(pairs[:3], seed=1)
    assert wide[1] - wide[0] > a[1] - a[0]
    assert pooled_speedup_ci(pairs[:1]) is None


def rec(i, ar_wall, m_wall, kind=4, n=10):
    steps = {"ar": [[0, 0, 0]] * n, "method": [[kind, 1, 1]] * (n // 2)}
    sys = lambda key, wall: {"new_tokens": n, "wall": wall, "steps": steps[key],  # noqa: E731
                             "step_times": [[wall / len(steps[key]), wall / len(steps[key]) / 2]] * len(steps[key])}
    return {"id": str(i), "index": i, "ar": sys("ar", ar_wall), "method": sys("method", m_wall),
            "speedup": ar_wall / m_wall, "matches_ar": True}


def test_history_judges_samples_against_the_run():
    h = StepHistory(min_samples=2)
    calls = iter([rec(0, 1.0, 0.5), rec(1, 1.0, 0.5), rec(2, 1.0, 5.0), rec(2, 1.0, 0.55)])
    first = [run_checked(lambda: next(calls), h) for _ in range(2)]
    assert all(r["interference"]["excess"] == {"ar": None, "method": None} for r in first)  # no history yet
    r = run_checked(lambda: next(calls), h, spike_factor=1.5, max_retries=2)
    assert r["interference"]["attempts"] == 2 and r["method"]["wall"] == 0.55
    assert r["interference"]["history"][0]["excess"]["method"] == pytest.approx(10.0)


def test_summary_reports_median_ci_and_flags_a_wide_ci():
    steady = [rec(i, 1.0, 0.5 + 0.01 * (i % 3)) for i in range(20)]
    s = aggregate(steady, None, run_settings().measure.ci)
    assert s["speedup_ci"][0] < s["speedup"] < s["speedup_ci"][1] and not s["ci_wide"]
    assert s["speedup_per_sample_median"] == pytest.approx(1 / 0.51)
    noisy = [rec(i, 1.0, [0.2, 3.0][i % 2]) for i in range(4)]
    assert aggregate(noisy, None, run_settings().measure.ci)["ci_wide"]


def test_refit_uses_verify_times_per_k():
    costs = refit_costs([rec(0, 1.0, 0.5), rec(1, 2.0, 0.5)])
    assert costs[1] == pytest.approx(0.075) and costs[5] == pytest.approx(0.05)


def test_calibrate_saves_costs_and_judges_quietness(tmp_path, monkeypatch, fake_time, capsys):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path))
    args = ["--repeats", "3", "model=tiny-llama", "method=pld", "threads=1", "profile.ks=[1,2,4]", "profile.context=16"]
    calibrate_main(args)
    out = capsys.readouterr().out
    assert "quiet enough to benchmark" in out and "NOT" not in out  # fake time: identical timings, CV 0
    saved = json.loads(next((tmp_path / "calibration").glob("tiny-*-cpu-float64.json")).read_text())
    assert saved["profile"]["costs"] == pytest.approx({str(k): (2 + k) * 4e-3 for k in (1, 2, 4)})
    assert saved["repeatability"]["cv"] == pytest.approx(0.0, abs=1e-9) and saved["draft"]["method"] == "pld"
    # a stall in one timing of the fixed workload: the machine is called noisy
    real_charge = fake_time.charge
    calls = []

    def charge(adapter, n_ids):
        calls.append(n_ids)
        real_charge(adapter, n_ids)
        if len(calls) == 60:  # 19 profile forwards, a prefill, 10 warm-up ones, then 3 x 10 timed
            fake_time.t += 0.1

    monkeypatch.setattr(fake_time, "charge", charge)
    calibrate_main(args)
    assert "NOT quiet enough" in capsys.readouterr().out


def test_calibrate_bad_input_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        calibrate_main(["--repeats", "1"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == "specbench: error: --repeats must be >= 2, got 1"
    # a misspelt key: the CLI's line (the nearest known key), not Hydra's advice to append it with '+'
    with pytest.raises(SystemExit) as e:
        calibrate_main(["n_samples=2"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().startswith(
        "specbench: error: unknown key 'n_samples' (did you mean 'task.num_samples'?); allowed: ")
