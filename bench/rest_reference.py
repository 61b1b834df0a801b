"""REST's retriever here vs the authors' `draftretriever` on the same prompts and the same datastore.

    # the authors' wheel is in their repository (DraftRetriever/wheels/, cp39); it needs a Python 3.9:
    python3.9 -m pip install --no-deps --target /tmp/rest_dr/site draftretriever-0.1.0-cp39-cp39-manylinux_2_34_x86_64.whl
    python bench/rest_reference.py --run results/bench/trainingfree_retrieval/trainingfree/gsm8k/rest \
        --draftretriever /tmp/rest_dr/site --python python3.9

NOT `pip install draftretriever`: PyPI's draftretriever 0.1.1 is ADED's retriever (a tri-gram
matrix and Monte Carlo tree search, github.com/liuxukun2000/ADED) under the same name and API, not
REST's suffix-array search (docs/trainingfree_retrieval.md).

Greedy acceptance depends only on the draft and AR's tokens, so both retrievers are replayed along
the AR output recorded by a `method=rest` run (its samples.jsonl): at each step each proposes a
tree for the context so far, the step accepts the longest tree path that AR's next tokens follow,
and commits that plus one token. Printed: mean accepted draft tokens per step for both (the bonus
token not counted), and the run's own measured figure (it must equal our replay: the loop is the
same). draftretriever runs in its own interpreter (`--python`, a subprocess answering one query a
line), gets the same token ids (one Writer entry, no separators: what `add_entry` per record
gives) and the authors' calls: `search(query, choices=num_draft)` for suffix lengths
max_suffix..min_suffix, the first non-empty answer wins (rest/model/utils.py
`generate_candidates_and_draft_buffer`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
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


def tree_nodes(paths: list[list[int]]) -> int:
    """Draft nodes the target verifies for these paths (their distinct prefixes)."""
    return len({tuple(p[: i + 1]) for p in paths for i in range(len(p))})


def replay(draft, prompt: list[int], out: list[int]) -> tuple[int, int, int]:
    """(steps, accepted draft tokens, drafted nodes) of a greedy decode of `out` after `prompt` with `draft`."""
    pos, steps, acc, nodes = 1, 0, 0, 0  # out[0] comes from the prefill
    while pos < len(out):
        paths = draft(prompt + out[:pos])
        n = min(accepted_along(paths, out[pos:]), len(out) - pos - 1)  # the budget: the last token is always the target's
        steps, acc, nodes, pos = steps + 1, acc + n, nodes + tree_nodes(paths), pos + n + 1
    return steps, acc, nodes


# the reference's side: runs under --python with the wheel on its path; one JSON query a line in, paths out
SERVER = """
import json, sys
import draftretriever
first = json.loads(sys.stdin.readline())
w = draftretriever.Writer(index_file_path=first["index"], max_chunk_len=512 * 1024 * 1024, vocab_size=first["vocab"])
w.add_entry(first["tokens"])
w.finalize()
del w
reader = draftretriever.Reader(index_file_path=first["index"])
print(json.dumps({"ready": draftretriever.__file__}), flush=True)
for line in sys.stdin:
    q = json.loads(line)
    print(json.dumps(reader.search(q["query"], choices=q["choices"])[0]), flush=True)
"""


class ReferenceRetriever:
    """The authors' draftretriever in a subprocess (its wheel is built for another Python)."""

    def __init__(self, python: str, site: str, tokens: list[int], vocab: int):
        index = Path(tempfile.mkdtemp()) / "datastore.idx"
        self.proc = subprocess.Popen([python, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={"PYTHONPATH": site, "RAYON_NUM_THREADS": "1"})
        self.ask({"index": str(index), "vocab": vocab, "tokens": tokens})

    def ask(self, msg: dict):
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"rest_reference: error: the draftretriever process ended (exit {self.proc.wait()})")
        return json.loads(line)

    def search(self, query: list[int], choices: int) -> list[list[int]]:
        return self.ask({"query": query, "choices": choices})


