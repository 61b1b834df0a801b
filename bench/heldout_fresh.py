"""Every shipped drafter scored on the same text, which none of them trained on, per domain (issue 44).

    python bench/heldout_fresh.py [--skip 3000] [--count 140] [--gsm8k 70] [--methods ...] [--json OUT]
                                  <overrides> [<method>:<override> ...]

bench/heldout_domains.py scores a part on its own training data's held-out split, so each part's figure is on
other sequences (and it needs that data in the cache: the session-54 mix was generated on a GPU). This builds
one held-out set on the spot instead, from prompts the shipped parts never saw:

- general: the recipe draws its ShareGPT prompts in one seeded order (models/general_data.general_prompts,
  train.seed); the parts trained on the mix read the first 3,000 of it (SPACE's the first 700), so the draws
  --skip+1 .. --skip+--count are new to all of them (the same pool and decontamination give the same order:
  the script checks that the first --skip draws hold the mix's per-domain counts, when --expect-mix is given);
- GSM8K: the train questions the mix's seeded sample (train.data.num_prompts + num_original of the split's
  rows) left out, in the math template (--gsm8k of them).

The target answers them as the recipe's data is made (models/distill.generate: the LLM-QAT hybrid,
train.data.max_new_tokens; cached, resumable), the labels are its greedy tokens, and each part is scored by
heldout_domains.py's scorer (the same functions as the trainers' curves).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from heldout_domains import SCORERS, interleave, save, score  # noqa: E402

from specbench.config import settings  # noqa: E402
from specbench.config.compose import compose, validate  # noqa: E402
from specbench.core.errors import SpecBenchError  # noqa: E402
from specbench.models import load_model  # noqa: E402
from specbench.models.artifacts import cache_dir, read_json, write_json  # noqa: E402
from specbench.models.distill import TEMPLATES, generate, read_train_split  # noqa: E402
from specbench.models.general_data import DOMAINS, general_prompts  # noqa: E402
from specbench.train.loop import with_labels  # noqa: E402


def fresh_prompts(target, run, skip: int, count: int, gsm8k: int, expect_mix: dict | None):
    """(prompts, domains): general draws skip+1..skip+count, then GSM8K train questions the mix's sample left out."""
    d, seed = run.train.data, int(run.train.seed)
    data_dir = run.task.data_dir or os.environ.get("SPECBENCH_DATA_DIR")
    prompts, domains, record = general_prompts(skip + count, seed, data_dir, target.tokenizer,
                                               int(d.general_max_prompt_tokens))
    first = {k: domains[:skip].count(k) for k in DOMAINS}
    if expect_mix and first != expect_mix:
        raise SpecBenchError(f"the first {skip} draws hold {first}, not the mix's {expect_mix}: another pool or "
                             "decontamination set, so the later draws may overlap what the parts trained on")
    print(f"general draws: {record['conversations_read']} conversations read; the first {skip}: {first}; "
          f"kept draws {skip + 1}-{len(prompts)}")
    prompts, domains = prompts[skip:], domains[skip:]
    rows = read_train_split(data_dir)
    used = set(random.Random(seed).sample(range(len(rows)), min(len(rows), int(d.num_prompts) + int(d.num_original))))
    left = [i for i in range(len(rows)) if i not in used][:gsm8k]
    print(f"GSM8K train: {len(rows) - len(used)} questions outside the mix's sample; {len(left)} kept")
    tok = target.tokenizer
    prompts += [tok.encode_chat([{"role": "user", "content": TEMPLATES[0].format(q=rows[i]["question"])}]) for i in left]
    return prompts, domains + ["gsm8k-math"] * len(left)


def fresh_sequences(target, run, prompts, domains):
    """The target's answers (cached by the prompts and the generation settings; a journal resumes)."""
    d = run.train.data
    key = hashlib.sha256(json.dumps([prompts, int(d.max_new_tokens), float(d.greedy_fraction), int(d.greedy_prefix),
                                     float(d.temperature), float(d.top_p), int(run.train.seed), target.key]).encode())
    path = cache_dir() / "heldout_fresh" / f"{key.hexdigest()[:16]}.json"
    if path.is_file():
        print(f"answers: reusing {path}")
        got = read_json(path, "held-out answers", "delete it")
        return [tuple(s) for s in got["sequences"]], got["domains"]
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    seqs, _ = generate(target, prompts, d, int(run.train.seed), journal=path.with_suffix(".journal"))
    of_prompt = {tuple(p): dom for p, dom in zip(prompts, domains)}
    doms = [of_prompt[tuple(s[:st])] for s, st in seqs]
    write_json(path, {"sequences": seqs, "domains": doms})
    path.with_suffix(".journal").unlink(missing_ok=True)
    print(f"answers: {len(seqs)} sequences in {time.monotonic() - t0:.0f} s -> {path}")
    return seqs, doms


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default=",".join(SCORERS))
    ap.add_argument("--skip", type=int, default=3000, help="general draws the parts trained on (the mix's general_prompts)")
    ap.add_argument("--count", type=int, default=140, help="general draws after them to score on")
    ap.add_argument("--gsm8k", type=int, default=70, help="GSM8K train questions outside the mix's sample")
    ap.add_argument("--expect-mix", help="JSON: the mix's per-domain counts of its first --skip draws (a check)")
    ap.add_argument("--json", help="write the table here too")
    args, overrides = ap.parse_known_args(argv)
    if args.skip < 0 or args.count < 1 or args.gsm8k < 0:
        raise SpecBenchError(f"--skip >= 0, --count >= 1, --gsm8k >= 0; got {args.skip}, {args.count}, {args.gsm8k}")
    torch.set_grad_enabled(False)
    common = [o for o in overrides if ":" not in o.split("=", 1)[0]]
    base = compose(["method=eesd", *common])
    validate(base)
    run0 = settings.of(base)
    if run0.threads:
        torch.set_num_threads(int(run0.threads))
    target = load_model(run0.model)
    prompts, domains = fresh_prompts(target, run0, args.skip, args.count, args.gsm8k,
                                     json.loads(args.expect_mix) if args.expect_mix else None)
    seqs, doms = fresh_sequences(target, run0, prompts, domains)
    labelled = with_labels(target, seqs, run0.train)
    groups = defaultdict(list)
    for s, dom in zip(labelled, doms):
        groups[dom].append(s)
    groups = dict(sorted(groups.items()))
    groups["general (pooled)"] = interleave([groups.get(d, []) for d in DOMAINS])
    limit = max(len(g) for g in groups.values())
    report = {}
    for m in args.methods.split(","):
        if m not in SCORERS:
            raise SpecBenchError(f"--methods {m!r}; allowed: {', '.join(SCORERS)}")
        mine = [o.split(":", 1)[1] for o in overrides if o.startswith(f"{m}:")]
        cfg = compose([f"method={m}", *common, *mine])
        validate(cfg)
        run = settings.of(cfg)
        report[m] = score(m, run, target, labelled, groups, limit)
    if args.json:
        save(args.json, argv, report)

if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SpecBenchError as e:
        sys.exit(f"specbench: error: {e}")
