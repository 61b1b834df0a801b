"""Run directories: nothing lost (overwrite moves aside, a failing command deletes nothing),
nothing mixed (one writer at a time, fingerprint first), damage refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specbench.run.runner as runner
from helpers import REPO, start_cli, tiny_model
from specbench.core.errors import SpecBenchError
from specbench.report import find_runs
from specbench.tasks.base import Sample
from test_runner import NUM_SAMPLES, check_complete, make_cfg, records

HOLD = r"""
import sys, time
from pathlib import Path
from omegaconf import OmegaConf
from specbench.run.rundir import RunDir
RunDir(Path(sys.argv[1]), OmegaConf.create({"method": {"name": "holder"}}))
print("locked", flush=True)
time.sleep(120)
"""


@pytest.fixture(autouse=True)
def keep_grad_mode():
    before = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(before)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    run_dir = tmp_path_factory.mktemp("runs") / "done"
    runner.run(make_cfg(run_dir, data_dir))
    torch.set_grad_enabled(True)
    return run_dir


@pytest.fixture
def copy(finished, tmp_path):
    import shutil

    dst = tmp_path / "run"
    shutil.copytree(finished, dst)
    return dst


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}


@pytest.fixture
def holder(tmp_path):
    """Another process holding the run dir's lock."""
    run_dir = tmp_path / "held"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    yield run_dir, proc.pid
    proc.kill()
    proc.wait()


def test_second_run_is_refused_naming_the_holder(holder, data_dir):
    run_dir, pid = holder
    with pytest.raises(SpecBenchError, match=rf"in use by another run \(pid {pid}\)"):
        runner.run(make_cfg(run_dir, data_dir))
    assert not (run_dir / "samples.jsonl").exists()
    cli = start_cli(["model=tiny-llama", "method=pld", "task.num_samples=2", "profile.enabled=false", f"run_dir={run_dir}"], data_dir)
    out, err = cli.communicate(timeout=300)
    assert cli.returncode == 2 and err.strip() == f"specbench: error: run dir {run_dir} is in use by another run (pid {pid}); wait for it or choose another run_name"


