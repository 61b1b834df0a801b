"""`python -m specbench engine=vllm method=<name> ...`: validate, prepare the model, run the vLLM worker, keep its results.

Nothing is written before the whole configuration is validated, the vLLM environment found and the prompts
tokenized. The run directory follows the native engine's rules (specbench/run/rundir.py: fingerprint with the
weights' hashes, one writer, resume, overwrite moves aside): one record per batch size in samples.jsonl,
appended the moment the worker reports it, so a crash keeps every finished batch size and a re-run runs
only the missing ones, on the same prompts (checked: a record names the sample ids it was measured on).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig

from specbench.config.validate import validate
from specbench.core.errors import SpecBenchError
from specbench.run.provenance import model_provenance, path_digest
from specbench.config.identity import check_run_dir
from specbench.run.rundir import RunDir
from specbench.config.settings import has, record
from specbench.config.settings import of as run_settings
from specbench.tasks import build_task
from specbench.vllm_engine import settings
from specbench.vllm_engine.convert import load_tokenizer, model_for_vllm
from specbench.vllm_engine.summary import batch_record, print_summary, summarize

WORKER = Path(__file__).resolve().parent / "worker.py"
PRELOAD = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "lib/libiomp5.so")  # the second: in the vLLM env


ENV_HINT = "run `make vllm-env` (or set engine.python to a Python with vllm installed)"
PROBE = "import vllm; print(vllm.__version__)"
PROBE_TIMEOUT_S = 600.0  # importing vllm takes seconds to a minute; a hang is not an environment
SYSTEM_KEYS = {"tokens": list, "wall": (int, float), "new_tokens": int, "requests": list, "spec": dict}
SPEC_KEYS = ("drafts", "draft_tokens", "accepted_tokens", "accepted_per_pos")


def check_environment(python: Path, timeout_s: float) -> str:
    """vLLM's version in `python` (as the worker runs it), before anything is written: a Python
    that cannot import vllm would fail only once the run directory exists."""
    if not python.is_file():
        raise SpecBenchError(f"engine=vllm needs the vLLM environment: {python} not found; {ENV_HINT}")
    try:
        p = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=timeout_s, check=False,
                           env=worker_env(python, 1), cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        raise SpecBenchError(f"engine=vllm: `import vllm` in {python} took longer than {timeout_s:g} s; {ENV_HINT}") from None
    except OSError as e:
        raise SpecBenchError(f"engine=vllm: {python} does not run ({e.strerror or e}); {ENV_HINT}") from None
    if p.returncode:
        last = ([ln.strip() for ln in p.stderr.splitlines() if ln.strip()] or ["no output"])[-1][:200]
        raise SpecBenchError(f"engine=vllm needs the vLLM environment: {python} cannot import vllm ({last}); {ENV_HINT}")
    return p.stdout.strip()


def check_record(rec, todo: list[int], seen: set, n_prompts: int) -> str | None:
    """What is wrong with one line of the worker's reply (None: a complete info or batch record)."""
    if not isinstance(rec, dict) or rec.get("kind") not in ("info", "batch"):
        return "a line that is neither an info nor a batch record"
    if rec["kind"] == "info":
        return None
    b = rec.get("batch_size")
    if b not in todo or b in seen:
        return f"batch size {b!r}, {'twice' if b in seen else f'not one of {todo}'}"
    for key in ("ar", "method"):
        r = rec.get(key)
        if not isinstance(r, dict) or any(not isinstance(r.get(k), t) for k, t in SYSTEM_KEYS.items()):
            return f"batch {b}: no complete {key!r} result (needs {', '.join(SYSTEM_KEYS)})"
        if len(r["tokens"]) != n_prompts or any(k not in r["spec"] for k in SPEC_KEYS):
            return f"batch {b}: {key!r} has {len(r['tokens'])} outputs for {n_prompts} prompts, or incomplete spec-decode counters"
    return None


def worker_env(python: Path, kv_cache_gib: float) -> dict:
    """vLLM's CPU advice: tcmalloc and Intel OpenMP preloaded (where present); its KV cache size; its
    OpenMP threads bound to the cores this process may use (so `taskset` confines it)."""
    env = dict(os.environ)
    venv = python.parent.parent
    found = [str(p) for p in (Path(PRELOAD[0]), venv / PRELOAD[1]) if p.is_file()]
    if found:
        env["LD_PRELOAD"] = ":".join(found + [env["LD_PRELOAD"]] if env.get("LD_PRELOAD") else found)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(kv_cache_gib)))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    env.pop("PYTHONPATH", None)  # the worker imports vllm and the stdlib only
    return env


def prompts_of(run):
    """The task's samples and their first turns as token ids (the native engine's tokenizer and
    template); `run`: the run's settings."""
    samples = build_task(run.task).load()
    tok = load_tokenizer(run.model)
    prompts = [tok.encode_chat(s.messages([])) for s in samples]
    limit = int(run.engine.max_model_len)
    for s, p in zip(samples, prompts):
        if len(p) >= limit:
            raise SpecBenchError(f"sample {s.id!r}: the prompt has {len(p)} tokens, engine.max_model_len={limit}; raise it")
    return samples, prompts, tok


def provenance_of(run) -> dict:
    out = {"model": model_provenance(run.model, None), "artifacts": {}}
    drafter = run.method.model if has(run.method, "model") else None  # eagle, eagle3, medusa, draft_model
    if drafter and Path(str(drafter)).expanduser().exists():
        out["artifacts"]["model"] = path_digest(drafter)
    return out


