"""The benchmark run on tiny-llama: resumption after crashes, config mismatch, overwrite, summary."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import specbench.run.runner as runner
from helpers import CONF
from specbench.core.errors import SpecBenchError

NUM_SAMPLES = 4


def make_cfg(run_dir: Path, data_dir: Path, *extra: str):
    method = next((e for e in extra if e.startswith("method=")), "method=vanilla_sd")
    draft = ["method.draft.checkpoint=null", "method.draft.num_layers=1"] if method == "method=vanilla_sd" else []
    overrides = [
        "model=tiny-llama",
        method,
        "task=gsm8k",
        f"task.num_samples={NUM_SAMPLES}",
        f"task.data_dir={data_dir}",
        "max_new_tokens=16",
        "profile.enabled=false",
        "warmup_tokens=2",
        f"run_dir={run_dir}",
        "progress=false",
        "threads=1",
        "measure.max_retries=0",  # fixed call counts per sample (the crash tests count run_sample calls)
        *draft,
        *[e for e in extra if e != method],
    ]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


@pytest.fixture(autouse=True)
def keep_grad_mode():
    """runner.run switches autograd off process-wide; give the other tests their mode back."""
    before = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(before)


def lines(run_dir: Path) -> list[bytes]:
    return (run_dir / "samples.jsonl").read_bytes().splitlines(keepends=True)


def records(run_dir: Path) -> list[dict]:
    out = []
    for line in lines(run_dir):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def check_complete(run_dir: Path) -> list[dict]:
    recs = records(run_dir)
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)) == NUM_SAMPLES, ids
    assert sorted(r["index"] for r in recs) == list(range(NUM_SAMPLES))
    return recs


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, data_dir):
    run_dir = tmp_path_factory.mktemp("runs") / "base"
    before = torch.is_grad_enabled()
    summary = runner.run(make_cfg(run_dir, data_dir))
    torch.set_grad_enabled(before)
    return run_dir, summary


@pytest.fixture
def copied_run(base_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(base_run[0], run_dir)
    return run_dir


def test_fresh_run_and_summary(base_run):
    run_dir, summary = base_run
    recs = check_complete(run_dir)
    assert all(json.loads(line) for line in lines(run_dir))
    assert all(r["matches_ar"] for r in recs)  # greedy: lossless
    for r in recs:
        assert len(r["ar"]["tokens"][0]) <= 16 and r["ar"]["tokens"] == r["method"]["tokens"]
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for s in (summary, on_disk):
        assert s["samples"] == NUM_SAMPLES
        assert s["matches_ar"] == NUM_SAMPLES
        assert s["speedup"] is not None and s["speedup"] > 0
        acc = s["acceptance"]
        for key in ("v_d", "r_d", "hm", "tau", "mean_accepted", "drafted", "accepted", "steps"):
            assert key in acc
        assert s["meta"]["method"] == "vanilla_sd" and s["meta"]["model"] == "tiny-llama"
    assert "speedup" in summary["printed"] and "v_d" in summary["printed"]
    assert (run_dir / "config.json").exists() and (run_dir / "config.yaml").exists()
    assert not (run_dir / "forward_costs.json").exists()  # profile.enabled=false


def truncate_mid_third_line(run_dir: Path) -> bytes:
    ls = lines(run_dir)
    assert len(ls) == NUM_SAMPLES
    head = ls[0] + ls[1]
    (run_dir / "samples.jsonl").write_bytes(head + ls[2][: len(ls[2]) // 2])
    return head


def test_resume_after_crash_mid_write(copied_run, data_dir):
    original = {r["id"]: r for r in records(copied_run)}
    head = truncate_mid_third_line(copied_run)
    summary = runner.run(make_cfg(copied_run, data_dir))
    assert (copied_run / "samples.jsonl").read_bytes().startswith(head)  # first two lines untouched
    recs = check_complete(copied_run)
    assert summary["samples"] == NUM_SAMPLES
    for r in recs:  # greedy and seeded per sample: re-run samples reproduce their tokens
        assert r["method"]["tokens"] == original[r["id"]]["method"]["tokens"]
        assert r["ar"]["tokens"] == original[r["id"]]["ar"]["tokens"]


def test_resume_leaves_only_valid_lines(copied_run, data_dir):
    truncate_mid_third_line(copied_run)
    runner.run(make_cfg(copied_run, data_dir))
    for line in lines(copied_run):
        json.loads(line)


def test_resume_with_nothing_left_reruns_nothing(copied_run, data_dir, monkeypatch):
    before = (copied_run / "samples.jsonl").read_bytes()

    def boom(*a, **k):
        raise AssertionError("no sample should run again")

    monkeypatch.setattr(runner, "run_sample", boom)
    summary = runner.run(make_cfg(copied_run, data_dir, "progress=true"))  # a resumable key may change
    assert (copied_run / "samples.jsonl").read_bytes() == before
    assert summary["samples"] == NUM_SAMPLES and summary["matches_ar"] == NUM_SAMPLES


def test_other_method_into_same_dir_is_refused(copied_run, data_dir):
    before = (copied_run / "samples.jsonl").read_bytes()
    with pytest.raises(SpecBenchError, match="different configuration.*method"):
        runner.run(make_cfg(copied_run, data_dir, "method=pld"))
    with pytest.raises(SpecBenchError, match="different configuration"):
        runner.run(make_cfg(copied_run, data_dir, "max_new_tokens=12"))
    assert (copied_run / "samples.jsonl").read_bytes() == before


def test_other_config_is_refused_before_the_model_loads(copied_run, data_dir, monkeypatch):
    """A refused resume costs nothing: no model load, no method build (REST's datastore, a training)."""
    def boom(*a, **k):
        raise AssertionError("a refused resume must not load the model or build the method")

    monkeypatch.setattr(runner, "load_model", boom)
    monkeypatch.setattr(runner, "build_method", boom)
    monkeypatch.setattr(runner, "ensure_trained", boom)
    with pytest.raises(SpecBenchError, match="different configuration.*method"):
        runner.run(make_cfg(copied_run, data_dir, "method=rest"))


def test_overwrite_starts_over(copied_run, data_dir):
    summary = runner.run(make_cfg(copied_run, data_dir, "method=pld", "overwrite=true"))
    recs = check_complete(copied_run)
    assert summary["meta"]["method"] == "pld"
    assert json.loads((copied_run / "summary.json").read_text())["meta"]["method"] == "pld"
    assert json.loads((copied_run / "config.json").read_text())["method"]["name"] == "pld"
    assert all(r["matches_ar"] for r in recs)
    # and the new configuration now owns the directory: resuming it without overwrite is fine
    again = runner.run(make_cfg(copied_run, data_dir, "method=pld"))
    assert again["samples"] == NUM_SAMPLES
    assert len(lines(copied_run)) == NUM_SAMPLES


def test_crash_during_run_then_resume(tmp_path, data_dir, monkeypatch):
    run_dir = tmp_path / "crash"
    real = runner.run_sample
    calls = []

    def flaky(index, *args, **kwargs):
        calls.append(index)
        if len(calls) == 3:
            raise RuntimeError("simulated crash")
        return real(index, *args, **kwargs)

    monkeypatch.setattr(runner, "run_sample", flaky)
    with pytest.raises(RuntimeError, match="simulated crash"):
        runner.run(make_cfg(run_dir, data_dir))
    first = lines(run_dir)
    assert len(first) == 2 and not (run_dir / "summary.json").exists()
    monkeypatch.setattr(runner, "run_sample", real)
    summary = runner.run(make_cfg(run_dir, data_dir))
    assert lines(run_dir)[:2] == first
    recs = check_complete(run_dir)
    assert all(json.loads(line) for line in lines(run_dir))
    assert summary["samples"] == NUM_SAMPLES and summary["matches_ar"] == NUM_SAMPLES
    assert {r["index"] for r in recs[2:]} == {2, 3}


@pytest.mark.parametrize(
    "extra,match",
    [
        (["max_new_tokens=0"], "max_new_tokens"),
        (["control.k=20", "control.k_max=5"], "k_max"),
        (["control=beta_ts", "control.k_max=0"], "k_max"),
        (["method.draft.num_layers=4"], "num_layers"),
        (["method.draft.source=nope"], "draft.source"),
        (["sampling.temperature=0.5", "model.dtype=float8"], "dtype"),
    ],
)
def test_bad_config_raises_specbench_error(tmp_path, data_dir, extra, match):
    with pytest.raises(SpecBenchError, match=match):
        runner.run(make_cfg(tmp_path / "x", data_dir, *extra))


def test_per_sample_tau_counts_steps(base_run):
    """Per sample (one turn): tau = tokens after the prefill's / decoding steps."""
    for r in records(base_run[0]):
        m = r["method"]
        assert m["acceptance"]["tau"] == pytest.approx((m["new_tokens"] - 1) / len(m["steps"]))


def test_pooled_tau_counts_one_prefill_token_per_sequence(base_run):
    run_dir, summary = base_run
    recs = records(run_dir)
    tokens = sum(r["method"]["new_tokens"] for r in recs)
    steps = sum(len(r["method"]["steps"]) for r in recs)
    sequences = sum(len(r["method"]["tokens"]) for r in recs)  # turns
    assert summary["acceptance"]["tau"] == pytest.approx((tokens - sequences) / steps)


def test_profile_without_k1(tmp_path, data_dir):
    s = runner.run(make_cfg(tmp_path / "p", data_dir, "profile.enabled=true", "profile.ks=[2,4]", "profile.reps=1", "profile.context=10"))
    assert s["alpha"] is not None


def test_warm_up_leaves_controllers_as_they_were(tmp_path, data_dir, monkeypatch):
    """A controller that keeps its state across sequences must start the measured run fresh: the
    unmeasured warm-up may not have moved its posterior."""
    from specbench.methods.base import Method

    real, seen = Method.generate, []

    def spy(self, *args, **kwargs):
        if hasattr(self, "controller"):
            seen.append(dict(self.controller.state()))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Method, "generate", spy)
    runner.run(make_cfg(tmp_path / "w", data_dir, "control=beta_ts", "control.reset_per_sequence=false", "warmup_tokens=6"))
    fresh = {"alpha": 1.0, "beta": 1.0, "theta": None}
    assert seen[0] == fresh  # the warm-up
    assert seen[1] == fresh, "the first measured sequence saw the warm-up's posterior"
    assert seen[2] != fresh  # and state does carry across measured sequences, as configured


