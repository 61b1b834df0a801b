"""Where one forward's time goes, per backend and k: linear layers, attention, the rest.

    taskset -c 1 python bench/forward_parts.py --backends ggml ggml_q8 --rounds 20

One forward over k new tokens after a 200-token cache, timed whole, with the time spent inside
the linear layers (every nn.Linear forward, hooks around the module) and inside the attention
function (the adapter's, attention.py) summed during it; "rest" is the difference (norms,
rotary, residuals, the cache, Python). The hooks cost a few microseconds per call, the same at
every k, which would make T(k)/T(1) look flatter than it is: so each round also times the same
forward without hooks, and T(k)/T(1) is computed from that plain forward ("hooks ms" is what
the hooks added). Backends and k interleaved round by round; medians over rounds. This is the
split behind docs/cpu-backends.md's T(8)/T(1) argument: what grows with k, and by how much.
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

from specbench.core.table import Column, markdown  # after the path is set

KS = (1, 2, 4, 8)


class Clock:
    """Seconds spent inside timed calls (not re-entrant: the timed calls do not nest)."""

    def __init__(self):
        self.total, self.start = 0.0, 0.0

    def pre(self, *_):
        self.start = time.perf_counter()

    def post(self, *_):
        self.total += time.perf_counter() - self.start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="*", default=["ggml", "ggml_q8"])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the table here (markdown)")
    args = ap.parse_args()

    from embedded import embedded_model

    from specbench.models import apply_backend, attention

    target = embedded_model(args.threads)

    lin, att = Clock(), Clock()
    linears = [m for m in target.model.modules() if isinstance(m, torch.nn.Linear)]
    inner = attention.grouped_sdpa_attention

    def timed_attention(*a, **kw):
        att.pre()
        try:
            return inner(*a, **kw)
        finally:
            att.post()

    handles = []  # of the hooks now registered

    def hooks(on: bool) -> None:
        for h in handles:
            h.remove()
        handles.clear()
        if on:
            for m in linears:
                handles.extend([m.register_forward_pre_hook(lin.pre), m.register_forward_hook(lin.post)])
        # the registered function is looked up by name at every call
        attention.AttentionInterface.register(attention.GROUPED_SDPA, timed_attention if on else inner)

    ids = [(7 * i + 3) % target.vocab_size for i in range(200 + max(KS))]
    rows = {(b, k): [] for b in args.backends for k in KS}
    for r in range(args.rounds):
        for b in args.backends[r % len(args.backends):] + args.backends[: r % len(args.backends)]:
            apply_backend(target.model, b)
            cache = target.new_cache()
            target.forward(ids[:200], cache, last_only=True)
            target.forward(ids[200:204], cache)  # warm-up
            cache.crop(200)
            for k in KS:
                times = []
                for on in (False, True):
                    hooks(on)
                    lin.total = att.total = 0.0
                    t0 = time.perf_counter()
                    target.forward(ids[200 : 200 + k], cache)
                    times.append(time.perf_counter() - t0)
                    cache.crop(200)
                rows[b, k].append((times[0], times[1], lin.total, att.total))
        hooks(False)
        print(f"round {r + 1}/{args.rounds}", flush=True)

    cells = []
    for b in args.backends:
        t1 = statistics.median(x[0] for x in rows[b, 1])
        for k in KS:
            plain, hooked, li, at = (1e3 * statistics.median(x[i] for x in rows[b, k]) for i in range(4))
            cells.append([b, k, plain, plain / (1e3 * t1), li, at, hooked - li - at, hooked - plain])
    text = "\n".join([
        "# One forward's time by part",
        "",
        f"- command: python {' '.join(sys.argv)}",
        (f"- date: {time.strftime('%Y-%m-%d %H:%M')}; {args.threads} torch thread(s); torch {torch.__version__}; "
         f"medians over {args.rounds} interleaved rounds; 200 cached tokens"),
        ("- forward ms and T(k)/T(1): the forward without hooks; linear / attention / rest: the same forward with "
         "hooks (rest = hooked forward - linear - attention); hooks ms: hooked - plain"),
        "",
        markdown(["backend", "k", Column("forward ms", spec=".1f"), Column("T(k)/T(1)", spec=".2f"),
                  Column("linear ms", spec=".1f"), Column("attention ms", spec=".1f"), Column("rest ms", spec=".1f"),
                  Column("hooks ms", spec=".1f")], cells),
        "",
    ])
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