def run_worker(python: Path, spec: dict, log: Path, timeout_s: float, on_record) -> dict:
    """Run the worker; `on_record(rec)` for each batch size the moment it is written. Returns the worker's info.
    Its reply is checked: every line a complete record, every batch size asked for reported, else one line."""
    info: dict = {}
    todo, seen, n = list(spec["batch_sizes"]), set(), len(spec["prompts"])
    with tempfile.TemporaryDirectory(prefix="specbench-vllm-") as tmp:
        spec = spec | {"out": str(Path(tmp) / "results.jsonl")}
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        Path(spec["out"]).touch()
        with open(log, "a") as logf, open(spec["out"]) as results:
            proc = subprocess.Popen([str(python), str(WORKER), str(Path(tmp) / "spec.json")], stdout=logf, stderr=subprocess.STDOUT,
                                    env=worker_env(python, float(spec["kv_cache_gib"])), start_new_session=True, cwd=tmp)
            try:
                deadline, pending = time.monotonic() + timeout_s, ""
                while True:
                    ended = proc.poll() is not None
                    pending += results.read()
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        rec = _parse(line)
                        if (wrong := check_record(rec, todo, seen, n)) is not None:
                            raise SpecBenchError(f"the vLLM worker's reply is not usable: {wrong} ({line[:80]!r}); "
                                                 f"finished batch sizes are kept (full log: {log})")
                        info.update(rec) if rec["kind"] == "info" else (seen.add(rec["batch_size"]), on_record(rec))
                    if ended:
                        break
                    if time.monotonic() > deadline:
                        raise SpecBenchError(f"the vLLM worker ran past engine.timeout_s={timeout_s:g}; finished batch sizes are kept ({log})")
                    time.sleep(0.2)
            finally:  # an error, a timeout or Ctrl-C: the worker's own session goes, it and the processes vLLM spawned
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    if proc.returncode:
        raise SpecBenchError(f"the vLLM worker failed (exit {proc.returncode}): {last_error(log)} (full log: {log})")
    missing = [f"batch size {b}" for b in todo if b not in seen] + ([] if info else ["its info record"])
    if missing:  # exit 0 and an incomplete reply: no table, no crossover claimed from what is not there
        raise SpecBenchError(f"the vLLM worker exited (0) without reporting {', '.join(missing)} ({last_error(log)}); "
                             f"finished batch sizes are kept (full log: {log})")
    return info


def _parse(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None  # check_record names it


def last_error(log: Path) -> str:
    """The worker log's last error line; a vLLM process that vanished is named (the kernel's OOM killer, mostly)."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    text = (errors or lines or ["no output"])[-1][:300]
    if any("died unexpectedly" in ln for ln in lines):
        text += "; a vLLM process died without an error (killed: out of memory? lower engine.kv_cache_gib)"
    return text


def run_vllm(cfg: DictConfig) -> dict:
    """An engine=vllm run of the composed config `cfg` (validated here, read as its settings;
    `cfg` itself is only recorded: config.yaml, the fingerprint)."""
    validate(cfg)
    run = run_settings(cfg)
    check_run_dir(run.run_dir)
    python = settings.worker_python(run.engine)
    version = check_environment(python, min(float(run.engine.timeout_s), PROBE_TIMEOUT_S))
    samples, prompts, tok = prompts_of(run)
    ids = [s.id for s in samples]
    provenance = provenance_of(run)
    model = model_for_vllm(run.model, provenance["model"])  # the converted model lives in the cache, not the run dir
    meta = {"engine": "vllm", "method": run.method.name, "task": run.task.name, "model": run.model.name, "vllm_model": model,
            "speculative_config": settings.speculative_config(run.method), "sampling": record(run.sampling),
            "max_new_tokens": int(run.max_new_tokens), "prompts": len(prompts), "first_turn_only": any(len(s.turns) > 1 for s in samples),
            "vllm_version": version, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    run_dir = RunDir(Path(run.run_dir), cfg, bool(run.overwrite), provenance)
    try:
        done = run_dir.done()
        for rec in done.values():
            if rec.get("prompt_ids") != ids:
                raise SpecBenchError(f"run dir {run_dir.path} holds {rec['id']} measured on other prompts (task.num_samples or "
                                     "task.seed changed); choose another run_name or pass overwrite=true")
        batches = [int(b) for b in run.engine.batch_sizes]
        todo = [b for b in batches if f"batch-{b}" not in done]
        if todo:
            spec = settings.worker_spec(run, model, prompts, ids, todo, tok.eos_ids, int(run.max_new_tokens), "")
            spec["kv_cache_gib"] = float(run.engine.kv_cache_gib)
            task = build_task(run.task)
            print(f"vllm: {run.method.name} and AR, {len(prompts)} prompts, batch sizes {todo} (worker log: {run_dir.path / 'worker.log'})")
            on_record = lambda rec: run_dir.append(batch_record(rec, batches.index(rec["batch_size"]), samples, ids, task, tok))  # noqa: E731
            meta["worker"] = run_worker(python, spec, run_dir.path / "worker.log", float(run.engine.timeout_s), on_record)
        done = run_dir.done()
        records = list(done.values())  # every batch size measured into this dir (engine.batch_sizes may grow)
        summary = summarize(records) | {"meta": meta}
        run_dir.write("summary.json", json.dumps(summary, indent=2, default=str))
    except KeyboardInterrupt:  # the worker is gone (run_worker); every finished batch size is on disk
        raise run_dir.interrupted("batch sizes") from None
    finally:
        run_dir.release()
    summary["printed"] = print_summary(summary)
    print(f"results: {run_dir.path}")
    return summary
