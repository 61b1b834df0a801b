"""A sweep killed with SIGKILL mid-way resumes with no finished sample lost or duplicated."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.ci  # CI only (docs/testing.md): a sweep of CLI processes, ~14 s of CPU, ~30 s of waiting
def test_sigkill_mid_sweep_then_resume(tmp_path, data_dir):
    env = dict(os.environ, SPECBENCH_DATA_DIR=str(data_dir), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable, "-m", "specbench", "-m", "model=tiny-llama", "method=vanilla_sd", "control.k=2,3", "task=gsm8k",
        "task.num_samples=6", "max_new_tokens=24", "method.draft.num_layers=1", "method.draft.checkpoint=null",
        "profile.enabled=false", "warmup_tokens=2", "progress=false", "threads=1",
        f"run_dir={tmp_path}/runs/k${{control.k}}", f"hydra.sweep.dir={tmp_path}/multirun",
    ]
    first = tmp_path / "runs" / "k2" / "samples.jsonl"
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while len(_records(first)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = first.read_text().splitlines()
    assert 2 <= len(before) < 6, "the kill should land mid-sweep"

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    for run in ("k2", "k3"):
        recs = _records(tmp_path / "runs" / run / "samples.jsonl")
        ids = [r["id"] for r in recs]
        assert len(ids) == 6 and len(set(ids)) == 6, ids
        assert all(r["matches_ar"] for r in recs)
    # finished samples were kept as they were, not recomputed
    after = first.read_text().splitlines()
    complete = [ln for ln in before if ln.endswith("}")]
    assert after[: len(complete)] == complete
