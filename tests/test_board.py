"""The project's leaderboard (specbench/report/board.py, `make leaderboard`): one table per host from stored
runs, missing and stale cells said so, lean run dirs (config.json + summary.json) read as the full ones, the
cell command's runs current, and the README's section regenerated from results/leaderboard."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

import specbench.methods  # noqa: F401 - registers the methods
from specbench.config.compose import compose
from specbench.core.errors import SpecBenchError
from specbench.methods.base import METHODS
from specbench.report import board, report
from specbench.report import cells as lb
from specbench.config.identity import fingerprint
from specbench.config.settings import of
from specbench.run.summary import aggregate

SPEC = {"model": "tiny-llama", "tasks": ["gsm8k", "xsum"],
        "overrides": ["task.num_samples=2", "max_new_tokens=8", "threads=1", "progress=false", "profile.ks=[1,2]",
                      "profile.reps=1", "profile.context=16", "warmup_tokens=2"],
        "rows": [{"name": "pld", "method": "pld", "label": "Prompt lookup"}, {"name": "suffix", "method": "suffix"},
                 {"name": "eagle3-3node", "method": "eagle3", "overrides": ["method.top_k=2", "method.depth=1"]}]}
XEON, EPYC = "Intel(R) Xeon(R) Processor", "AMD EPYC"
README = f"# a project\n\nbefore\n\n{board.BEGIN}\nold table\n{board.END}\n\nafter\n"


def published_sha() -> str:
    return json.loads(next(lb.PUBLISHED.rglob("*.json")).read_text())["sha256"]


@pytest.fixture
def folder(tmp_path) -> Path:
    d = tmp_path / "leaderboard"
    d.mkdir()
    (d / lb.SPEC).write_text(yaml.safe_dump(SPEC))
    return d


def make_cell(folder: Path, row: str, task: str, host: str, m_tps=(150.0, 150.0), edit=None, lean=True,
              trained=None, artifact=None, ar_tps=100.0) -> Path:
    """A cell as the runner leaves it: config.json the fingerprint its command records, summary.json from
    specbench.run.summary.aggregate over samples of 10 tokens (AR at `ar_tps` tokens/s; the method at `m_tps`
    times AR's speed / 100), samples.jsonl unless `lean`."""
    spec = lb.load_spec(folder)
    config = fingerprint(compose([*lb.overrides(spec, spec.row(row), task), "run_dir=unused"]))
    config["provenance"] = {"model": {"sha256": "ab" * 32}, "artifacts": {}}
    if artifact:
        config["provenance"]["artifacts"]["checkpoint"] = artifact
    for key, value in (edit or {}).items():
        group, leaf = key.split(".")
        config[group][leaf] = value
    scale = ar_tps / 100.0
    recs = [{"id": f"{task}-{i}", "category": None, "matches_ar": True, "speedup": m / 100.0,
             "ar": {"new_tokens": 10, "wall": 10 / ar_tps, "tokens_per_s": ar_tps, "times": {"wall": 10 / ar_tps}},
             "method": {"new_tokens": 10, "wall": 10 / (m * scale), "tokens_per_s": m * scale,
                        "times": {"wall": 10 / (m * scale)}}}
            for i, m in enumerate(m_tps)]
    summary = aggregate(recs, None, of(compose(["model=tiny-llama"])).measure.ci)
    summary["acceptance"] = {"tau": 2.5}
    summary["meta"] = {"method": config["method"]["name"], "task": task, "model": "tiny-llama", "backend": "eager",
                       "started": "2026-11-27T10:00:00", "method_settings": {"trained": trained} if trained else {},
                       "env": {"cpu_model": host, "cpu_count": 2, "torch_threads": 1, "torch": "2.13", "transformers": "5.2"}}
    d = folder / lb.host_slug(host) / task / row
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config))
    (d / "summary.json").write_text(json.dumps(summary))
    if not lean:
        (d / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


def test_every_registered_method_has_a_row_whose_command_composes():
    spec = lb.load_spec()
    assert {r.method for r in spec.rows} >= set(METHODS) - {"ar"}
    assert spec.tasks == ("gsm8k", "humaneval", "mt_bench", "xsum")
    assert "task.num_samples=20" in spec.overrides and spec.model == "smollm2-135m"
    for r in spec.rows:
        config = lb.expected_config(lb.overrides(spec, r, "gsm8k"))
        assert config["method"]["name"] == r.method and config["model"]["backend"] == "ggml"
        assert ("train_if_missing" not in config["method"]) or config["method"]["train_if_missing"] is False


def test_one_table_per_host_missing_and_stale_cells_said_so(folder, tmp_path):
    make_cell(folder, "pld", "gsm8k", XEON, m_tps=(150.0, 150.0))
    make_cell(folder, "pld", "gsm8k", EPYC, m_tps=(120.0, 120.0))
    make_cell(folder, "suffix", "gsm8k", XEON, m_tps=(170.0, 170.0), edit={"method.max_depth": 24})
    sha = published_sha()
    make_cell(folder, "eagle3-3node", "xsum", XEON, trained="1000 steps on 6660 sequences",
              artifact={"path": "/x/published_artifacts/m/eagle3/a.safetensors", "sha256": sha})
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert set(board.regenerate(folder, readme)) == {folder / "README.md", readme}
    text = readme.read_text()
    assert text.startswith("# a project\n\nbefore\n") and text.endswith(f"{board.END}\n\nafter\n") and "old table" not in text
    xeon, epyc = text.split(f"**Host: {EPYC}**")[1].split(f"**Host: {XEON}**")[::-1]  # sorted: AMD first

    def pld(part: str) -> str:
        return next(ln for ln in part.splitlines() if "(`pld`)" in ln)

    assert "| 1.50x [1.50, 1.50], tau 2.50, =AR 2/2 | no run |" in pld(xeon)
    assert "1.20x" in pld(epyc) and "1.50x" not in epyc and "1.35x" not in text  # hosts never pooled
    suffix = next(ln for ln in xeon.splitlines() if "(`suffix`)" in ln)
    assert "stale: method.max_depth 24 -> 64" in suffix and "1.70x" not in suffix  # no stale figure shown
    eagle = next(ln for ln in xeon.splitlines() if "(`eagle3-3node`)" in ln)
    assert "1000 steps on 6660 sequences (published)" in eagle and eagle.endswith("| no run | 1.50x [1.50, 1.50], tau 2.50, =AR 2/2 |")
    assert "(`eagle3-3node`)" not in epyc and "Not measured on this host: `suffix`, `eagle3-3node`." in epyc
    assert (folder / "README.md").read_text().count("**Host:") == 2
    assert board.regenerate(folder, readme, check=True) == []
    make_cell(folder, "pld", "xsum", EPYC)  # a new cell: both generated files are out of date
    assert set(board.regenerate(folder, readme, check=True)) == {folder / "README.md", readme}


def test_a_cell_whose_ar_ran_in_a_slower_regime_says_so(folder, tmp_path):
    make_cell(folder, "pld", "gsm8k", EPYC, ar_tps=60.0)
    make_cell(folder, "suffix", "gsm8k", EPYC, ar_tps=15.0)  # the same CPU name, a 4x slower machine
    make_cell(folder, "eagle3-3node", "gsm8k", EPYC, ar_tps=31.0)  # just over half: one regime
    make_cell(folder, "pld", "xsum", EPYC, ar_tps=20.0)  # tasks are compared only with themselves
    make_cell(folder, "pld", "gsm8k", XEON, ar_tps=15.0)  # and hosts only with themselves
    readme = tmp_path / "README.md"
    readme.write_text(README)
    board.regenerate(folder, readme)
    epyc, xeon = readme.read_text().split(f"**Host: {XEON}**")
    lines = {ln.split("(`")[1].split("`)")[0]: ln for ln in epyc.splitlines() if "(`" in ln}
    assert "1.50x [1.50, 1.50], tau 2.50, =AR 2/2, AR at 25% of the host's fastest |" in lines["suffix"]
    assert "host's fastest" not in lines["pld"] + lines["eagle3-3node"] + xeon.split("Model `")[0]
    assert "AR 15 to 60 tokens/s on GSM8K)" in epyc and "AR 15 to 15 tokens/s on GSM8K)" in xeon


def test_an_ar_of_other_weights_sets_no_range_and_gets_no_flag(folder, tmp_path):
    make_cell(folder, "pld", "gsm8k", EPYC, ar_tps=60.0)
    moved = make_cell(folder, "suffix", "gsm8k", EPYC, ar_tps=20.0) / "summary.json"
    d = json.loads(moved.read_text())
    d["meta"]["baseline_weights"] = "fine-tuned"  # as SPACE's: AR decodes the model its delta moved
    moved.write_text(json.dumps(d))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    board.regenerate(folder, readme)
    text = readme.read_text()
    assert "AR 60 to 60 tokens/s on GSM8K)" in text and not re.search(r"AR at \d+% of the host's fastest", text)


def test_a_cell_refiled_under_a_fuller_cpu_name_is_counted_in_its_host_line(folder, tmp_path):
    zen2 = "AMD EPYC (family 23, model 49)"
    for row in ("pld", "suffix"):
        s = make_cell(folder, row, "gsm8k", zen2) / "summary.json"
        if row == "pld":  # recorded as "AMD EPYC" before the family and model were kept, re-filed with a note
            d = json.loads(s.read_text())
            d["meta"]["env"]["cpu_model_note"] = "recorded as 'AMD EPYC'; the session read family 23, model 49"
            s.write_text(json.dumps(d))
    make_cell(folder, "pld", "gsm8k", EPYC)
    readme = tmp_path / "README.md"
    readme.write_text(README)
    board.regenerate(folder, readme)
    hosts = {ln.split("**")[1]: ln for ln in readme.read_text().splitlines() if ln.startswith("**Host: ")}
    assert "; 1 of its cells re-filed under this name" in hosts[f"Host: {zen2}"]
    assert "re-filed" not in hosts[f"Host: {EPYC}"]


def test_a_trained_part_no_longer_published_makes_the_cell_stale(folder, tmp_path):
    make_cell(folder, "eagle3-3node", "gsm8k", XEON, trained="60 steps",
              artifact={"path": "/x/published_artifacts/m/eagle3/old.safetensors", "sha256": "0" * 64})
    make_cell(folder, "eagle3-3node", "xsum", XEON, trained="60 steps",
              artifact={"path": "/root/.cache/specbench/eagle3/a.safetensors", "sha256": "1" * 64})
    spec = lb.load_spec(folder)
    cells = {c.task: c for c in lb.find_cells(spec, folder)}
    assert board.cell_text(cells["gsm8k"]) == "stale: its checkpoint is no longer the published part"
    assert cells["xsum"].trained == ["60 steps (from the measuring host's cache, not published)"] and not cells["xsum"].stale


def test_a_corpus_its_datastore_and_a_ranked_vocabulary_are_no_trained_part(folder):
    """REST's (and SAM-Decoding's) corpus and datastore, and a draft vocabulary's ranking file, are pinned by the run's provenance; no training
    made them: the budget column said "budget not recorded (from the measuring host's cache, ...)"."""
    d = make_cell(folder, "suffix", "gsm8k", EPYC)
    config = json.loads((d / "config.json").read_text())
    config["provenance"]["artifacts"] = {"corpus.0": {"path": "/data/train.jsonl", "sha256": "2" * 64},
                                         "aux_datastore": {"path": "/c/datastore/x.npz", "sha256": "3" * 64},
                                         # a draft vocabulary's ranked token file (the eesd-q8-v8k row)
                                         "method.draft_vocab.source": {"path": "/r/draft_vocab_mix.json", "sha256": "4" * 64}}
    (d / "config.json").write_text(json.dumps(config))
    (cell,) = lb.find_cells(lb.load_spec(folder), folder)
    assert cell.trained == [] and not cell.stale


def test_a_lean_run_dir_reads_as_the_full_one(folder, tmp_path):
    full = make_cell(folder, "pld", "gsm8k", XEON, m_tps=(150.0, 130.0, 170.0, 120.0), lean=False)
    report([folder], tmp_path / "full")
    (full / "samples.jsonl").unlink()
    report([folder], tmp_path / "lean")
    md = (tmp_path / "lean" / "tables.md").read_text()
    assert md == (tmp_path / "full" / "tables.md").read_text()
    ci = json.loads((full / "summary.json").read_text())["speedup_ci"]
    assert f"[{ci[0]:.2f}, {ci[1]:.2f}]" in md  # the bootstrap interval, from the summary's per-sample pairs
    s = json.loads((full / "summary.json").read_text())
    s["per_sample"] = s["per_sample"][:-1]  # a summary whose pairs do not add up is refused, never half-read
    (full / "summary.json").write_text(json.dumps(s))
    with pytest.raises(SpecBenchError, match="but per_sample holds 3"):
        report([folder], tmp_path / "bad")


def test_add_files_a_finished_run_and_refuses_a_stale_one(folder, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(folder / lb.SPEC, other / lb.SPEC)
    run = make_cell(other, "pld", "gsm8k", XEON, lean=False)
    s = json.loads((run / "summary.json").read_text())
    del s["per_sample"]  # a run recorded before summaries carried their per-sample pairs
    (run / "summary.json").write_text(json.dumps(s))
    dest = board.add_run(run, "pld", folder)
    assert dest == folder / "intel-r-xeon-r-processor" / "gsm8k" / "pld"
    assert len(json.loads((dest / "summary.json").read_text())["per_sample"]) == 2
    with pytest.raises(SpecBenchError, match="exists"):
        board.add_run(run, "pld", folder)
    stale = make_cell(other, "suffix", "gsm8k", XEON, lean=False, edit={"method.max_depth": 24})
    with pytest.raises(SpecBenchError, match="method.max_depth 24 -> 64"):
        board.add_run(stale, "suffix", folder)


def test_cell_command_and_bad_input(folder, capsys, monkeypatch):
    monkeypatch.setattr("specbench.run.runner.cpu_model", lambda: "Fancy CPU (R) 9")
    assert board.run_cell("eagle3-3node", "gsm8k", ["overwrite=true"], folder, dry_run=True) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("python -m specbench model=tiny-llama method=eagle3 task=gsm8k task.num_samples=2")
    assert "method.top_k=2 method.depth=1 method.train_if_missing=false run_name=eagle3-3node" in line
    assert line.endswith(f"run_dir={folder}/fancy-cpu-r-9/gsm8k/eagle3-3node overwrite=true")
    board.run_cell("pld", "gsm8k", [], folder, dry_run=True)
    assert "train_if_missing" not in capsys.readouterr().out  # a method that trains nothing has no such key
    with pytest.raises(SpecBenchError, match="unknown leaderboard row 'nope'; allowed: pld, suffix, eagle3-3node"):
        board.run_cell("nope", "gsm8k", [], folder, dry_run=True)
    with pytest.raises(SpecBenchError, match="task 'humaneval' is not a leaderboard column; allowed: gsm8k, xsum"):
        board.run_cell("pld", "humaneval", [], folder, dry_run=True)
    # a folder or README that is not there: named, one line each (the README's was a traceback)
    with pytest.raises(SpecBenchError, match="holds no leaderboard.yaml"):
        board.regenerate(folder / "nope", None, check=True)
    with pytest.raises(SpecBenchError, match="--readme .*/NO.md: no such file"):
        board.regenerate(folder, folder / "NO.md", check=True)


def test_a_cell_the_command_measures_is_current(folder, monkeypatch):
    """A real tiny run with the cell's own overrides (in process, as `cell` runs it) is read back as a current
    cell: what the command records and what the stale check expects agree."""
    from specbench.run.runner import run

    spec = lb.load_spec(folder)
    d = folder / "some-host" / "gsm8k" / "pld"
    run(compose([*lb.overrides(spec, spec.row("pld"), "gsm8k"), f"run_dir={d}"]))
    (d / "samples.jsonl").unlink()  # what a clone has: config.json and summary.json
    (cell,) = lb.find_cells(spec, folder)
    assert not cell.stale and "=AR 2/2" in board.cell_text(cell)


def test_the_readme_shows_the_current_leaderboard():
    """README.md's leaderboard section and results/leaderboard/README.md are what `make leaderboard` writes
    from the stored runs: no figure in them is typed by hand."""
    assert board.regenerate(check=True) == []


def test_the_host_line_names_the_kernels_its_cells_ran(folder, tmp_path):
    """An AVX2 host's cells measured before its AVX2 kernels (the portable attention, ~10x slower at 4
    queries) and after them differ in time, not in tokens: the host line says which kernels its cells
    recorded, and that older cells recorded none."""
    zen3 = "AMD EPYC (family 25, model 1)"
    for row in ("pld", "suffix"):
        s = make_cell(folder, row, "gsm8k", zen3) / "summary.json"
        if row == "pld":
            d = json.loads(s.read_text())
            d["meta"]["env"]["kernels"] = {"linear": "AVX2", "int8": "AVX2", "attention": "AVX2", "sources": "8aaf6b53c5b2"}
            s.write_text(json.dumps(d))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    board.regenerate(folder, readme)
    line = next(ln for ln in readme.read_text().splitlines() if ln.startswith(f"**Host: {zen3}"))
    assert "; kernels: linear AVX2, attention AVX2 (sources 8aaf6b53c5b2), not recorded" in line


def test_a_cell_that_ran_beside_other_work_says_so(folder, tmp_path):
    """Two cells at once cost the speculative rows ~10% on a 2-core Xeon: a cell whose load average exceeded its
    own threads says by how much, and its host line counts the cells that ran alone and beside other work."""
    for row, load in (("pld", 1.02), ("suffix", 2.01), ("eagle3-3node", None)):
        s = make_cell(folder, row, "gsm8k", XEON) / "summary.json"
        d = json.loads(s.read_text())
        d["shared_cores"] = None if load is None else {"loadavg_1m_median": load, "threads": 1, "shared": False}
        s.write_text(json.dumps(d))
    make_cell(folder, "pld", "gsm8k", EPYC)  # a host whose cells recorded no load
    readme = tmp_path / "README.md"
    readme.write_text(README)
    board.regenerate(folder, readme)
    epyc, xeon = readme.read_text().split(f"**Host: {XEON}**")
    lines = {ln.split("(`")[1].split("`)")[0]: ln for ln in xeon.splitlines() if "(`" in ln and "|" in ln}
    assert "=AR 2/2, beside load 1.0 |" in lines["suffix"]
    assert "beside load" not in lines["pld"] + lines["eagle3-3node"]
    assert "; 1 of its cells ran alone, 1 beside other work (median load beyond their own threads 0.5)" in xeon
    assert "; no cell recorded the machine's load" in epyc
