"""`python -m specbench.tools.doctor`: one command for a user with a GPU (`make gpu-check`).

It writes one report file, section by section (a time limit leaves what was done):
- versions and the device;
- the host-sync budget counted on fake CUDA tensors (tests/test_sync_budget.py, greedy, both
  execution modes: what the code makes a GPU wait for per decoding step);
- the tests on the real GPU (`-m cuda`: tests/test_cuda_device.py, both modes, graphs captured);
- the synchronising calls the real GPU reports per decoding step (`set_sync_debug_mode("warn")`),
  per method and mode, with the sites (file:line) that make them;
- AR tokens/s in eager and graphs mode beside the bound the device's memory bandwidth puts on it;
- a GSM8K bench of AR, PLD, SuffixDecoding, EAGLE-3 (the authors' tree), EAGLE-2, EESD and Medusa
  in both modes, one row per method, the two speedups side by side (specbench/tools/regimes.py).

Without a GPU it still runs, says plainly that none was found, and reports the fake-CUDA counts.

    python -m specbench.tools.doctor [--model smollm2-135m|tiny-llama|<hub id or local path>]
        [--device cuda|cpu] [--samples 10] [--tokens 128] [--seconds 420] [--out doctor_report.md] [--no-tests]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specbench.config.compose import CONF_DIR, fail
from specbench.core.errors import SpecBenchError, check_output_file

REPO = CONF_DIR.parent
DEVICES = ("cuda", "cpu")
PROMPT = "Write a short Python function that returns the n-th Fibonacci number, and explain it."
# what the untrained parts need beyond conf/method/<name>.yaml (as tests/test_every_method.py)
UNTRAINED = {"medusa": {"tree_from_accuracies": None, "sizes": [2, 2, 1, 1]},
             "samd": {"aux_settings": {"allow_untrained": True}}}  # its auxiliary's head (EAGLE-2's)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specbench.tools.doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="conf/model/<name> or a hub id / local path (model=hf)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=128, help="new tokens per generation in the bench")
    p.add_argument("--samples", type=int, default=10, help="GSM8K questions in the bench (per mode)")
    p.add_argument("--seconds", type=float, default=420.0,
                   help="the bench's time budget: eager stops starting prompts after ~40%% of it, graphs after ~25%%")
    p.add_argument("--out", default="doctor_report.md")
    p.add_argument("--no-tests", action="store_true", help="skip the pytest runs (the bench only)")
    p.add_argument("--methods", default="issue", choices=("issue", "all"),
                   help="issue: AR, PLD, suffix, EAGLE-3, EAGLE-2, EESD, Medusa; all: every registered method")
    args = p.parse_args(argv)
    if args.device not in DEVICES:
        fail(f"unknown --device {args.device!r}; allowed: {', '.join(DEVICES)}")
    if args.tokens < 2:
        fail(f"--tokens must be >= 2, got {args.tokens}")
    if args.samples < 2:
        fail(f"--samples must be >= 2, got {args.samples}")
    if not args.seconds > 0:  # also nan
        fail(f"--seconds must be > 0, got {args.seconds}")
    try:
        check_output_file(args.out, "--out")
    except SpecBenchError as e:
        fail(f"{e} (the report's file, e.g. doctor_report.md)")
    return args


# -- facts ------------------------------------------------------------------------------------
def versions() -> list[str]:
    import torch
    import transformers

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return [f"- specbench commit: {commit or 'unknown'}", f"- python {platform.python_version()} on {platform.platform()}",
            f"- torch {torch.__version__} (CUDA build: {torch.version.cuda or 'none'}, cuDNN: "
            f"{torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else 'none'})",
            f"- transformers {transformers.__version__}"]


def device_lines() -> tuple[bool, list[str]]:
    import torch

    if not torch.cuda.is_available():
        why = "this torch is a CPU-only build" if torch.version.cuda is None else "torch sees no CUDA device"
        return False, [f"**No GPU was found** ({why}). Nothing below was measured on a GPU."]
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(f"- cuda:{i}: {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB")
    return True, out


# -- tests ------------------------------------------------------------------------------------
def pytest_run(args: list[str], env_extra: dict | None = None) -> tuple[int, str]:
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "pytest", "-rfEs", "-p", "no:cacheprovider", "-p", "no:warnings", *args],
                       cwd=REPO, env=env, capture_output=True, text=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    totals = [ln.strip("= ") for ln in lines if re.search(r"\d+ (passed|failed|error|skipped)", ln)]
    return r.returncode, "\n".join(failed + totals[-1:])


def sync_budget() -> tuple[int, str, dict]:
    """tests/test_sync_budget.py with its counts written to a temporary file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "syncs.json"
        code, summary = pytest_run(["tests/test_sync_budget.py", "-k", "greedy or counter or report"],
                                   {"SPECBENCH_SYNC_REPORT": str(path)})
        counts = json.loads(path.read_text()) if path.is_file() else {}
    return code, summary, counts


