"""`python -m specbench.doctor`: one command for the first user with a GPU (`make gpu-check`).

It writes one report file to attach to an issue: versions, the device, the host-sync budget of
every method counted on fake CUDA tensors (tests/test_sync_budget.py: what the code would make a
GPU wait for, per decoding step), the tests on the device (`-m "fake_cuda or cuda"`: the fake-CUDA
checks and tests/test_cuda_device.py on the real GPU) and a short bench of every method on the
model the user names (default: the embedded model, on `cuda`), run under
`torch.cuda.set_sync_debug_mode("warn")`, with the synchronising calls it saw per decoding step.

Without a GPU it still runs, says plainly that none was found, and reports the fake-CUDA
counts; the bench then runs only with `--device cpu` (no sync figures there: a CPU never waits).

    python -m specbench.doctor [--model smollm2-135m|tiny-llama|<hub id or local path>]
        [--device cuda|cpu] [--tokens 32] [--out doctor_report.md] [--no-tests]
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
import warnings
from pathlib import Path

from specbench.config import CONF_DIR, fail

REPO = CONF_DIR.parent
DEVICES = ("cuda", "cpu")
PROMPT = "Write a short Python function that returns the n-th Fibonacci number, and explain it."
# what the untrained parts need beyond conf/method/<name>.yaml (as tests/test_every_method.py)
UNTRAINED = {"medusa": {"tree_from_accuracies": None, "sizes": [2, 2, 1, 1]},
             "samd": {"aux_settings": {"allow_untrained": True}}}  # its auxiliary's head (EAGLE-2's)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m specbench.doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="conf/model/<name> or a hub id / local path (model=hf)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per method in the bench")
    p.add_argument("--out", default="doctor_report.md")
    p.add_argument("--no-tests", action="store_true", help="skip the pytest runs (the bench only)")
    args = p.parse_args(argv)
    if args.device not in DEVICES:
        fail(f"unknown --device {args.device!r}; allowed: {', '.join(DEVICES)}")
    if args.tokens < 2:
        fail(f"--tokens must be >= 2, got {args.tokens}")
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
        code, summary = pytest_run(["tests/test_sync_budget.py"], {"SPECBENCH_SYNC_REPORT": str(path)})
        counts = json.loads(path.read_text()) if path.is_file() else {}
    return code, summary, counts


def budget_table(counts: dict) -> list[str]:
    rows = ["| method-controller | steps | drafted per step | reads (D2H) per step | budget per step | "
            "H2D copies per step | in the layer loop |", "|---|---|---|---|---|---|---|"]
    for name, c in sorted(counts.items()):
        rows.append(f"| {name} | {c['steps']} | {_spread(c['drafted'])} | {_spread(c['d2h'])} | {_spread(c['budget'])} "
                    f"| {_spread(c['h2d'])} | {c['in_layer']} |")
    return rows


def _spread(xs: list[int]) -> str:
    return str(xs[0]) if len(set(xs)) == 1 else f"{min(xs)}-{max(xs)} (mean {sum(xs) / len(xs):.1f})"


# -- bench ------------------------------------------------------------------------------------
def model_cfg(name: str, device: str):
    from omegaconf import OmegaConf

    f = CONF_DIR / "model" / f"{name}.yaml"
    cfg = OmegaConf.load(f) if f.is_file() else OmegaConf.merge(OmegaConf.load(CONF_DIR / "model" / "hf.yaml"), {"id": name})
    over = {"device": device}
    if device == "cuda":
        over["backend"] = "eager"  # the CPU kernels (ggml, mkldnn, ...) do not apply on a GPU
    return OmegaConf.merge(cfg, over)


def bench(args) -> list[str]:
    import torch
    from omegaconf import OmegaConf

    from specbench.engine.sampling import SamplingConfig
    from specbench.methods import METHODS, build_method
    from specbench.models import load_model

    target = load_model(model_cfg(args.model, args.device))
    prompt = target.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    eos = frozenset()
    rows = [f"Model `{args.model}` ({target.name}) on {target.device}, {target.dtype}; prompt of {len(prompt)} tokens, "
            f"{args.tokens} new tokens, greedy, untrained parts where nothing trained is cached.", "",
            "| method | tokens/s | steps | syncs per step | equals AR | note |", "|---|---|---|---|---|---|"]
    ar = None
    for name in ["ar"] + sorted(m for m in METHODS if m != "ar"):
        cfg = OmegaConf.merge(OmegaConf.load(CONF_DIR / "method" / f"{name}.yaml"), {"allow_untrained": True},
                              UNTRAINED.get(name, {}))
        try:
            m = build_method(name, target, cfg, SamplingConfig())
            with torch.no_grad():
                m.generate(prompt, 4, eos, 0)  # warm-up (kernels, allocator)
                t0, syncs, gen = time.perf_counter(), *_counted(lambda: m.generate(prompt, args.tokens, eos, 0))
                dt = time.perf_counter() - t0
        except Exception as e:  # one method's failure must not hide the others' results
            rows.append(f"| {name} | – | – | – | – | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} |")
            continue
        ar = gen.tokens if name == "ar" else ar
        steps = max(1, len(gen.steps) or len(gen.tokens) - 1)
        per_step = "n/a (CPU)" if syncs is None else f"{syncs / steps:.1f}"
        same = "–" if name == "ar" else ("yes" if gen.tokens == ar else "no")
        note = "external loop (transformers)" if m.external_loop else ""
        rows.append(f"| {name} | {len(gen.tokens) / dt:.1f} | {steps} | {per_step} | {same} | {note} |")
    return rows


def _counted(fn):
    """(synchronising calls seen by CUDA's sync debug mode, fn's result); None off CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None, fn()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen), out