@pytest.mark.ci  # CI only (docs/testing.md): two CLI runs at once, ~12 s of CPU
def test_two_concurrent_runs_do_not_mix(tmp_path, data_dir):
    """Two configurations started together into one dir: one runs, the other is refused; the
    samples on disk all belong to the configuration config.json names."""
    run_dir = tmp_path / "shared"
    common = ["model=tiny-llama", "task.num_samples=3", "max_new_tokens=24", "profile.enabled=false", "progress=false",
              "threads=1", f"run_dir={run_dir}"]
    procs = [start_cli(common + ["method=pld"], data_dir),
             start_cli(common + ["method=vanilla_sd", "method.draft.num_layers=1", "method.draft.checkpoint=null"], data_dir)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    codes = sorted(r[2] for r in results)
    assert codes == [0, 2], [r[1][-500:] for r in results]
    err = next(r[1] for r in results if r[2] == 2).strip()
    assert err.count("\n") == 0 and ("in use by another run" in err or "different configuration" in err), err
    method = json.loads((run_dir / "config.json").read_text())["method"]["name"]
    recs = records(run_dir)
    assert len(recs) == 3 == len({r["id"] for r in recs})
    assert json.loads((run_dir / "summary.json").read_text())["meta"]["method"] == method
    assert all(r["method"]["acceptance"] for r in recs)


def test_failing_overwrite_keeps_the_old_results(copy, data_dir):
    before = snapshot(copy)
    with pytest.raises(SpecBenchError, match="num_layers"):
        runner.run(make_cfg(copy, data_dir, "overwrite=true", "method.draft.num_layers=4"))
    assert snapshot(copy) == before
    assert not list(copy.parent.glob("run.old-*"))


def test_crashing_overwrite_moves_the_old_run_aside(copy, data_dir, monkeypatch):
    before = snapshot(copy)
    real = runner.run_sample

    def crash_on_second(index, *a, **k):
        if index == 1:
            raise RuntimeError("simulated crash")
        return real(index, *a, **k)

    monkeypatch.setattr(runner, "run_sample", crash_on_second)
    with pytest.raises(RuntimeError, match="simulated crash"):
        runner.run(make_cfg(copy, data_dir, "overwrite=true", "method=pld"))
    (old,) = copy.parent.glob("run.old-*")
    assert snapshot(old) == before  # every byte of the old run kept
    assert len(records(copy)) == 1 and not (copy / "summary.json").exists()
    # the report shows neither the half-done run nor the moved-aside one as a result
    with pytest.raises(SpecBenchError, match="no run dirs"):
        find_runs([copy.parent])


def test_config_error_leaves_no_run_dir(tmp_path, data_dir):
    for extra in (["method.draft.num_layers=4"], ["sampling.top_p=1.5"], ["task.num_samples=100000"]):
        with pytest.raises(SpecBenchError):
            runner.run(make_cfg(tmp_path / "never", data_dir, *extra))
        assert not (tmp_path / "never").exists()


def test_fingerprint_is_written_before_the_first_sample(tmp_path, data_dir, monkeypatch):
    run_dir = tmp_path / "fp"

    def crash(*a, **k):
        raise RuntimeError("crash before any sample")

    monkeypatch.setattr(runner, "run_sample", crash)
    with pytest.raises(RuntimeError):
        runner.run(make_cfg(run_dir, data_dir))
    assert json.loads((run_dir / "config.json").read_text())["method"]["name"] == "vanilla_sd"


@pytest.mark.parametrize("damage", ["delete", "garbage", "null"])
def test_samples_without_a_readable_config_are_refused(copy, data_dir, damage):
    cfg = copy / "config.json"
    {"delete": cfg.unlink, "garbage": lambda: cfg.write_text("{oops"), "null": lambda: cfg.write_text("null")}[damage]()
    before = (copy / "samples.jsonl").read_bytes()
    with pytest.raises(SpecBenchError, match="config.json") as e:
        runner.run(make_cfg(copy, data_dir))
    assert "\n" not in str(e.value) and "overwrite=true" in str(e.value)
    assert (copy / "samples.jsonl").read_bytes() == before


@pytest.mark.parametrize("line", [b"{}\n", b"null\n", b"[1, 2]\n", b'{"id": "x"}\n', b"{oops}\n"])
def test_sample_lines_that_are_not_records_are_refused(copy, data_dir, line):
    p = copy / "samples.jsonl"
    ls = p.read_bytes().splitlines(keepends=True)
    p.write_bytes(ls[0] + line + b"".join(ls[1:]))
    with pytest.raises(SpecBenchError, match=r"samples.jsonl:2 is not a sample record"):
        runner.run(make_cfg(copy, data_dir))
    with pytest.raises(SpecBenchError, match=r"samples.jsonl:2 is not a sample record"):
        find_runs([copy])


def test_a_sample_held_twice_is_refused_on_resume(copy, data_dir):
    """issue 42: the runner resumed such a file without a word (only the report refused it)."""
    p = copy / "samples.jsonl"
    good = p.read_bytes()
    first = json.loads(good.splitlines()[0])["id"]
    p.write_bytes(good + good.splitlines(keepends=True)[0])
    with pytest.raises(SpecBenchError) as e:
        runner.run(make_cfg(copy, data_dir))
    n = len(good.splitlines()) + 1
    assert str(e.value) == (f"{p}:{n} holds sample {first!r} again (first at line 1): the run is mixed; pass overwrite=true "
                            "(moves the old contents aside, deletes nothing) or choose another run_name")
    assert p.read_bytes() == good + good.splitlines(keepends=True)[0]  # nothing touched


@pytest.mark.parametrize("content", ["{oops", "null", '{"1": "fast"}', "{}"])
def test_damaged_forward_costs_are_refused(copy, data_dir, content):
    (copy / "forward_costs.json").write_text(content)
    with pytest.raises(SpecBenchError, match="forward_costs.json is damaged"):
        runner.run(make_cfg(copy, data_dir))


@pytest.mark.parametrize("content", ["{oops", "null", "[1]"])
def test_damaged_profile_is_only_left_out(copy, data_dir, content):
    """profile.json is shown, never computed with: a damaged one drops out of the metadata."""
    (copy / "forward_costs.json").write_text('{"1": 0.01, "2": 0.012}')
    (copy / "profile.json").write_text(content)
    s = runner.run(make_cfg(copy, data_dir))
    assert s["meta"]["forward_costs"] and "profile" not in s["meta"]


def test_unwritable_run_dir_is_one_line(tmp_path, data_dir):
    (tmp_path / "file").write_text("not a dir")
    with pytest.raises(SpecBenchError, match="cannot write run dir"):
        runner.run(make_cfg(tmp_path / "file" / "run", data_dir))


def test_resume_drops_the_stale_summary(copy, data_dir, monkeypatch):
    ls = (copy / "samples.jsonl").read_bytes().splitlines(keepends=True)
    (copy / "samples.jsonl").write_bytes(b"".join(ls[:2]))
    real = runner.run_sample

    def crash_on_fourth(index, *a, **k):
        if index == 3:
            raise RuntimeError("simulated crash")
        return real(index, *a, **k)

    monkeypatch.setattr(runner, "run_sample", crash_on_fourth)
    with pytest.raises(RuntimeError):
        runner.run(make_cfg(copy, data_dir))
    # the old summary counted 4 samples of which 2 were then missing: it must not survive
    assert not (copy / "summary.json").exists()
    monkeypatch.setattr(runner, "run_sample", real)
    runner.run(make_cfg(copy, data_dir))
    check_complete(copy)


def test_resume_after_the_task_data_changed_in_place_is_refused(data_dir, tmp_path):
    """A task file rewritten between a run and its resumption: the finished samples answered other
    prompts under the same ids; resuming would mix them with the new ones (one summary, both sets)."""
    import shutil

    data, run_dir = tmp_path / "data", tmp_path / "run"
    shutil.copytree(data_dir, data)
    runner.run(make_cfg(run_dir, data, "task.num_samples=2"))
    test = data / "gsm8k" / "test.jsonl"
    rows = [json.loads(line) for line in test.read_text().splitlines()]
    test.write_text("".join(json.dumps({**r, "question": "Another question: " + r["question"]}) + "\n" for r in rows))
    before = snapshot(run_dir)
    with pytest.raises(SpecBenchError, match="made from another prompt or reference than the task gives it now"):
        runner.run(make_cfg(run_dir, data))
    assert snapshot(run_dir) == before
    runner.run(make_cfg(run_dir, data, "overwrite=true"))
    check_complete(run_dir)


def test_a_lean_copy_is_not_run_into(copy, data_dir):
    """A run dir kept as config.json + summary.json (results/leaderboard's cells) has nothing to resume
    from: a run into it would replace the recorded summary at its first sample."""
    (copy / "samples.jsonl").unlink()
    before = snapshot(copy)
    with pytest.raises(SpecBenchError, match=f"holds the summary of {NUM_SAMPLES} samples but not their samples.jsonl"):
        runner.run(make_cfg(copy, data_dir))
    assert snapshot(copy) == before
    runner.run(make_cfg(copy, data_dir, "overwrite=true"))  # moves it aside
    check_complete(copy)


def test_a_new_configuration_drops_the_old_profile(copy, data_dir):
    """No samples yet: the new fingerprint replaces the old one, and the old configuration's T(k)
    profile must go with it, or the finished run reports another model's forward costs."""
    (copy / "samples.jsonl").write_bytes(b"")
    (copy / "summary.json").unlink()
    (copy / "forward_costs.json").write_text(json.dumps({"1": 0.5, "4": 0.7}))
    (copy / "profile.json").write_text(json.dumps({"spread": 0.1}))
    runner.run(make_cfg(copy, data_dir, "max_new_tokens=12"))  # profile.enabled=false
    assert not (copy / "forward_costs.json").exists() and not (copy / "profile.json").exists()
    again = runner.run(make_cfg(copy, data_dir, "max_new_tokens=12"))  # nothing left to run: reads what is there
    assert again["meta"]["forward_costs"] is None and "profile" not in again["meta"]


def test_the_report_reads_the_samples_its_summary_counts(copy, data_dir, capsys):
    """Resumed with a smaller task.num_samples, the summary counts a subset of samples.jsonl: the
    report's pairs (its interval, its paired test) are that subset, not every line."""
    runner.run(make_cfg(copy, data_dir, "task.num_samples=2"))
    assert f"note: {NUM_SAMPLES - 2} finished sample(s) in {copy} are not in this selection" in capsys.readouterr().out
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["samples"] == 2 and len((copy / "samples.jsonl").read_bytes().splitlines()) == NUM_SAMPLES
    (run,) = find_runs([copy])
    assert [s["id"] for s in run.samples()] == [p["id"] for p in summary["per_sample"]]
    del summary["per_sample"]
    (copy / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SpecBenchError, match=f"counts 2 of the {NUM_SAMPLES} samples in samples.jsonl and does not say which"):
        find_runs([copy])


# -- the report ---------------------------------------------------------------------------------
def test_report_refuses_damaged_and_mixed_runs(copy):
    find_runs([copy])  # intact: fine
    p = copy / "samples.jsonl"
    good = p.read_bytes()
    p.write_bytes(good + good.splitlines(keepends=True)[0])
    with pytest.raises(SpecBenchError, match="twice"):
        find_runs([copy])
    p.write_bytes(b"".join(good.splitlines(keepends=True)[:2]))
    with pytest.raises(SpecBenchError, match=f"counts {NUM_SAMPLES} samples but samples.jsonl holds 2"):
        find_runs([copy])
    p.write_bytes(good)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["method"]["name"] = "pld"
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecBenchError, match="mixed run"):
        find_runs([copy])
    (copy / "config.json").unlink()
    with pytest.raises(SpecBenchError, match="no config.json"):
        find_runs([copy])


