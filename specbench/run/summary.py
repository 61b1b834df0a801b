"""A run's figures over its samples, with their uncertainty, and the end-of-run summary text.

The headline speedup is pooled (ratio of summed tokens/s, the papers' way). Beside it: the
median per-sample speedup (a few spoiled samples cannot move it) and a bootstrap confidence
interval of the pooled speedup over samples; a run whose CI is wider than `max_rel_width` of
its speedup is flagged (`ci_wide`). The cost model's prediction is given twice: from the
start-up profile and refitted from the run's own verify steps (specbench/run/profiling.py).
"""

from __future__ import annotations

import statistics

from specbench.core import table
from specbench.run.interference import foreign_share
from specbench.metrics import (StepStats, acceptance_metrics, cost_terms, eq14_speedup, position_rates, position_stats,
                               predicted_speedup)
from specbench.metrics.costmodel import interp_cost
from specbench.run.profiling import refit_costs
from specbench.core.stats import pooled_speedup_ci
from specbench.core.table import Column

def uncertainty(records: list[dict], ci) -> dict:
    """Median per-sample speedup, bootstrap CI of the pooled one, and the wide-CI flag; `ci`: the
    run's `measure.ci` settings (level, resamples, seed, max_rel_width)."""
    per = [r["speedup"] for r in records if r.get("speedup")]
    pairs = [(r["ar"]["new_tokens"], r["ar"]["wall"], r["method"]["new_tokens"], r["method"]["wall"]) for r in records]
    interval = pooled_speedup_ci(pairs, float(ci.level), int(ci.resamples), int(ci.seed))
    out = {"speedup_per_sample_median": statistics.median(per) if per else None,
           "speedup_ci": list(interval) if interval else None, "ci_level": float(ci.level)}
    pooled = _pooled(records)
    if interval and pooled:
        out["ci_rel_width"] = (interval[1] - interval[0]) / pooled
        out["ci_wide"] = out["ci_rel_width"] > float(ci.max_rel_width)
    return out


def _pooled(records: list[dict]) -> float | None:
    a = sum(r["ar"]["new_tokens"] for r in records), sum(r["ar"]["wall"] for r in records)
    m = sum(r["method"]["new_tokens"] for r in records), sum(r["method"]["wall"] for r in records)
    return (m[0] / m[1]) / (a[0] / a[1]) if a[0] and a[1] and m[1] else None


def interference_summary(records: list[dict]) -> dict | None:
    info = [r["interference"] for r in records if r.get("interference")]
    if not info:
        return None
    loads = [r["load"] for r in records if r.get("load")]
    avg = [x["loadavg_1m"] for x in loads if x.get("loadavg_1m") is not None]
    cpu = [x["cpu_per_wall"] for x in loads if x.get("cpu_per_wall") is not None]
    return {
        "remeasured": sum(i["attempts"] > 1 for i in info),
        "spiked": sum(bool(i["spiked"]) for i in info),
        "loadavg_1m_median": statistics.median(avg) if avg else None,
        "cpu_per_wall_median": statistics.median(cpu) if cpu else None,
        "foreign_share": foreign_share(loads),
    }


def _system(records: list[dict], key: str) -> dict:
    tok = sum(r[key]["new_tokens"] for r in records)
    wall = sum(r[key]["wall"] for r in records)
    times: dict[str, float] = {}
    q: dict[str, list[float]] = {}
    for r in records:
        for k, v in r[key].get("times", {}).items():
            times[k] = times.get(k, 0.0) + v
        for k, v in (r[key].get("quality") or {}).items():
            q.setdefault(k, []).append(v)
    return {
        "new_tokens": tok,
        "wall": wall,
        "tokens_per_s": tok / wall if wall else None,
        "times": times,
        "time_share": {k: v / wall for k, v in times.items() if k != "wall"} if wall else {},
        "quality": {k: statistics.fmean(v) for k, v in q.items()},
    }