def same_retrieval(reference, m, recs, samples, target, stride: int = 4) -> str:
    """On the same contexts (every `stride`-th position of AR's outputs): does the authors' first
    non-empty span equal our longest matching suffix, and is each of their paths a prefix of one of
    the continuations ours retrieved (they cut the trie differently, not retrieve differently)?"""
    spans = inside = paths = contexts = 0
    for rec in recs:
        prompt = target.tokenizer.encode_chat(samples[rec["id"]].messages([]))
        out = rec["ar"]["tokens"][0]
        for pos in range(1, len(out), stride):
            context = prompt + out[:pos]
            theirs = reference(context)
            conts = {tuple(int(t) for t in row if t >= 0) for row in m.retrieve(context)}
            contexts += 1
            spans += reference.span == m.last_match[0]
            paths += len(theirs)
            inside += sum(any(c[: len(p)] == tuple(p) for c in conts) for p in theirs)
    return (f"same contexts ({contexts}, every {stride}th position): the authors' span = our longest suffix in "
            f"{spans}/{contexts}; their paths that are prefixes of our retrieved continuations: {inside}/{paths}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a method=rest run directory")
    ap.add_argument("--draftretriever", help="folder where the authors' draftretriever wheel is installed")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that wheel is built for (python3.9)")
    args = ap.parse_args()
    import torch
    from omegaconf import OmegaConf

    from specbench.methods import build_method
    from specbench.models import load_model
    from specbench.engine.sampling import SamplingConfig
    from specbench.config.settings import of, run_values
    from specbench.tasks import build_task

    run = Path(args.run)
    recorded = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"), resolve=True)
    # a run made before `method.cut` existed used the node cut (all num_draft prefixes kept)
    recorded["method"] = {"cut": "nodes"} | recorded["method"]
    cfg = of(recorded)
    torch.set_grad_enabled(False)
    target = load_model(cfg.model)
    m = build_method("rest", target, cfg.method, SamplingConfig(), run_values(cfg))
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
        # vocab: the alphabet libsais sorts (every id below it), as the authors' get_datastore_*.py pass it
        reader = ReferenceRetriever(args.python, args.draftretriever, m.datastore.tokens.tolist(), target.vocab_size + 1)

        def reference(context):
            for span in range(m.max_suffix, m.min_suffix - 1, -1):
                paths = reader.search(context[-span:], m.num_draft)
                if paths:
                    reference.span = span
                    return [[t for t in p if t >= 0] for p in paths]
            reference.span = 0
            return []

        drafts["draftretriever"] = reference
    measured = [0, 0]
    totals = {k: [0, 0, 0] for k in drafts}
    for rec in recs:
        sample = samples[rec["id"]]
        prompt = target.tokenizer.encode_chat(sample.messages([]))
        out = rec["ar"]["tokens"][0]
        for k, d in drafts.items():
            totals[k] = [x + y for x, y in zip(totals[k], replay(d, prompt, out))]
        steps = rec["method"]["steps"]
        measured[0] += len(steps)
        measured[1] += sum(s[2] if isinstance(s, list) else s["kept"] for s in steps)
    print(f"# REST retrievers replayed along AR's output ({len(recs)} samples of {cfg.task.name}, datastore {m.datastore_path.name})")
    print("| retriever | steps | accepted draft tokens | mean accepted per step | mean drafted nodes per step |")
    print("|---|---|---|---|---|")
    for k, (s, a, n) in totals.items():
        print(f"| {k} | {s} | {a} | {a / s:.3f} | {n / s:.1f} |")
    print(f"| the run's measured steps (method=rest) | {measured[0]} | {measured[1]} | {measured[1] / max(1, measured[0]):.3f} | |")
    if "draftretriever" in drafts:
        print(same_retrieval(drafts["draftretriever"], m, recs, samples, target))


if __name__ == "__main__":
    main()
