import json
import time

import pytest

from helpers import task_settings

from specbench.config import settings
from specbench.core.errors import SpecBenchError
from specbench.tasks import TASKS, Sample, build_task
from specbench.tasks.gsm8k import extract_number
from specbench.tasks.humaneval import program_sources
from specbench.tasks.sandbox import run_judged, run_python

BUILTIN = ["gsm8k", "xsum", "humaneval", "mt_bench"]


def task(name, data_dir, **cfg):
    return build_task(task_settings(name, **{"data_dir": str(data_dir), "num_samples": 5, "seed": 0} | cfg))


@pytest.fixture
def no_hub(monkeypatch):
    """Hub lookups fail as they would offline without a cache, whatever this machine has cached."""
    import datasets

    def offline(*a, **k):
        raise ConnectionError("offline (test)")

    monkeypatch.setattr(datasets, "load_dataset", offline)


def test_registry_and_unknown_task():
    assert set(BUILTIN + ["jsonl"]) <= set(TASKS)
    with pytest.raises(SpecBenchError, match="unknown task 'nope'; allowed: .*gsm8k"):
        build_task(settings.group("task", {"name": "nope"}))  # a task without a table or a class


@pytest.mark.parametrize("name", BUILTIN)
def test_subset_is_reproducible(name, data_dir):
    a = task(name, data_dir).load()
    assert len(a) == 5 and len({s.id for s in a}) == 5
    assert [s.id for s in a] == [s.id for s in task(name, data_dir).load()]
    assert [s.id for s in a] != [s.id for s in task(name, data_dir, seed=1).load()]
    assert all(isinstance(s.id, str) and s.turns and all(isinstance(t, str) for t in s.turns) for s in a)
    with pytest.raises(SpecBenchError, match="num_samples=100000 is larger"):
        task(name, data_dir, num_samples=100000).load()


@pytest.mark.parametrize("name, file", [("gsm8k", "gsm8k/test.jsonl"), ("xsum", "xsum/test.jsonl"),
                                        ("mt_bench", "mt_bench/question.jsonl")])
def test_missing_data_names_every_place(name, file, tmp_path, no_hub):
    with pytest.raises(SpecBenchError) as e:
        task(name, tmp_path).load()
    msg = str(e.value)
    assert "\n" not in msg and f"no data for task '{name}" in msg
    assert str(tmp_path / file) in msg and "hub " in msg
    assert "Set SPECBENCH_DATA_DIR" in msg and "HF_DATASETS_OFFLINE=0" in msg  # what to do about it


def test_hub_fails_fast_offline(tmp_path, monkeypatch):
    # the real datasets call: must not sit in network retries (it is cache-only unless asked)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    t0 = time.time()
    try:
        task("mt_bench", tmp_path).load()
    except SpecBenchError as e:
        assert "mt_bench_prompts" in str(e)
    assert time.time() - t0 < 20


def test_humaneval_falls_back_to_package(tmp_path, no_hub):
    assert len(task("humaneval", tmp_path, num_samples=None).load()) == 164


# -- gsm8k --------------------------------------------------------------------------------------
def test_gsm8k_prompt_and_exemplar(data_dir):
    s = task("gsm8k", data_dir).load()[0]
    assert s.id.startswith("gsm8k-") and "The answer is <number>" in s.turns[0]
    (user, assistant), = s.few_shot
    assert user.startswith("Natalia sold clips")  # line 1 of train.jsonl
    assert "<<" not in assistant and "####" not in assistant and assistant.endswith("The answer is 72.")
    assert task("gsm8k", data_dir, fewshot_index=None).load()[0].few_shot == []
    with pytest.raises(SpecBenchError, match="fewshot_index=99999"):
        task("gsm8k", data_dir, fewshot_index=99999).load()


