"""python -m specbench.tools.doctor on this CPU machine: it runs, says no GPU was found, reports the
fake-CUDA sync counts (tests/test_sync_budget.py's, covered there) and, with --device cpu, a bench
row for every method; bad input is one line and no file."""

import subprocess
import sys

import pytest
import torch

from helpers import REPO
from specbench.tools import doctor
from specbench.methods.base import METHODS


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU wording")
def test_no_gpu_is_said_plainly_and_the_bench_waits_for_one(tmp_path):
    out = tmp_path / "r.md"
    doctor.main(["--no-tests", "--out", str(out)])
    text = out.read_text()
    assert "**No GPU was found**" in text and "Not run: no GPU found" in text and "torch " in text


def test_cpu_bench_has_a_row_per_method(tmp_path):
    out = tmp_path / "r.md"
    doctor.main(["--no-tests", "--device", "cpu", "--model", "tiny-llama", "--tokens", "6", "--samples", "2",
                 "--methods", "all", "--out", str(out)])
    text = out.read_text()
    rows = {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| ")}
    assert sorted(set(rows) - {"method"}) == sorted(METHODS)
    # every method ran in both modes on its 2 prompts and equalled AR (hf_assisted: eager only)
    for name, row in rows.items():
        cells = [c.strip() for c in row.split("|")[1:-1]]
        if name not in ("method", "ar"):
            assert cells[6] == "2/2" and cells[7] == ("0/0" if name == "hf_assisted" else "2/2"), row
    assert "AR: eager" in text


def test_budget_table_from_counts():
    rows = doctor.budget_table({"pld-fixed [graphs]": {"steps": 3, "drafted": [0, 4, 4], "syncs": [1, 1, 1],
                                                       "h2d_queued": [1, 1, 1], "budget": [1, 5, 5], "in_layer": 0}})
    assert rows[-1] == "| pld-fixed [graphs] | 3 | 0-4 (mean 2.7) | 1 | 1-5 (mean 3.7) | 1 | 0 |"


@pytest.mark.parametrize("argv, expect", [(["--device", "tpu"], "unknown --device 'tpu'; allowed: cuda, cpu"),
                                          (["--seconds", "-1"], "--seconds must be > 0, got -1.0"),
                                          (["--seconds", "nan"], "--seconds must be > 0, got nan")])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, argv, expect):
    out = tmp_path / "r.md"
    r = subprocess.run([sys.executable, "-m", "specbench.tools.doctor", *argv, "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 2 and not out.exists(), r.stderr[-500:]
    assert r.stderr.strip() == f"specbench: error: {expect}"


def test_an_output_directory_and_an_unloadable_model_are_one_line(tmp_path):
    """--out <a directory> and --model <nothing loadable> were tracebacks (the second after writing)."""
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "specbench.tools.doctor", "--device", "cpu", "--no-tests", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.strip() == f"specbench: error: --out {str(tmp_path)!r} is a directory; give a file (the report's file, e.g. doctor_report.md)"
    out = tmp_path / "r.md"
    r = subprocess.run([sys.executable, "-m", "specbench.tools.doctor", "--device", "cpu", "--no-tests", "--model", str(tmp_path / "none"),
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("specbench: error:"), r.stderr[-800:]
    assert f"(the report so far: {out})" in r.stderr
