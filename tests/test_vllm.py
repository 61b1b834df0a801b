"""engine=vllm (specbench/vllm_engine, docs/vllm.md): its configuration, the JSON contract between the
project's process and the worker (a fake worker in the stdlib), and one real run in .venv-vllm.

The real run skips, saying why, when the vLLM environment is absent (`make vllm-env` builds it)."""

from __future__ import annotations

import json
import os
import sys
import time
import textwrap
from pathlib import Path

import pytest
import yaml

from specbench.config import schema
from specbench.config.compose import CONF_DIR, compose, validate
from specbench.config.engines import engine_argv
from specbench.core.errors import SpecBenchError
from specbench.config.identity import config_hash

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[1]
VENV_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
REQUIRED = os.environ.get("SPECBENCH_REQUIRE_VLLM") == "1"  # CI: the real run must run, never skip


def vllm_cfg(*overrides):
    return compose(engine_argv(["engine=vllm", *overrides]))


# ----------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("method", sorted(p.stem for p in (CONF_DIR / "method" / "vllm").glob("*.yaml")))
def test_every_vllm_method_validates_and_its_keys_are_in_the_schema(method):
    data = yaml.safe_load((CONF_DIR / "method" / "vllm" / f"{method}.yaml").read_text())
    assert set(data) == set(schema.VLLM_METHODS[data["name"]])
    extra = ["method.model=/some/head"] if method in ("eagle", "eagle3", "medusa", "draft_model") else []
    cfg = vllm_cfg(f"method={method}", *extra)
    validate(cfg)
    assert cfg.method.name == method and cfg.engine.name == "vllm"


def test_engine_files_match_the_schema():
    assert set(schema.VLLM_METHODS) == {p.stem for p in (CONF_DIR / "method" / "vllm").glob("*.yaml")}
    for p in (CONF_DIR / "engine").glob("*.yaml"):
        data = yaml.safe_load(p.read_text())
        assert set(data) == set(schema.ENGINES[data["name"]]), p


@pytest.mark.parametrize("overrides, message", [
    (["method=eagle3"], "method.model=null is not allowed; expected the eagle3 drafter vLLM loads"),
    (["method=ngram", "method.prompt_lookup_min=4", "method.prompt_lookup_max=2"],
     r"method.prompt_lookup_max=2 is not allowed; expected an integer >= method.prompt_lookup_min \(4\)"),
    (["method=ngram", "model=tiny-llama"], "model.loader='tiny' is not allowed"),
    (["method=eagle3", "method.model=/d", "model.draft_quant=q8_0"], "model.draft_quant='q8_0' is not allowed; expected none"),
    (["method=ngram", "engine.batch_sizes=[0,2]"], r"engine.batch_sizes=\[0, 2\] is not allowed"),
    # vLLM reads no control.*: each changed only the run dir's name and identity (same measurement, new dirs)
    (["method=ngram", "control=beta_ts"], r"control.\* is not read with engine=vllm"),
    (["method=ngram", "control.k=7"], r"control.\* is not read with engine=vllm"),
    # refused by the summary after the worker ran, a run dir left behind
    (["method=ngram", "engine.batch_sizes=[2,2]"], r"engine.batch_sizes=\[2, 2\] is not allowed; expected distinct batch sizes"),
    (["method=suffix", "method.min_token_prob=2"], "method.min_token_prob=2 is not allowed"),
    (["method=ngram", "method.k=3"], "unknown key 'method.k' for method 'ngram'; allowed: name, num_speculative_tokens"),
])
def test_bad_settings_are_one_line(overrides, message):
    with pytest.raises(SpecBenchError, match=message):
        validate(vllm_cfg(*overrides))


def test_method_names_are_vllms_with_engine_vllm_only():
    assert engine_argv(["engine=vllm", "method=ngram,suffix"]) == ["engine=vllm", "method=vllm/ngram,vllm/suffix"]
    assert engine_argv(["method=pld"]) == ["method=pld"]
    with pytest.raises(SpecBenchError, match="run each engine in its own command"):
        engine_argv(["engine=native,vllm"])


