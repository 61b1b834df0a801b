"""`--help` of `python -m specbench` and `python -m specbench.train`: what the tool does, its
main options, the choices found in conf/ (each with the first comment line of its file, so a new
method or task shows up without touching this file) and example commands. Hydra's generic help
(config groups and a config dump) stays available as `--hydra-help`."""

from __future__ import annotations

from specbench.config.compose import CONF_DIR

HELP_FLAGS = ("--help", "-h")


def wants_help(argv: list[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv)


def choices(group: str) -> list[tuple[str, str]]:
    """(name, description) of every conf/<group>/*.yaml; the description is the file's first
    comment line ('' where the file starts with a key or a package directive)."""
    out = []
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        first = next((ln for ln in path.read_text().splitlines() if ln.strip()), "")
        text = first.lstrip("# ").strip() if first.startswith("#") and not first.startswith("# @package") else ""
        out.append((path.stem, text))
    return out


def listing(group: str, width: int = 14, limit: int = 96) -> str:
    lines = []
    for name, text in choices(group):
        text = text if len(text) <= limit else text[: limit - 3].rstrip() + "..."
        lines.append(f"  {name:<{width}} {text}".rstrip())
    return "\n".join(lines)


def names(group: str) -> str:
    return ", ".join(name for name, _ in choices(group))


OPTIONS = """\
  method=NAME            the decoding method to compare with AR (below)
  task=NAME              the workload (below); task.num_samples=N (default: the task's), task.data_dir=DIR
  model=NAME             the target model (default: smollm2-135m, the embedded one); model=hf model.id=HUB_ID
  control=NAME           how many tokens to draft per step (default: the method's paper choice); control.k=K
  sampling.temperature=T 0 (default): greedy; > 0: sampling (also sampling.top_p, sampling.top_k)
  max_new_tokens=N       new tokens per reply (default: the task's)
  run_dir=DIR            where results go (default: results/runs/<model>/<task>/<run_name>); or run_name=NAME
  overwrite=true         discard the run dir's stored samples and start again (default: resume)
  threads=N              torch CPU threads; seed=N; progress=false; timing=coarse
  -m a=x,y b=z           a sweep: one run per combination (docs/sweeps.md); +experiment=NAME: a preset
  --hydra-help           Hydra's own help (every config group, the full configuration)"""


def main_help() -> str:
    return f"""\
specbench: benchmark lossless speculative decoding against plain autoregressive (AR) decoding.
Runs a method and AR on the same samples of a task, interleaved in one process, checks the
method's output against AR's, and records speedup (with a confidence interval), acceptance
metrics and a timing breakdown in the run dir (summary.json, samples.jsonl).

usage: python -m specbench [method=NAME] [task=NAME] [key=value ...]
       python -m specbench -m key=a,b [key=value ...]

options (key=value, Hydra overrides; any key of conf/config.yaml and its groups):
{OPTIONS}

methods (conf/method):
{listing("method")}

tasks (conf/task):
{listing("task")}

models (conf/model): {names("model")}
controllers (conf/control): {names("control")}
presets (+experiment=, conf/experiment): {names("experiment")}

examples:
  python -m specbench method=eesd task=gsm8k task.num_samples=3
  python -m specbench method=pld task=humaneval sampling.temperature=1.0 max_new_tokens=256
  python -m specbench -m method=pld control.k=2,4,8 model=tiny-llama task.num_samples=2

Train a method's parts ahead of time: python -m specbench.train --help. Tables and plots of
finished runs: python -m specbench.report RUN_DIR ..."""


def train_help(trainable: list[str]) -> str:
    return f"""\
specbench.train: train a method's draft parts on the target's own outputs (self-distillation on
GSM8K *train* prompts) and cache the checkpoint where `python -m specbench` looks for it. A run
trains a missing part once on first use with a small budget (train.first_use); this command
trains with the full one (conf/train/default.yaml).

usage: python -m specbench.train method=NAME [model=NAME] [train.key=value ...]

methods with trained parts: {", ".join(m for m in trainable if m in names("method").split(", "))}
models (conf/model): {names("model")}

options: model=, method.* (the part's structure), train.max_steps= (optimiser steps; or train.epochs=),
  train.max_sequences=, train.data.num_prompts=, train.schedule=, train.eval_every=, train.seed=;
  an interrupted run resumes (train.checkpoint_every); SPECBENCH_DATA_DIR: the data folder.
  Plot held-out acceptance vs steps: python -m specbench.train.curves <artifact>.log.json -o curves.png

examples:
  python -m specbench.train method=eesd
  python -m specbench.train method=medusa train.max_steps=400
  python -m specbench.train method=vanilla_sd model=tiny-llama train.epochs=1"""