def test_report_refuses_a_run_in_progress_and_skips_moved_aside_runs(holder, copy):
    run_dir, pid = holder
    import shutil

    for name in ("samples.jsonl", "summary.json", "config.json"):
        shutil.copy(copy / name, run_dir / name)
    with pytest.raises(SpecBenchError, match=rf"still being written \(pid {pid}\)"):
        find_runs([run_dir])
    old = copy.parent / "aside" / "run.old-20250101-000000"
    old.parent.mkdir()
    copy.rename(old)
    with pytest.raises(SpecBenchError, match="no run dirs"):
        find_runs([old.parent])


def test_only_what_overwrite_moved_aside_is_skipped(copy, data_dir):
    """issue 42: a run named my.old-baseline was skipped as 'moved aside by overwrite'. What overwrite=true makes
    (<run>.old-<timestamp>, -N when taken) is skipped; a run whose name merely holds '.old-' is reported."""
    from specbench.run.rundir import moved_aside

    named = copy.rename(copy.parent / "my.old-baseline")
    assert [r.path for r in find_runs([named.parent])] == [named.resolve()]
    runner.run(make_cfg(named, data_dir, "overwrite=true"))  # moves the old contents aside, runs again
    (aside,) = named.parent.glob("my.old-baseline.old-*")
    assert moved_aside(aside) and not moved_aside(named)
    assert [r.path for r in find_runs([named.parent])] == [named.resolve()]
    for name in ("run.old-20250101-000000", "run.old-20250101-000000-2"):
        assert moved_aside(Path(name))
    for name in ("run.old-", "run.old-baseline", "run.old-20250101", "run.old-20250101-000000-x"):
        assert not moved_aside(Path(name))


