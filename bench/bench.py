"""Benchmark suites on the embedded model: one process, one model load, every figure measured.

    python bench/bench.py --suite core        # issue: AR, vanilla SD, PLD, hf_assisted
    python bench/bench.py --suite selfdraft   # Self-SD and EESD with fixed K, Beta-TS, Cali-TS
    python bench/bench.py --suite heads       # Medusa (greedy, typical) and SPACE
    python bench/bench.py --suite fidelity    # SPACE mask rules, Beta-TS counts, Cali-TS (issue 8)
    python bench/bench.py --suite draftvocab  # EESD and Self-SD drafting over the V' most frequent tokens
    python bench/bench.py --suite trainingfree # PLD, Token Recycling, Lookahead, transformers' prompt lookup, REST, SuffixDecoding (issue 33)
    python bench/bench.py --suite hydra       # Hydra++ beside Medusa-1, both trained on first use (issue 34)
    python bench/bench.py --suite firstuse    # EESD, Medusa-1, Medusa-2, EAGLE-2, each trained on first use
                                              # with the same train.first_use budget (empty cache: trains)

Each configuration is a normal specbench run (AR interleaved with the method on the same
samples, in this process); its speedup is a ratio inside that run. Results land in
results/bench/<suite>/<task>/<run_name>/ (resumable) and the printed table is also written to
results/bench/<suite>.md together with the command, machine and versions.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specbench.core.table import Column, markdown  # after the path is set

HYDRA_TREE = "[[0],[0,0],[1],[0,1],[2],[0,0,0],[1,0],[0,2],[3],[0,3],[4],[0,4],[2,0],[0,5],[0,0,1],[0,0,0,0]]"  # conf/method/hydra.yaml's

SUITES = {
    "core": {
        "tasks": ["gsm8k"],
        "runs": [
            ("vanilla_sd-fixed10", ["method=vanilla_sd", "control=fixed", "control.k=10"]),
            ("vanilla_sd-fixed3", ["method=vanilla_sd", "control=fixed", "control.k=3"]),
            ("pld-fixed10", ["method=pld", "control=fixed", "control.k=10"]),
            ("hf_assisted-assistant10", ["method=hf_assisted", "method.mode=assistant", "method.k=10"]),
            ("hf_assisted-assistant3", ["method=hf_assisted", "method.mode=assistant", "method.k=3"]),
            ("hf_assisted-pld10", ["method=hf_assisted", "method.mode=prompt_lookup", "method.k=10"]),
        ],
    },
    "selfdraft": {
        "tasks": ["gsm8k", "xsum"],
        "runs": [
            ("self_sd-fixed4", ["method=self_sd", "method.skip.source=search", "control=fixed", "control.k=4"]),
            ("self_sd-adaptive", ["method=self_sd", "method.skip.source=search", "control=adaptive_threshold"]),
            ("self_sd-beta_ts", ["method=self_sd", "method.skip.source=search", "control=beta_ts"]),
            ("self_sd-cali_ts", ["method=self_sd", "method.skip.source=search", "control=cali_ts"]),
            ("eesd-fixed4", ["method=eesd", "control=fixed", "control.k=4"]),
            ("eesd-beta_ts", ["method=eesd", "control=beta_ts"]),
            ("eesd-cali_ts", ["method=eesd", "control=cali_ts"]),
        ],
    },
    "heads": {
        "tasks": ["humaneval", "mt_bench"],
        "runs": [
            # the default heads (own vocabulary projections): the part `python -m specbench.train method=medusa` trains
            ("medusa-greedy", ["method=medusa"]),
            ("medusa-typical-t0.7", ["method=medusa", "method.acceptance=typical", "sampling.temperature=0.7"]),
            ("space-k5", ["method=space"]),
        ],
    },
    # the CPU issue's stretch: self-drafting with a draft head over the V' most frequent tokens of the
    # self-distillation data (method.draft_vocab; verification keeps the full head)
    "draftvocab": {
        "tasks": ["gsm8k"],
        "runs": [(f"{m}-fixed4-{v or 'full'}", [f"method={m}", *extra, "control=fixed", "control.k=4", f"method.draft_vocab.size={v or 'null'}"])
                 for m, extra in (("eesd", []), ("self_sd", ["method.skip.source=search"]))
                 for v in (None, 16384, 4096, 1024)],
    },
    # every trained method at its paper default, each part trained on first use with one budget
    "firstuse": {
        "tasks": ["mt_bench"],
        "runs": [
            ("eesd-cali_ts", ["method=eesd"]),
            ("medusa1", ["method=medusa"]),
            ("medusa2", ["method=medusa", "method.variant=medusa2"]),
            ("eagle2", ["method=eagle"]),
        ],
    },
    # issue 34: Hydra++ beside Medusa-1, each trained on first use with the same train.first_use budget;
    # medusa1-tree16 verifies Hydra's default tree (conf/method/hydra.yaml), so only the heads differ
    "hydra": {
        "tasks": ["gsm8k"],
        "runs": [
            ("hydra_pp", ["method=hydra"]),
            ("medusa1-tree16", ["method=medusa", "method.tree_from_accuracies=null", f"method.tree={HYDRA_TREE}"]),
            ("medusa1", ["method=medusa"]),
        ],
    },
    # issue 33: the training-free drafters side by side (paper defaults; Lookahead also at a small CPU window)
    "trainingfree": {
        "tasks": ["gsm8k", "humaneval", "mt_bench", "xsum"],
        "runs": [
            ("pld-fixed10", ["method=pld", "control=fixed", "control.k=10"]),
            ("token_recycling", ["method=token_recycling"]),
            ("token_recycling-16", ["method=token_recycling", "method.max_nodes=16"]),
            ("lookahead", ["method=lookahead"]),
            ("lookahead-w4n3g4", ["method=lookahead", "method.window=4", "method.ngram=3", "method.guess=4"]),
            ("hf_assisted-pld10", ["method=hf_assisted", "method.mode=prompt_lookup", "method.k=10"]),
            ("rest", ["method=rest"]),  # datastore: GSM8K train (docs/trainingfree_retrieval.md)
            ("suffix", ["method=suffix"]),
        ],
    },
    # issue 8: SPACE's mask rule and Beta-TS's counts, before (literal) vs after (default)
    "fidelity": {
        "tasks": ["gsm8k", "mt_bench"],
        "runs": [
            ("space-k5-group", ["method=space", "method.mask_rule=group"]),
            ("space-k5-eq6", ["method=space", "method.mask_rule=eq6"]),
            ("eesd-beta_ts", ["method=eesd", "control=beta_ts"]),
            ("eesd-beta_ts-paper_output", ["method=eesd", "control=beta_ts", "control.counts=paper_output"]),
            ("eesd-cali_ts", ["method=eesd", "control=cali_ts"]),
        ],
    },
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=sorted(SUITES), default="core")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--only", nargs="*", help="run names to run (default: all)")
    ap.add_argument("--tasks", nargs="*", help="override the suite's tasks")
    ap.add_argument("--out", default=str(REPO / "results" / "bench"))
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()

    from hydra import compose, initialize_config_dir

    from specbench.config.compose import CONF_DIR
    from specbench.models import load_model
    from specbench.run.runner import run
    from specbench.config.settings import of

    suite = SUITES[args.suite]
    names = [n for n, _ in suite["runs"]]
    if unknown := [n for n in args.only or [] if n not in names]:  # else: an empty table written over the stored one
        ap.exit(2, f"specbench: error: --only {unknown} not in the {args.suite} suite; allowed: {', '.join(names)}\n")
    if args.samples < 1 or args.max_new_tokens < 1:
        ap.exit(2, f"specbench: error: --samples {args.samples} / --max-new-tokens {args.max_new_tokens}: expected integers >= 1\n")
    out = Path(args.out)
    base = [f"task.num_samples={args.samples}", f"max_new_tokens={args.max_new_tokens}", "progress=true"] + args.overrides
    rows, target = [], None
    for task in args.tasks or suite["tasks"]:
        for name, overrides in suite["runs"]:
            if args.only and name not in args.only:
                continue
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose("config", overrides=[f"task={task}", *overrides, *base, f"run_dir={out}/{args.suite}/{task}/{name}"])
            if target is None:
                torch.set_grad_enabled(False)
                target = load_model(of(cfg).model)
            try:
                s = run(cfg, target)
            except Exception as e:  # noqa: BLE001 - one failing configuration must not lose the others
                print(f"!! {task}/{name} failed: {type(e).__name__}: {e}")
                rows.append({"task": task, "run": name, "error": f"{type(e).__name__}: {e}"})
                continue
            acc = s.get("acceptance") or {}
            m, ar = s["method"], s["ar"]
            rows.append({
                "task": task, "run": name, "samples": s["samples"], "ar_tok_s": ar["tokens_per_s"],
                "tok_s": m["tokens_per_s"], "speedup": s["speedup"], "predicted": s.get("predicted_speedup"),
                "ci": "-" if not s.get("speedup_ci") else "{:.2f}-{:.2f}".format(*s["speedup_ci"]), "alpha": s.get("alpha"),
                "v_d": acc.get("v_d"), "r_d": acc.get("r_d"), "hm": acc.get("hm"), "tau": acc.get("tau"),
                "same_as_ar": f"{s['matches_ar']}/{s['samples']}",
                "draft%": 100 * m["time_share"].get("draft", 0), "verify%": 100 * m["time_share"].get("verify", 0),
                "control%": 100 * m["time_share"].get("control", 0), "other%": 100 * m["time_share"].get("other", 0),
                "prefill%": 100 * m["time_share"].get("prefill", 0),
                "settings": s["meta"]["method_settings"],
            })
    table = format_table(rows)
    meta = {
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
    }
    import transformers

    meta["transformers"] = transformers.__version__
    text = "\n".join([f"# bench suite `{args.suite}`", "", *(f"- {k}: {v}" for k, v in meta.items()), "", table, ""])
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.suite}.md").write_text(text)
    (out / f"{args.suite}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))


COLUMNS = [Column("task"), Column("run", align="<"), Column("n", "samples"), Column("AR tok/s", "ar_tok_s", ".2f"),
           Column("tok/s", "tok_s", ".2f"), Column("speedup", spec=".3f"), Column("95% CI", "ci"), Column("predicted", spec=".3f"),
           Column("draft/T(1)", "alpha", ".3f"),
           Column("v_d", spec=".3f"), Column("r_d", spec=".3f"), Column("HM", "hm", ".2f"), Column("tau", spec=".2f"),
           Column("=AR", "same_as_ar"), Column("draft%", spec=".1f"), Column("verify%", spec=".1f"),
           Column("control%", spec=".1f"), Column("other%", spec=".2f"), Column("prefill%", spec=".1f")]


def format_table(rows) -> str:
    return markdown(COLUMNS, [[r["task"], r["run"], f"failed: {r['error'][:80]}"] if "error" in r else r for r in rows])


if __name__ == "__main__":
    main()
