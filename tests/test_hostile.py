"""Hostile command lines (issue 31): each must end in exit 2 with exactly one stderr line
`specbench: error: ...` naming the key or value, and leave nothing on disk (no run directory).

Each row runs through a real entry point, in this process (fast) or, with `subprocess=True`, as
`python -m ...`. The run happens with cwd = tmp_path and run_dir under it; `setup(tmp_path)` may
write files first (they are the only ones allowed to exist afterwards). Rows that must be refused
before any model is loaded (`before_run=True`, the default) run with the runner replaced by a stub
that fails loudly, so a value slipping through validation fails fast instead of running a benchmark.
To add cases (run dirs, checkpoints, sandbox), append `Case(...)` rows to CASES; rows whose
refusal happens inside the run set `before_run=False`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from helpers import REPO

TINY = ["model=tiny-llama", "progress=false", "profile.enabled=false"]


@dataclass
class Case:
    id: str
    argv: list[str]
    expect: str                                  # a substring of the error line
    entry: str = "specbench"                     # specbench | specbench.train | specbench.tools.skipsearch
    setup: Callable[[Path], None] | None = None  # writes input files under tmp_path
    subprocess: bool = False
    before_run: bool = True                      # refused before the runner starts
    env: dict = field(default_factory=dict)


def big_hf_model(tmp: Path) -> None:
    """A config.json only (no weights): 80 layers of width 8192 and a 10M-token context."""
    (tmp / "big").mkdir()
    (tmp / "big" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 80, "hidden_size": 8192,
        "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
        "max_position_embeddings": 10_000_000}))


def write(rel: str, content) -> Callable[[Path], None]:
    """A setup writing one file under tmp_path (text, or bytes as given)."""
    def setup(tmp: Path) -> None:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(content if isinstance(content, bytes) else content.encode())
    return setup


def hostile_hf_model(tmp: Path) -> None:
    """A local Hugging Face model whose pytorch_model.bin is a pickle that runs a command when loaded
    without weights_only (it would write tmp/pwned: the test's nothing-written check catches it)."""
    import contextlib
    import io
    import os

    import torch
    from test_cli import make_other_tokenizer_model

    class Bomb:
        def __reduce__(self):
            return os.system, (f"touch {tmp / 'pwned'}",)

    with contextlib.redirect_stderr(io.StringIO()):  # transformers' "Writing model shards" bar
        make_other_tokenizer_model(tmp / "hostile")
    for f in (tmp / "hostile").glob("*.safetensors"):
        f.unlink()
    torch.save({"model.embed_tokens.weight": Bomb()}, tmp / "hostile" / "pytorch_model.bin")
    write("p.jsonl", '{"prompt": "the cat"}\n')(tmp)


JSONL = TINY + ["method=pld", "task=jsonl", "task.path={tmp}/p.jsonl"]


CASES = [
    # issue 31, item 5
    Case("profile_ks_huge", ["profile.ks=[1,100000]"], "profile.ks=[1, 100000]"),
    Case("profile_context_huge", ["profile.context=100000"], "profile.context=100000"),
    Case("ci_level_above_one", TINY + ["measure.ci.level=1.5"], "measure.ci.level=1.5"),
    Case("ci_resamples_zero", TINY + ["measure.ci.resamples=0"], "measure.ci.resamples=0"),
    Case("max_new_tokens_null", TINY + ["max_new_tokens=null"], "max_new_tokens=null"),
    Case("temperature_null", TINY + ["sampling.temperature=null"], "sampling.temperature=null"),
    Case("warmup_negative", TINY + ["warmup_tokens=-1"], "warmup_tokens=-1"),
    Case("control_k_negative", TINY + ["control.k=-3"], "control.k=-3"),
    Case("profile_reps_null", TINY + ["profile.reps=null"], "profile.reps=null"),
    Case("seed_overflow", TINY + [f"seed={2**63}"], f"seed={2**63}"),
    Case("tiny_hidden_63", TINY + ["model.hidden_size=63"], "model.hidden_size=63"),
    Case("allow_untrained_no", TINY + ["method=eesd", "method.allow_untrained=no"], "method.allow_untrained='no'"),
    Case("draft_layers_fraction", TINY + ["method.draft.num_layers=2.5"], "method.draft.num_layers=2.5"),
    Case("spike_factor_zero", TINY + ["measure.spike_factor=0"], "measure.spike_factor=0"),
    Case("space_k_zero", TINY + ["method=space", "method.k=0"], "method.k=0"),
    Case("train_batch_zero", ["method=eesd", "model=tiny-llama", "train.batch_size=0"], "train.batch_size=0",
         entry="specbench.train"),
    Case("train_lr_negative", ["method=eesd", "model=tiny-llama", "train.lr=-1"], "train.lr=-1", entry="specbench.train"),
    Case("train_distill_unknown", ["method=eesd", "model=tiny-llama", "train.distill=kl"], "unknown train.distill 'kl'; allowed: hard, soft",
         entry="specbench.train"),
    # wrong types, lists where scalars go and back
    Case("num_samples_list", TINY + ["task.num_samples=[1,2]"], "task.num_samples=[1, 2]"),
    Case("control_k_list", TINY + ["control.k=[4]"], "control.k=[4]"),
    Case("profile_ks_scalar", TINY + ["profile.enabled=true", "profile.ks=4"], "profile.ks=4"),
    Case("profile_ks_empty", TINY + ["profile.ks=[]"], "profile.ks=[]"),
    Case("profile_ks_zero_item", TINY + ["profile.ks=[1,0]"], "profile.ks=[1, 0]"),
    Case("n_layers_bool", TINY + ["method=eesd", "method.n_layers=true"], "method.n_layers=true"),
    Case("top_k_fraction", TINY + ["sampling.top_k=1.5"], "sampling.top_k=1.5"),
    Case("allow_untrained_int", TINY + ["method=eesd", "method.allow_untrained=1"], "method.allow_untrained=1"),
    # empty strings, negative zero, NaN / inf
    Case("seed_empty", TINY + ["seed="], "seed=''"),
    Case("run_name_empty", TINY + ["run_name="], "run_name=''"),
    # run_name is a part of run_dir: a path in it nested or left results/ (run_dir=<path> puts a run elsewhere)
    Case("run_name_parent", TINY + ["run_name=../../x"], "run_name='../../x' is not allowed; expected one folder name"),
    Case("run_name_nested", TINY + ["run_name=a/b"], "run_name='a/b' is not allowed"),
    Case("alpha0_negative_zero", TINY + ["method=eesd", "control=beta_ts", "control.alpha0=-0.0"], "control.alpha0=-0.0"),
    Case("top_p_nan", TINY + ["sampling.top_p=nan"], "sampling.top_p=nan"),
    Case("temperature_inf", TINY + ["sampling.temperature=inf"], "sampling.temperature=inf"),
    Case("ci_width_minus_inf", TINY + ["measure.ci.max_rel_width=-inf"], "measure.ci.max_rel_width=-inf"),
    # huge values and resource bounds
    Case("threads_huge", TINY + ["threads=100000"], "threads=100000"),
    Case("resamples_huge", TINY + ["measure.ci.resamples=10000000000"], "measure.ci.resamples=10000000000"),
    Case("control_k_beyond_context", TINY + ["control.k=100000"], "control.k=100000"),
    Case("tiny_too_big_for_memory", TINY + ["model.hidden_size=1000000", "model.num_heads=4"], "model.hidden_size=1000000"),
    Case("profile_memory", ["model=hf", "model.id={tmp}/big", "model.device=cpu", "method=pld", "profile.context=1000000"],
         "profile.context=1000000", setup=big_hf_model),
    Case("eesd_layers_beyond_model", TINY + ["method=eesd", "method.n_layers=30"], "method.n_layers=30"),
    Case("skip_layer_beyond_model", TINY + ["method=self_sd", "method.skip.attn=[0,99]"], "method.skip.attn=[0, 99]"),
    Case("eagle3_layer_beyond_model", TINY + ["method=eagle3", "method.layers=[0,1,4]"], "method.layers=[0, 1, 4]"),
    Case("eagle3_two_layers", TINY + ["method=eagle3", "method.layers=[1,2]"], "three layer indices from 0 to 3"),
    Case("eagle3_draft_vocab_zero", TINY + ["method=eagle3", "method.draft_vocab_size=0"], "method.draft_vocab_size=0"),
    Case("draft_vocab_beyond_vocab", TINY + ["method=eesd", "method.draft_vocab.size=1000000"], "method.draft_vocab.size"),
    # issue 42: sizes bounded by the model (specbench/config/bounds.py; every key: tests/test_bounds.py)
    Case("lookahead_window_huge", TINY + ["method=lookahead", "method.window=100000"], "method.window=100000"),
    Case("rest_num_draft_huge_profiled", ["model=tiny-llama", "progress=false", "method=rest", "method.num_draft=1000000"],
         "method.num_draft=1000000"),
    Case("token_recycling_topk_beyond_vocab", TINY + ["method=token_recycling", "method.topk=1000"],
         "method.topk=1000 is not allowed; expected at most 259, the vocabulary of the model tiny-llama"),
    Case("medusa_dense_tree_too_wide", TINY + ["method=medusa", "method.tree_from_accuracies=null", "method.sizes=[200,200]"],
         "method.sizes=[200, 200]"),
    Case("space_k_too_wide", TINY + ["method=space", "method.k=100"], "method.k=100"),
    Case("warmup_beyond_context", TINY + ["warmup_tokens=100000"], "warmup_tokens=100000"),
    # issue 42: input files refused in one line naming file and line, before anything is written
    Case("jsonl_path_a_directory", JSONL[:-1] + ["task.path={tmp}/d"], "task.path='{tmp}/d' is a directory; give a JSONL file",
         setup=write("d/p.jsonl", '{"prompt": "a"}\n'), before_run=False),
    Case("hf_model_path_missing", ["model=hf", "model.id=/nonexistent/model", "method=pld"],
         "model.id='/nonexistent/model': no such directory"),
    Case("hf_draft_path_missing", TINY + ["method=vanilla_sd", "method.draft.source=hf", "method.draft.id=./nope"],
         "method.draft.id='./nope': no such directory"),
    Case("jsonl_empty_prompt", JSONL, "p.jsonl:1: field 'prompt' holds an empty prompt",
         setup=write("p.jsonl", '{"prompt": ""}\n'), before_run=False),
    Case("jsonl_empty_second_turn", JSONL, "p.jsonl:2: field 'prompt' holds an empty prompt",
         setup=write("p.jsonl", '{"prompt": "a"}\n{"prompt": ["b", " "]}\n'), before_run=False),
    Case("jsonl_category_null", JSONL + ["task.category_field=cat"], "p.jsonl:2: field 'cat' is null",
         setup=write("p.jsonl", '{"prompt": "a", "cat": "x"}\n{"prompt": "b", "cat": null}\n'), before_run=False),
    Case("jsonl_category_object", JSONL + ["task.category_field=cat"], 'p.jsonl:1: field \'cat\' is {"x": 1}',
         setup=write("p.jsonl", '{"prompt": "a", "cat": {"x": 1}}\n'), before_run=False),
    Case("spec_bench_second_turn_beyond_context", TINY + ["method=pld", "task=spec_bench", "task.path={tmp}/q.jsonl"],
         "sample '7' turn 2: the conversation has", before_run=False,
         setup=write("q.jsonl", json.dumps({"question_id": 7, "category": "writing", "turns": ["hi", "x" * 5000]}) + "\n")),
    Case("humaneval_damaged_local_copy", TINY + ["method=pld", "task=humaneval", "task.data_dir={tmp}/data", "task.allow_unisolated=true"],
         "HumanEval.jsonl.gz cannot be read (BadGzipFile", setup=write("data/humaneval/HumanEval.jsonl.gz", b"not gzip"),
         before_run=False),
    Case("hf_weights_a_hostile_pickle", ["model=hf", "model.id={tmp}/hostile", "model.device=cpu", "method=pld", "progress=false",
                                         "profile.enabled=false", "task=jsonl", "task.path={tmp}/p.jsonl"],
         "hostile/pytorch_model.bin): UnpicklingError: torch.load(weights_only=True) refused it", setup=hostile_hf_model,
         before_run=False),
    Case("device_unknown", TINY + ["model.device=foo"], "model.device='foo' is not usable here (Expected one of cpu, cuda",
         before_run=False),
    Case("device_absent", TINY + ["model.device=ve"], "model.device='ve' is not usable here", before_run=False),
    Case("jsonl_lone_surrogate", JSONL, "p.jsonl:1: field 'prompt' holds text that is not Unicode",
         setup=write("p.jsonl", '{"prompt": "x \\ud800 y"}\n'), before_run=False),
    Case("categories_without_a_category_field", TINY + ["method=pld", "task=spec_bench", "task.path={tmp}/q.jsonl",
                                                        "task.category_field=null", "task.categories=[qa]"],
         "task.categories=['qa'] needs samples with categories", before_run=False,
         setup=write("q.jsonl", json.dumps({"question_id": 1, "category": "qa", "turns": ["hi"]}) + "\n")),
    Case("humaneval_timeout_beyond_rlimit", TINY + ["task=humaneval", "task.timeout_s=1e18"], "task.timeout_s=1e+18"),
    Case("humaneval_memory_beyond_rlimit", TINY + ["task=humaneval", "task.memory_mb=8796093022208"], "task.memory_mb=8796093022208"),
    # method knobs (red team, s71): each was a traceback inside the run, with a run dir left behind
    Case("temperature_overflows_float32", TINY + ["sampling.temperature=1e-40"], "sampling.temperature=1e-40 is not allowed; expected 0 (greedy) or a number >= 1e-05"),
    Case("cali_sigma_huge", TINY + ["method=eesd", "control=cali_ts", "control.sigma_m=1e200"], "control.sigma_m=1e+200"),
    Case("cali_sigma_tiny", TINY + ["method=eesd", "control=cali_ts", "control.sigma_s=1e-200"], "control.sigma_s=1e-200"),
    Case("suffix_factor_huge", TINY + ["method=suffix", "method.max_spec_factor=1e308"], "method.max_spec_factor=1e+308"),
    Case("medusa_tree_negative_rank", TINY + ["method=medusa", "method.tree_from_accuracies=null", "method.tree=[[-1]]"],
         "method.tree=[[-1]] is not allowed; expected a list of distinct non-empty paths"),
    Case("hydra_tree_empty_path", TINY + ["method=hydra", "method.tree=[[]]"], "method.tree=[[]] is not allowed"),
    Case("medusa_tree_path_twice", TINY + ["method=medusa", "method.tree_from_accuracies=null", "method.tree=[[0],[0]]"],
         "method.tree=[[0], [0]] is not allowed"),
    Case("token_recycling_tree_a_number", TINY + ["method=token_recycling", "method.tree=5"], "method.tree=5 is not allowed"),
    Case("samd_aux_topk_beyond_vocab", TINY + ["method=samd", "method.aux=token_recycling", "+method.aux_settings.topk=100000"],
         "method.topk=100000 is not allowed; expected at most 259, the vocabulary of the model tiny-llama (method.aux_settings of the auxiliary"),
    Case("samd_aux_tree_negative_rank", TINY + ["method=samd", "method.aux=medusa", "+method.aux_settings.tree_from_accuracies=null",
                                                 "+method.aux_settings.tree=[[-1]]"], "(method.aux_settings of the auxiliary method.aux=medusa)"),
    Case("hf_draft_without_id", TINY + ["method=vanilla_sd", "method.draft.source=hf"], "method.draft.source=hf needs method.draft.id"),
    Case("draft_layers_all_of_them", TINY + ["method=vanilla_sd", "method.draft.checkpoint=null", "method.draft.num_layers=4"],
         "method.draft.num_layers=4 is not allowed; expected an integer from 1 to 3"),
    Case("misspelt_group_in_a_dotted_key", TINY + ["contrl.k=3"], "unknown key 'contrl' (did you mean 'control'?)"),
    Case("misspelt_group_lists_the_groups", TINY + ["methd=pld"], "allowed: control, engine, max_new_tokens"),
    Case("jsonl_gzip", JSONL, "p.jsonl' is gzip-compressed; decompress it", setup=write("p.jsonl", __import__("gzip").compress(b'{"prompt": "a"}\n')),
         before_run=False),
    Case("jsonl_null_record", JSONL, "p.jsonl:1 is a JSON null; expected an object", setup=write("p.jsonl", "null\n"), before_run=False),
    Case("jsonl_reference_null", JSONL + ["task.reference_field=ref"], "p.jsonl:1: field 'ref' is null; expected a string or a list of 1 string",
         setup=write("p.jsonl", '{"prompt": "a", "ref": null}\n'), before_run=False),
    Case("jsonl_reference_short_of_the_turns", JSONL + ["task.reference_field=ref"], "p.jsonl:1: field 'ref' is [\"x\"]; expected a string or a list of 2 strings",
         setup=write("p.jsonl", '{"prompt": ["a", "b"], "ref": ["x"]}\n'), before_run=False),
    Case("beta_prior_huge", TINY + ["method=eesd", "control=beta_ts", "control.alpha0=1e308"], "control.alpha0=1e+308"),
    # training (red team, s71): each was refused, or crashed, only after the data was generated
    Case("train_no_bound", ["method=vanilla_sd", "model=tiny-llama", "train.max_steps=null", "train.epochs=null"],
         "train.max_steps and train.epochs are both null", entry="specbench.train"),
    Case("train_one_sequence", ["method=eesd", "model=tiny-llama", "train.max_sequences=1"], "train.max_sequences=1", entry="specbench.train"),
    Case("train_answer_within_greedy_prefix", ["method=vanilla_sd", "model=tiny-llama", "train.data.max_new_tokens=4"],
         "train.data.max_new_tokens=4 is not allowed; expected an integer > train.data.greedy_prefix (4)", entry="specbench.train"),
    Case("search_out_a_directory", ["model=tiny-llama", "out={tmp}/d"], "out= '{tmp}/d' is a directory; give a file",
         entry="specbench.tools.skipsearch", setup=write("d/keep", "")),
    # unknown keys, bad group choices and choice values, rules between keys
    Case("unknown_top_key", TINY + ["+bogus=1"], "unknown key 'bogus'"),
    Case("unknown_method_key", TINY + ["+method.foo=1"], "unknown key 'method.foo'"),
    # without '+', Hydra's own refusal suggested '+key=...'; ours names the allowed keys and the nearest one
    Case("misplaced_key", TINY + ["n_samples=2"], "unknown key 'n_samples' (did you mean 'task.num_samples'?); allowed: "),
    Case("misspelt_key", TINY + ["method=pld", "method.max_ngam=3"],
         "unknown key 'method.max_ngam' for method 'pld' (did you mean 'method.max_ngram'?); allowed: max_ngram, min_ngram"),
    Case("top_level_name_of_a_group_key", TINY + ["temperature=0.5"], "(did you mean 'sampling.temperature'?)"),
    Case("no_near_key_in_another_group", TINY + ["method=pld", "method.k=3"],
         "unknown key 'method.k' for method 'pld'; allowed: max_ngram, min_ngram, name"),
    Case("override_hydra_refuses_unnamed", TINY + ["profile.ks.x=1"], "profile.ks.x=1: invalid literal for int()"),
    Case("misspelt_key_in_a_sweep", TINY + ["-m", "method=pld,suffix", "method.max_ngam=3"], "did you mean 'method.max_ngram'?"),
    Case("unknown_train_key", ["method=eesd", "model=tiny-llama", "+train.data.foo=1"], "train.data.foo",
         entry="specbench.train"),
    Case("unknown_method", TINY + ["method=nope"], "unknown method 'nope'"),
    Case("unknown_loader", TINY + ["model.loader=nope"], "unknown model loader 'nope'"),
    Case("unknown_counts", TINY + ["method=eesd", "control=beta_ts", "control.counts=all"], "unknown control.counts 'all'"),
    Case("unknown_timing", TINY + ["timing=fast"], "unknown timing 'fast'"),
    Case("unknown_dtype", TINY + ["model.dtype=float8"], "unknown model.dtype 'float8'"),
    Case("kv_heads_not_divisor", TINY + ["model.num_kv_heads=3"], "model.num_kv_heads=3"),
    Case("pld_max_below_min", TINY + ["method=pld", "method.max_ngram=1", "method.min_ngram=2"], "method.max_ngram=1"),
    Case("humaneval_memory_zero", TINY + ["task=humaneval", "task.memory_mb=0"], "task.memory_mb=0"),
    Case("fewshot_negative", TINY + ["task.fewshot_index=-1"], "task.fewshot_index=-1"),
    Case("remove_key", TINY + ["~seed"], "~seed"),
    Case("sweep_bad_point", ["-m"] + TINY + ["control.k=1,0"], "control.k=0"),
    # what only running a point found (its first points ran and wrote first): now refused before any
    Case("sweep_point_task_file_missing", ["-m"] + TINY + ["task=jsonl", "task.path={tmp}/p.jsonl,{tmp}/missing.jsonl"],
         "task.path='{tmp}/missing.jsonl' not found", setup=write("p.jsonl", '{"prompt": "a"}\n')),
    Case("sweep_point_run_dir_of_another_config", ["-m"] + TINY + ["run_dir={tmp}/new,{tmp}/old"],
         "run dir {tmp}/old holds results of a different configuration", setup=lambda t: (
             write("old/config.json", json.dumps({"method": {"name": "suffix"}, "seed": 5}))(t),
             write("old/samples.jsonl", '{"id": "0"}\n')(t))),
    Case("run_into_a_lean_copy", TINY + ["run_dir={tmp}/lean"], "run dir {tmp}/lean holds the summary of 3 samples but not",
         setup=lambda t: (write("lean/config.json", json.dumps({"method": {"name": "pld"}}))(t),
                          write("lean/summary.json", json.dumps({"samples": 3}))(t))),
    Case("preset_bad_seed", TINY + ["+experiment=repeats", "seed=-1"], "seed=-1"),
    Case("first_use_budget_negative", ["method=eesd", "model=tiny-llama", "train.first_use.train.max_minutes=-1"],
         "train.first_use.train.max_minutes=-1", entry="specbench.train"),
    Case("search_iterations_fraction", ["model=tiny-llama", "iterations=2.5"], "iterations=2.5", entry="specbench.tools.skipsearch"),
    Case("search_k_zero", ["model=tiny-llama", "k=0"], "k=0", entry="specbench.tools.skipsearch"),
    Case("search_draft_exit_unknown", ["model=tiny-llama", "draft_exit=magic"], "unknown draft_exit 'magic'; allowed: adaptive, fixed",
         entry="specbench.tools.skipsearch"),
    Case("search_confirm_negative", ["model=tiny-llama", "confirm=-1"], "confirm=-1", entry="specbench.tools.skipsearch"),
    # the real `python -m` path, once per entry point
    Case("subprocess_profile_context", ["profile.context=100000"], "profile.context=100000", subprocess=True),
    Case("subprocess_train_minutes", ["method=eesd", "model=tiny-llama", "train.max_minutes=-1.5"], "train.max_minutes=-1.5",
         entry="specbench.train", subprocess=True),
]


def _in_process(case: Case, argv: list[str], capsys, monkeypatch) -> tuple[int, str]:
    if case.before_run:  # what each entry point does once its input is validated
        import specbench.run.runner
        import specbench.tools.skipsearch
        import specbench.train.__main__

        def refuse(*a, **k):
            raise AssertionError(f"{case.id}: validation let {case.argv} through")
        monkeypatch.setattr(specbench.run.runner, "run", refuse)
        monkeypatch.setattr(specbench.train.__main__, "train", refuse)
        monkeypatch.setattr(specbench.tools.skipsearch, "load_model", refuse)
    monkeypatch.setattr(sys, "argv", [case.entry, *argv])
    with pytest.raises(SystemExit) as e:
        if case.entry == "specbench":
            from specbench.cli import main
            main()
        elif case.entry == "specbench.train":
            from specbench.train.__main__ import main
            main(argv)
        else:
            from specbench.tools.skipsearch import cli
            cli()
    return e.value.code, capsys.readouterr().err


def _subprocess(case: Case, argv: list[str], tmp_path: Path) -> tuple[int, str]:
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO), **case.env}
    p = subprocess.run([sys.executable, "-m", case.entry, *argv], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    return p.returncode, p.stderr


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_line_and_writes_nothing(case, tmp_path, capsys, monkeypatch):
    if case.setup:
        case.setup(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in case.argv]
    if case.entry == "specbench" and not any(a.startswith("run_dir=") for a in argv):
        argv.append(f"run_dir={tmp_path / 'run'}")
    code, err = _subprocess(case, argv, tmp_path) if case.subprocess else _in_process(case, argv, capsys, monkeypatch)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("specbench: error:"), err[-2000:]
    assert case.expect.replace("{tmp}", str(tmp_path)) in lines[0], lines[0]
    assert sorted(tmp_path.rglob("*")) == before  # no run directory, nothing else written


def test_the_multirun_flag_may_follow_the_overrides(tmp_path, monkeypatch):
    """Hydra's argparse took -m only before the overrides: after them, a valid sweep got argparse's
    usage dump and 'unrecognized arguments' instead of running."""
    import specbench.run.runner
    from specbench.cli import main

    ran = []
    monkeypatch.setattr(specbench.run.runner, "run", lambda cfg: ran.append(cfg.method.name))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["specbench", *TINY, "-m", "method=pld,suffix", f"run_dir={tmp_path}/r"])
    main()
    assert ran == ["pld", "suffix"]


def test_a_jsonl_file_with_a_byte_order_mark_is_read(tmp_path):
    """Editors on Windows write one; it was refused as 'Unexpected UTF-8 BOM (decode using utf-8-sig)'."""
    from specbench.config import settings
    from specbench.tasks import build_task

    (tmp_path / "p.jsonl").write_bytes(b'\xef\xbb\xbf{"prompt": "hi"}\n')
    (sample,) = build_task(settings.shipped("task", "jsonl", {"path": str(tmp_path / "p.jsonl")})).load_all()
    assert sample.turns == ["hi"]
