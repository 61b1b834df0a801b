"""Why the EAGLE drafts accept less on MT-Bench and XSum than on GSM8K: depth-1 acceptance against the
target's own confidence, per task (issue 44).

    python bench/task_confidence.py [--methods eagle3,eagle] [--samples 20] [--max-new 128] [--json OUT]
                                    [--plot OUT.png] [<overrides>, e.g. model.backend=eager threads=1]

For each of the leaderboard's four tasks (its first N samples; MT-Bench's first turn only) the target
writes its greedy answer (transformers' generate, no draft); then one teacher-forced pass over prompt +
answer gives, at every answer position, the target's greedy choice and its probability p_max (its
"confidence"), and each shipped draft's top-1 guess at depth 1 from the verified prefix (as in
bench/heldout_domains.py: EAGLE-2's head from the target's final features, EAGLE-3's first unrolled step
from its three taps). The positions are binned by p_max, and per task the script prints each bin's share of
the positions and the draft's acceptance inside it.

The question it answers: is a draft's lower acceptance on a task a *domain* gap (it accepts less than on
GSM8K at the same target confidence: more general training data would close it) or the *text's*
predictability (the target itself is less sure there, and a draft agrees less wherever the target is
unsure, on any task)? The reweighted acceptance (the task's per-bin acceptance under GSM8K's bin shares)
splits the gap to GSM8K: gap = (GSM8K - reweighted) [the draft at equal confidence] + (reweighted - task)
[the confidence mix]. Teacher-forced depth 1 is what a 3-node tree's first level reads; it is not tau.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from specbench.config import settings
from specbench.config.compose import compose, validate
from specbench.core.errors import SpecBenchError
from specbench.models import load_model
from specbench.tasks import build_task

TASKS = ("gsm8k", "humaneval", "mt_bench", "xsum")
EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0 + 1e-9)  # p_max bins; the last holds the near-certain positions
# where the drafted token sits in the sequence: the drafts trained on sequences cut at train.max_len=320
POS_EDGES = (0, 320, 512, 768, 1024, 10**9)


def answer(target, prompt: list[int], max_new: int) -> list[int]:
    """The target's greedy answer (new tokens, up to and including an end-of-turn token)."""
    eos = sorted(target.tokenizer.eos_ids) or None
    ids = torch.tensor([prompt], device=target.device)
    out = target.model.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                                pad_token_id=(eos or [0])[0], attention_mask=torch.ones_like(ids))
    return out[0, len(prompt):].tolist()


def target_pass(target, ids: torch.Tensor):
    """The target's greedy choice and its probability at every position of ids [1, T]."""
    h = target.norm(target.run_layers(target.embed(ids), None))
    choice, conf = [], []
    for j in range(0, ids.shape[1], 128):  # never a [T, 49k] float tensor at once
        p = torch.softmax(target.lm_head(h[:, j: j + 128]).float(), -1)
        c, a = p.max(-1)
        choice.append(a)
        conf.append(c)
    return h, torch.cat(choice, 1)[0], torch.cat(conf, 1)[0]


def guess_eagle(target, head, ids, h):
    """Row t: EAGLE-2's top-1 for the token after ids[t+1], from f_t and x_(t+1)."""
    return head.logits(head(h[:, :-1], ids[:, 1:], None)).argmax(-1)[0]


def guess_eagle3(target, head, ids, h):
    """Row t: EAGLE-3's first unrolled step (the tree's depth 1) for the token after ids[t+1]."""
    from specbench.train.eagle3 import target_side, ttt_unroll
    taps, _ = target_side(target, head, ids)
    out = ttt_unroll(head, taps, ids, 1, 0)[0]
    return head.target_ids()[head.draft_logits(out).argmax(-1)][0]


def load_head(method: str, target, run):
    if method == "eagle":
        from specbench.methods.eagle_head import load_eagle
        return load_eagle(target, run.method)
    from specbench.methods.eagle3_head import load_eagle3
    return load_eagle3(target, run.method)


GUESS = {"eagle": guess_eagle, "eagle3": guess_eagle3}