def test_gsm8k_score(data_dir):
    t = task("gsm8k", data_dir)
    for s in t.load():
        ref = float(s.reference)
        assert t.score(s, [f"Step one... so the total is {ref + 1}. The answer is {ref:,.0f}."]) == {"accuracy": 1.0}
        assert t.score(s, [f"I get {ref} at first, but the answer is {ref + 3}."]) == {"accuracy": 0.0}
    assert t.primary_metric == "accuracy"


@pytest.mark.parametrize("text, number", [("The answer is $1,234.", 1234), ("answer is: -3.50", -3.5),
                                          ("first 7, then 8", 8), ("The answer is **42**.", 42), ("none", None)])
def test_gsm8k_extract_number(text, number):
    assert extract_number(text) == number


# -- xsum ---------------------------------------------------------------------------------------
def test_xsum_prompt_and_score(data_dir):
    t = task("xsum", data_dir, max_doc_words=50)
    samples = t.load()
    exemplar = json.loads((data_dir / "xsum/test.jsonl").read_text().splitlines()[0])
    assert samples[0].few_shot[0][1] == exemplar["summary"].strip()
    assert exemplar["id"] not in {s.id for s in task("xsum", data_dir, num_samples=None).load()}
    s = samples[0]
    assert len(s.turns[0].split()) < 50 + 20 and "one sentence" in s.turns[0]
    good = t.score(s, [s.reference])
    assert set(good) == {"rouge1", "rouge2", "rougeL"} and min(good.values()) > 0.99
    bad = t.score(s, ["Quantum chromodynamics describes the strong interaction between quarks."])
    assert bad["rouge2"] < 0.1 and bad["rouge1"] < 0.3
    assert t.primary_metric == "rouge2"


# -- humaneval ----------------------------------------------------------------------------------
def test_humaneval_score(data_dir):
    t = task("humaneval", data_dir, num_samples=2)
    for s in t.load():
        p = s.reference
        assert p["prompt"].strip() in s.turns[0] and s.id.startswith("HumanEval/")
        full = p["prompt"] + p["canonical_solution"]
        assert t.score(s, [f"Sure:\n```python\n{full}\n```"]) == {"pass@1": 1.0}
        assert t.score(s, [p["canonical_solution"]]) == {"pass@1": 1.0}  # an indented body only
        wrong = f"```python\ndef {p['entry_point']}(*args):\n    return None\n```"
        assert t.score(s, [wrong]) == {"pass@1": 0.0}


def test_humaneval_program_variants():
    problem = {"prompt": "import math\n\ndef f(x):\n    \"\"\"Root.\"\"\"\n", "entry_point": "f"}
    check = "def check(f):\n    assert f(4) == 2\n"
    for reply in [
        "    return math.isqrt(x)\n",  # indented body
        "return math.isqrt(x)",  # body that lost its indent
        "```py\ndef f(x):\n    return math.isqrt(x)\n```",  # full function, import from the prompt
        "```python\ndef f(x):\n    return math.isqrt(x)\n",  # unclosed fence (cut off)
    ]:
        assert run_judged(program_sources(reply, problem), "f", check).passed, reply


# -- mt_bench -----------------------------------------------------------------------------------
def test_mt_bench_turns_and_messages(data_dir):
    t = task("mt_bench", data_dir, num_samples=None)
    samples = {s.id: s for s in t.load()}
    assert len(samples) == 80 and all(len(s.turns) == 2 and s.category for s in samples.values())
    s = samples["101"]
    assert s.category == "reasoning" and s.reference == ["You are in second place.", "Uncertain."]
    assert samples["81"].reference is None
    assert s.messages([]) == [{"role": "user", "content": s.turns[0]}]
    assert s.messages(["Second."]) == [
        {"role": "user", "content": s.turns[0]},
        {"role": "assistant", "content": "Second."},
        {"role": "user", "content": s.turns[1]},
    ]
    assert t.score(s, ["a", "b"]) == {} and t.primary_metric is None
    math = task("mt_bench", data_dir, num_samples=None, categories=["math"]).load()
    assert len(math) == 10 and {x.category for x in math} == {"math"}
    with pytest.raises(SpecBenchError, match="unknown mt_bench categories.*allowed: coding"):
        task("mt_bench", data_dir, categories=["poetry"]).load()


