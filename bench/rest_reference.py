"""REST's retriever here vs the authors' `draftretriever` on the same prompts and the same datastore.

    pip install --no-deps --target /tmp/dr draftretriever        # a prebuilt wheel (cp311, manylinux)
    python bench/rest_reference.py --run results/bench/trainingfree_retrieval/trainingfree/gsm8k/rest --draftretriever /tmp/dr

Greedy acceptance depends only on the draft and AR's tokens, so both retrievers are replayed along
the AR output recorded by a `method=rest` run (its samples.jsonl): at each step each proposes a
tree for the context so far, the step accepts the longest tree path that AR's next tokens follow,
and commits that plus one token. Printed: mean accepted draft tokens per step for both, and the
run's own measured figure (it must equal our replay: the loop is the same). draftretriever gets the
same token ids (one Writer entry, no separators: what `add_entry` per record gives) and the
authors' calls: `search(query, choices=num_draft)` for suffix lengths max_suffix..min_suffix, the
first non-empty answer wins (rest/model/utils.py `generate_candidates_and_draft_buffer`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def accepted_along(paths: list[list[int]], future: list[int]) -> int:
    """The most leading tokens of `future` that one of the candidate paths spells."""
    best = 0
    for p in paths:
        n = 0
        while n < len(p) and n < len(future) and p[n] == future[n]:
            n += 1
        best = max(best, n)
    return best


def replay(draft, prompt: list[int], out: list[int]) -> tuple[int, int]:
    """(steps, accepted draft tokens) of a greedy decode of `out` after `prompt` with `draft`."""
    pos, steps, acc = 1, 0, 0  # out[0] comes from the prefill
    while pos < len(out):
        n = accepted_along(draft(prompt + out[:pos]), out[pos:])
        n = min(n, len(out) - pos - 1)  # the budget: the last token is always the target's
        steps, acc, pos = steps + 1, acc + n, pos + n + 1
    return steps, acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a method=rest run directory")
    ap.add_argument("--draftretriever", help="folder where the draftretriever wheel is installed")
    args = ap.parse_args()
    import torch
    from omegaconf import OmegaConf

    from specbench.methods import build_method
    from specbench.models import load_model
    from specbench.engine.sampling import SamplingConfig
    from specbench.tasks import build_task

    run = Path(args.run)
    cfg = OmegaConf.load(run / "config.yaml")
    torch.set_grad_enabled(False)
    target = load_model(cfg.model)
    m = build_method("rest", target, cfg.method, SamplingConfig(), {"cfg": cfg})
    samples = {s.id: s for s in build_task(cfg.task).load()}
    recs = [json.loads(line) for line in open(run / "samples.jsonl")]

    def ours(context):
        m.tokens = context
        prop = m.propose(0)
        if prop.tree is None:
            return []
        toks = [None] + prop.tokens
        return [[toks[j] for j in leaf[1:]] for leaf in prop.tree.retrieve]

    drafts = {"specbench rest": ours}
    if args.draftretriever:
        sys.path.insert(0, args.draftretriever)
        import draftretriever

        index = Path(tempfile.mkdtemp()) / "datastore.idx"
        w = draftretriever.Writer(str(index), vocab_size=target.vocab_size + 1)  # the 0.1.1 wheel: (file_path, vocab_size)
        w.add_entry(m.datastore.tokens.tolist())
        w.finalize()
        reader = draftretriever.Reader(index_file_path=str(index))

        def reference(context):
            for span in range(m.max_suffix, m.min_suffix - 1, -1):
                paths = reader.search(context[-span:], choices=m.num_draft)[0]
                if paths:
                    return [[t for t in p if t >= 0] for p in paths]
            return []

        drafts["draftretriever"] = reference
    measured = [0, 0]
    totals = {k: [0, 0] for k in drafts}
    for rec in recs:
        sample = samples[rec["id"]]
        prompt = target.tokenizer.encode_chat(sample.messages([]))
        out = rec["ar"]["tokens"][0]
        for k, d in drafts.items():
            s, a = replay(d, prompt, out)
            totals[k][0] += s
            totals[k][1] += a
        steps = rec["method"]["steps"]
        measured[0] += len(steps)
        measured[1] += sum(s[2] if isinstance(s, list) else s["kept"] for s in steps)
    print(f"# REST retrievers replayed along AR's output ({len(recs)} samples of {cfg.task.name}, datastore {m.datastore_path.name})")
    print("| retriever | steps | accepted draft tokens | mean accepted per step |")
    print("|---|---|---|---|")
    for k, (s, a) in totals.items():
        print(f"| {k} | {s} | {a} | {a / s:.3f} |")
    print(f"| the run's measured steps (method=rest) | {measured[0]} | {measured[1]} | {measured[1] / max(1, measured[0]):.3f} |")


if __name__ == "__main__":
    main()