def score_sample(target, drafts: dict, prompt: list[int], new: list[int]) -> tuple[list[float], dict, list[int]]:
    """(the target's p_max at each drafted answer position, {draft: whether its depth-1 guess there is the
    target's choice}, each drafted token's index in the sequence). `drafts`: {name: (guess function, head)}; a guess's row t is for the choice at t+1.
    An answer's first token comes from the prefill, so rows start-1 .. T-3 count (they draft answer tokens
    2..n; the choice after the last token is never committed)."""
    ids = torch.tensor([prompt + new], device=target.device)
    h, choice, conf = target_pass(target, ids)
    lo, hi = len(prompt) - 1, ids.shape[1] - 2
    if hi <= lo:
        return [], {m: [] for m in drafts}, []
    return (conf[lo + 1: hi + 1].tolist(), {m: (g(target, head, ids, h)[lo:hi] == choice[lo + 1: hi + 1]).tolist()
                                            for m, (g, head) in drafts.items()}, list(range(lo + 2, hi + 2)))


def bins_of(conf: list[float], right: list[bool], edges=EDGES) -> list[dict]:
    rows = []
    for lo, hi in zip(edges, edges[1:]):
        sel = [r for c, r in zip(conf, right) if lo <= c < hi]
        rows.append({"lo": lo, "hi": min(hi, 1.0) if edges is EDGES else hi, "share": len(sel) / max(1, len(conf)),
                     "accept": sum(sel) / len(sel) if sel else None, "n": len(sel)})
    return rows


def reweighted(task_bins: list[dict], ref_bins: list[dict]) -> float | None:
    """The task's per-bin acceptance under the reference's bin shares (None if a used bin is empty)."""
    total = 0.0
    for t, r in zip(task_bins, ref_bins):
        if r["share"] > 0:
            if t["accept"] is None:
                return None
            total += r["share"] * t["accept"]
    return total


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="eagle3,eagle")
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--plot", help="a PNG: acceptance against p_max per task, and each task's p_max mix")
    args, overrides = ap.parse_known_args(argv)
    methods = args.methods.split(",")
    for m in methods:
        if m not in GUESS:
            raise SpecBenchError(f"--methods {m!r}; allowed: {', '.join(GUESS)}")
    torch.set_grad_enabled(False)
    runs = {}
    for m in methods:
        cfg = compose([f"method={m}", *overrides])
        validate(cfg)
        runs[m] = settings.of(cfg)
    first = runs[methods[0]]
    if first.threads:
        torch.set_num_threads(int(first.threads))
    target = load_model(first.model)
    drafts = {}
    for m in methods:
        head, info = load_head(m, target, runs[m])
        head.eval()
        drafts[m] = (GUESS[m], head)
        print(f"{m}: {info.get('checkpoint') or info.get('path') or info}")
    tasks = args.tasks.split(",")
    if "gsm8k" not in tasks or any(t not in TASKS for t in tasks):
        raise SpecBenchError(f"--tasks {args.tasks!r}: a comma-separated subset of {', '.join(TASKS)} with gsm8k (the reference)")
    conf, pos, right = {t: [] for t in tasks}, {t: [] for t in tasks}, {m: {t: [] for t in tasks} for m in methods}
    for task in tasks:
        tcfg = settings.of(compose([f"task={task}", f"task.num_samples={args.samples}", *overrides])).task
        t0 = time.monotonic()
        for s in build_task(tcfg).load():
            prompt = target.tokenizer.encode_chat(s.messages([]))
            c, r, p = score_sample(target, drafts, prompt, answer(target, prompt, args.max_new))
            conf[task] += c
            pos[task] += p
            for m in methods:
                right[m][task] += r[m]
        print(f"{task}: {len(conf[task])} positions, {time.monotonic() - t0:.0f} s", flush=True)
    report = {"argv": argv, "samples": args.samples, "max_new": args.max_new, "edges": EDGES[:-1] + (1.0,),
              "position_edges": POS_EDGES, "mean_p_max": {t: sum(conf[t]) / len(conf[t]) for t in tasks}, "methods": {}}
    for m in methods:
        per = {t: bins_of(conf[t], right[m][t]) for t in tasks}
        rows = {t: {"positions": len(right[m][t]), "accept": sum(right[m][t]) / len(right[m][t]),
                    "reweighted_to_gsm8k": reweighted(per[t], per["gsm8k"]), "bins": per[t],
                    "by_position": bins_of(pos[t], right[m][t], POS_EDGES)} for t in tasks}
        report["methods"][m] = rows
        print_table(m, rows, report["mean_p_max"])
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.plot:
        plot(report, args.plot)


