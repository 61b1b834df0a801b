"""A run's identity: default run dirs that never collide for different settings (and still resume
the same command), the weights' and trained artifacts' hashes in the fingerprint (a resumption
against others is one line, never a mix), run_dir only where a run may be written, and the
report's model identity (runs of different models are never pooled)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import specbench.run.runner as runner
from helpers import CONF, REPO, tiny_model
from specbench.core.errors import SpecBenchError
from specbench.run.provenance import file_sha256
from specbench.report import find_runs, report
from test_report import make_run
from test_runner import make_cfg


@pytest.fixture(autouse=True)
def keep_grad_mode():
    before = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(before)


def composed(*overrides: str, hydra_config: bool = False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra_config)


def run_dir_of(*overrides: str) -> str:
    return str(composed(*overrides).run_dir)


# -- default run names ------------------------------------------------------------------------------
def test_default_run_dirs_differ_by_setting_and_not_by_resumable_keys():
    make_run = run_dir_of("method=eesd", "task=gsm8k", "task.num_samples=3", "max_new_tokens=128")
    readme = run_dir_of("method=eesd", "task=gsm8k", "task.num_samples=2")
    assert make_run != readme  # the README's commands in any order (issue 29)
    assert readme.startswith("results/runs/smollm2-135m/gsm8k/eesd-cali_ts-")  # the human part stays
    assert len(readme.rsplit("-", 1)[1]) == 8
    # keys a resumption may change keep the directory: the same command resumes
    assert readme == run_dir_of("method=eesd", "task=gsm8k", "task.num_samples=5", "progress=false", "overwrite=true")
    # a sweep's points, seeds, models of one name, samplings: each its own directory
    points = {run_dir_of("method=pld", f"control.k={k}", "model=tiny-llama") for k in (2, 4)}
    points |= {run_dir_of("method=pld", "control.k=2", "model=tiny-llama", f"model.seed={s}") for s in (1, 2)}
    points |= {run_dir_of("method=pld", "control.k=2", "model=tiny-llama", "seed=3"),
               run_dir_of("method=pld", "control.k=2", "model=tiny-llama", "sampling.temperature=0.7")}
    assert len(points) == 6
    # as a Hydra job composes it (with the hydra node): the same name
    assert composed("method=eesd", "task=gsm8k", "task.num_samples=2", hydra_config=True).run_dir == readme


def test_the_train_group_names_only_runs_that_train():
    """A new first-use budget (the `train` group) renamed and refused the run dirs of methods that
    train nothing: PLD's 10 finished samples could not be resumed to 20 (session 12)."""
    for m in ("pld", "suffix", "rest", "token_recycling", "lookahead"):
        assert run_dir_of(f"method={m}") == run_dir_of(f"method={m}", "train.max_steps=7", "train.first_use.train.data.num_prompts=3")
    assert run_dir_of("method=eesd") != run_dir_of("method=eesd", "train.first_use.train.data.num_prompts=3")


def test_a_run_recorded_with_another_train_group_resumes_unless_it_loaded_artifacts(tmp_path, data_dir):
    from specbench.run.rundir import RunDir

    def recorded(method: str, train: dict | None, artifacts: dict) -> Path:
        run_dir = tmp_path / f"{method}-{len(list(tmp_path.iterdir()))}"
        cfg = make_cfg(run_dir, data_dir, f"method={method}")
        RunDir(run_dir, cfg, provenance={"model": {}, "artifacts": artifacts}).release()
        fp = json.loads((run_dir / "config.json").read_text())
        fp["train"] = train  # as an older specbench, or another first-use budget, wrote it
        fp["run_name"] = fp["run_name"][:-8] + "6526ad9c"  # and the default name's hash with it
        (run_dir / "config.json").write_text(json.dumps(fp))
        (run_dir / "samples.jsonl").write_text(json.dumps({"id": "s0", "method": {}, "ar": {}}) + "\n")
        return run_dir

    # PLD recorded `train` before it left its identity: resumes
    run_dir = recorded("pld", {"max_steps": 3}, {})
    RunDir(run_dir, make_cfg(run_dir, data_dir, "method=pld"), provenance={"model": {}, "artifacts": {}}).release()
    # a method that trains, with no trained artifact loaded (untrained draft): the budget cannot matter
    run_dir = recorded("vanilla_sd", {"max_steps": 3}, {})
    RunDir(run_dir, make_cfg(run_dir, data_dir), provenance={"model": {}, "artifacts": {}}).release()
    # one that loaded a trained artifact: another budget is another run
    art = {"checkpoint": {"path": "/x", "sha256": "ab"}}
    run_dir = recorded("vanilla_sd", {"max_steps": 3}, art)
    with pytest.raises(SpecBenchError, match=r"different configuration \(differs in: train\)"):
        RunDir(run_dir, make_cfg(run_dir, data_dir), provenance={"model": {}, "artifacts": art})


