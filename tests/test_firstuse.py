"""A fresh machine: every method and every task run from an empty artifact cache on the tiny model
(missing trained parts are trained on first use), paper-default settings, and what may never be
cached or trusted (untrained checkpoints, crafted or damaged files)."""

import json
import os
import threading
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import specbench.run.runner as runner
from helpers import CONF
from specbench.models import artifacts
from specbench.run import firstuse
from specbench.core.errors import SpecBenchError
from specbench.methods import METHODS as REGISTERED
from specbench.models import load_model
from specbench.config.settings import of
from specbench.train.session import FIRST_USE, TRAINERS

# a tiny first-use budget: seconds on the tiny model
TINY_BUDGET = [
    "train.first_use.train.data.num_prompts=3", "train.first_use.train.data.num_original=2",
    "train.first_use.train.data.max_new_tokens=8", "train.first_use.train.data.batch_size=3",
    "train.first_use.train.epochs=1", "train.first_use.train.batch_size=3", "train.first_use.train.max_len=1024",
    "train.first_use.train.eval_fraction=0.3", "train.first_use.train.cali_predictor.pairs_per_sequence=4",
    "train.first_use.train.cali_predictor.epochs=1", "train.first_use.skip_search.iterations=2",
    "train.first_use.skip_search.num_prompts=1", "train.first_use.skip_search.max_new_tokens=8",
]
# every registered method, from the registry; hf_assisted sorts before vanilla_sd, which then finds
# the draft hf_assisted trained (the one checkpoint both load); samd's auxiliary (EAGLE-2 by default)
# finds the head eagle trained
METHODS = sorted(REGISTERED)
SHARES_AN_EARLIER_PART = {"vanilla_sd", "samd"}
TASKS = ["gsm8k", "xsum", "humaneval", "mt_bench", "jsonl"]
TRAINED = {  # method -> describe() key saying its trained part was loaded
    "vanilla_sd": "draft_trained", "hf_assisted": "draft_trained", "eesd": "exit_trained", "medusa": "heads_trained", "eagle": "head_trained", "eagle3": "head_trained",
    "space": "space_trained",
}


def cfg_for(tmp_path, data_dir, *extra):
    overrides = ["model=tiny-llama", "task.num_samples=2", f"task.data_dir={data_dir}", "max_new_tokens=12",
                 "profile.enabled=false", "warmup_tokens=2", f"run_dir={tmp_path / 'run'}", "progress=false",
                 "threads=1", *TINY_BUDGET, *extra]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache for the runs below: empty at the first; the self-distillation data generated
    there is reused, but every method still trains its own part on first use."""
    return tmp_path_factory.mktemp("shared-cache")


@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_from_an_empty_cache(method, tmp_path, data_dir, shared_cache, monkeypatch):
    """`method=X task=gsm8k task.num_samples=2` with X's trained part missing: trains it, then runs
    losslessly with the trained part (not an untrained stand-in)."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(shared_cache))
    cfg = cfg_for(tmp_path, data_dir, f"method={method}", "task=gsm8k")
    target = load_model(of(cfg).model)
    missing = firstuse.missing_parts(of(cfg), target)
    assert bool(missing) == (method in FIRST_USE and method not in SHARES_AN_EARLIER_PART)
    assert all(p.train in TRAINERS for p in missing if isinstance(p.train, str))
    s = runner.run(cfg, target)
    assert not firstuse.missing_parts(of(cfg), target)
    assert s["samples"] == 2 and s["matches_ar"] == 2
    settings = s["meta"]["method_settings"]
    if TRAINED.get(method):
        assert settings[TRAINED[method]] is True
    if method == "samd":  # its auxiliary's trained head, not an untrained stand-in
        assert settings["aux"] == "eagle" and settings["aux_settings"]["head_trained"] is True
    if method == "self_sd":
        assert settings["skip_source"] == "search"
    if method == "eesd":
        assert settings.get("cali_predictor")  # Cali-TS (the paper default) got its trained predictor


