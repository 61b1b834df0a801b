"""`python -m specbench ...` in a subprocess: end-to-end runs, and one-line errors for bad input.

Every case runs from the repo root (conf/ is found relative to the package) with its own run_dir
under a tmp dir. The processes are started together (a few at a time) in one module fixture: each
pays ~5 s of imports, so running them one by one would dominate the suite's time.
"""

import json
import os
import time
from pathlib import Path

import pytest

from helpers import start_cli

TINY = ["model=tiny-llama", "task=gsm8k", "profile.enabled=false", "progress=false", "threads=1"]
DRAFT = ["method.draft.num_layers=1", "method.draft.checkpoint=null"]
E2E = ["task.num_samples=2", "max_new_tokens=12"]

# name -> (args, extra env); "{tmp}" is replaced by the case's tmp dir
CASES: dict[str, tuple[list[str], dict]] = {
    "e2e_vanilla_sd": (TINY + E2E + DRAFT + ["method=vanilla_sd"], {}),
    # the forward-cost profile on: predicted and eq.14 speedups are printed too
    "e2e_pld": (TINY + E2E + ["method=pld", "profile.enabled=true", "profile.reps=1", "profile.context=20"], {}),
    "e2e_eagle": (TINY + E2E + ["method=eagle", "method.allow_untrained=true"], {}),
    "unknown_method": (TINY + ["method=nope"], {}),
    "unknown_task": (TINY + ["task=nope"], {}),
    "unknown_model": (TINY + ["model=nope"], {}),
    "unknown_control": (TINY + DRAFT + ["control=nope"], {}),
    "control_k_zero": (TINY + DRAFT + ["control.k=0"], {}),
    "max_new_tokens_zero": (TINY + DRAFT + ["max_new_tokens=0"], {}),
    "too_many_samples": (TINY + DRAFT + ["task.num_samples=100000"], {}),
    "missing_data_dir": (TINY + DRAFT + ["task.num_samples=2"], {"SPECBENCH_DATA_DIR": "{tmp}/empty"}),
    "hf_model_missing": (TINY + ["model=hf", "model.id=/nonexistent/path", "method=pld"], {}),
    "unreadable_gguf": (TINY + ["model=smollm2-135m", "model.path={tmp}/garbage.gguf", "method=pld"], {}),
    "draft_other_tokenizer": (
        TINY + ["method.draft.source=hf", "method.draft.id={tmp}/other_tok_model", "method.draft.device=cpu", "task.num_samples=1"],
        {},
    ),
    "max_new_tokens_not_int": (TINY + DRAFT + ["max_new_tokens=abc"], {}),
    "unknown_key": (TINY + DRAFT + ["no_such_key=1"], {}),
    # every bad value: one line, exit 2, and no run dir left behind (issue 10)
    "k_not_a_number": (TINY + DRAFT + ["control.k=abc"], {}),
    "temperature_not_a_number": (TINY + DRAFT + ["sampling.temperature=hot"], {}),
    "num_samples_not_a_number": (TINY + DRAFT + ["task.num_samples=ten"], {}),
    "seed_not_a_number": (TINY + DRAFT + ["seed=abc"], {}),
    "threads_zero": (TINY[:-1] + DRAFT + ["threads=0"], {}),
    "top_p_above_one": (TINY + DRAFT + ["sampling.top_p=1.5"], {}),
    "top_p_zero": (TINY + DRAFT + ["sampling.top_p=0"], {}),
    "top_k_negative": (TINY + DRAFT + ["sampling.top_k=-1"], {}),
    "num_samples_fraction": (TINY + DRAFT + ["task.num_samples=2.5"], {}),
    "pld_max_below_min": (TINY + ["method=pld", "method.max_ngram=1", "method.min_ngram=2"], {}),
    "pld_max_zero": (TINY + ["method=pld", "method.max_ngram=0"], {}),
    "empty_split_all": (TINY + ["method=pld", "task.num_samples=all", "task.data_dir={tmp}/emptysplit"], {}),
    "prompt_longer_than_context": (TINY + ["method=pld", "task=jsonl", "task.path={tmp}/long.jsonl"], {}),
    "jsonl_not_utf8": (TINY + ["method=pld", "task=jsonl", "task.path={tmp}/latin1.jsonl"], {}),
    "hf_dir_not_a_model": (TINY + ["model=hf", "model.id={tmp}/empty", "method=pld"], {}),
    "humaneval_timeout_zero": (TINY + ["method=pld", "task=humaneval", "task.timeout_s=0"], {}),
    "humaneval_memory_negative": (TINY + ["method=pld", "task=humaneval", "task.memory_mb=-1"], {}),
    "multirun_unknown_key": (["-m"] + TINY + ["method=pld", "nokey=1,2"], {}),
    "multirun_bad_value": (["-m"] + TINY + DRAFT + ["control.k=1,abc"], {}),
    "experiment_unknown": (TINY + ["+experiment=bogus"], {}),
    "experiment_bad_value": (TINY + DRAFT + ["+experiment=repeats", "control.k=abc"], {}),
    "eagle_released_no_config": (TINY + ["method=eagle", "method.checkpoint={tmp}/empty"], {}),
}
ERRORS = [c for c in CASES if not c.startswith("e2e")]