def budget_table(counts: dict) -> list[str]:
    rows = ["| method-controller [mode] | steps | drafted per step | syncs per step | budget per step | "
            "queued copies in per step | in the layer loop |", "|---|---|---|---|---|---|---|"]
    for name, c in sorted(counts.items()):
        rows.append(f"| {name} | {c['steps']} | {_spread(c['drafted'])} | {_spread(c['syncs'])} | {_spread(c['budget'])} "
                    f"| {_spread(c['h2d_queued'])} | {c['in_layer']} |")
    return rows


def _spread(xs: list[int]) -> str:
    return str(xs[0]) if len(set(xs)) == 1 else f"{min(xs)}-{max(xs)} (mean {sum(xs) / len(xs):.1f})"


# -- bench ------------------------------------------------------------------------------------
SYNC_METHODS = ["ar", "pld", "suffix", "eagle3", "eagle", "eesd", "medusa"]


def model_cfg(name: str, device: str):
    """The model's settings: conf/model/<name>.yaml, or conf/model/hf.yaml with id=name."""
    from specbench.config import settings

    over = {"device": device}
    if device == "cuda":
        over["backend"] = "eager"  # the CPU kernels (ggml, mkldnn, ...) do not apply on a GPU
    if (CONF_DIR / "model" / f"{name}.yaml").is_file():
        return settings.shipped("model", name, over)
    return settings.shipped("model", "hf", {"id": name}, over)


def gsm8k_prompts(target, n: int) -> tuple[list[list[int]], str]:
    """The first n GSM8K test questions as chat prompts: from SPECBENCH_DATA_DIR, else the few the
    tests ship (tests/data, enough for the doctor on a machine without the data)."""
    from specbench.config.settings import shipped
    from specbench.tasks import build_task

    data = os.environ.get("SPECBENCH_DATA_DIR", "")
    if not (Path(data) / "gsm8k" / "test.jsonl").is_file():
        data = str(REPO / "tests" / "data")
    samples = build_task(shipped("task", "gsm8k", {"num_samples": None, "data_dir": data})).load()[:n]
    return [target.tokenizer.encode_chat(s.messages([])) for s in samples], data


def methods_to_bench(args) -> dict:
    from specbench.tools import regimes
    from specbench.methods import METHODS

    if args.methods == "all":
        return {m: regimes.METHODS.get(m, {}) for m in sorted(METHODS) if m != "ar"}
    return {m: regimes.METHODS.get(m, {}) for m in SYNC_METHODS if m != "ar"}


def real_syncs(target, methods: dict, tokens: int) -> list[str]:
    """Synchronising calls per decoding step on the real GPU, both modes, with their sites."""
    import torch

    from specbench.tools import regimes
    from specbench.models.graphs import precapture
    from specbench.tools.syncs import count_generation

    prompt = target.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    rows = ["| method | mode | steps | syncs per step | syncs outside steps | top sites (file:function:line, count) |",
            "|---|---|---|---|---|---|"]
    for mode in ("eager", "graphs"):
        target.set_execution(mode, 64)
        target.static_capacity = 1024
        precapture(target)
        for name in ["ar", *methods]:
            try:
                m, note = regimes.build_one(target, name, methods.get(name, {}), UNTRAINED)
                if m is None:
                    raise RuntimeError(note)
                with torch.no_grad():
                    m.generate(prompt, 16, frozenset(), 0)  # warm-up: this method's own graphs are captured here
                got, _ = count_generation(m, prompt, tokens)
                mean = got.per_step_mean()
                rows.append(f"| {name} | {mode} | {got.steps} | {'–' if mean is None else f'{mean:.2f}'} | {got.outside} | {got.top(4)} |")
            except Exception as e:  # noqa: BLE001 - one method's failure must not hide the others'
                rows.append(f"| {name} | {mode} | – | – | – | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} |")
    target.set_execution("eager")
    return rows


