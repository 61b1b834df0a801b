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


def _as_from_a_shell():
    """The child's SIGINT as a shell gives it (default, unblocked), whatever the test process inherited: a
    disposition of SIG_IGN or a blocked SIGINT survives exec, and Python then never raises KeyboardInterrupt
    (under pytest-xdist the run once finished all its samples with the interrupt pending)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_mid_run_is_one_line_keeps_the_samples_and_resumes(tmp_path, data_dir, sig):
    """issue 42: Ctrl-C printed a KeyboardInterrupt traceback. Now one line naming what was kept and the way on,
    exit 130, the lock released (the same command resumes at once), every kept sample line whole. SIGTERM (a
    scheduler's time limit) takes the same path, exit 143; it used to end the process with no line (and, with
    engine=vllm, leave the worker running in its own session)."""
    env = dict(os.environ, SPECBENCH_DATA_DIR=str(data_dir), OMP_NUM_THREADS="1")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "specbench", "model=tiny-llama", "method=pld", "task=gsm8k", "task.num_samples=6",
           "max_new_tokens=32", "profile.enabled=false", "warmup_tokens=2", "progress=false", "threads=1", f"run_dir={run_dir}"]
    samples = run_dir / "samples.jsonl"
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_as_from_a_shell)
    deadline = time.monotonic() + 240
    while len(_records(samples)) < 1 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(sig)
    err = proc.communicate(timeout=120)[1]
    kept = samples.read_text().splitlines()
    assert 1 <= len(kept) < 6, "the interrupt should land mid-run"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 128 + sig, err[-2000:]
    assert lines == [f"specbench: interrupted: {len(kept)} samples kept in {run_dir}; run the same command to resume"], err[-2000:]
    assert all(json.loads(ln)["id"] for ln in kept)  # whole records only
    assert not (run_dir / "summary.json").exists()  # no summary of a part of the run

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    after = samples.read_text().splitlines()
    assert after[: len(kept)] == kept and len({json.loads(ln)["id"] for ln in after}) == 6


def test_sigterm_mid_training_is_one_line(tmp_path, data_dir):
    """python -m specbench.train stopped by a scheduler (SIGTERM) or Ctrl-C: one line saying the journals and resume
    states are kept and how to go on, exit 143; it was a bare death (SIGTERM) or a KeyboardInterrupt traceback."""
    env = dict(os.environ, SPECBENCH_DATA_DIR=str(data_dir), SPECBENCH_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "specbench.train", "method=eesd", "model=tiny-llama", "threads=1", "train.max_steps=100000",
           "train.data.num_prompts=2", "train.data.num_original=2", "train.checkpoint_every=1", "progress=false"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not list(tmp_path.rglob("*.resume.safetensors")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert proc.returncode == 143 and last.startswith("specbench: interrupted: the generated batches"), err[-2000:]
    assert "Traceback" not in err
