"""Cross-engine consistency: vLLM's n-gram drafter against the native prompt lookup (method=pld) at batch 1.

usage: python bench/vllm_consistency.py --vllm RUN_DIR --native RUN_DIR
  RUN_DIR of `engine=vllm method=ngram` (its batch-1 record) and of the native `method=pld` on the same task
  and prompts, with the same settings (pld's max_ngram/min_ngram = ngram's prompt_lookup_max/min, control.k =
  num_speculative_tokens). Prints, in vLLM's definitions (mean acceptance length = 1 + accepted / drafts,
  position i: drafts whose token i was accepted / drafts; a draft: a verification that had >= 1 drafted token):
  - each engine as measured (vLLM: its counters; native: its per-step records);
  - a replay of each engine's lookup rule, in plain Python, along that engine's own greedy output:
    native `pld.lookup` (the most recent earlier match of the longest n-gram) and vLLM's rule (the earliest
    match of the longest n-gram, vllm/v1/spec_decode/ngram_proposer.py);
  - both rules replayed along the same output, so the rule's effect is seen apart from the outputs'.
A measured row equal to its own rule's replay says the engine does what its rule says; the gap between the
two rules on the same tokens is the explained difference between the engines.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from omegaconf import OmegaConf

from specbench.methods.pld import lookup as native_rule
from specbench.config.settings import of
from specbench.tasks import build_task
from specbench.vllm_engine.convert import load_tokenizer


def vllm_rule(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """vLLM's n-gram proposal: the longest n-gram in [min, max] ending the sequence, its EARLIEST earlier match."""
    n_tok = len(tokens)
    for n in range(min(max_ngram, n_tok - 1), min_ngram - 1, -1):
        tail = tokens[-n:]
        for start in range(0, n_tok - n):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []


def replay(prompt: list[int], output: list[int], rule, k: int, hi: int, lo: int, max_new: int | None = None) -> list[tuple[int, int]]:
    """(drafted, accepted) per verification of a greedy decode that produced `output` (the first token: prefill).
    `max_new`: the native loop's cap (a step drafts at most the tokens left but one; one left: no draft);
    vLLM drafts k whatever is left and drops what passes max_tokens."""
    seq, pos, steps = prompt + output, len(prompt) + 1, []
    while pos < len(seq):
        kk = k if max_new is None else min(k, max_new - (pos - len(prompt)) - 1)
        d = rule(seq[:pos], kk, hi, lo) if kk > 0 else []
        a = 0
        while a < len(d) and pos + a < len(seq) and d[a] == seq[pos + a]:
            a += 1
        steps.append((len(d), a))
        pos += a + 1
    return steps


def stats(steps: list[tuple[int, int]], k: int) -> dict:
    drafted = [(d, a) for d, a in steps if d > 0]
    n = len(drafted)
    return {"drafts": n, "accepted": sum(a for _, a in drafted), "mean_len": 1 + sum(a for _, a in drafted) / n if n else None,
            "per_pos": [sum(a > i for _, a in drafted) / n if n else None for i in range(k)]}


def line(name: str, s: dict) -> str:
    pos = " ".join("-" if p is None else f"{p:.3f}" for p in s["per_pos"])
    return f"{name:<50} drafts {s['drafts']:>5}  accepted {s['accepted']:>5}  mean length {s['mean_len']:.3f}  by position {pos}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vllm", required=True, type=Path)
    p.add_argument("--native", required=True, type=Path)
    a = p.parse_args()
    cfg = OmegaConf.load(a.vllm / "config.yaml")
    spec = json.loads((a.vllm / "summary.json").read_text())["meta"]["speculative_config"]
    k, hi, lo = spec["num_speculative_tokens"], spec["prompt_lookup_max"], spec["prompt_lookup_min"]
    ncfg = OmegaConf.load(a.native / "config.yaml")
    assert (ncfg.control.k, ncfg.method.max_ngram, ncfg.method.min_ngram) == (k, hi, lo), "the native run's settings differ"
    samples = build_task(of(cfg).task).load()
    tok = load_tokenizer(of(cfg).model)
    prompts = {s.id: tok.encode_chat(s.messages([])) for s in samples}

    v = next(json.loads(x) for x in (a.vllm / "samples.jsonl").read_text().splitlines() if json.loads(x)["batch_size"] == 1)
    v_out = dict(zip(v["prompt_ids"], v["method"]["tokens"]))
    native = {r["id"]: r for r in map(json.loads, (a.native / "samples.jsonl").read_text().splitlines())}
    ids = [i for i in v["prompt_ids"] if i in native]
    n_out = {i: native[i]["method"]["tokens"][0] for i in ids}
    vs = v["method"]["spec"]
    vm = {"drafts": vs["drafts"], "accepted": vs["accepted_tokens"], "mean_len": 1 + vs["accepted_tokens"] / vs["drafts"],
          "per_pos": [x / vs["drafts"] for x in vs["accepted_per_pos"]]}
    nsteps = [(row[0], row[2]) for i in ids for row in native[i]["method"]["steps"]]
    same = sum(v_out[i] == n_out[i] for i in ids)
    print(f"{len(ids)} prompts, k={k}, n-gram {lo}..{hi}, greedy; vLLM's and the native outputs identical for {same}/{len(ids)}")
    print(line("vLLM ngram, measured (batch 1)", vm))
    print(line("vLLM's rule replayed on vLLM's output", stats(sum((replay(prompts[i], v_out[i], vllm_rule, k, hi, lo) for i in ids), []), k)))
    print(line("native pld, measured", stats(nsteps, k)))
    cap = int(ncfg.max_new_tokens)
    print(line("native rule replayed on the native output", stats(sum((replay(prompts[i], n_out[i], native_rule, k, hi, lo, cap) for i in ids), []), k)))
    print(line("native rule replayed on vLLM's output (uncapped)", stats(sum((replay(prompts[i], v_out[i], native_rule, k, hi, lo) for i in ids), []), k)))


if __name__ == "__main__":
    main()
