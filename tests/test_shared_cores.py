"""A run loaded from start to end is flagged (the spike check, against the run's own medians,
cannot see it): from the load average and each system's CPU/wall, per sample."""

import json
import os

import pytest
from hydra import compose, initialize_config_dir

import specbench.run.runner as runner
from helpers import CONF, run_settings
import specbench.run.interference as interference
from specbench.run.interference import foreign_cpu, measure_load, read_cpu_busy, shared_cores
from specbench.report import report
from specbench.config.settings import merge


def measure(**over):
    """conf/config.yaml's measure group (as composed) with `over`."""
    return merge(run_settings().measure, over)


def rec(load=1.0, cpu_ar=1.9, cpu_m=1.9, cores=2, threads=2):
    def system(cpu):
        return {"load": {"loadavg_1m": load, "cpu_per_wall": cpu, "cores": cores, "threads": threads}}
    return {"ar": system(cpu_ar), "method": system(cpu_m)}


def test_quiet_run_is_not_flagged():
    s = shared_cores([rec(), rec(load=1.8)], measure())
    assert s["shared"] is False and s["reasons"] == [] and s["loadavg_1m_median"] == 1.4


def test_load_above_the_usable_cores_flags_the_run():
    s = shared_cores([rec(load=6.12), rec(load=5.0), rec(load=1.0)], measure())  # the PLD run: load 6.12 on 2 cores
    assert s["shared"] and s["reasons"] == ["load average 5.00 > 1 x 2 usable cores"]
    assert not shared_cores([rec(load=6.12)] * 3, measure(**{"max_load_per_core": 4}))["shared"]  # the threshold is the config's


def test_cpu_well_under_the_threads_flags_the_run_on_cpu_only():
    s = shared_cores([rec(cpu_m=0.56)] * 3, measure())  # the CPU/wall 0.56 at 2 threads
    assert s["shared"] and s["reasons"] == ["method CPU/wall 0.560 < 1.00 (2 threads)"]
    assert not shared_cores([rec(cpu_m=0.56)] * 3, measure(), on_cpu=False)["shared"]  # a GPU run's host thread waits
    assert not shared_cores([rec(cpu_ar=0.9, cpu_m=0.9, threads=1)] * 3, measure())["shared"]


def test_runs_recorded_without_load_are_not_judged():
    assert shared_cores([{"ar": {}, "method": {}}], measure()) is None


def run_cfg(run_dir, *extra):
    overrides = ["model=tiny-llama", "method=pld", "task=gsm8k", "task.num_samples=2", "max_new_tokens=8",
                 "warmup_tokens=2", "profile.enabled=false", f"run_dir={run_dir}", "progress=false", "threads=1", *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


@pytest.mark.parametrize("loaded", [True, False])
def test_a_loaded_run_is_flagged_in_summary_printout_and_report(loaded, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0,) * 3 if loaded else (0.0,) * 3)
    monkeypatch.setattr(interference, "PROC_STAT", str(tmp_path / "no-proc-stat"))  # the load-average fallback
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


# --- the CPUs of the process's affinity, from /proc/stat (a run pinned with taskset) ---

TICK = os.sysconf("SC_CLK_TCK")


def proc_stat(path, busy0, busy1, idle0=0, idle1=0):
    """A fake /proc/stat: CPU 0 and 1 with the given busy seconds (split over user, system, steal)."""
    def line(n, busy, idle):
        b = int(busy * TICK)
        return f"cpu{n} {b // 2} 0 {b - b // 2 - b // 4} {int(idle * TICK)} 0 0 0 {b // 4} 0 0"
    cpu = int((busy0 + busy1) * TICK)
    path.write_text("\n".join([f"cpu  {cpu} 0 0 0 0 0 0 0 0 0", line(0, busy0, idle0), line(1, busy1, idle1),
                               "intr 1 2 3", "ctxt 99", "btime 1", "cpu_bogus 1", ""]))