def make_other_tokenizer_model(path: Path) -> None:
    """A local Hugging Face Llama whose tokenizer (a word-level one built here, no download) is not
    the target's byte tokenizer."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "the", "a", "cat", "sat", "on", "mat", "."])}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    hf_tok.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, bos_token_id=1, eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(path)


@pytest.fixture(scope="module")
def cli(tmp_path_factory, data_dir):
    """Run every case; returns name -> (returncode, stdout, stderr, run_dir)."""
    root = tmp_path_factory.mktemp("cli")
    (root / "empty").mkdir()
    (root / "garbage.gguf").write_bytes(os.urandom(4096))
    (root / "emptysplit" / "gsm8k").mkdir(parents=True)
    (root / "emptysplit" / "gsm8k" / "test.jsonl").write_text("")
    (root / "emptysplit" / "gsm8k" / "train.jsonl").write_text((data_dir / "gsm8k" / "train.jsonl").read_text())
    (root / "long.jsonl").write_text('{"prompt": "short"}\n' + json.dumps({"prompt": "x" * 5000}) + "\n")
    (root / "latin1.jsonl").write_bytes('{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    make_other_tokenizer_model(root / "other_tok_model")
    pending = []
    for name, (args, env) in CASES.items():
        run_dir = root / "runs" / name
        args = [a.replace("{tmp}", str(root)) for a in args] + [f"run_dir={run_dir}"]
        env = {k: v.replace("{tmp}", str(root)) for k, v in env.items()}
        pending.append((name, args, env, run_dir))
    results, running = {}, []
    deadline = time.monotonic() + 600
    while pending or running:
        while pending and len(running) < 3:
            name, args, env, run_dir = pending.pop(0)
            env = {"SPECBENCH_DATA_DIR": str(data_dir), **env}
            running.append((name, run_dir, start_cli(args, env.pop("SPECBENCH_DATA_DIR"), **env)))
        for item in list(running):
            name, run_dir, proc = item
            if proc.poll() is not None:
                out, err = proc.communicate()
                results[name] = (proc.returncode, out, err, run_dir)
                running.remove(item)
        if time.monotonic() > deadline:
            for _, _, proc in running:
                proc.kill()
            pytest.fail(f"CLI cases still running after 600 s: {[n for n, _, _ in running]}")
        time.sleep(0.05)
    return results


@pytest.mark.parametrize("name", ["e2e_vanilla_sd", "e2e_pld", "e2e_eagle"])
def test_end_to_end(cli, name):
    rc, out, err, run_dir = cli[name]
    assert rc == 0, err[-3000:]
    assert "Traceback" not in err
    assert "speedup" in out and "v_d" in out and "HM" in out
    assert "outputs identical to AR: 2/2" in out
    assert (run_dir / "summary.json").exists()
    assert len((run_dir / "samples.jsonl").read_text().splitlines()) == 2


def test_end_to_end_profile_gives_predictions(cli):
    rc, out, _, run_dir = cli["e2e_pld"]
    assert rc == 0
    assert (run_dir / "forward_costs.json").exists()
    line = next(l for l in out.splitlines() if l.startswith("speedup"))
    assert "predicted -x" not in line  # a number, not a dash


def is_progress_bar(line: str) -> bool:
    return "it/s]" in line or "s/it]" in line


def check_one_line_error(rc, out, err, allow_progress_bars=False):
    assert rc != 0
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    if allow_progress_bars:
        lines = [l for l in lines if l.strip() and not is_progress_bar(l)]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("specbench: error:"), lines[0]
    return lines[0]


EXPECT = {
    "unknown_method": "unknown method 'nope'",
    "unknown_task": "unknown task 'nope'",
    "unknown_model": "unknown model 'nope'",
    "unknown_control": "unknown control 'nope'",
    "control_k_zero": "control.k",
    "max_new_tokens_zero": "max_new_tokens",
    "too_many_samples": "num_samples",
    "missing_data_dir": "no data",
    "hf_model_missing": "/nonexistent/path",
    "unreadable_gguf": "garbage.gguf",
    "draft_other_tokenizer": "different tokenizer",
    "max_new_tokens_not_int": "max_new_tokens",
    "unknown_key": "no_such_key",
    "k_not_a_number": "control.k='abc'",
    "temperature_not_a_number": "sampling.temperature='hot'",
    "num_samples_not_a_number": "task.num_samples='ten'",
    "seed_not_a_number": "seed='abc'",
    "threads_zero": "threads=0",
    "top_p_above_one": "sampling.top_p=1.5",
    "top_p_zero": "sampling.top_p=0",
    "top_k_negative": "sampling.top_k=-1",
    "num_samples_fraction": "task.num_samples=2.5",
    "pld_max_below_min": "method.max_ngram=1",
    "pld_max_zero": "method.max_ngram=0",
    "empty_split_all": "split is empty",
    "prompt_longer_than_context": "context",
    "jsonl_not_utf8": "latin1.jsonl:1 is not UTF-8",
    "hf_dir_not_a_model": "not a Hugging Face model",
    "humaneval_timeout_zero": "task.timeout_s=0",
    "humaneval_memory_negative": "task.memory_mb=-1",
    "multirun_unknown_key": "nokey",
    "multirun_bad_value": "control.k='abc'",
    "experiment_unknown": "unknown experiment 'bogus'",
    "experiment_bad_value": "control.k='abc'",
    "eagle_released_no_config": "has no config.json",
}


@pytest.mark.parametrize("name", ERRORS)
def test_bad_input_one_line_error(cli, name):
    rc, out, err, _ = cli[name]
    line = check_one_line_error(rc, out, err)
    assert EXPECT[name] in line


@pytest.mark.parametrize("name", ERRORS)
def test_bad_input_leaves_no_run_dir(cli, name):
    rc, _, _, run_dir = cli[name]
    assert rc == 2
    assert not run_dir.exists() and not list(run_dir.parent.glob(run_dir.name + "*"))


def test_train_typo_is_one_line():
    import subprocess
    import sys

    from helpers import REPO

    for args, expect in ((["+train.epoch=3"], "train.epoch"), (["train.epochs=x"], "train.epochs='x'"), (["nokey=1"], "nokey")):
        p = subprocess.run([sys.executable, "-m", "specbench.train", "method=eesd", "model=tiny-llama", *args],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        assert p.returncode == 2
        assert expect in check_one_line_error(p.returncode, p.stdout, p.stderr)


def test_other_tokenizer_error_is_the_only_stderr_output(cli):
    check_one_line_error(*cli["draft_other_tokenizer"][:3])


def test_non_integer_max_new_tokens(cli):
    check_one_line_error(*cli["max_new_tokens_not_int"][:3])


def test_unknown_key(cli):
    check_one_line_error(*cli["unknown_key"][:3])