def test_messages_with_system_and_few_shot():
    s = Sample(id="x", turns=["q1", "q2"], few_shot=[("eq", "ea")], system="sys")
    assert [m["role"] for m in s.messages(["a1"])] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert s.messages(["a1"])[-1]["content"] == "q2"


# -- jsonl --------------------------------------------------------------------------------------
def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_task(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"q": "Capital of France?", "a": "Paris", "key": "k1", "cat": "geo"},
        {"q": ["Say hi.", "Say bye."], "a": ["hi", "bye"], "key": "k2", "cat": "chat"},
    ])
    t = build_task(task_settings("jsonl", **{"path": str(path), "prompt_field": "q", "reference_field": "a",
                    "id_field": "key", "category_field": "cat", "system": "Be brief."}))
    s1, s2 = t.load()
    assert (s1.id, s1.turns, s1.category, s1.system) == ("k1", ["Capital of France?"], "geo", "Be brief.")
    assert s2.turns == ["Say hi.", "Say bye."]
    assert t.score(s1, [" Paris "]) == {"exact_match": 1.0, "rouge1": 1.0, "rougeL": 1.0}
    assert t.score(s1, ["London"]) == {"exact_match": 0.0, "rouge1": 0.0, "rougeL": 0.0}
    assert t.score(s2, ["hi", "ciao"])["exact_match"] == 0.5
    assert t.primary_metric == "rougeL"


def test_jsonl_without_reference_and_default_ids(tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    t = build_task(task_settings("jsonl", **{"path": "p.jsonl", "data_dir": str(tmp_path)}))  # relative to data_dir
    samples = t.load()
    assert [s.id for s in samples] == ["0", "1"] and t.score(samples[0], ["x"]) == {}
    assert t.primary_metric is None


@pytest.mark.parametrize("rows, cfg, message", [
    (None, {}, "needs task.path"),
    (None, {"path": "/nonexistent/p.jsonl"}, "task.path='/nonexistent/p.jsonl' not found"),
    ([{"text": "a"}], {}, "has no field 'prompt'; fields: text"),
    ([{"prompt": 3}], {}, "must be a string or a non-empty list"),
    ([{"prompt": "a", "i": 1}, {"prompt": "b", "i": 1}], {"id_field": "i"}, "id '1' occurs more than once"),
])
def test_jsonl_errors(tmp_path, rows, cfg, message):
    if rows is not None:
        cfg = {"path": str(write_jsonl(tmp_path / "p.jsonl", rows)), **cfg}
    with pytest.raises(SpecBenchError, match=message):
        build_task(task_settings("jsonl", **cfg)).load()


def test_jsonl_bad_json(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(SpecBenchError, match=r"p.jsonl:2 is not valid JSON"):
        build_task(task_settings("jsonl", **{"path": str(tmp_path / "p.jsonl")})).load()


# -- sandbox ------------------------------------------------------------------------------------
def test_sandbox_pass_and_fail(tmp_path):
    ok = run_python("import os\nprint('hi', os.getcwd())")
    assert ok.passed and ok.status == "passed" and "hi" in ok.output
    assert str(tmp_path) not in ok.output  # runs in its own temporary directory
    bad = run_python("assert 1 + 1 == 3, 'maths'")
    assert not bad.passed and bad.status == "failed" and "AssertionError: maths" in bad.output


def test_sandbox_timeout():
    t0 = time.time()
    r = run_python("while True:\n    pass", timeout_s=1)
    assert (r.passed, r.status) == (False, "timeout") and time.time() - t0 < 5


def test_sandbox_memory_limit():
    r = run_python("x = bytearray(4 * 1024**3)\nprint('allocated')", memory_mb=256)
    assert not r.passed and r.status == "error" and "allocated" not in r.output
