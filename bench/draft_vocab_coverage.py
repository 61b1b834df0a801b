"""How much of the text a V'-token draft head can write (method.draft_vocab), per V'.

    python bench/draft_vocab_coverage.py --runs results/bench/draftvocab/gsm8k/eesd-fixed4-full

Ranks the vocabulary as the methods do (`distill`: the loss tokens of the self-distillation data
built with conf/train/default.yaml's `data`, from the artifact cache or generated), then prints,
for each V', the share of those training tokens and the share of AR's output tokens in the given
run directories (samples.jsonl: what greedy AR wrote on the evaluated prompts) that lie inside the
subset. A draft token outside the subset is impossible, so the second share bounds how often a
V'-token draft can agree with the target at all. Also the draft head's cost per call for one
token on `--backend` (median of `--reps`; the full head is V' = the vocabulary), beside a whole
one-token forward of the target after a 200-token cache (the head's share of a decoding step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from specbench.core.table import Column, markdown  # after the path is set


def ar_tokens(run_dirs) -> list[int]:
    toks = []
    for d in run_dirs:
        for line in (Path(d) / "samples.jsonl").read_text().splitlines():
            if line.strip():
                toks += [t for turn in json.loads(line)["ar"]["tokens"] for t in turn]
    return toks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="*", default=[], help="run directories whose AR outputs to check")
    ap.add_argument("--sizes", nargs="*", type=int, default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--backend", default="ggml")
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()

    from embedded import embedded_model
    from ggml_kernel import median_ms
    from specbench.methods.draft_vocab import SubsetHead, rank_tokens, subset_ids
    from specbench.config.settings import shipped
    from specbench.models.distill import build_sequences

    target = embedded_model(1, args.backend)
    train = shipped("train", "default")
    seqs = build_sequences(target, train.data, os.environ.get("SPECBENCH_DATA_DIR"), int(train.seed))
    ranked = rank_tokens(seqs, target.vocab_size)
    loss = [t for s, st in seqs for t in s[st:]]
    out = ar_tokens(args.runs)
    eos = sorted(target.tokenizer.eos_ids or ())
    h = torch.randn(1, 1, target.hidden_size)
    ids = [(7 * i + 3) % target.vocab_size for i in range(201)]
    cache = target.new_cache()
    target.forward(ids[:200], cache, last_only=True)

    def step():
        target.forward(ids[200:], cache)
        cache.crop(200)

    t1 = median_ms(step, args.reps)
    rows = []
    for v in [*args.sizes, target.vocab_size]:
        ids_v = subset_ids(ranked, v, target.vocab_size, keep=eos)
        kept = set(ids_v.tolist())
        head = target.lm_head if v == target.vocab_size else SubsetHead(target.lm_head, ids_v, args.backend)
        ms = median_ms(lambda head=head: head(h), args.reps)
        rows.append([v, f"{100 * v / target.vocab_size:.1f}%", 100 * sum(t in kept for t in loss) / len(loss),
                     100 * sum(t in kept for t in out) / len(out) if out else None, ms, 100 * ms / t1])
    print(f"vocabulary {target.vocab_size}; {len(loss)} training (loss) tokens; {len(out)} AR output tokens from "
          f"{len(args.runs)} run(s); backend {args.backend}: one-token forward T(1) = {t1:.2f} ms\n")
    print(markdown(["V'", "of the vocabulary", Column("training tokens covered %", spec=".2f"),
                    Column("AR output tokens covered %", spec=".2f"), Column("head ms (1 token)", spec=".3f"),
                    Column("head / T(1) %", spec=".1f")], rows))


if __name__ == "__main__":
    main()