def test_report_cli_refusal_is_one_line(copy):
    (copy / "samples.jsonl").write_bytes(b"null\n")
    p = subprocess.run([sys.executable, "-m", "specbench.report", str(copy)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("specbench: error:"), p.stderr


# -- the model's context ------------------------------------------------------------------------
def test_max_new_tokens_is_capped_at_the_context_and_long_prompts_refused():
    target = tiny_model()
    ctx = target.context_length
    assert ctx and ctx > 16
    short = Sample(id="a", turns=["hello"])
    assert runner.check_context([short], target, 10**6) == ctx
    assert runner.check_context([short], target, 16) == 16
    with pytest.raises(SpecBenchError, match=f"'long'.*context {ctx}"):
        runner.check_context([short, Sample(id="long", turns=["x" * (ctx + 10)])], target, 16)


def test_a_long_first_reply_leaves_the_later_turns_their_room():
    """A two-turn sample with max_new_tokens as large as the context: turn 1 took the whole context and
    turn 2 was refused mid-run, every time the run was resumed. A reply may not take what the later
    turns' text needs (one token of reply each included)."""
    from types import SimpleNamespace

    from specbench.methods.base import Generation

    class Tok:  # one token a character; the chat template adds 2 a message
        eos_ids = []

        def encode_chat(self, messages):
            return [0] * sum(len(m["content"]) + 2 for m in messages)

        def decode(self, tokens):
            return "x" * len(tokens)

    limits = []

    def generate(prompt, limit, eos, seed):
        limits.append(limit)
        return Generation(tokens=[1] * limit)

    method = SimpleNamespace(target=SimpleNamespace(context_length=100), generate=generate)
    sample = Sample(id="s", turns=["a" * 10, "b" * 20])
    gens, replies = runner.run_generation(method, sample, Tok(), 1000, 0)
    assert len(gens) == 2 and limits[0] == 100 - 12 - (2 + 22 + 1)  # room for the empty reply's template, turn 2 and its token
    assert len(Tok().encode_chat(sample.messages(replies[:1]))) + limits[1] <= 100


def test_a_prompt_beyond_the_context_is_refused_before_first_use_training(tmp_path, data_dir, monkeypatch):
    """It was refused only after a missing trained part had been trained (minutes, files in the cache)."""
    p = tmp_path / "long.jsonl"
    p.write_text(json.dumps({"prompt": "a" * 5000}) + "\n")

    def no_training(*a, **k):
        raise AssertionError("first-use training ran before the prompt was checked")

    monkeypatch.setattr(runner, "ensure_trained", no_training)
    with pytest.raises(SpecBenchError, match="the prompt has .* tokens, the model's context"):
        runner.run(make_cfg(tmp_path / "run", data_dir, "method=medusa", "task=jsonl", f"task.path={p}", "task.num_samples=1"))
    assert not (tmp_path / "run").exists()


def test_a_report_says_which_files_in_its_folder_an_earlier_report_left(copy, tmp_path, capsys):
    """A second report into one --out rewrote the tables and left the first one's plots of other runs
    beside them without a word."""
    from specbench.report import report

    out = tmp_path / "rep"
    out.mkdir()
    (out / "speedup_vs_k_other-model.png").write_bytes(b"an earlier report's plot")
    report([copy], out)
    assert f"note: 1 file(s) in {out} are from an earlier report, not this one: speedup_vs_k_other-model.png" in capsys.readouterr().out
    report([copy], out)  # its own files, rewritten: nothing more to say of them
    assert "tables.md" not in capsys.readouterr().out.split("note:")[-1]
