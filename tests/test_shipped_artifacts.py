"""Published artifacts (specbench/published_artifacts, specbench/tools/publish.py) and EAGLE-3's
lm_head=target: a draft whose head is the target's rows is saved without them and derived at
load; a published float16 checkpoint is found when the cache holds none (and a local training
wins over it), loads strictly, decodes losslessly; every shipped file matches its recorded sha256."""

import json
from pathlib import Path

import pytest
import torch

from specbench.models import artifacts
from specbench.config import settings
from specbench.core.errors import SpecBenchError
from specbench.methods.eagle3_head import structure_of
from specbench.run.provenance import file_sha256
from specbench.tools.publish import publish, reads_init
from specbench.train.eagle3 import train_eagle3
from specbench.train.parts import FIRST_USE
from tests.helpers import ar_tokens, build, method_cfg, tiny_model, train_run
from tests.test_medusa import tiny_sequences, train_cfg

MCFG = {"name": "eagle3", "top_k": 3, "depth": 3, "num_nodes": 8, "draft_vocab_size": 48, "ttt_steps": 2,
        "layers": "auto", "lm_head": "target", "checkpoint": "auto"}


def trained(tmp_path, monkeypatch, mcfg=MCFG):
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    target = tiny_model()
    res = train_eagle3(target, train_cfg(mcfg, labels="target", epochs=2), tiny_sequences())
    return target, res["eagle3"]


def test_lm_head_target_is_not_saved_and_is_derived_at_load(tmp_path, monkeypatch):
    target, path = trained(tmp_path, monkeypatch)
    state = artifacts.read_checkpoint(path, "-")["state"]
    assert "lm_head.weight" not in state and "fc.weight" in state
    m = build("eagle3", target, method_cfg(**MCFG))
    assert m.info["head_trained"]
    assert torch.equal(m.head.lm_head.weight, target.lm_head.weight[m.head.target_ids()])
    prompt = tiny_sequences(1, seed=5)[0][0][:10]
    assert m.generate(prompt, 16, frozenset(), 0).tokens == ar_tokens(target, prompt, 16)


def test_a_checkpoint_with_its_own_head_is_refused_under_lm_head_target(tmp_path, monkeypatch):
    target, path = trained(tmp_path, monkeypatch, MCFG | {"lm_head": "trained"})
    with pytest.raises(SpecBenchError, match="was trained for .* not eagle3 .*lm_head.: .target"):
        build("eagle3", target, method_cfg(**MCFG | {"checkpoint": path}))


def test_a_published_checkpoint_is_found_and_a_local_training_wins(tmp_path, monkeypatch):
    target, path = trained(tmp_path, monkeypatch)
    monkeypatch.setattr(artifacts, "PUBLISHED", tmp_path / "published")
    shipped = publish(path, "python -m specbench.train method=eagle3 model=tiny-llama")
    info = json.loads(shipped.with_suffix(".json").read_text())
    assert info["sha256"] == file_sha256(shipped) and "tiny-llama" in info["command"]
    assert all(v.dtype in (torch.float16, torch.long, torch.bool) for v in
               artifacts._flatten(artifacts.read_checkpoint(shipped, "-")["state"]).values())
    cfg = train_run(MCFG)
    assert str(FIRST_USE["eagle3"](cfg, target)[0].path) == path  # the cache's own first
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "empty"))
    parts = FIRST_USE["eagle3"](cfg, target)
    assert parts[0].path == shipped and parts[0].path.is_file()  # first use trains nothing
    m = build("eagle3", target, method_cfg(**MCFG))
    assert m.info["checkpoint"] == str(shipped) and m.info["head_trained"]
    local = artifacts.read_checkpoint(path, "-")["state"]
    assert torch.equal(m.head.fc.weight, local["fc.weight"].half().to(m.head.fc.weight.dtype))
    prompt = tiny_sequences(1, seed=5)[0][0][:10]
    assert m.generate(prompt, 16, frozenset(), 0).tokens == ar_tokens(target, prompt, 16)