def pinned_run(tmp_path, monkeypatch, busy_other, busy_own, own_cpu=4.0, wall=5.0, load=3.0):
    """measure_load of one generation pinned to CPU 1: over it, CPU 0 and CPU 1 got this much busier
    (seconds) while the process itself used own_cpu seconds of CPU in `wall` seconds."""
    stat = tmp_path / "stat"
    proc_stat(stat, 100.0, 100.0, 50.0, 50.0)
    clock = iter([10.0, 10.0 + wall])
    cpu = iter([1.0, 1.0 + own_cpu])

    def generation():  # the time passes: /proc/stat after the generation
        proc_stat(stat, 100.0 + busy_other, 100.0 + busy_own, 50.0 + wall - busy_other, 50.0 + wall - busy_own)
        return "rec"

    monkeypatch.setattr(interference, "PROC_STAT", str(stat))
    monkeypatch.setattr(interference.os, "sched_getaffinity", lambda pid: {1})
    monkeypatch.setattr(interference.os, "getloadavg", lambda: (load,) * 3)
    monkeypatch.setattr(interference.time, "process_time", lambda: next(cpu))
    monkeypatch.setattr(interference.PhaseTimer, "now", lambda self: next(clock))
    rec, measured = measure_load(generation)
    assert rec == "rec" and measured["cpus"] == [1] and measured["cores"] == 1 and measured["wall_s"] == wall
    return {"ar": {"load": measured}, "method": {"load": measured}}


def test_read_cpu_busy_counts_user_nice_system_irq_softirq_steal(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 {TICK} 2 3 {50 * TICK} 7 5 6 8 0 0\ncpu1 0 0 0 1 0 0 0 0 0 0\n")
    busy = read_cpu_busy(str(stat))
    assert busy == {0: (TICK + 2 + 3 + 5 + 6 + 8) / TICK, 1: 0.0}  # idle and iowait are not busy
    assert read_cpu_busy(str(tmp_path / "absent")) is None


def test_foreign_cpu_is_our_cpus_busy_time_minus_our_own():
    before, after = {0: 10.0, 1: 10.0}, {0: 15.0, 1: 14.0}
    assert foreign_cpu(before, after, [1], 3.0) == pytest.approx(1.0)
    assert foreign_cpu(before, after, [0, 1], 3.0) == pytest.approx(6.0)
    assert foreign_cpu(before, after, [1], 4.5) == 0.0  # tick rounding never makes it negative
    assert foreign_cpu(before, None, [1], 1.0) is None and foreign_cpu(before, after, [2], 1.0) is None


def test_a_busy_other_core_does_not_flag_a_run_pinned_to_an_idle_one(tmp_path, monkeypatch):
    # core 0 busy the whole time, load average 3 on a 1-CPU affinity: the load-average rule would flag it
    r = pinned_run(tmp_path, monkeypatch, busy_other=5.0, busy_own=4.0, own_cpu=4.0, load=3.0)
    assert r["method"]["load"]["foreign_s"] == 0.0
    s = shared_cores([r] * 3, measure(**{"min_cpu_per_thread": 0}))
    assert s["shared"] is False and s["foreign_share"] == 0.0 and s["judged_by"] == "proc_stat"
    assert s["loadavg_1m_median"] == 3.0  # recorded beside it


def test_a_busy_own_core_flags_the_run(tmp_path, monkeypatch):
    # our CPU busy the whole 5 s, the process had 3 s of it: others took 2 s (40%); the load average looks quiet
    r = pinned_run(tmp_path, monkeypatch, busy_other=0.0, busy_own=5.0, own_cpu=3.0, load=0.2)
    assert r["ar"]["load"]["foreign_s"] == pytest.approx(2.0)
    s = shared_cores([r] * 3, measure(**{"min_cpu_per_thread": 0}))
    assert s["shared"] and s["reasons"] == ["others took 40.0% of CPUs 1 > 10%"]
    assert not shared_cores([r] * 3, measure(**{"min_cpu_per_thread": 0, "max_foreign_share": 0.5}))["shared"]  # the config's


def test_without_proc_stat_the_load_average_judges(tmp_path, monkeypatch):
    monkeypatch.setattr(interference, "PROC_STAT", str(tmp_path / "absent"))
    _, measured = measure_load(lambda: None)
    assert measured["foreign_s"] is None
    r = {"ar": {"load": measured | {"loadavg_1m": 9.0, "cores": 2}}, "method": {"load": measured | {"loadavg_1m": 9.0, "cores": 2}}}
    s = shared_cores([r], measure(**{"min_cpu_per_thread": 0}))
    assert s["shared"] and s["judged_by"] == "loadavg" and s["foreign_share"] is None