@pytest.mark.parametrize("argv, message", [
    (["engine=vllm", "method=pld"], "unknown method 'pld' for engine=vllm; allowed: ar, draft_model, eagle, eagle3, medusa, ngram, suffix"),
    (["method=vllm/ngram"], "vLLM's methods run with engine=vllm"),
    (["engine=vllm", "method=ngram", "method.num_speculative_tokens=0"], "method.num_speculative_tokens=0 is not allowed"),
    (["engine=vllm", "method=ngram", "engine.python=/nowhere/python", "task.num_samples=1"], "run `make vllm-env`"),
])
def test_cli_refuses_in_one_line_before_writing(tmp_path, argv, message):
    import subprocess

    run_dir = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "specbench", *argv, f"run_dir={run_dir}"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specbench: error: ") and message in lines[0], p.stderr[-2000:]
    assert not run_dir.exists()


def test_native_fingerprints_are_unchanged_by_the_engine_group():
    """Runs written before engines existed keep their default directory (and resume)."""
    cfg = compose(["method=pld"])
    plain = compose(["method=pld"])
    from omegaconf import OmegaConf, open_dict

    with open_dict(plain):
        del plain["engine"]
    assert config_hash(cfg) == config_hash(plain)
    assert config_hash(vllm_cfg("method=ar")) != config_hash(compose(["method=ar"]))
    assert OmegaConf.select(cfg, "engine.name") == "native"


def test_speculative_config_maps_conf_names_to_vllms():
    from specbench.config.settings import of
    from specbench.vllm_engine.settings import speculative_config

    plain = lambda c: of(c).method  # noqa: E731 - the method's settings
    assert speculative_config(plain(vllm_cfg("method=ar"))) is None
    assert speculative_config(plain(vllm_cfg("method=ngram", "method.prompt_lookup_max=4"))) == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    suffix = speculative_config(plain(vllm_cfg("method=suffix", "method.max_cached_requests=0")))
    assert suffix["suffix_decoding_max_cached_requests"] == 0 and suffix["suffix_decoding_max_tree_depth"] == 24
    assert speculative_config(plain(vllm_cfg("method=eagle3", "method.model=/h")))["model"] == "/h"


# ----------------------------------------------------------------------------- the worker's pure parts
class _Metric:
    def __init__(self, name, value=None, values=None):
        self.name, self.value, self.values = name, value, values


def test_a_worker_killed_by_the_kernel_is_named(tmp_path):
    from specbench.vllm_engine.run import last_error

    log = tmp_path / "worker.log"
    log.write_text("INFO start\nERROR [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly (exit code: None)\n"
                   "RuntimeError: Engine core initialization failed. See root cause above.\n")
    assert last_error(log).startswith("RuntimeError: Engine core initialization failed") and "out of memory?" in last_error(log)


def test_sigterm_stops_the_worker_in_its_own_session(tmp_path, monkeypatch):
    """SIGTERM (a scheduler's time limit) takes Ctrl-C's path (core/errors.stop_on_sigterm): run_worker's `finally`
    kills the worker's session. By default SIGTERM ends this process alone and the worker, started in a session of
    its own, runs on (holding its GPU memory)."""
    import os
    import signal
    import threading

    from specbench.core.errors import stop_on_sigterm
    from specbench.vllm_engine import run

    pidfile = tmp_path / "worker.pid"
    script = tmp_path / "sleeper.py"
    script.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    monkeypatch.setattr(run, "WORKER", script)

    def term_once_started():
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    old = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        threading.Thread(target=term_once_started, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            run.run_worker(Path(sys.executable), {"batch_sizes": [1], "prompts": [[1]], "kv_cache_gib": 1},
                           tmp_path / "worker.log", 120, lambda rec: None)
    finally:
        signal.signal(signal.SIGTERM, old)
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(int(pidfile.read_text()), 0)


def test_worker_counters_are_differences_per_batch_size():
    sys.path.insert(0, str(REPO / "specbench" / "vllm_engine"))
    try:
        import worker
    finally:
        sys.path.pop(0)

    class LLM:
        metrics: list = []

        def get_metrics(self):
            return self.metrics

    llm = LLM()
    llm.metrics = [_Metric("vllm:spec_decode_num_drafts", 10), _Metric("vllm:spec_decode_num_draft_tokens", 50),
                   _Metric("vllm:spec_decode_num_accepted_tokens", 20), _Metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=[9, 6, 3, 2, 0])]
    before = worker.counters(llm)
    llm.metrics = [_Metric("vllm:spec_decode_num_drafts", 16), _Metric("vllm:spec_decode_num_draft_tokens", 80),
                   _Metric("vllm:spec_decode_num_accepted_tokens", 30), _Metric("vllm:spec_decode_num_accepted_tokens_per_pos", values=[14, 9, 4, 3, 0]),
                   _Metric("vllm:num_requests_running", 0)]
    assert worker.difference(worker.counters(llm), before) == {
        "drafts": 6, "draft_tokens": 30, "accepted_tokens": 10, "accepted_per_pos": [5, 3, 1, 1, 0]}

    class Out:
        class metrics:
            first_token_latency, first_token_ts, last_token_ts = 0.5, 10.0, 12.0

        outputs = [type("C", (), {"token_ids": [1, 2, 3, 4, 5]})]

    assert worker.request_times(Out) == {"ttft": 0.5, "tpot": 0.5}


