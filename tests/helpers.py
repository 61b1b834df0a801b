"""Shared helpers for tests on tiny random models (CPU, float64, byte tokenizer).

`tiny_model(**overrides)` builds (once per distinct config) a tiny-llama adapter exactly as
`model=tiny-llama` does; `method_cfg(...)` a method's settings from conf/method/<name>.yaml;
`build(...)` a method with the run values the runner passes (`run_values`, the control settings in them).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from specbench.config import schema, settings
from specbench.config.compose import compose
from specbench.engine.sampling import SamplingConfig
from specbench.methods import build_method
from specbench.models import apply_backend, load_model

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"

GREEDY = SamplingConfig()

# One intra-op thread: the tiny models' ops are far too small to gain from more, and on a shared
# 2-core machine a second thread makes every forward 10-20x slower under contention.
torch.set_num_threads(1)


# what the trainers' unit tests change in conf/train/default.yaml: a fixed rate without warm-up, the
# text's next tokens as labels, an epoch bound, no held-out curve and no resume states
UNIT_TRAIN = {"schedule": "constant", "warmup_steps": 0, "labels": "text", "max_steps": None, "eval_every": None,
              "checkpoint_every": None}


def train_run(method: dict, **train):
    """The run settings a trainer gets for `python -m specbench.train model=tiny-llama method=<name>`:
    the method's keys (`method["name"]`, TEST_METHOD's, then `method`'s) and UNIT_TRAIN then `train`
    over conf/'s."""
    name = method["name"]
    own = {k: v for k, v in method.items() if k != "name"}
    return settings.merge(run_settings(f"method={name}"), {"method": TEST_METHOD.get(name, {})}, {"method": own},
                          {"train": UNIT_TRAIN | train})


def train_settings(**overrides):
    """conf/train/default.yaml's settings (the composed run's `train`) with `overrides`."""
    return settings.merge(run_settings().train, overrides)


def tiny_settings(**overrides):
    """conf/model/tiny-llama.yaml's settings with `overrides`."""
    return settings.shipped("model", "tiny-llama", overrides)


def task_settings(name: str, **overrides):
    """conf/task/<name>.yaml's settings with `overrides`."""
    return settings.shipped("task", name, overrides)


@functools.lru_cache(maxsize=None)
def _tiny(frozen: str):
    return load_model(tiny_settings(**json.loads(frozen)))


@functools.lru_cache(maxsize=None)
def _run_settings(argv: tuple):
    return settings.of(compose(list(argv)))


def run_settings(*argv: str):
    """The whole run's settings for a command line (model=tiny-llama unless given), composed from
    conf/ as `python -m specbench` composes them (cached: settings are frozen)."""
    model = () if any(a.startswith("model=") for a in argv) else ("model=tiny-llama",)
    return _run_settings((*model, *argv))


def tiny_model(**overrides):
    """A tiny-llama adapter (cached per config: treat it as read-only)."""
    return _tiny(json.dumps(overrides, sort_keys=True))


def q4_tiny_model(backend: str):
    """A private float32 tiny model whose linear weights went through Q4_1 (quantized and
    dequantized by gguf-py): the embedded model's situation, so `ggml` runs its Q4_1 kernel."""
    from gguf import GGMLQuantizationType, quants

    target = copy.deepcopy(tiny_model(dtype="float32", init_std=0.3))
    q4 = GGMLQuantizationType.Q4_1
    with torch.no_grad():
        for m in target.model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(torch.from_numpy(quants.dequantize(quants.quantize(m.weight.numpy(), q4), q4).copy()))
    apply_backend(target.model, backend)
    return target


def control_settings(name: str = "fixed", **overrides):
    """conf/control/<name>.yaml's settings with `overrides` (fixed: k_max follows k, as composed)."""
    return settings.shipped("control", name, overrides)


def control(name: str = "fixed", k: int = 4, **kw):
    """conf/control/<name>.yaml's settings capped at k (fixed: K = k)."""
    return control_settings(name, **({"k": k} if name == "fixed" else {"k_max": k}), **kw)


def controller(name: str, seed: int = 0, **overrides):
    """The controller conf/control/<name>.yaml builds, with `overrides`."""
    from specbench.control import build_controller

    return build_controller(control_settings(name, **overrides), seed=seed)