@pytest.mark.parametrize("task", TASKS)
def test_every_task_runs_with_first_use_training(task, tmp_path, data_dir, shared_cache, monkeypatch):
    """EESD (trained on first use, once, in the cache shared with the cases above) on every task."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(shared_cache))
    extra = []
    if task == "jsonl":
        path = tmp_path / "prompts.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(3)))
        extra = [f"task.path={path}"]
    s = runner.run(cfg_for(tmp_path, data_dir, "method=eesd", f"task={task}", *extra))
    assert s["samples"] == 2 and s["matches_ar"] == 2 and s["meta"]["method_settings"]["exit_trained"]


def test_train_if_missing_false_keeps_the_error_with_the_command(tmp_path, data_dir):
    with pytest.raises(SpecBenchError, match="python -m specbench.train method=eesd"):
        runner.run(cfg_for(tmp_path, data_dir, "method=eesd", "method.train_if_missing=false"))
    assert not (artifacts.cache_dir() / "eesd").exists()


def test_large_models_are_never_trained_silently(tmp_path, data_dir):
    with pytest.raises(SpecBenchError, match="python -m specbench.train method=medusa"):
        runner.run(cfg_for(tmp_path, data_dir, "method=medusa", "train.first_use.max_params=1000"))
    assert not (artifacts.cache_dir() / "distill").exists()


def test_paper_defaults():
    def composed(*o):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=list(o))

    assert composed("method=eesd").control.name == "cali_ts"
    assert composed("method=self_sd").control.name == "adaptive_threshold"
    assert composed("method=self_sd").method.skip.source == "auto"  # -> the searched set (first use)
    assert composed("method=medusa").method.tree_from_accuracies == 63
    assert composed("method=space").method.k == 5
    assert composed("method=eesd", "control=beta_ts").control.name == "beta_ts"  # the command line wins


# -- the cache -------------------------------------------------------------------------------------
def test_cache_dir_resolution_is_independent_of_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", "rel")
    assert artifacts.cache_dir() == tmp_path / "rel"  # made absolute once, where it was given
    monkeypatch.delenv("SPECBENCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert artifacts.cache_dir() == tmp_path / "xdg" / "specbench"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert artifacts.cache_dir() == tmp_path / "home" / ".cache" / "specbench"


SETTINGS = {"steps": 3, "train_sequences": 5, "held_out_agreement_before": 0.1, "held_out_agreement_after": 0.4}


def test_concurrent_first_uses_leave_a_whole_checkpoint():
    """Many writers of the same checkpoint at once: no writer fails, the file is whole."""
    state = {"w": torch.arange(200_000, dtype=torch.float32)}
    errors = []

    def write():
        try:
            artifacts.save_checkpoint("eesd", "m", {"n": 1}, state, SETTINGS)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ckpt = artifacts.load_checkpoint("eesd", "m", {"n": 1})
    assert torch.equal(ckpt["state"]["w"], state["w"]) and ckpt["settings"]["steps"] == 3
    assert [p.name for p in Path(ckpt["path"]).parent.iterdir()] == [Path(ckpt["path"]).name]  # no temp files left


def test_untrained_checkpoints_are_never_cached():
    for bad in ({"steps": 0, "train_sequences": 5}, {"steps": 4, "train_sequences": 0}, {}):
        with pytest.raises(SpecBenchError, match="nothing was learned"):
            artifacts.save_checkpoint("eesd", "m", {"n": 1}, {"w": torch.zeros(2)}, bad)
    assert not artifacts.checkpoint_path("eesd", "m", {"n": 1}).exists()


def test_zero_step_training_is_an_error(tmp_path, data_dir):
    with pytest.raises(SpecBenchError, match="no checkpoint written"):
        runner.run(cfg_for(tmp_path, data_dir, "method=eesd", "train.first_use.train.max_minutes=0"))
    assert not (artifacts.cache_dir() / "eesd").exists()


# -- nothing trusted blindly -------------------------------------------------------------------------
class Bomb:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_bomb_checkpoint_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    path = artifacts.checkpoint_path("eesd", "m", {"n": 1})
    path.parent.mkdir(parents=True)
    for target in (path, tmp_path / "given.pt"):
        torch.save({"state": Bomb(marker)}, target)  # what torch.load(weights_only=False) would execute
        for where in ("auto", str(target)):
            with pytest.raises(SpecBenchError, match="damaged or not a specbench checkpoint") as e:
                artifacts.load_checkpoint("eesd", "m", {"n": 1}, where)
            assert "\n" not in str(e.value) and "re-create it with" in str(e.value)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["empty", "truncated", "random"])
def test_damaged_checkpoints_are_one_line_errors_naming_the_file(damage):
    path = artifacts.save_checkpoint("medusa", "m", {"num_heads": 1, "share_head": False},
                                     {"w": torch.randn(1000)}, SETTINGS)
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[: len(data) // 2], "random": os.urandom(len(data))}[damage])
    with pytest.raises(SpecBenchError) as e:
        artifacts.load_checkpoint("medusa", "m", {"num_heads": 1, "share_head": False}, model_name="tiny-llama")
    msg = str(e.value)
    assert str(path) in msg and "python -m specbench.train method=medusa model=tiny-llama" in msg and "\n" not in msg


def test_first_use_registry_matches_the_methods_and_trainers():
    """Parts are declared for registered methods only, and a method with a trainer of its own
    declares what it loads (else it could never be trained on first use)."""
    assert set(FIRST_USE) <= set(REGISTERED), set(FIRST_USE) - set(REGISTERED)
    assert set(TRAINERS) & set(REGISTERED) <= set(FIRST_USE), (set(TRAINERS) & set(REGISTERED)) - set(FIRST_USE)


def test_a_method_without_a_paper_control_file_gets_the_fallback(tmp_path):
    """conf/control/paper/<method>.yaml is optional: without it `fixed`, and control= still wins."""
    import shutil

    from specbench.config.compose import PAPER_CONTROL_FALLBACK, register_paper_control_fallbacks

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "method" / "brand_new.yaml").write_text("name: brand_new\n")
    # vLLM engine methods (conf/method/vllm/) have no paper controller: they get the fallback too
    assert [m for m in register_paper_control_fallbacks(conf) if not m.startswith("vllm/")] == ["brand_new"]

    def composed(*o):
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            return compose("config", overrides=list(o))

    assert composed("method=brand_new").control.name == PAPER_CONTROL_FALLBACK == "fixed"
    assert composed("method=brand_new", "control=beta_ts").control.name == "beta_ts"
    assert composed("method=eesd").control.name == "cali_ts"  # a file, where there is one, is used


def test_medusa2_trains_on_first_use(tmp_path, data_dir, monkeypatch):
    """method.variant=medusa2 is its own trained part (backbone + heads): trained once, then lossless
    with respect to the fine-tuned weights, with the original weights' row beside it."""
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cache"))
    cfg = cfg_for(tmp_path, data_dir, "method=medusa", "method.variant=medusa2", "task=gsm8k")
    target = load_model(of(cfg).model)
    assert [p.path.parent.name for p in firstuse.missing_parts(of(cfg), target)] == ["medusa2"]
    s = runner.run(cfg, target)
    assert not firstuse.missing_parts(of(cfg), target)
    assert s["samples"] == 2 and s["matches_ar"] == 2 and "base" in s
    assert s["meta"]["method_settings"]["heads_trained"] is True