# -- the report -------------------------------------------------------------------------------
def report(args) -> list[str]:
    gpu, dev = device_lines()
    out = ["# specbench doctor report", "", f"Written {time.strftime('%Y-%m-%d %H:%M:%S')} by "
           f"`python -m specbench.doctor {' '.join(sys.argv[1:])}`.", "", "## Versions", "", *versions(),
           "", "## Device", "", *dev, ""]
    if not args.no_tests:
        code, summary, counts = sync_budget()
        out += ["## Host syncs per decoding step (counted on fake CUDA tensors)", "",
                "tests/test_sync_budget.py, the tiny model, greedy and (rows marked so) sampling at T=0.7, "
                "top_p=0.9: what the code makes a GPU wait for, whatever the GPU (docs/gpu.md has the budget). "
                "Fake tensors have no values, so each case follows one path: under sampling a tree's "
                "rejection walk stops at its root here.", "", *budget_table(counts), "",
                f"Budget test: {'passed' if code == 0 else 'FAILED'}: `{summary}`", ""]
        if gpu:
            code, summary = pytest_run(["-m", "fake_cuda or cuda", "tests"])
            out += ["## Tests on this GPU", "", f"`pytest -m \"fake_cuda or cuda\" tests`: "
                    f"{'passed' if code == 0 else 'FAILED'}", "", "```", summary, "```", ""]
        else:
            out += ["## Tests on a GPU", "", "Not run: no GPU (`pytest -m \"fake_cuda or cuda\"` runs them on one).", ""]
    out += ["## Bench", ""]
    if args.device == "cuda" and not gpu:
        out += ["Not run: no GPU found (`--device cpu` runs it on the CPU, without sync figures).", ""]
    else:
        out += bench(args) + ["", "syncs per step: calls that `torch.cuda.set_sync_debug_mode(\"warn\")` "
                              "reported during generation, over decoding steps (prefill included)."]
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    text = "\n".join(report(args)) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    print(f"report written to {args.out}")


if __name__ == "__main__":
    main()