def test_worker_cpu_time_counts_the_processes_vllm_spawns():
    """vLLM computes in processes it spawns (engine core, workers): the worker's CPU time must include them,
    or its CPU share (which flags a measurement whose core other jobs took) would read near 0 for every run."""
    import subprocess

    sys.path.insert(0, str(REPO / "specbench" / "vllm_engine"))
    try:
        import worker
    finally:
        sys.path.pop(0)
    before = worker.cpu_seconds()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\nprint(1, flush=True)\ntime.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # the child has burnt its 0.4 s and still runs
        assert worker.cpu_seconds() - before >= 0.35
    finally:
        child.kill()
        child.wait()
    cores = len(os.sched_getaffinity(0))
    assert worker.cpu_share(1.0, 2.0) == pytest.approx(0.5 / cores) and worker.cpu_share(None, 2.0) is None


# ----------------------------------------------------------------------------- the JSON contract (fake worker)
FAKE_WORKER = textwrap.dedent('''
    import json, os, sys
    spec = json.load(open(sys.argv[1]))
    with open(os.environ["FAKE_SPEC_COPY"], "a") as f:
        f.write(json.dumps(spec) + "\\n")
    need = {"model", "dtype", "max_model_len", "enforce_eager", "tensor_parallel_size", "pipeline_parallel_size",
            "max_num_seqs", "seed", "speculative_config", "prompts", "ids", "batch_sizes", "sampling", "warmup_tokens", "out"}
    assert need <= set(spec), need - set(spec)
    out = open(spec["out"], "a")
    out.write(json.dumps({"kind": "info", "vllm": "fake"}) + "\\n"); out.flush()
    for b in spec["batch_sizes"]:
        if str(b) == os.environ.get("FAKE_FAIL_AT"):
            print("RuntimeError: boom"); sys.exit(3)
        rec = {"kind": "batch", "batch_size": b}
        for key, wall in (("ar", 1.0), ("method", 0.5 * b)):
            toks = [p[-3:] for p in spec["prompts"]]
            rec[key] = {"tokens": toks, "wall": wall, "new_tokens": sum(map(len, toks)), "cpu_share": 0.25 if key == "ar" else 0.75,
                        "requests": [{"ttft": 0.01 * b, "tpot": 0.02} for _ in toks],
                        "spec": {"drafts": 4, "draft_tokens": 20, "accepted_tokens": 6, "accepted_per_pos": [3, 2, 1, 0, 0]}
                                if key == "method" else {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_pos": []}}
        out.write(json.dumps(rec) + "\\n"); out.flush()
''')


def fake_python(tmp_path: Path, with_vllm: bool = True) -> Path:
    """An interpreter for engine.python: this one, with a stub `vllm` package importable (or none)."""
    stub = tmp_path / "fake_site"
    if with_vllm:
        (stub / "vllm").mkdir(parents=True, exist_ok=True)
        (stub / "vllm" / "__init__.py").write_text('__version__ = "0.0.fake"\n')
    exe = tmp_path / ("fake_python" if with_vllm else "python_without_vllm")
    exe.write_text(f'#!/bin/sh\nPYTHONPATH={stub} exec {sys.executable} "$@"\n')
    exe.chmod(0o755)
    return exe