def test_explicit_run_name_and_run_dir_win():
    assert run_dir_of("method=pld", "run_name=mine") == "results/runs/smollm2-135m/gsm8k/mine"
    assert run_dir_of("method=pld", "run_dir=/tmp/x/y") == "/tmp/x/y"


def test_presets_name_each_point_apart_and_repeats_share_a_stem():
    a = composed("+experiment=eesd_table1", "method=eesd", "control=beta_ts", "task=gsm8k", "model=tiny-llama")
    b = composed("+experiment=eesd_table1", "method=eesd", "control=beta_ts", "task=gsm8k", "model=tiny-llama", "model.seed=1")
    assert a.run_name.startswith("table1-eesd-beta_ts-") and a.run_dir != b.run_dir
    seeds = [composed("+experiment=repeats", "method=pld", f"seed={s}", "model=tiny-llama").run_name for s in (0, 1)]
    stem = seeds[0].rsplit("-seed", 1)[0]
    assert seeds == [f"{stem}-seed0", f"{stem}-seed1"]  # declared repeats (report: same stem, -seed<N>)
    other = composed("+experiment=repeats", "method=pld", "seed=0", "model=tiny-llama", "max_new_tokens=9").run_name
    assert other.rsplit("-seed", 1)[0] != stem


def _cli(args: list[str], cwd: Path, timeout: int = 500) -> subprocess.CompletedProcess:
    """`python -m specbench` in `cwd` (so the default results/runs/... lands there, not in the repo)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "specbench", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


SMALL = ["model=tiny-llama", "method=pld", "task=gsm8k", "task.num_samples=1", "max_new_tokens=4", "profile.enabled=false",
         "progress=false", "warmup_tokens=1", "threads=1"]


@pytest.mark.ci  # CI only (docs/testing.md): two sweeps of CLI processes, ~26 s of CPU
@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "submitit_local"])
def test_a_sweep_gives_each_point_its_own_dir_and_reruns_resume(tmp_path, data_dir, launcher):
    """issue 29: `-m method=pld control.k=2,4` stopped at its second point (basic launcher) or raced
    for one directory (submitit_local, points in parallel)."""
    if launcher == "submitit_local":
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    args = ["-m", "control.k=2,4", f"task.data_dir={data_dir}", f"hydra.sweep.dir={tmp_path / 'sweep'}", *SMALL]
    if launcher != "basic":
        args += [f"hydra/launcher={launcher}", "hydra.launcher.timeout_min=5"]
    r = _cli(args, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    dirs = sorted((tmp_path / "results/runs/tiny-llama/gsm8k").iterdir())
    assert len(dirs) == 2 and all(d.name.startswith("pld-fixed-") for d in dirs)
    assert sorted(json.loads((d / "config.json").read_text())["control"]["k"] for d in dirs) == [2, 4]
    if launcher == "basic":  # the same command again: both points resume (nothing new, nothing refused)
        before = {d: (d / "samples.jsonl").read_text() for d in dirs}
        r = _cli(args, tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert {d: (d / "samples.jsonl").read_text() for d in dirs} == before
        assert sorted((tmp_path / "results/runs/tiny-llama/gsm8k").iterdir()) == dirs


# -- provenance --------------------------------------------------------------------------------------
def test_file_hash_is_cached_by_path_size_mtime_and_inode(tmp_path):
    from specbench.run.provenance import _cache_entry

    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 1000)
    real = file_sha256(f)
    entry = _cache_entry(f.resolve(), f.stat())
    entry.write_text(json.dumps({"sha256": "cached"}))
    assert file_sha256(f) == "cached"  # read from the cache, not re-hashed
    tmp = tmp_path / "new.bin"
    tmp.write_bytes(b"b" * 1000)  # same size, replaced in place
    os.replace(tmp, f)
    assert file_sha256(f) not in ("cached", real)


def _hf_cfg(d: Path, run_dir: Path, n: int, *extra: str):
    return composed("model=hf", f"model.id={d / 'model'}", "model.dtype=float64", "model.device=cpu", "method=pld",
                    "task=jsonl", f"task.path={d / 'prompts.jsonl'}", f"task.num_samples={n}", "max_new_tokens=6",
                    "profile.enabled=false", "progress=false", "warmup_tokens=1", f"run_dir={run_dir}", *extra)


def test_new_weights_at_the_same_model_path_are_not_resumed_into(tmp_path):
    """issue 31 item 1: new weights at the same model.id path appended model B's samples to model A's."""
    from test_hf_draft import byte_tokenizer, save_model

    tok = byte_tokenizer()
    save_model(tmp_path / "model", 2, 0, tok)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Hello", "1 2 3", "abc")))
    run_dir = tmp_path / "run"
    runner.run(_hf_cfg(tmp_path, run_dir, 1))
    recorded = json.loads((run_dir / "config.json").read_text())["provenance"]["model"]
    assert recorded["path"] == str((tmp_path / "model").resolve()) and len(recorded["sha256"]) == 64
    samples = (run_dir / "samples.jsonl").read_text()
    save_model(tmp_path / "model", 2, 1, tok)  # other weights, same path
    with pytest.raises(SpecBenchError) as e:
        runner.run(_hf_cfg(tmp_path, run_dir, 2))
    msg = str(e.value)
    assert "other weights or inputs" in msg and "the model's weights" in msg and str(tmp_path / "model") in msg
    assert f"sha256 {recorded['sha256'][:8]} -> " in msg and "\n" not in msg
    assert (run_dir / "samples.jsonl").read_text() == samples  # nothing mixed
    runner.run(_hf_cfg(tmp_path, run_dir, 2, "overwrite=true"))  # the way out the line names
    assert len((run_dir / "samples.jsonl").read_text().splitlines()) == 2


def _save_exit_layer(seed: int) -> Path:
    from specbench.models.artifacts import save_checkpoint
    from specbench.methods.eesd import EarlyExit

    target = tiny_model()
    torch.manual_seed(seed)
    exit_ = EarlyExit(target, 2, "shared")
    with torch.no_grad():
        for p in exit_.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return save_checkpoint("eesd", target.key, exit_.structure(), exit_.state_dict(), {"steps": 1, "train_sequences": 1})


def test_a_replaced_exit_layer_is_not_resumed_into(tmp_path, data_dir):
    """issue 31 item 1: after a new training replaced the cached EESD exit layer, a resumption
    credited all samples to the new checkpoint though some were drafted by the old one."""
    path = _save_exit_layer(0)
    run_dir = tmp_path / "run"
    cfg = lambda n: make_cfg(run_dir, data_dir, "method=eesd", "control=fixed", "control.k=2", "method.n_layers=2",
                             "method.train_if_missing=false", f"task.num_samples={n}")  # noqa: E731
    runner.run(cfg(1))
    artifacts = json.loads((run_dir / "config.json").read_text())["provenance"]["artifacts"]
    assert artifacts["checkpoint"] == {"path": str(path.resolve()), "sha256": file_sha256(path)}
    samples = (run_dir / "samples.jsonl").read_text()
    assert _save_exit_layer(1) == path  # `python -m specbench.train` writes the same cache path
    with pytest.raises(SpecBenchError, match="other weights or inputs: checkpoint " + re.escape(str(path.resolve()))) as e:
        runner.run(cfg(2))
    assert "\n" not in str(e.value)
    assert (run_dir / "samples.jsonl").read_text() == samples


@pytest.mark.parametrize("method", [["method=rest"], ["method=samd", "method.aux=pld"]], ids=["rest", "samd"])
def test_a_corpus_rewritten_in_place_is_not_resumed_into(tmp_path, data_dir, method):
    """issue 42: `method=rest method.corpus=<file>`, one sample, the corpus rewritten in place, a
    resumption: sample 2 was drafted from another datastore than sample 1, without a word. SAM-Decoding
    reads the same corpus and datastore for its static automaton (it declared neither)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((data_dir / "retrieval_corpus.txt").read_text())
    run_dir = tmp_path / "run"
    cfg = lambda n: make_cfg(run_dir, data_dir, *method, f"method.corpus=[{corpus}]",  # noqa: E731
                             f"task.num_samples={n}")
    runner.run(cfg(1))
    artifacts = json.loads((run_dir / "config.json").read_text())["provenance"]["artifacts"]
    assert artifacts["corpus"] == {"path": str(corpus.resolve()), "sha256": file_sha256(corpus)}
    assert artifacts["datastore"]["path"].endswith(".npz") and len(artifacts["datastore"]["sha256"]) == 64
    samples = (run_dir / "samples.jsonl").read_text()
    corpus.write_text("an entirely different corpus " * 50)
    with pytest.raises(SpecBenchError, match="other weights or inputs: corpus " + re.escape(str(corpus.resolve()))) as e:
        runner.run(cfg(2))
    assert "datastore" in str(e.value) and "\n" not in str(e.value)
    assert (run_dir / "samples.jsonl").read_text() == samples  # nothing mixed