def test_speedup_is_method_over_ar(tmp_path, data_dir, monkeypatch):
    """A method that sleeps on every step is slower than AR: its speedup must be < 1 (an inverted
    ratio, AR's rate over the method's, would report > 1)."""
    import time

    from specbench.methods.base import METHODS, ARMethod

    class Sleepy(ARMethod):
        name = "sleepy"

        def step(self, budget):
            time.sleep(0.01)
            return super().step(budget)

    monkeypatch.setitem(METHODS, "sleepy", Sleepy)
    s = runner.run(make_cfg(tmp_path / "s", data_dir, "method=ar", "method.name=sleepy"))
    recs = records(tmp_path / "s")
    assert all(r["matches_ar"] for r in recs) and s["meta"]["method"] == "sleepy"
    assert all(r["speedup"] < 1 for r in recs)
    assert s["speedup"] < 1


@pytest.mark.parametrize(("method", "retries"), [("method=suffix", 0), ("method=pld", 2)])
def test_a_method_that_carries_state_across_samples_is_not_measured_twice(tmp_path, data_dir, monkeypatch, method,
                                                                           retries):
    """SuffixDecoding's global trie keeps every output: a sample measured again after a spike would draft
    from its own first attempt (greedy: the same tokens), so its retry's acceptance is not the method's.
    Such a method gets no retries (a spiked sample is flagged); a stateless one keeps them."""
    seen = []

    def checked(measure, history, spike_factor, max_retries):
        seen.append(max_retries)
        return runner_run_checked(measure, history, spike_factor, max_retries)

    runner_run_checked = runner.run_checked
    monkeypatch.setattr(runner, "run_checked", checked)
    cfg = make_cfg(tmp_path / "run", data_dir, method)
    cfg.measure.max_retries = 2
    runner.run(cfg)
    assert seen == [retries] * NUM_SAMPLES
