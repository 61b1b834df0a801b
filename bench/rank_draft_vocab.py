"""A ranked token file for `method.draft_vocab.source` from a self-distillation data file.

    python bench/rank_draft_vocab.py results/bench/gpu_general/distill_gpu_general.json.xz \
        --top 16384 -o results/bench/eesd/draft_vocab_mix.json

Ranks the loss tokens of the file's sequences as `draft_vocab.source=distill` ranks its own data
(specbench/methods/draft_vocab.py `rank_tokens`: most frequent first, ties by id) and writes the
first `--top` ids as a JSON list. A file ranked on a general mix gives a draft vocabulary that
covers general text better than the default GSM8K-only data, and needs no generation on first use.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specbench.methods.draft_vocab import rank_tokens  # after the path is set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path, help="a distill data file (.json or .json.xz: {'sequences': [[ids, start], ...]})")
    ap.add_argument("--top", type=int, default=16384, help="ids to keep (the largest draft_vocab.size it serves)")
    ap.add_argument("--vocab-size", type=int, default=49152, help="the target's vocabulary size")
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args()
    opener = lzma.open if a.data.suffix == ".xz" else open
    with opener(a.data, "rt") as f:
        seqs = json.load(f)["sequences"]
    ranked = rank_tokens([(s, start) for s, start in seqs], a.vocab_size)[: a.top]
    a.out.write_text(json.dumps(ranked))
    print(f"{a.out}: the {len(ranked)} most frequent of {sum(len(s) - st for s, st in seqs)} loss tokens in {len(seqs)} sequences")


if __name__ == "__main__":
    main()
