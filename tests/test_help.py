"""`--help`: ours (what the tool does, options, the choices in conf/, examples), not Hydra's dump."""

import shlex
import subprocess
import sys

import pytest

from specbench.config.compose import CONF_DIR, precheck
from specbench.config.help import main_help, train_help
from tests.conftest import REPO


def examples(text: str) -> list[list[str]]:
    block = text.split("examples:\n", 1)[1].split("\n\n", 1)[0]
    return [shlex.split(line)[3:] for line in block.splitlines()]  # after `python -m <module>`


def test_help_is_ours_and_lists_every_method_and_task():
    r = subprocess.run([sys.executable, "-m", "specbench", "--help"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0 and r.stderr == ""
    out = r.stdout
    assert out.startswith("specbench: benchmark lossless speculative decoding") and "Powered by Hydra" not in out
    for group in ("method", "task"):
        listed = out.split(f"{group}s (conf/{group}):\n", 1)[1].split("\n\n", 1)[0]
        assert [ln.split()[0] for ln in listed.splitlines()] == sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    for key in ("method=", "task=", "model=", "control=", "sampling.temperature=", "max_new_tokens=",
                "run_dir=", "run_name=", "overwrite=", "-m "):
        assert key in out, key
    assert len(examples(out)) == 3


@pytest.mark.parametrize("args", examples(main_help()), ids=" ".join)
def test_help_examples_are_valid_commands(args):
    precheck(args)  # bad input would exit 2 (a sweep: every combination)


def test_train_help_names_only_methods_one_can_pass():
    text = train_help(["eesd", "medusa", "medusa2"])
    assert "methods with trained parts: eesd, medusa\n" in text and len(examples(text)) == 3