def bench(args, log=print) -> list[str]:
    """Both regimes on GSM8K (specbench/tools/regimes.py) and AR against the bandwidth bound."""
    import torch

    from specbench.tools import regimes
    from specbench.models import load_model

    target = load_model(model_cfg(args.model, args.device))
    prompts, data = gsm8k_prompts(target, args.samples)
    methods = methods_to_bench(args)
    log(f"bench: {len(prompts)} GSM8K prompts from {data}, {args.tokens} new tokens, methods {', '.join(methods)}")
    eager = regimes.run_mode(target, "eager", methods, prompts, args.tokens, log, seconds=0.4 * args.seconds,
                             untrained=UNTRAINED)
    done = len(eager["ar"].per_prompt)
    graphs = regimes.run_mode(target, "graphs", methods, prompts[:done], args.tokens, log,
                              seconds=0.25 * args.seconds, untrained=UNTRAINED)
    out = [f"Model `{args.model}` ({target.name}) on {target.device}, {target.dtype}; {done} GSM8K questions "
           f"(first of {data}), {args.tokens} new tokens, greedy, batch 1; each mode's speedups against AR in the same "
           "mode, AR run once per question and mode; trained parts as published or cached (`untrained`: none found, "
           "the method ran with random weights: its speedup means nothing).", "",
           *regimes.table({"eager": eager, "graphs": graphs}), ""]
    ar_e, ar_g = eager["ar"].tok_s, graphs["ar"].tok_s
    line = f"AR: eager {ar_e:.1f} tok/s, graphs {ar_g:.1f} tok/s ({ar_g / ar_e:.1f}x)." if ar_e and ar_g else "AR: –"
    if target.device.type == "cuda":
        bw, wb = regimes.device_bandwidth(target.device), regimes.weight_bytes(target)
        bound = bw / wb
        line += (f" Bandwidth bound: {wb / 1e6:.0f} MB of weights per token at {bw / 1e9:.0f} GB/s (a device copy) = "
                 f"{bound:.0f} tok/s; eager reaches {100 * ar_e / bound:.1f}% of it, graphs {100 * ar_g / bound:.1f}%.")
    out.append(line)
    if args.device == "cuda":
        log("syncs: counting each method's synchronising calls in both modes")
        out += ["", "### Synchronising calls on this GPU, per decoding step", "",
                "`torch.cuda.set_sync_debug_mode(\"warn\")` over one generation of " f"{min(args.tokens, 64)} tokens of a short code question (after a "
                "warm-up that captures the method's graphs); outside steps: prefill, set-up and the "
                "timer's start/stop. The budget (docs/gpu.md) is what tests/test_sync_budget.py holds the fake count to.", "",
                *real_syncs(target, {m: methods[m] for m in methods if m in SYNC_METHODS}, min(args.tokens, 64))]
    del target
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return out


# -- the report -------------------------------------------------------------------------------
def report(args, write=lambda lines: None) -> list[str]:
    gpu, dev = device_lines()
    out = ["# specbench doctor report", "", f"Written {time.strftime('%Y-%m-%d %H:%M:%S')} by "
           f"`python -m specbench.tools.doctor {' '.join(sys.argv[1:])}`.", "", "## Versions", "", *versions(),
           "", "## Device", "", *dev, ""]
    write(out)
    if not args.no_tests:
        code, summary, counts = sync_budget()
        out += ["## Host syncs per decoding step (counted on fake CUDA tensors)", "",
                "tests/test_sync_budget.py, the tiny model, greedy, both execution modes: what the code makes a GPU "
                "wait for (reads, and copies in that block), whatever the GPU (docs/gpu.md has the budget).", "",
                *budget_table(counts), "", f"Budget test: {'passed' if code == 0 else 'FAILED'}: `{summary}`", ""]
        write(out)
        if gpu:
            code, summary = pytest_run(["-m", "cuda", "tests"])
            out += ["## Tests on this GPU", "", f"`pytest -m cuda tests` (tests/test_cuda_device.py: every method in both "
                    f"modes, graphs captured): {'passed' if code == 0 else 'FAILED'}", "", "```", summary, "```", ""]
        else:
            out += ["## Tests on a GPU", "", "Not run: no GPU (`pytest -m cuda` runs them on one).", ""]
        write(out)
    out += ["## Bench: eager and graphs", ""]
    if args.device == "cuda" and not gpu:
        out += ["Not run: no GPU found (`--device cpu` runs it on the CPU, without sync figures).", ""]
    else:
        out += bench(args, log=lambda msg: print(msg, flush=True)) + [""]
    write(out)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    def write(lines):  # after every section: a run cut short by a time limit keeps what it measured
        Path(args.out).write_text("\n".join(lines) + "\n")

    try:
        text = "\n".join(report(args, write)) + "\n"
    except SpecBenchError as e:  # a model that cannot be loaded, ...: one line; what was measured stays written
        fail(f"{e} (the report so far: {args.out})")
    except OSError as e:
        fail(f"cannot write {args.out}: {e.strerror or e}")
    print(text)
    print(f"report written to {args.out}")


if __name__ == "__main__":
    main()