@pytest.fixture
def fake_worker(tmp_path, monkeypatch):
    from specbench.vllm_engine import run

    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    monkeypatch.setattr(run, "WORKER", script)
    monkeypatch.setattr(run, "model_for_vllm", lambda model_cfg, prov: "fake-model")  # no conversion
    monkeypatch.setenv("FAKE_SPEC_COPY", str(tmp_path / "specs.jsonl"))
    return tmp_path / "specs.jsonl"


def _specs(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.ci  # CI only (docs/testing.md): worker processes, ~15 s of CPU
def test_fake_worker_contract_records_resume_and_summary(tmp_path, fake_worker, monkeypatch):
    from specbench.vllm_engine.convert import load_tokenizer
    from specbench.vllm_engine.run import run_vllm

    run_dir = tmp_path / "run"
    args = ["method=ngram", "task.num_samples=3", "engine.batch_sizes=[1,2,4]", f"engine.python={fake_python(tmp_path)}",
            "max_new_tokens=8", f"run_dir={run_dir}"]
    monkeypatch.setenv("FAKE_FAIL_AT", "2")
    with pytest.raises(SpecBenchError, match=r"the vLLM worker failed \(exit 3\): RuntimeError: boom"):
        run_vllm(vllm_cfg(*args))
    lines = (run_dir / "samples.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["batch-1"]  # the finished batch size is kept

    monkeypatch.delenv("FAKE_FAIL_AT")
    cfg = vllm_cfg(*args)
    s = run_vllm(cfg)
    first, second = _specs(fake_worker)
    assert first["batch_sizes"] == [1, 2, 4] and second["batch_sizes"] == [2, 4]  # resumed: only the missing ones
    from specbench.config.settings import of
    from specbench.tasks import build_task

    tok = load_tokenizer(of(cfg).model)
    assert second["prompts"] == [tok.encode_chat(x.messages([])) for x in build_task(of(cfg).task).load()]
    assert second["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    assert second["sampling"]["stop_token_ids"] == sorted(tok.eos_ids) and second["sampling"]["max_tokens"] == 8
    assert second["max_num_seqs"] == 4
    assert [b["batch_size"] for b in s["batches"]] == [1, 2, 4]
    assert [round(b["speedup"], 6) for b in s["batches"]] == [2.0, 1.0, 0.5]
    assert s["crossover_batch"] == 4 and s["matches_ar"] == 3
    b1 = s["batches"][0]
    assert b1["mean_accepted_length"] == 1 + 6 / 4 and b1["per_position"] == [0.75, 0.5, 0.25, 0, 0]
    assert (b1["ar_cpu_share"], b1["method_cpu_share"]) == (0.25, 0.75) and "0.25/0.75" in s["printed"]
    assert json.loads((run_dir / "summary.json").read_text())["engine"] == "vllm"

    # the report reads it; the native report routes it there
    from specbench.report import report

    out = report([run_dir], tmp_path / "rep")
    assert out["runs"] == []
    text = (tmp_path / "rep" / "vllm_tables.md").read_text()
    assert "| ngram (k=5) | 4 |" in text and "0.500x" in text and (tmp_path / "rep" / "vllm_throughput.png").stat().st_size > 1000
    # a run of another setting stands in its own table and plot (it was listed under the first one's header)
    other = tmp_path / "other"
    run_vllm(vllm_cfg(*args[:-2], "max_new_tokens=6", f"run_dir={other}"))
    report([run_dir, other], tmp_path / "rep2")
    text = (tmp_path / "rep2" / "vllm_tables.md").read_text()
    assert text.count("# vLLM: throughput vs batch size") == 2 and "max_new_tokens 6" in text and "max_new_tokens 8" in text
    assert {p.name for p in (tmp_path / "rep2").glob("*.png")} == {"vllm_throughput_1.png", "vllm_throughput_2.png"}
    with pytest.raises(SpecBenchError, match="engine=vllm runs only"):  # refused before anything is written
        report([run_dir], tmp_path / "rep3", baseline="pld")
    assert not (tmp_path / "rep3").exists()

    # other prompts are never mixed into these batch sizes
    with pytest.raises(SpecBenchError, match="measured on other prompts"):
        run_vllm(vllm_cfg(*args[:1], "task.num_samples=2", *args[2:]))
    assert json.loads((run_dir / "summary.json").read_text())["meta"]["vllm_version"] == "0.0.fake"


def test_a_python_without_vllm_is_refused_before_anything_is_written(tmp_path, fake_worker):
    """issue 42: engine.python pointing at a Python without vllm failed inside the worker, after the run dir was written."""
    from specbench.vllm_engine.run import run_vllm

    run_dir = tmp_path / "run"
    args = ["method=ngram", "task.num_samples=1", f"engine.python={fake_python(tmp_path, with_vllm=False)}", f"run_dir={run_dir}"]
    with pytest.raises(SpecBenchError, match=r"cannot import vllm \(ModuleNotFoundError: No module named 'vllm'\); run `make vllm-env`"):
        run_vllm(vllm_cfg(*args))
    assert not run_dir.exists()


@pytest.mark.parametrize("body, message", [
    ("", "without reporting batch size 1, batch size 2, its info record"),  # exit 0, nothing said
    ('out.write(json.dumps({"kind": "info"}) + "\\n")', "without reporting batch size 1, batch size 2"),
    ('out.write("not json\\n")', "neither an info nor a batch record"),
    ('out.write(json.dumps({"kind": "batch", "batch_size": 1, "ar": {}}) + "\\n")', "batch 1: no complete 'ar' result"),
    ('out.write(json.dumps({"kind": "batch", "batch_size": 8}) + "\\n")', "batch size 8, not one of [1, 2]"),
])
def test_an_incomplete_worker_reply_is_one_line_and_claims_nothing(tmp_path, fake_worker, monkeypatch, body, message):
    """issue 42: a worker that exited 0 reporting nothing gave exit 0, an empty table and 'the method pays at every
    batch size measured'. Now: one line, exit 2 from the CLI, no summary."""
    from specbench.vllm_engine import run

    script = tmp_path / "quiet_worker.py"
    script.write_text("import json, sys\nspec = json.load(open(sys.argv[1]))\nout = open(spec['out'], 'a')\n" + body + "\n")
    monkeypatch.setattr(run, "WORKER", script)
    run_dir = tmp_path / "run"
    cfg = vllm_cfg("method=ngram", "task.num_samples=2", "engine.batch_sizes=[1,2]", f"engine.python={fake_python(tmp_path)}",
                   f"run_dir={run_dir}")
    with pytest.raises(SpecBenchError) as e:
        run.run_vllm(cfg)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (run_dir / "summary.json").exists() and not (run_dir / "samples.jsonl").exists()


# ----------------------------------------------------------------------------- a real run in .venv-vllm
@pytest.mark.slow
@pytest.mark.skipif(not VENV_PYTHON.is_file() and not REQUIRED,
                    reason=f"{VENV_PYTHON} is absent: `make vllm-env` builds vLLM's environment (docs/vllm.md)")
def test_real_vllm_ar_and_ngram_at_batch_1_and_2(tmp_path):
    """The embedded model converted and served by vLLM: AR and n-gram speculation, greedy, equal outputs.
    SPECBENCH_REQUIRE_VLLM=1 (CI, .ci/run): a missing environment fails instead of skipping."""
    from specbench.vllm_engine.run import run_vllm

    run_dir = tmp_path / "run"
    s = run_vllm(vllm_cfg("method=ngram", "task.num_samples=2", "engine.batch_sizes=[1,2]", "max_new_tokens=24",
                          "engine.max_model_len=1024", "engine.kv_cache_gib=1", "warmup_tokens=2", f"run_dir={run_dir}"))
    assert [b["batch_size"] for b in s["batches"]] == [1, 2]
    assert s["matches_ar"] == 2, s["batches"]  # greedy: vLLM's n-gram speculation returns vLLM's AR tokens
    assert s["meta"]["worker"]["vllm"]
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for key in ("ar", "method"):
            r = rec[key]
            assert len(r["tokens"]) == 2 and all(1 <= len(t) <= 24 for t in r["tokens"])
            assert r["new_tokens"] == sum(map(len, r["tokens"])) and r["wall"] > 0 and len(r["ttft"]) == 2
        assert rec["ar"]["spec"]["drafts"] == 0 and rec["method"]["spec"]["draft_tokens"] >= rec["method"]["spec"]["accepted_tokens"]