def aggregate(records: list[dict], costs: dict[int, float] | None, ci, per_category: bool = True) -> dict:
    """Pooled figures over samples: ratios of sums (the papers' way), plus per-sample spreads;
    `ci`: the run's `measure.ci` settings."""
    if not records:
        return {"samples": 0}
    out: dict = {"samples": len(records)}
    for key in ("ar", "method", "base"):
        if key != "base" or all("base" in r for r in records):
            out[key] = _system(records, key)
    if "base" in out:
        of = sum(r["base"].get("agree_of", 0) for r in records)
        out["base"]["agreement"] = sum(r["base"].get("agree_tokens", 0) for r in records) / of if of else None
    m = out["method"]
    out["speedup"] = m["tokens_per_s"] / out["ar"]["tokens_per_s"] if out["ar"]["tokens_per_s"] else None
    ar_per_token = out["ar"]["wall"] / out["ar"]["new_tokens"] if out["ar"]["new_tokens"] else None
    out["cost_terms"] = cost_terms(m["times"], m["new_tokens"], ar_per_token)
    per = [r["speedup"] for r in records if r.get("speedup")]
    out["speedup_per_sample_mean"] = statistics.fmean(per) if per else None
    out["speedup_per_sample_std"] = statistics.stdev(per) if len(per) > 1 else None
    out |= uncertainty(records, ci)
    out["matches_ar"] = sum(bool(r["matches_ar"]) for r in records)
    inter = interference_summary(records)
    if inter:
        out["interference"] = inter
    steps = [s for r in records for s in r["method"].get("steps", [])]
    n_seq = sum(len(r["method"].get("tokens") or [None]) for r in records)  # one prefill token each
    out["sequences"] = n_seq
    if steps:
        acc = acceptance_metrics(steps, m["new_tokens"], n_seq)
        out["acceptance"] = acc
        out |= position_stats(steps)
        draft_cost = m["times"].get("draft", 0.0) / max(1, acc["drafted"])
        timed = "draft" in m["times"]  # timing=coarse records the wall only: nothing to predict from
        if costs and timed:
            out["predicted_speedup"] = predicted_speedup(steps, m["new_tokens"], draft_cost, costs, n_seq)
            out["alpha"] = draft_cost / interp_cost(costs, 1)
            out["eq14_speedup"] = eq14_speedup(acc["v_d"], acc["r_d"], out["alpha"])
        if timed and per_category and any(r["method"].get("step_times") for r in records):
            refit = refit_costs(records)
            out["refit_costs"] = refit
            out["predicted_speedup_refit"] = predicted_speedup(steps, m["new_tokens"], draft_cost, refit, n_seq)
    split = source_split(records)
    if split:
        out["draft_sources"] = split
    cats = sorted({r["category"] for r in records if r.get("category")}) if per_category else []
    if per_category:  # the whole run (not a category's slice): what a run dir without samples.jsonl keeps
        out["per_sample"] = per_sample(records)
    if cats:
        out["per_category"] = {c: aggregate([r for r in records if r.get("category") == c], None, ci, False) for c in cats}
        for c in cats:
            for k in POSITION_KEYS:
                out["per_category"][c].pop(k, None)
    return out


def per_sample(records: list[dict]) -> list[dict]:
    """Per sample, what the report needs beyond the totals: the pairs behind the bootstrap interval
    and the paired test (tokens and wall of AR and of the method), the category and =AR. A lean copy
    of a run dir (config.json + summary.json, as results/leaderboard keeps them) is read through it."""
    return [{"id": r["id"], "category": r.get("category"), "matches_ar": bool(r["matches_ar"]),
             **{k: {"new_tokens": r[k]["new_tokens"], "wall": r[k]["wall"]} for k in ("ar", "method")}} for r in records]


def source_split(records: list[dict]) -> dict:
    """Per draft source (a method that records `draft_source` per step: SAM-Decoding's dynamic,
    static, aux): its steps, the tokens it drafted (a tree's nodes) and how many were accepted and kept."""
    out: dict[str, dict] = {}
    for r in records:
        m = r["method"]
        for src, row in zip(m.get("draft_source") or [], m.get("steps", [])):
            s, d = StepStats.of(row), out.setdefault(src, {"steps": 0, "drafted": 0, "accepted": 0, "kept": 0})
            d["steps"] += 1
            d["drafted"] += s.draft_tokens
            d["accepted"] += s.accepted
            d["kept"] += s.kept
    return out


def source_line(split: dict) -> str:
    kept = sum(d["kept"] for d in split.values())
    return "draft sources (steps, accepted / drafted, share of the kept draft tokens): " + "   ".join(
        f"{src} {d['steps']}, {d['accepted']}/{d['drafted']}, {_fmt(_percent(d['kept'] / kept if kept else None), '.0f')}%"
        for src, d in sorted(split.items()))