def test_every_declared_input_is_hashed(tmp_path):
    from specbench.run.provenance import artifact_provenance

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("a")
    b.write_text("b")
    out = artifact_provenance({}, {}, {"corpus": [a, b], "datastore": str(a), "store": b})
    assert set(out) == {"corpus.0", "corpus.1"}  # one entry per file: the same file under two keys once
    assert out["corpus.1"] == {"path": str(b.resolve()), "sha256": file_sha256(b)}


# -- run_dir -----------------------------------------------------------------------------------------
def test_run_dir_in_a_directory_that_is_not_a_run_is_refused_untouched(tmp_path, data_dir):
    """issue 31 item 3: pointed at a Hugging Face model dir, a run overwrote its config.json."""
    d = tmp_path / "hf-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (d / "model.safetensors").write_bytes(b"weights")
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    for extra in ([], ["overwrite=true"]):
        with pytest.raises(SpecBenchError, match=r"run_dir=.*hf-model' holds files that are not a specbench run "
                                                 r"\(config.json, model.safetensors\)"):
            runner.run(make_cfg(d, data_dir, *extra))
        assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # not even a lock file
    lone = tmp_path / "lone"  # a foreign config.json alone is not ours either
    lone.mkdir()
    (lone / "config.json").write_text("{}")
    with pytest.raises(SpecBenchError, match="not a specbench run"):
        runner.run(make_cfg(lone, data_dir))
    assert (lone / "config.json").read_text() == "{}"


