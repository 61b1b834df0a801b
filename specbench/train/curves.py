"""python -m specbench.train.curves <log.json> [<log.json> ...] -o curves.png

Held-out acceptance against optimiser steps, from the training logs every trainer writes next to
its artifact (`<artifact>.log.json`, its "curve": the evaluations every train.eval_every steps).
One line per log and draft depth (depth k: top-1 agreement of draft position / head k with the
target's greedy token on the held-out sequences, given the correct prefix). Reads JSON and
writes a PNG (matplotlib, Agg); imports nothing heavy of specbench.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specbench.core.errors import SpecBenchError, check_output_file


def fail(message: str) -> None:
    print(f"specbench: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_curve(path: Path) -> tuple[str, list[dict]]:
    """(a label, the evaluations) of one training log; a bad file is one line and exit 2."""
    try:
        body = json.loads(Path(path).read_text())
        points = body["curve"]
        settings = body.get("settings") or {}
        number = (int, float)
        assert isinstance(points, list) and isinstance(settings, dict) and isinstance(settings.get("method") or {}, dict)
        assert all(isinstance(p, dict) and isinstance(p.get("step"), number) and not isinstance(p["step"], bool)
                   and isinstance(p.get("acceptance"), list) and p["acceptance"]  # one figure a depth
                   and all(isinstance(a, number) for a in p["acceptance"]) for p in points)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AssertionError):
        fail(f"{path} is not a training log with a held-out curve (a <artifact>.log.json written with "
             "train.eval_every set)")
    if not points:
        fail(f"{path} holds no held-out evaluation (train.eval_every was null)")
    method = (settings.get("method") or {}).get("name") or Path(path).parent.name
    name = Path(path).stem.split(".")[0]  # a cache file's is <model key>-<structure hash>: its hash is enough
    return f"{method} ({name if len(name) <= 24 else name[-10:]})", points


def plot(curves: list[tuple[str, list[dict]]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one colour per log, one line style per depth: several multi-depth logs stay readable
    styles = ["-", "--", ":", "-.", (0, (1, 3))]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, (label, points) in enumerate(curves):
        depths = max(len(p["acceptance"]) for p in points)
        for d in range(depths):
            xs = [p["step"] for p in points if len(p["acceptance"]) > d]
            ys = [p["acceptance"][d] for p in points if len(p["acceptance"]) > d]
            ax.plot(xs, ys, marker="o", markersize=3, color=f"C{i % 10}", linestyle=styles[d % len(styles)],
                    label=f"{label} depth {d + 1}" if depths > 1 else label)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("held-out top-1 agreement with the target")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("acceptance vs training steps")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m specbench.train.curves",
                                 description="Plot held-out acceptance against optimiser steps from training logs.")
    ap.add_argument("logs", nargs="+", type=Path, help="training logs (<artifact>.log.json)")
    ap.add_argument("-o", "--out", type=Path, required=True, help="the PNG to write")
    args = ap.parse_args(argv)
    if args.out.suffix.lower() != ".png":
        fail(f"-o {args.out}: the output must be a .png file")
    try:
        check_output_file(args.out, "-o")
    except SpecBenchError as e:
        fail(str(e))
    curves = [read_curve(p) for p in args.logs]  # every input checked before anything is written
    try:
        out = plot(curves, args.out)
    except OSError as e:
        fail(f"cannot write {args.out}: {e.strerror or e}")
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