def _fmt(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def _percent(x):
    return None if x is None else 100 * x


def _ci_text(s: dict) -> str:
    ci = s.get("speedup_ci")
    if not ci:
        return f"n={s['samples']}, no CI"
    shared = ", on shared cores" if (s.get("shared_cores") or {}).get("shared") else ""
    return f"{100 * s['ci_level']:.0f}% CI {ci[0]:.3f}-{ci[1]:.3f}, n={s['samples']}{shared}"


def _shared_lines(s: dict) -> list[str]:
    """The whole-run load check (interference.shared_cores): a run that shared its cores from
    start to end has no spikes against its own medians, so it is said here."""
    sc = s.get("shared_cores") or {}
    if not sc.get("shared"):
        return []
    return [f"warning: the run shared its cores ({'; '.join(sc['reasons'])}): its timings, speedup and CI "
            "are not a quiet machine's; run again with the cores to itself (python -m specbench.tools.calibrate checks)"]


def _measurement_lines(s: dict, meta: dict) -> list[str]:
    lines = [
        f"speedup {_fmt(s['speedup'], '.3f')}x pooled ({_ci_text(s)})   median per sample "
        f"{_fmt(s.get('speedup_per_sample_median'), '.3f')}x   (per-sample mean {_fmt(s['speedup_per_sample_mean'], '.3f')}"
        f" ± {_fmt(s['speedup_per_sample_std'], '.3f')})",
        f"predicted {_fmt(s.get('predicted_speedup'), '.3f')}x (start-up profile)   "
        f"{_fmt(s.get('predicted_speedup_refit'), '.3f')}x (refit from this run's verify steps)   "
        f"eq.14 {_fmt(s.get('eq14_speedup'), '.3f')}x",
    ]
    prof = meta.get("profile")
    if prof:
        bad = f"; still non-monotone at k={prof['non_monotone']}" if prof.get("non_monotone") else ""
        again = f"; re-measured k={sorted(prof['remeasured'])}" if prof.get("remeasured") else ""
        lines.append(f"profile: spread of repeats up to {100 * prof['max_spread']:.0f}%{again}{bad}")
    inter = s.get("interference")
    if inter:
        lines.append(
            f"interference: {inter['remeasured']} sample(s) re-measured, {inter['spiked']} still spiked (flagged)   "
            f"load avg {_fmt(inter['loadavg_1m_median'], '.2f')}   CPU/wall {_fmt(inter['cpu_per_wall_median'], '.2f')}   "
            f"others on our CPUs {_fmt(_percent(inter.get('foreign_share')), '.1f')}%"
        )
    lines += _shared_lines(s)
    if s.get("ci_wide"):
        lines.append(f"warning: the CI spans {100 * s['ci_rel_width']:.0f}% of the speedup: "
                     "more samples or a quieter machine (python -m specbench.tools.calibrate checks)")
    return lines


POSITION_KEYS = ("pos_drafted", "pos_accepted", "pos_reached", "accepted_hist")


def _rates(rates: list, n: int = 12) -> str:
    return " ".join("-" if r is None else f"{r:.2f}" for r in rates[:n])


def acceptance_lines(s: dict) -> list[str]:
    """The acceptance figures, each defined where it is printed (docs/metrics.md)."""
    acc = s["acceptance"]
    lines = [f"v_d {_fmt(acc['v_d'])}  r_d {_fmt(acc['r_d'])}  HM {_fmt(acc['hm'], '.2f')}  tau {_fmt(acc['tau'], '.2f')}"
             f"  accepted/step {_fmt(acc['mean_accepted'], '.2f')}  drafted/step {_fmt(acc['mean_drafted'], '.2f')}",
             "  (v_d = accepted / drafted, drafted = a chain's length or a tree's depth per step; "
             f"per token drafted, a tree's nodes counted: v_d {_fmt(acc.get('v_d_tokens'))})"]
    if "pos_reached" in s:  # summaries written before it was recorded print the unconditional rate only
        rates = position_rates(s["pos_drafted"], s["pos_accepted"], s["pos_reached"])
        lines += ["acceptance by draft position i (1 = first drafted token; a tree: depth i):",
                  "  unconditional (accepted at i / drafts with a position i): " + _rates(rates["unconditional"]),
                  "  conditional (accepted at i / drafts that reached i, i.e. accepted 1..i-1): " + _rates(rates["conditional"])]
    else:
        rates = [a / d if d else None for d, a in zip(s["pos_drafted"], s["pos_accepted"])]
        lines.append("acceptance by draft position (unconditional: accepted at i / drafts with a position i): " + _rates(rates))
    hist = s.get("accepted_hist")
    if hist:
        lines.append("steps by draft tokens accepted: " + "  ".join(f"{n}: {c}" for n, c in enumerate(hist)))
    return lines


def step_line(s: dict) -> str | None:
    """Why a drafter wins or loses, per verify step, in AR steps: AR's decoding time per token, its
    prefill left out (the method's prefill is compared apart). What the drafts cost (how many, at what
    each: the draft head's cost), what the one verify forward over them costs (its width), and the
    tokens it commits (tau); its decoding beats AR's when draft + verify < tau. (Until session 55 the
    unit was AR's whole time per token, prefill included, which made every drafter look cheaper.)"""
    acc, ar, m = s.get("acceptance"), s.get("ar"), s.get("method")
    if not acc or not acc.get("tau") or not acc.get("steps") or not ar or not m:
        return None
    times, ar_times = m.get("times", {}), ar.get("times", {})
    ar_steps = ar["new_tokens"] - s.get("sequences", s["samples"])  # each prefill gives one token
    ar_decode = ar["wall"] - ar_times.get("prefill", 0.0)
    if "draft" not in times or "verify" not in times or ar_steps <= 0 or ar_decode <= 0:
        return None
    unit = acc["steps"] * ar_decode / ar_steps  # seconds of AR decoding for as many steps as the method's
    tau, drafted = acc["tau"], acc["draft_tokens"] / acc["steps"]
    draft, verify = times["draft"] / unit, times["verify"] / unit
    each = f" at {draft / drafted:.2f} each" if drafted else ""
    verdict = "<" if draft + verify < tau else ">="
    prefill = (f"; its prefill {times['prefill'] / ar_times['prefill']:.2f}x AR's"
               if times.get("prefill") and ar_times.get("prefill") else "")
    return (f"per verify step, in AR decoding steps: {drafted:.2f} draft tokens{each} = {draft:.2f}, one verify forward "
            f"over {drafted + 1:.2f} rows = {verify:.2f}; it commits tau {tau:.2f} tokens (draft + verify "
            f"{draft + verify:.2f} {verdict} tau {tau:.2f}){prefill}")


SYSTEM_COLUMNS = ["", "tokens", Column("wall s", spec=".2f"), Column("tok/s", spec=".2f"), Column("quality", align="<")]
CATEGORY_COLUMNS = ["category", "samples", Column("speedup", align="<"), Column("tau", align="<")]  # labelled cells, no header


def print_summary(s: dict, meta: dict) -> str:
    lines = [
        f"\n== {meta['method']} vs AR | task {meta['task']} | model {meta['model']} | {meta.get('device', '?')}, "
        f"execution {meta.get('execution', 'eager')} | {s['samples']} samples ==",
        f"lossless by design: {meta['lossless']}   outputs identical to AR: {s.get('matches_ar', 0)}/{s['samples']}",
        "settings: " + ", ".join(f"{k}={v}" for k, v in meta["method_settings"].items() if k not in ("method", "lossless")),
    ]
    lines += [f"WARNING: {note}" for note in meta.get("task_notes") or []]
    if s.get("graph_captures_timed"):
        lines.append(f"note: {s['graph_captures_timed']} CUDA graph captures fell inside timed generations "
                     "(each costs its sample about three eager forwards)")
    if meta["method_settings"].get("draft_trained") is False:
        lines.append("note: the draft is untrained (run `python -m specbench.train` to distil it); expect a slowdown")
    if s["samples"]:
        ar, m = s["ar"], s["method"]
        systems = [("AR", ar), (meta["method"], m)] + ([("AR base", s["base"])] if "base" in s else [])
        rows = [[name, d["new_tokens"], d["wall"], d["tokens_per_s"],
                 ", ".join(f"{k}={v:.3f}" for k, v in d["quality"].items()) or "n/a"] for name, d in systems]
        lines.append(table.text(SYSTEM_COLUMNS, rows))
        if "base" in s:
            lines.append(f"AR base = original weights; its output follows AR's (fine-tuned) for {_fmt(s['base'].get('agreement'))}"
                         " of AR's tokens (common prefix)")
        lines += _measurement_lines(s, meta)
        if s.get("acceptance"):
            lines += acceptance_lines(s)
        if s.get("draft_sources"):
            lines.append(source_line(s["draft_sources"]))
        terms = s.get("cost_terms")
        if terms:
            parts = " + ".join(f"{k} {v:.2f}" for k, v in terms.items() if k != "total")
            lines.append(f"time per token in AR's time per token: {parts} = {terms['total']:.2f} (AR: 1.00)")
            why = step_line(s)
            lines += [why] if why else []
        share = m["time_share"]
        lines.append(
            "time share (method): " + ("  ".join(f"{k} {100 * v:.1f}%" for k, v in share.items()) or "n/a (timing=coarse: wall clock only)")
        )
        if s.get("per_category"):
            rows = [[c, f"{cs['samples']} samples", f"speedup {_fmt(cs.get('speedup'), '.3f')}x",
                     f"tau {_fmt((cs.get('acceptance') or {}).get('tau'), '.2f')}"] for c, cs in s["per_category"].items()]
            lines += ["per category:", table.text(CATEGORY_COLUMNS, rows, indent="  ", header=False)]
    text = "\n".join(lines)
    print(text)
    return text
