"""task=spec_bench on a synthetic question.jsonl in Spec-Bench's format: loading, per-category
summary, and the leaderboard table and plot of the report."""

import json

import pytest
import torch
from hydra import compose, initialize_config_dir

from helpers import CONF, task_settings
from specbench.core.errors import SpecBenchError
from specbench.report import report
from specbench.run.runner import run
from specbench.tasks import build_task
from specbench.tasks.spec_bench import COLUMNS

# Spec-Bench's raw categories: MT-Bench's 8, then the five others (one question each here)
ROWS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku about rain.", "Now make it rhyme."]},
    {"question_id": 82, "category": "coding", "turns": ["Print 1 to 3 in Python.", "Now in C."]},
    {"question_id": 161, "category": "translation", "turns": ["Translate to English: Guten Morgen."]},
    {"question_id": 241, "category": "summarization", "turns": ["Summarize: the cat sat on the mat all day."]},
    {"question_id": 321, "category": "qa", "turns": ["What is the capital of France?"]},
    {"question_id": 401, "category": "math_reasoning", "turns": ["What is 12 + 30? Think step by step."]},
    {"question_id": 481, "category": "rag", "turns": ["Context: Paris is in France. Question: where is Paris?"]},
]


@pytest.fixture
def question_file(tmp_path):
    p = tmp_path / "question.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return p


def cfg(path, **kw):
    base = {"path": str(path) if path else None, "prompt_field": "turns", "id_field": "question_id",
            "category_field": "category", "group_mt_bench": True, "url": "https://example.invalid/q.jsonl"}
    return task_settings("spec_bench", **(base | kw))


def test_loads_and_groups_mt_bench(question_file):
    samples = build_task(cfg(question_file)).load()
    assert [s.id for s in samples] == [str(r["question_id"]) for r in ROWS]
    assert [s.category for s in samples] == ["mt_bench", "mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
    assert samples[0].turns == ROWS[0]["turns"]
    raw = build_task(cfg(question_file, group_mt_bench=False)).load()
    assert raw[1].category == "coding"
    only = build_task(cfg(question_file, categories=["rag", "qa"])).load()
    assert [s.category for s in only] == ["qa", "rag"]
    with pytest.raises(SpecBenchError, match=r"unknown spec_bench categories \['nope'\]; allowed: math_reasoning, mt_bench, qa, rag, summarization, translation"):
        build_task(cfg(question_file, categories=["nope"])).load()


def test_preset_matches_spec_bench_fields():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        c = compose("config", overrides=["task=spec_bench"])
    assert (c.task.prompt_field, c.task.id_field, c.task.category_field) == ("turns", "question_id", "category")
    assert c.task.max_new_tokens == 1024 and c.task.url.endswith("data/spec_bench/question.jsonl")


def test_missing_file_is_one_line_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SpecBenchError) as e:
        build_task(cfg(None, data_dir=str(tmp_path))).load()
    msg = str(e.value)
    assert "\n" not in msg and "task.path=<file>" in msg and str(tmp_path / "spec_bench/question.jsonl") in msg
    assert "HF_DATASETS_OFFLINE=0" in msg
    # found under data_dir without task.path
    (tmp_path / "spec_bench").mkdir()
    (tmp_path / "spec_bench/question.jsonl").write_text(json.dumps(ROWS[2]) + "\n")
    assert [s.id for s in build_task(cfg(None, data_dir=str(tmp_path))).load()] == ["161"]


def test_run_summary_and_leaderboard(tmp_path, question_file, capsys):
    torch.set_num_threads(1)
    before = torch.is_grad_enabled()
    common = ["model=tiny-llama", "task=spec_bench", f"task.path={question_file}", "max_new_tokens=10",
              "profile.enabled=false", "progress=false", "warmup_tokens=2"]
    summaries = {}
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for method, extra in (("vanilla_sd", ["method.draft.num_layers=1", "method.draft.checkpoint=null"]), ("pld", [])):
            c = compose("config", overrides=[*common, f"method={method}", *extra,
                                             f"run_dir={tmp_path}/runs/tiny-llama/spec_bench/{method}"])
            summaries[method] = run(c)
    torch.set_grad_enabled(before)
    s = summaries["vanilla_sd"]
    per = s["per_category"]
    assert set(per) == {c for c, _ in COLUMNS}
    assert per["mt_bench"]["samples"] == 2 and per["rag"]["samples"] == 1
    assert all(v["acceptance"]["tau"] >= 1.0 for v in per.values())
    printed = s["printed"]
    assert "per category:" in printed
    for c, v in per.items():
        assert f"{c}" in printed and f"speedup {v['speedup']:.3f}x" in printed and f"tau {v['acceptance']['tau']:.2f}" in printed

    out = report([tmp_path / "runs"], tmp_path / "rep")
    md = (tmp_path / "rep" / "tables.md").read_text()
    board = md.split("## Spec-Bench leaderboard")[1].split("\n## ")[0]
    header = next(line for line in board.splitlines() if line.startswith("| Models"))
    names = [n for _, n in COLUMNS]
    assert header == "| " + " | ".join(["Models", *names, "#Mean Accepted Tokens", "Overall"]) + " |"
    body = [line for line in board.splitlines() if line.startswith("| ") and not line.startswith("| Models")]
    assert len(body) == 2  # rows: methods
    speed = {m: summaries[m]["speedup"] for m in summaries}
    first = max(speed, key=speed.get)
    assert body[0].startswith(f"| {first}")  # sorted by overall speedup, as Spec-Bench sorts
    vs = next(line for line in body if line.startswith("| vanilla_sd"))
    cells = [c.strip() for c in vs.strip("|").split("|")]
    assert cells[1:7] == [f"{per[c]['speedup']:.2f}x" for c, _ in COLUMNS]
    assert cells[7] == f"{s['acceptance']['tau']:.2f}" and cells[8] == f"{s['speedup']:.2f}x"
    assert "Spec-Bench tau per category" in md
    pngs = [p for p in out["plots"] if p.name.startswith("spec_bench_leaderboard_")]
    assert len(pngs) == 1 and pngs[0].stat().st_size > 0


def test_download_when_allowed_then_cached(tmp_path, monkeypatch):
    import io
    import urllib.request

    body = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
    fetched = []

    def fake_urlopen(url, timeout=None):
        fetched.append(url)
        return io.BytesIO(body)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    t = build_task(cfg(None, data_dir=str(tmp_path / "empty")))
    assert len(t.load()) == len(ROWS) and fetched == ["https://example.invalid/q.jsonl"]
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # offline later: the cached copy is used
    assert len(build_task(cfg(None, data_dir=str(tmp_path / "empty"))).load()) == len(ROWS) and len(fetched) == 1
