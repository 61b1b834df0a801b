"""Eager and graphs side by side for any model: `python bench/gpu_regimes.py --model <name>`.

The doctor's bench (specbench/tools/regimes.py) without the rest of the report: AR and the chosen
methods over the first N GSM8K questions in `model.execution=eager` and in `graphs`, each mode's
speedups against AR in the same mode, tau, =AR, and AR's tokens/s against the device's bandwidth
bound. `--model` is conf/model/<name> or a hub id / local path (model=hf). Prints the table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specbench.tools import doctor  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cuda", choices=doctor.DEVICES)
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--seconds", type=float, default=600.0, help="time budget (eager gets 40%%, graphs 25%%)")
    p.add_argument("--methods", default="issue", choices=("issue", "all"))
    args = p.parse_args()
    print("\n".join(doctor.bench(args, log=lambda m: print(m, file=sys.stderr, flush=True))))


if __name__ == "__main__":
    main()