def share_acc(b: dict) -> str:
    return f"{b['share']:.2f} / " + ("-" if b["accept"] is None else f"{b['accept']:.2f}")


def print_table(m: str, rows: dict, mean_p_max: dict) -> None:
    print(f"\n{m}: depth-1 acceptance (teacher-forced) by the target's p_max; share of positions / acceptance")
    print("| task | positions | mean p_max | " + " | ".join(f"[{lo:g}, {min(hi, 1):g})" for lo, hi in zip(EDGES, EDGES[1:]))
          + " | accept | under GSM8K's mix |")
    print("|---|---:|---:|" + "---|" * (len(EDGES) - 1) + "---:|---:|")
    for t, r in rows.items():
        rw = r["reweighted_to_gsm8k"]
        print(f"| {t} | {r['positions']} | {mean_p_max[t]:.3f} | {' | '.join(share_acc(b) for b in r['bins'])} | "
              f"{r['accept']:.3f} | " + ("-" if rw is None else f"{rw:.3f}") + " |")
    g = rows["gsm8k"]["accept"]
    for t, r in rows.items():
        rw = r["reweighted_to_gsm8k"]
        if t != "gsm8k" and rw is not None and g != r["accept"]:
            print(f"{t}: gap to GSM8K {g - r['accept']:+.3f} = at equal confidence {g - rw:+.3f} + the confidence mix "
                  f"{rw - r['accept']:+.3f} ({(rw - r['accept']) / (g - r['accept']):.0%} of it)")
    print(f"\n{m}: by the drafted token's index in the sequence (the drafts trained on sequences cut at 320 tokens)")
    print("| task | " + " | ".join(f"[{lo}, {hi if hi < 10**9 else ''})" for lo, hi in zip(POS_EDGES, POS_EDGES[1:])) + " |")
    print("|---|" + "---|" * (len(POS_EDGES) - 1))
    for t, r in rows.items():
        print(f"| {t} | {' | '.join(share_acc(b) for b in r['by_position'])} |")


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    methods = list(report["methods"])
    rows = (len(methods) + 3) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(12, 4.2 * rows), squeeze=False)
    axes = list(axes.flat)
    mids = [f"{lo:g}-{hi:g}" for lo, hi in zip(report["edges"], report["edges"][1:])]
    for ax, m in zip(axes, methods):
        for t, r in report["methods"][m].items():
            ax.plot(mids, [b["accept"] for b in r["bins"]], marker="o", label=f"{t} ({r['accept']:.2f})")
        ax.set(title=f"{m}: depth-1 acceptance by target p_max", xlabel="target's p_max", ylabel="acceptance", ylim=(0, 1))
        ax.legend(fontsize=8)
    first = report["methods"][methods[0]]
    ax = axes[len(methods)]
    w = 0.8 / len(first)
    for i, (t, r) in enumerate(first.items()):
        ax.bar([x + i * w for x in range(len(mids))], [b["share"] for b in r["bins"]], w, label=t)
    ax.set_xticks([x + 0.4 - w / 2 for x in range(len(mids))], mids)
    ax.set(title="share of answer positions by target p_max", xlabel="target's p_max", ylabel="share")
    ax.legend(fontsize=8)
    ax = axes[len(methods) + 1]
    edges = report["position_edges"]
    names = [f"{lo}-{hi}" if hi < 10**9 else f"{lo}+" for lo, hi in zip(edges, edges[1:])]
    for t, r in first.items():
        ax.plot(names, [b["accept"] for b in r["by_position"]], marker="o", label=t)
    ax.set(title=f"{methods[0]}: acceptance by the drafted token's index", xlabel="index in the sequence",
           ylabel="acceptance", ylim=(0, 1))
    ax.legend(fontsize=8)
    for ax in axes[len(methods) + 2:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SpecBenchError as e:
        sys.exit(f"specbench: error: {e}")
