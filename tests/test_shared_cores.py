"""A run loaded from start to end is flagged (the spike check, against the run's own medians,
cannot see it): from the load average and each system's CPU/wall, per sample."""

import json
import os

import pytest
from hydra import compose, initialize_config_dir

import specbench.runner as runner
from helpers import CONF
from specbench.interference import shared_cores
from specbench.report import report


def rec(load=1.0, cpu_ar=1.9, cpu_m=1.9, cores=2, threads=2):
    def system(cpu):
        return {"load": {"loadavg_1m": load, "cpu_per_wall": cpu, "cores": cores, "threads": threads}}
    return {"ar": system(cpu_ar), "method": system(cpu_m)}


def test_quiet_run_is_not_flagged():
    s = shared_cores([rec(), rec(load=1.8)])
    assert s["shared"] is False and s["reasons"] == [] and s["loadavg_1m_median"] == 1.4


def test_load_above_the_usable_cores_flags_the_run():
    s = shared_cores([rec(load=6.12), rec(load=5.0), rec(load=1.0)])  # the PLD run: load 6.12 on 2 cores
    assert s["shared"] and s["reasons"] == ["load average 5.00 > 1 x 2 usable cores"]
    assert not shared_cores([rec(load=6.12)] * 3, {"max_load_per_core": 4})["shared"]  # the threshold is the config's


def test_cpu_well_under_the_threads_flags_the_run_on_cpu_only():
    s = shared_cores([rec(cpu_m=0.56)] * 3)  # the CPU/wall 0.56 at 2 threads
    assert s["shared"] and s["reasons"] == ["method CPU/wall 0.560 < 1.00 (2 threads)"]
    assert not shared_cores([rec(cpu_m=0.56)] * 3, on_cpu=False)["shared"]  # a GPU run's host thread waits
    assert not shared_cores([rec(cpu_ar=0.9, cpu_m=0.9, threads=1)] * 3)["shared"]


def test_runs_recorded_without_load_are_not_judged():
    assert shared_cores([{"ar": {}, "method": {}}]) is None


def run_cfg(run_dir, *extra):
    overrides = ["model=tiny-llama", "method=pld", "task=gsm8k", "task.num_samples=2", "max_new_tokens=8",
                 "warmup_tokens=2", "profile.enabled=false", f"run_dir={run_dir}", "progress=false", "threads=1", *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


@pytest.mark.parametrize("loaded", [True, False])
def test_a_loaded_run_is_flagged_in_summary_printout_and_report(loaded, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0,) * 3 if loaded else (0.0,) * 3)
    run_dir = tmp_path / "run"
    # quiet: the CPU/wall test off, so a busy test machine cannot flag it
    s = runner.run(run_cfg(run_dir, *([] if loaded else ["measure.min_cpu_per_thread=0"])))
    stored = json.loads((run_dir / "summary.json").read_text())["shared_cores"]
    assert stored["shared"] is loaded and stored["cores"] >= 1 and stored["threads"] == 1
    for line in (run_dir / "samples.jsonl").read_text().splitlines():  # per system, per sample
        r = json.loads(line)
        assert r["ar"]["load"]["loadavg_1m"] == r["method"]["load"]["loadavg_1m"] == (64.0 if loaded else 0.0)
    assert ("the run shared its cores (load average 64.00 >" in s["printed"]) is loaded
    assert ("on shared cores)" in s["printed"]) is loaded  # the CI is marked
    report([run_dir], tmp_path / "rep")
    assert ("(shared cores) n=2" in (tmp_path / "rep" / "tables.md").read_text()) is loaded
