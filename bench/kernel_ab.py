"""The C kernels of a git revision against the working tree's, on the embedded model's shapes.

    taskset -c 0 python bench/kernel_ab.py --rev 0af4716          # before session 64's AVX2 paths

Builds both versions of specbench/kernels/*.c with the backend's flags (-march=native: the path
this CPU takes), checks that they return the same bits, and times them alternately in one process
(rounds x reps, medians), so the machine's drift falls on both alike:
- the 211 linear layers of the embedded model (Q4_1 body, Q8_0 head) at `--rows` rows of x;
- the batch-invariant attention at the embedded model's heads (9 query heads over 3 KV heads, D =
  64) over `--keys` cached keys, at 1, 4 and 8 queries (a causal verify's mask).
Prints a markdown table per part, the command and each build's compiled paths.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specbench.kernels import ggml  # after the path is set

PATHS = {2: "AVX-512", 1: "AVX2", 0: "portable"}


def build(sources: list[Path], out: Path):
    subprocess.run([ggml.compiler(), *ggml.CFLAGS, "-o", str(out), *map(str, sources)], check=True)
    return ggml.load(out)


def sources_at(rev: str, tmp: Path) -> list[Path]:
    paths = []
    for p in ggml.SOURCES:
        rel = p.relative_to(REPO).as_posix()
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{rel}"], capture_output=True, text=True, check=False)
        if text.returncode != 0:
            sys.exit(f"specbench: error: --rev {rev!r}: no {rel} there ({text.stderr.strip()})")
        (tmp / p.name).write_text(text.stdout)
        paths.append(tmp / p.name)
    return paths


def timed(fns, rounds: int, reps: int) -> list[float]:
    """ms per call of each fn, alternating fns round by round; medians"""
    res = [[] for _ in fns]
    for _ in range(rounds):
        for i, f in enumerate(fns):
            f()
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
            res[i].append(1e3 * statistics.median(ts))
    return [statistics.median(r) for r in res]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", required=True, help="the git revision whose kernels are the baseline")
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    sys.path.insert(0, str(REPO / "bench"))
    from embedded import embedded_model

    from specbench.models import attention

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        libs = [build(sources_at(args.rev, tmp), tmp / "before.so"), build(list(ggml.SOURCES), tmp / "after.so")]
        print(f"- command: python {' '.join(sys.argv)}")
        for name, lib in zip((args.rev, "working tree"), libs):
            print(f"- {name}: linear {PATHS[lib.ggml_kernels_path()]}, attention "
                  f"{PATHS.get(getattr(lib, 'attention_kernels_path', lambda: -1)(), 'no path function (portable or AVX-512)')}")
        target = embedded_model(1)
        layers = [m for m in target.model.modules() if isinstance(m, torch.nn.Linear)]
        blocks = [ggml.recover(m.weight) for m in layers]
        print(f"\n{len(layers)} linear layers, ms per forward's worth\n\n| rows | {args.rev} | working tree | same bits |")
        print("|---:|---:|---:|---|")
        torch.manual_seed(0)
        for m in args.rows:
            xs = [torch.randn(m, lin.in_features) for lin in layers]
            outs = [[ggml.linear(x, b, None, lib=lib) for x, b in zip(xs, blocks)] for lib in libs]
            same = all(torch.equal(a, b) for a, b in zip(*outs))
            ms = timed([lambda lib=lib: [ggml.linear(x, b, None, lib=lib) for x, b in zip(xs, blocks)] for lib in libs],
                       args.rounds, args.reps)
            print(f"| {m} | {ms[0]:.1f} | {ms[1]:.1f} | {'yes' if same else 'NO'} |", flush=True)

        class Attn:
            num_key_value_groups = 3

        n = args.keys
        print(f"\nattention, one layer's call over {n} keys, us\n\n| queries | {args.rev} | working tree | same bits |")
        print("|---:|---:|---:|---|")
        for q in (1, 4, 8):
            query, (key, value) = torch.randn(1, 9, q, 64), torch.randn(2, 1, 3, n, 64)
            mask = torch.ones(q, n, dtype=torch.bool).tril(n - q).view(1, 1, q, n) if q > 1 else None
            fns = []
            for lib in libs:
                def call(fn=lib.invariant_attention):
                    attention._kernel = lambda: fn  # the function the adapter looks up once
                    return attention.invariant_attention(Attn(), query, key, value, mask, scaling=0.125)
                fns.append(call)
            same = torch.equal(fns[0](), fns[1]())
            us = [1e3 * t for t in timed(fns, args.rounds, 20 * args.reps)]
            print(f"| {q} | {us[0]:.0f} | {us[1]:.0f} | {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
