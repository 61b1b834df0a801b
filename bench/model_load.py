"""How long loading the embedded model takes, from an empty cache and then with the cache filled.

  python bench/model_load.py [--repeats 2] [--backend ggml]

Each load runs in a fresh process (imports not counted) with SPECBENCH_CACHE_DIR set to one new temporary
directory, so the first load converts the tokenizer and the weights (models/tokenizer.py, models/converted.py)
and the later ones read them.
Pin it on a shared machine (taskset -c 1 ...): the figures are single-core wall times.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = """
import sys, time
from specbench.config.settings import merge, shipped
from specbench.models import load_model
cfg = merge(shipped("model", "smollm2-135m"), {"backend": sys.argv[1]})
t = time.perf_counter()
load_model(cfg)
print(f"{time.perf_counter() - t:.1f}")
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="loads after the first (cache filled)")
    ap.add_argument("--backend", default="ggml", help="model.backend of the loaded model (the default: ggml)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "SPECBENCH_CACHE_DIR": cache}
        for i in range(1 + a.repeats):
            out = subprocess.run([sys.executable, "-c", CHILD, a.backend], env=env, capture_output=True, text=True, check=True)
            print(f"load {i + 1} ({'empty cache' if i == 0 else 'cache filled'}): {out.stdout.strip()} s", flush=True)


if __name__ == "__main__":
    main()
