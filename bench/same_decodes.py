"""Does a change alter any decode? Runs every drafting method on the embedded model with this
checkout and with another git revision, greedy and sampled (same seeds), and compares the tokens
and every step's (drafted, accepted). A refactor of the decode loop must print "same" everywhere.

    python bench/same_decodes.py --ref b63b77b          # this checkout vs that revision
    python bench/same_decodes.py --dump out.json        # (internal) decode with the imported specbench

Trained parts come from the artifact cache (both sides load the same files); `--samples` GSM8K
prompts, `--max-new-tokens` each. Timings are not compared (see bench/bench.py for those).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = [("eesd", ["method=eesd"]), ("eesd-beta_ts", ["method=eesd", "control=beta_ts"]), ("medusa", ["method=medusa"]),
        ("eagle", ["method=eagle"]), ("space", ["method=space"]),
        ("self_sd", ["method=self_sd", "method.skip.source=heuristic"]),
        ("vanilla_sd", ["method=vanilla_sd", "control=fixed", "control.k=4"]), ("pld", ["method=pld"])]


def dump(path: str, samples: int, max_new: int) -> None:
    import torch

    from specbench.config.compose import compose
    from specbench.engine.sampling import SamplingConfig
    from specbench.methods import build_method
    from specbench.models import load_model
    from specbench.tasks import build_task

    try:  # typed settings (specbench/config/settings.py); a revision from before them: the config nodes themselves
        from specbench.config.settings import of, run_values
    except ImportError:
        of, run_values = None, None

    torch.set_num_threads(1)
    cfg = compose(["task=gsm8k", f"task.num_samples={samples}"])
    cfg = of(cfg) if of else cfg
    target = load_model(cfg.model)
    prompts = [target.tokenizer.encode_chat(s.messages([])) for s in build_task(cfg.task).load()]
    out = {}
    for name, overrides in RUNS:
        for temp in (0.0, 0.7):
            c = compose(["task=gsm8k", *overrides, f"sampling.temperature={temp}"])
            values = run_values(of(c)) if of else {"control": c.get("control"), "cfg": c}
            c = of(c) if of else c
            m = build_method(c.method.name, target, c.method, SamplingConfig.from_cfg(c.sampling), values)
            res = []
            for i, p in enumerate(prompts):
                g = m.generate(p, max_new, target.tokenizer.eos_ids, 100 + i)
                steps = [[s[0], s[1]] if isinstance(s, tuple) else [s.drafted, s.accepted] for s in g.steps]
                res.append({"tokens": g.tokens, "steps": steps})
            out[f"{name} T={temp}"] = res
            print(f"{name} T={temp}: {[len(r['tokens']) for r in res]} tokens", flush=True)
    Path(path).write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", help="git revision to compare this checkout with")
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    args = ap.parse_args()
    if args.dump:
        return dump(args.dump, args.samples, args.max_new_tokens)
    if not args.ref:
        ap.error("--ref is required")
    tmp = Path(tempfile.mkdtemp(prefix="same_decodes_"))
    old_tree = tmp / "ref"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(old_tree), args.ref], check=True)
    try:
        results = {}
        for label, root in (("ref", old_tree), ("this", REPO)):
            env = dict(os.environ, PYTHONPATH=str(root))
            out = tmp / f"{label}.json"
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--dump", str(out), "--samples", str(args.samples),
                            "--max-new-tokens", str(args.max_new_tokens)], cwd=root, env=env, check=True)
            results[label] = json.loads(out.read_text())
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)], check=False)
    a, b = results["ref"], results["this"]
    print(f"\n{'run':20s} tokens  steps   (this checkout vs {args.ref})")
    for k in a:
        same_t = all(x["tokens"] == y["tokens"] for x, y in zip(a[k], b.get(k, [])))
        same_s = all(x["steps"] == y["steps"] for x, y in zip(a[k], b.get(k, [])))
        print(f"{k:20s} {'same' if same_t else 'DIFF':6s}  {'same' if same_s else 'DIFF'}")


if __name__ == "__main__":
    main()
