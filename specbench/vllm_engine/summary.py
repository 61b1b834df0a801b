"""A vLLM run's figures: one record per batch size (AR and the method on the same prompts), the summary over them.

Throughput is output tokens over the wall time of all prompts at that batch size; speedup is the method's
throughput over AR's in the same worker. Acceptance follows vLLM's own definitions (its spec-decode
counters): mean acceptance length = 1 + accepted / drafts (the token the target adds per verification
counted), acceptance at position i = accepted at i / drafts. The crossover is the smallest batch size
at which the method's speedup falls below 1 (speculation stops paying); null when it pays at every size.
"""

from __future__ import annotations

import statistics

from specbench.core import table
from specbench.core.table import Column


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def acceptance(spec: dict) -> dict | None:
    """vLLM's acceptance figures from its counters over one batch size (None: nothing was drafted)."""
    drafts = spec.get("drafts", 0)
    if not drafts:
        return None
    return {"drafts": drafts, "draft_tokens": spec["draft_tokens"], "accepted_tokens": spec["accepted_tokens"],
            "mean_accepted_length": 1 + spec["accepted_tokens"] / drafts,
            "acceptance_rate": spec["accepted_tokens"] / spec["draft_tokens"] if spec["draft_tokens"] else None,
            "per_position": [a / drafts for a in spec["accepted_per_pos"]]}


def system_record(r: dict, samples, task, tok) -> dict:
    """One system's results at one batch size, as the worker returned them plus the derived figures."""
    ttft = [q["ttft"] for q in r["requests"] if q.get("ttft") is not None]
    tpot = [q["tpot"] for q in r["requests"] if q.get("tpot") is not None]
    scores: dict[str, list[float]] = {}
    for s, t in zip(samples, r["tokens"]):
        for k, v in task.score(s, [tok.decode(t)]).items():
            scores.setdefault(k, []).append(v)
    return {"new_tokens": r["new_tokens"], "wall": r["wall"], "tokens_per_s": r["new_tokens"] / r["wall"] if r["wall"] else None,
            "tokens": r["tokens"], "ttft": ttft, "tpot": tpot,
            "ttft_median": _quantile(ttft, 0.5), "ttft_p90": _quantile(ttft, 0.9),
            "tpot_median": _quantile(tpot, 0.5), "tpot_p90": _quantile(tpot, 0.9),
            "quality": {k: statistics.fmean(v) for k, v in scores.items()}, "spec": r["spec"], "acceptance": acceptance(r["spec"]),
            "cpu_share": r.get("cpu_share")}  # absent in records of workers before it was measured


def batch_record(rec: dict, index: int, samples, ids: list[str], task, tok) -> dict:
    """The samples.jsonl line of one batch size (the native runner's shape: id, ar, method, matches_ar, speedup)."""
    ar, m = system_record(rec["ar"], samples, task, tok), system_record(rec["method"], samples, task, tok)
    same = [a == b for a, b in zip(ar["tokens"], m["tokens"])]
    speedup = m["tokens_per_s"] / ar["tokens_per_s"] if ar["tokens_per_s"] and m["tokens_per_s"] else None
    return {"id": f"batch-{rec['batch_size']}", "index": index, "category": None, "batch_size": rec["batch_size"],
            "prompt_ids": ids, "ar": ar, "method": m, "matches_ar": all(same), "matches_ar_per_request": same, "speedup": speedup}


def crossover(rows: list[dict]) -> int | None:
    """The smallest batch size whose speedup is below 1; None when the method pays at every size."""
    below = [r["batch_size"] for r in rows if r["speedup"] is not None and r["speedup"] < 1]
    return min(below) if below else None


def summarize(records: list[dict]) -> dict:
    rows = []
    for r in sorted(records, key=lambda r: r["batch_size"]):
        acc = r["method"].get("acceptance") or {}
        rows.append({"batch_size": r["batch_size"], "ar_tokens_per_s": r["ar"]["tokens_per_s"],
                     "method_tokens_per_s": r["method"]["tokens_per_s"], "speedup": r["speedup"],
                     "matches_ar": sum(r["matches_ar_per_request"]), "requests": len(r["matches_ar_per_request"]),
                     **{f"{s}_{k}": r[s].get(k) for s in ("ar", "method")
                        for k in ("ttft_median", "ttft_p90", "tpot_median", "tpot_p90", "cpu_share")},
                     "mean_accepted_length": acc.get("mean_accepted_length"), "acceptance_rate": acc.get("acceptance_rate"),
                     "per_position": acc.get("per_position"), "drafts": acc.get("drafts"),
                     "quality": r["method"]["quality"], "ar_quality": r["ar"]["quality"]})
    return {"engine": "vllm", "samples": len(records), "batches": rows, "crossover_batch": crossover(rows),
            "matches_ar": sum(bool(r["matches_ar"]) for r in records)}


def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


COLUMNS = [Column("batch"), Column("AR tok/s", spec=".1f"), Column("method tok/s", spec=".1f"), Column("speedup"),
           Column("=AR"), Column("TTFT ms AR/method"), Column("TPOT ms AR/method"), Column("accept len"), Column("accept by position", align="<"), Column("CPU share AR/method")]


def rows_of(s: dict) -> list[list]:
    return [[b["batch_size"], b["ar_tokens_per_s"], b["method_tokens_per_s"], _f(b["speedup"], ".3f") + "x",
             f"{b['matches_ar']}/{b['requests']}",
             f"{_f(_ms(b['ar_ttft_median']), '.0f')}/{_f(_ms(b['method_ttft_median']), '.0f')}",
             f"{_f(_ms(b['ar_tpot_median']), '.1f')}/{_f(_ms(b['method_tpot_median']), '.1f')}",
             _f(b["mean_accepted_length"]), " ".join(_f(p) for p in b["per_position"] or []),
             f"{_f(b.get('ar_cpu_share'))}/{_f(b.get('method_cpu_share'))}"] for b in s["batches"]]


def _ms(x):
    return None if x is None else 1000 * x


def print_summary(s: dict) -> str:
    meta = s["meta"]
    cross = s["crossover_batch"]
    lines = [f"\n== vLLM: {meta['method']} vs AR | task {meta['task']} | model {meta['model']} | {meta['prompts']} prompts ==",
             f"speculative_config: {meta['speculative_config']}",
             table.text(COLUMNS, rows_of(s)),
             "(TTFT, TPOT: medians over requests; accept len: 1 + accepted / drafts; by position: accepted at i / drafts;\n"
             " CPU share: vLLM's CPU time / (wall x its cores): well below 1, other jobs took its cores while it was timed)",
             "crossover: " + (f"speculation stops paying at batch {cross}" if cross else "the method pays at every batch size measured")]
    if meta.get("first_turn_only"):
        lines.append("note: multi-turn samples: vLLM runs their first turn only")
    text = "\n".join(lines)
    print(text)
    return text