def test_empty_run_dir_is_one_line_exit_2(tmp_path, data_dir):
    """issue 31 item 3: `run_dir=` wrote the run into the working directory; with overwrite=true a traceback."""
    for extra in ([], ["overwrite=true"]):
        with pytest.raises(SpecBenchError, match=r"run_dir='' is empty"):
            runner.run(make_cfg(tmp_path, data_dir, "run_dir=", *extra))
    before = sorted(tmp_path.iterdir())
    r = _cli(["run_dir=", "overwrite=true", *SMALL, f"task.data_dir={data_dir}"], tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == ["specbench: error: run_dir='' is empty; give a directory "
                                             "(default: results/runs/<model>/<task>/<run_name>)"]
    assert [p.name for p in tmp_path.iterdir() if p not in before] in ([], ["cli.log"])  # Hydra's log, no run


# -- the report's model identity ---------------------------------------------------------------------
def test_runs_of_different_models_of_one_name_are_never_pooled(tmp_path):
    """issue 31 item 2: two `model=hf` runs of different models, and two tiny seeds, were averaged
    as repeats ("2 runs in 1 systems")."""
    hf = lambda i, p: {"model": {"name": "hf", "id": i}, "provenance": {"model": {"path": p, "sha256": p * 8}}}  # noqa: E731
    make_run(tmp_path / "a", model="hf", extra=hf("/m/two-layers", "a"), m_tps=(150, 150, 150))
    make_run(tmp_path / "b", model="hf", extra=hf("/m/three-layers", "b"), m_tps=(300, 300, 300))
    make_run(tmp_path / "c", extra={"model": {"name": "tiny-llama", "seed": 0}})
    make_run(tmp_path / "d", extra={"model": {"name": "tiny-llama", "seed": 1}})
    out = report([tmp_path], tmp_path / "rep")
    assert len(out["groups"]) == 4 and all(len(g.runs) == 1 for g in out["groups"])
    models = sorted(g.first.model for g in out["groups"])
    assert models == ["hf (id=/m/three-layers, weights=bbbbbbbb)", "hf (id=/m/two-layers, weights=aaaaaaaa)",
                      "tiny-llama (seed=0)", "tiny-llama (seed=1)"]
    md = (tmp_path / "rep" / "tables.md").read_text()
    assert "hf (id=/m/two-layers" in md and "tiny-llama (seed=1)" in md


def test_same_weights_elsewhere_pool_and_new_weights_do_not(tmp_path):
    """The weights' hash, not where the file lay, tells models apart; trained artifacts of other
    hashes are other systems."""
    same = lambda p, h, ck: {"provenance": {"model": {"path": p, "sha256": h},  # noqa: E731
                                            "artifacts": {"checkpoint": {"path": p + ".ck", "sha256": ck}}}}
    make_run(tmp_path / "host1", seed=0, extra=same("/host1/m.gguf", "1" * 64, "c" * 64))
    make_run(tmp_path / "host2", seed=1, extra=same("/host2/m.gguf", "1" * 64, "c" * 64))
    runs = find_runs([tmp_path])
    assert len(report([tmp_path], tmp_path / "rep")["groups"]) == 1  # repeats: same model, same checkpoint
    make_run(tmp_path / "new", seed=2, extra=same("/host1/m.gguf", "2" * 64, "c" * 64))
    make_run(tmp_path / "retrained", seed=3, extra=same("/host1/m.gguf", "1" * 64, "d" * 64))
    groups = report([tmp_path], tmp_path / "rep2")["groups"]
    assert sorted(len(g.runs) for g in groups) == [1, 1, 2]
    assert sorted(g.label for g in groups) == ["vanilla_sd+fixed (checkpoint=cccccccc)", "vanilla_sd+fixed (checkpoint=cccccccc)",
                                               "vanilla_sd+fixed (checkpoint=dddddddd)"]
    assert len(runs) == 2


def test_declared_repeats_of_two_models_are_refused(tmp_path):
    for seed, model_id in enumerate(("/m/a", "/m/b")):
        make_run(tmp_path, model="hf", seed=seed, name=f"pld-fixed-seed{seed}", extra={"model": {"name": "hf", "id": model_id}})
    with pytest.raises(SpecBenchError, match=r"refusing to average .* differ in model \(hf \(id=/m/a\) vs hf \(id=/m/b\)\)"):
        report([tmp_path], tmp_path / "rep")