def test_structure_key_of_lm_head():
    trained = method_cfg("eagle3", layers="auto", draft_vocab_size=8, lm_head="trained")
    assert structure_of(trained) == {"layers": "auto", "draft_vocab_size": 8}
    assert structure_of(method_cfg("eagle3", draft_vocab_size=8, lm_head="target"))["lm_head"] == "target"
    with pytest.raises(SpecBenchError, match="unknown method.lm_head 'x'; allowed: target, trained"):
        structure_of(method_cfg("eagle3", lm_head="x"))


def test_an_altered_published_artifact_is_refused_before_anything_is_written(tmp_path, monkeypatch, data_dir):
    """issue 42: a published artifact whose bytes no longer matched its shipped sha256 was loaded and
    run, and the settings line printed the manifest's training record for the altered weights."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    import specbench.run.runner as runner
    from tests.test_runner import make_cfg

    target, path = trained(tmp_path, monkeypatch)
    monkeypatch.setattr(artifacts, "PUBLISHED", tmp_path / "published")
    shipped = publish(path, "python -m specbench.train method=eagle3 model=tiny-llama")
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "empty"))
    assert build("eagle3", target, method_cfg(**MCFG)).info["checkpoint"] == str(shipped)  # as shipped: loads
    with safe_open(str(shipped), framework="pt") as f:  # altered: still a valid, finite checkpoint, same metadata
        meta, flat = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    flat["fc.weight"] = flat["fc.weight"] * 2
    save_file(flat, str(shipped), metadata=meta)
    with pytest.raises(SpecBenchError, match=f"published artifact {shipped} does not match its shipped sha256") as e:
        build("eagle3", target, method_cfg(**MCFG))
    assert "\n" not in str(e.value) and "train your own" in str(e.value)
    run_dir = tmp_path / "run"
    overrides = [f"method.{k}={v}" for k, v in MCFG.items() if k != "name"] + ["method.train_if_missing=false"]
    with pytest.raises(SpecBenchError, match="does not match its shipped sha256"):
        runner.run(make_cfg(run_dir, data_dir, "method=eagle3", *overrides))
    assert not run_dir.exists()  # nothing written
    shipped.with_suffix(".json").unlink()
    with pytest.raises(SpecBenchError, match="has no readable manifest"):
        build("eagle3", target, method_cfg(**MCFG))


def test_a_fine_tune_is_published_only_with_a_note_on_its_init(tmp_path, monkeypatch):
    path = trained(tmp_path, monkeypatch)[1]
    monkeypatch.setattr(artifacts, "PUBLISHED", tmp_path / "published")
    command = "python -m specbench.train method=eagle3 model=tiny-llama train.init=/scratch/init.safetensors"
    with pytest.raises(SpecBenchError, match="give --note"):
        publish(path, command)
    shipped = publish(path, command, note="train.init: git show abc:init.safetensors")
    assert json.loads(shipped.with_suffix(".json").read_text())["note"] == "train.init: git show abc:init.safetensors"
    # the record's command is what reruns it; a missing file is named as missing
    with pytest.raises(SpecBenchError, match="is not the command that made it; expected 'python -m specbench.train ...'"):
        publish(path, "make train")
    with pytest.raises(SpecBenchError, match="no checkpoint file"):
        publish(tmp_path / "nope.safetensors", command, note="x")
    # train.init=null starts from the target: no outside file, no note needed
    assert "note" not in json.loads(publish(path, command.replace("/scratch/init.safetensors", "null"))
                                    .with_suffix(".json").read_text())


SHIPPED = sorted(artifacts.PUBLISHED.rglob("*.safetensors")) if artifacts.PUBLISHED.is_dir() else []


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_artifact_matches_its_record(path):
    info = json.loads(path.with_suffix(".json").read_text())
    # issue 44's size bound: each shipped part at most ~25 MB in float16 (Hydra++'s 3 heads: 25.0 MB)
    assert info["sha256"] == file_sha256(path) and info["bytes"] == path.stat().st_size <= 25 * 2**20
    meta = artifacts.read_checkpoint(path, "-")
    assert path == artifacts.published_path(meta["kind"], meta["model_key"], meta["structure"])
    assert info["command"].startswith("python -m specbench.train ")
    # a fine-tune's command reads a file outside the package: its record says where that file is kept
    if reads_init(info["command"]):
        sha = meta["settings"]["init"]["sha256"]
        assert "git show " in info.get("note", "") and sha[:16] in info["note"], path.name


def test_a_published_eesd_exit_layer_and_cali_predictor_make_first_use_train_nothing(tmp_path, monkeypatch, data_dir):
    """issue 44: `make run` (EESD + Cali-TS) from an empty cache with both parts published trains
    nothing; the Cali-TS part was looked for in the cache only, so a shipped predictor was retrained
    (and the exit layer with it)."""
    from specbench.run.firstuse import missing_parts
    from specbench.train.__main__ import train
    from tests.test_eesd import _cfg

    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECBENCH_DATA_DIR", str(data_dir))
    cfg = _cfg("eesd", ["method.n_layers=2", "control=cali_ts"])
    out = train(cfg)
    monkeypatch.setattr(artifacts, "PUBLISHED", tmp_path / "published")
    shipped = [publish(Path(out[k]), "python -m specbench.train method=eesd model=tiny-llama") for k in ("eesd", "cali")]
    monkeypatch.setenv("SPECBENCH_CACHE_DIR", str(tmp_path / "empty"))
    target, run = tiny_model(), settings.of(cfg)
    parts = FIRST_USE["eesd"](run, target)
    assert sorted(p.path for p in parts) == sorted(shipped) and missing_parts(run, target) == []
    m = build("eesd", target, run.method)
    assert m.info["exit_trained"] and m.info["checkpoint"] == str(shipped[0])


SHIPPED_METHODS = {"eagle": "eagle", "eagle3": "eagle3", "eesd": "eesd", "cali": "eesd", "medusa": "medusa", "hydra": "hydra",
                   "vanilla_draft": "vanilla_sd", "space": "space"}  # kind -> the method loading it


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_artifact_is_what_its_methods_default_config_loads(path):
    """A shipped file whose structure is not the method's default (conf/method/*.yaml, the paper's
    controller) is never found by `checkpoint: auto`: dead weight, and `make run` would train."""
    import types

    from specbench.config.compose import compose
    from specbench.train.session import FIRST_USE as every  # imports every trainer module: the registry is whole

    kind = path.parent.name
    cfg = settings.of(compose([f"method={SHIPPED_METHODS[kind]}"]))
    # every part ships for the embedded model (30 decoder layers: vanilla-SD's `num_layers: auto` reads it)
    assert path.parent.parent.name.startswith("smollm2-135m-")
    target = types.SimpleNamespace(key=path.parent.parent.name, num_layers=30)
    assert path in [p.path for p in every[cfg.method.name](cfg, target)]


SHIPPED_SKIP = sorted(artifacts.PUBLISHED.glob("*/self_sd/*.json")) if artifacts.PUBLISHED.is_dir() else []
SHIPPED_SKIP = [p for p in SHIPPED_SKIP if not p.name.endswith(".sha256.json")]


@pytest.mark.parametrize("path", SHIPPED_SKIP, ids=[p.name for p in SHIPPED_SKIP])
def test_every_shipped_skip_set_matches_its_record_and_is_what_self_sd_loads(path):
    """issue 44: Self-SD's searched skip set ships like a checkpoint (tools/publish.py): its record holds
    the sha256 and the search command, and `method=self_sd` (skip.source: auto) with an empty cache loads
    it for the embedded model, so first use searches nothing."""
    import types

    from specbench.config.compose import compose
    from specbench.methods.self_sd import resolve_skip
    from specbench.train.session import FIRST_USE as every

    info = json.loads(artifacts.manifest_path(path).read_text())
    result = json.loads(path.read_text())
    assert info["sha256"] == file_sha256(path) and info["bytes"] == path.stat().st_size
    assert info["command"].startswith("python -m specbench.tools.skipsearch ") and result["command"] == info["command"]
    assert info["skip"] == result["skip"] and result["model_key"] == path.parent.parent.name
    cfg = settings.of(compose(["method=self_sd"]))
    target = types.SimpleNamespace(key=result["model_key"], name="smollm2-135m", num_layers=result["num_layers"])
    skip, described = resolve_skip(target, cfg.method.skip)
    assert described["skip_file"] == str(path) and sorted(skip.attn) == result["skip"]["attn"]
    assert [p.path for p in every["self_sd"](cfg, target)] == [path]