def controller_args(name: str, **overrides) -> dict:
    """conf/control/<name>.yaml's keys as a controller class's arguments (seed 0): for a test that
    hands it what no config holds (a CaliPredictor object)."""
    args = settings.record(control_settings(name, **overrides))
    del args["name"]
    return args | {"seed": 0}


# what the tests change in conf/method/<name>.yaml so that a method builds on the 4-layer tiny model with
# nothing trained (other keys: as shipped)
TEST_METHOD = {
    "vanilla_sd": {"draft": {"num_layers": 1, "checkpoint": None}},  # a 1-layer draft, untrained
    "hf_assisted": {"draft": {"num_layers": 1, "checkpoint": None}},
    "medusa": {"tree_from_accuracies": None},  # untrained heads have no accuracies: a tree or sizes, else the default dense one
}


def method_cfg(name: str = "vanilla_sd", **kw):
    """conf/method/<name>.yaml's settings, TEST_METHOD's and then `kw` merged over them (`allow_untrained`
    only where the method has the key: a test of every method may pass it to all)."""
    if "allow_untrained" not in schema.METHODS.get(name, {}):
        kw.pop("allow_untrained", None)
    return settings.shipped("method", name, TEST_METHOD.get(name, {}), kw)


def run_values(ctrl=None, **kw) -> settings.RunValues:
    """The run values a method gets from `python -m specbench model=tiny-llama` (conf/config.yaml), with
    the control settings `ctrl` (default: conf/control/fixed.yaml) and the data dir of this moment."""
    values = settings.run_values(run_settings("control=fixed"))
    kw = {"data_dir": os.environ.get("SPECBENCH_DATA_DIR"), **kw}
    return dataclasses.replace(values, control=ctrl if ctrl is not None else values.control, **kw)


def build(name: str, target, cfg=None, sampling: SamplingConfig = GREEDY, ctrl=None, **values):
    cfg = cfg if cfg is not None else method_cfg(name)
    return build_method(name, target, cfg, sampling, run_values(ctrl, **values))


@torch.no_grad()  # as the runner does: with grad on, a backend's layers run F.linear (training)
def ar_tokens(target, prompt, max_new, eos_ids=frozenset(), seed=0, sampling: SamplingConfig = GREEDY) -> list[int]:
    return build("ar", target, method_cfg("ar"), sampling).generate(prompt, max_new, eos_ids, seed).tokens


def run_cli(args: list[str], data_dir, timeout: int = 300, **env_extra) -> subprocess.CompletedProcess:
    """`python -m specbench ARGS` from the repo root (conf is found relative to the package)."""
    env = dict(os.environ, SPECBENCH_DATA_DIR=str(data_dir), **env_extra)
    return subprocess.run(
        [sys.executable, "-m", "specbench", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def start_cli(args: list[str], data_dir, **env_extra) -> subprocess.Popen:
    """Like run_cli, without waiting (several CLI runs can overlap)."""
    env = dict(os.environ, SPECBENCH_DATA_DIR=str(data_dir), **env_extra)
    return subprocess.Popen(
        [sys.executable, "-m", "specbench", *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def write_released(path: Path, state: dict, config: dict, fmt: str = "safetensors", embed=None, drop=None, rename=None,
                   conf=None, state_fix=None) -> dict:
    """A synthetic released draft (EAGLE, EAGLE-3) in its authors' layout: config.json (`config`
    updated by `conf`) and the weights as model.safetensors or pytorch_model.bin, after the edits
    a bad-release test asks for: `embed` added as embed_tokens.weight (SpecForge keeps it), key
    `drop` removed, key rename[0] renamed rename[1], `state_fix(state)`. Returns the saved state."""
    state = {k: v.clone() for k, v in state.items()}
    if embed is not None:
        state["embed_tokens.weight"] = embed.detach().clone()
    if drop:
        state.pop(drop)
    if rename:
        state[rename[1]] = state.pop(rename[0])
    if state_fix:
        state_fix(state)
    (path / "config.json").write_text(json.dumps(config | (conf or {})))
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path / "model.safetensors"))
    else:
        torch.save(state, path / "pytorch_model.bin")
    return state
