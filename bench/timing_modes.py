"""Does the per-phase breakdown move the speedup it sits beside? `timing=fine` vs `timing=coarse`.

    python bench/timing_modes.py                       # tiny-llama (seconds), vanilla SD + PLD
    python bench/timing_modes.py --model smollm2-135m --rounds 3 --max-new 64

For each method, AR and the method generate the same prompts with the timer in one mode, then
in the other, the order alternating per round; a round's speedup is the ratio of pooled tok/s
inside that round. Printed: median and min-max of the per-round speedups for each mode, and
the ratio of the medians (1.00 means the breakdown costs nothing measurable). On CPU a timer
mark is a perf_counter read, so this shows the Python-side cost only; on CUDA the difference
would be synchronisation, which tests/test_timing.py rules out by counting.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specbench.engine.sampling import SamplingConfig  # noqa: E402
from specbench.methods import build_method  # noqa: E402
from specbench.models import load_model  # noqa: E402
from specbench.config.settings import RunValues, shipped  # noqa: E402

# what differs from conf/method/<name>.yaml: an untrained one-layer draft
METHODS = {"vanilla_sd": {"draft": {"num_layers": 1, "checkpoint": None}}}


def build(name: str, target, mode: str):
    values = RunValues(mode, shipped("control", "fixed", {"k": 4}), None, target.name, None)
    return build_method(name, target, shipped("method", name, METHODS.get(name, {})), SamplingConfig(), values)


def tok_per_s(m, prompts, max_new, eos) -> float:
    toks = wall = 0.0
    for i, p in enumerate(prompts):
        g = m.generate(p, max_new, eos, seed=i)
        toks += len(g.tokens)
        wall += g.times["wall"]
    return toks / wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--methods", default="vanilla_sd,pld")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    target = load_model(shipped("model", args.model))
    tok = target.tokenizer
    texts = [f"Question {i}: list the numbers from {i} to {i + 9}, then list them again." for i in range(args.prompts)]
    prompts = [tok.encode_chat([{"role": "user", "content": t}]) for t in texts]
    eos = tok.eos_ids
    print(f"model {args.model}, {args.prompts} prompts x {args.max_new} tokens, {args.rounds} rounds, "
          f"{args.threads} thread(s), {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'method':12}{'mode':8}{'median speedup':>16}{'min':>8}{'max':>8}")
    for name in args.methods.split(","):
        systems = {mode: (build("ar", target, mode), build(name, target, mode)) for mode in ("fine", "coarse")}
        for ar, m in systems.values():  # warm-up, unmeasured
            ar.generate(prompts[0], 8, eos, 0)
            m.generate(prompts[0], 8, eos, 0)
        speedups: dict[str, list[float]] = {"fine": [], "coarse": []}
        for r in range(args.rounds):
            for mode in (("fine", "coarse") if r % 2 == 0 else ("coarse", "fine")):
                ar, m = systems[mode]
                speedups[mode].append(tok_per_s(m, prompts, args.max_new, eos) / tok_per_s(ar, prompts, args.max_new, eos))
        for mode, v in speedups.items():
            print(f"{name:12}{mode:8}{statistics.median(v):>16.3f}{min(v):>8.3f}{max(v):>8.3f}")
        ratio = statistics.median(speedups["fine"]) / statistics.median(speedups["coarse"])
        print(f"{name:12}fine/coarse median ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
