"""The cluster path: `hydra/launcher=submitit_slurm` cannot run here, so the same launcher family
runs end to end with `hydra/launcher=submitit_local` (real submitit, its local executor: the job
is pickled, started in a fresh process and its result read back). One job on tiny-llama, a
couple of tokens: the cost is two process start-ups (~20-60 s on a loaded 2-core machine)."""

import json

import pytest

from helpers import run_cli

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")


@pytest.mark.ci  # CI only (docs/testing.md): submitit's local processes, ~7 s of CPU
@pytest.mark.slow
def test_submitit_local_end_to_end(tmp_path, data_dir):
    run_dir = tmp_path / "run"
    r = run_cli(["-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                 "model=tiny-llama", "method=pld", "task=gsm8k", "task.num_samples=1", "max_new_tokens=6", "control.k=2",
                 "profile.enabled=false", "progress=false", "warmup_tokens=2", "threads=1", f"run_dir={run_dir}"],
                data_dir, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Submitit 'local' sweep output dir" in r.stdout + r.stderr
    jobs = list((tmp_path / "sweep" / ".submitit").glob("*/*_result.pkl"))
    assert len(jobs) == 1  # the run went through submitit, not Hydra's basic launcher
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["samples"] == 1 and s["matches_ar"] == 1 and s["meta"]["method"] == "pld"
    assert len((run_dir / "samples.jsonl").read_text().splitlines()) == 1
