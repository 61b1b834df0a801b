"""specbench's vLLM worker: `<vLLM env python> worker.py SPEC.json` (stdlib + vllm only; see settings.worker_spec).

Builds vLLM's AR engine and, for a speculative method, a second engine with its speculative_config, in this one
process; then for each batch size B runs the prompts in groups of B (each group submitted together, the next
after it finishes) through both, the order alternating per batch size, and appends one JSON line per batch size
to spec["out"] (flushed at once, so a crash keeps the finished batch sizes). Per system and batch size: output
token ids, wall time, per-request TTFT / TPOT (RequestOutput.metrics), and the difference of vLLM's spec-decode
counters (llm.get_metrics(), which needs disable_log_stats=False) over the batch size's generation.
"""

import json
import os
import sys
import time

COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
            "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def _add(a: list, b: list, sign: int = 1) -> list:
    """Element-wise a + sign * b, the shorter padded with zeros."""
    n = max(len(a), len(b))
    return [x + sign * y for x, y in zip(a + [0] * (n - len(a)), b + [0] * (n - len(b)))]


def counters(llm) -> dict:
    """vLLM's spec-decode counters so far (summed over engines; one per data-parallel rank)."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_pos": []}
    for m in llm.get_metrics():
        if m.name in COUNTERS:
            out[COUNTERS[m.name]] += int(m.value)
        elif m.name == PER_POS:
            out["accepted_per_pos"] = _add(out["accepted_per_pos"], [int(v) for v in m.values])
    return out


def difference(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in COUNTERS.values()} | {
        "accepted_per_pos": _add(after["accepted_per_pos"], before["accepted_per_pos"], -1)}


def request_times(out) -> dict:
    """TTFT and TPOT of one finished request from RequestOutput.metrics (None where vLLM gave none)."""
    m, n = getattr(out, "metrics", None), len(out.outputs[0].token_ids)
    first = getattr(m, "first_token_latency", None)
    if first is None:
        first_ts, arrival = getattr(m, "first_token_ts", None), getattr(m, "arrival_time", None)
        first = first_ts - arrival if first_ts and arrival else None
    first_ts, last_ts = getattr(m, "first_token_ts", None), getattr(m, "last_token_ts", None)
    tpot = (last_ts - first_ts) / (n - 1) if first_ts and last_ts and n > 1 else None
    return {"ttft": first, "tpot": tpot}


def _stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, user + system clock ticks) of a live process, from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
    except OSError:
        return None
    return int(fields[1]), int(fields[11]) + int(fields[12])


def cpu_seconds() -> float | None:
    """CPU time of this process and every process under it (vLLM's engine cores and workers); None off Linux."""
    if not os.path.isdir("/proc/self"):
        return None
    stats = {int(p): st for p in os.listdir("/proc") if p.isdigit() and (st := _stat(p))}
    tree = {os.getpid()}
    for _ in range(4):  # worker -> engine core -> vLLM worker (-> its helpers)
        tree |= {pid for pid, (ppid, _) in stats.items() if ppid in tree}
    ticks = sum(stats[pid][1] for pid in tree if pid in stats)
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_share(cpu: float | None, wall: float) -> float | None:
    """vLLM's CPU time over the wall time times the cores it may use: well below 1, something else ran on
    those cores during the measurement (a shared machine), and its throughput is low by about that much."""
    cores = len(os.sched_getaffinity(0))
    return cpu / (wall * cores) if cpu is not None and wall > 0 else None


def generate(llm, spec, batch: int) -> dict:
    from vllm import SamplingParams

    s = spec["sampling"]
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    params = [SamplingParams(temperature=s["temperature"], top_p=s["top_p"], top_k=s["top_k"], max_tokens=s["max_tokens"],
                             stop_token_ids=s["stop_token_ids"], ignore_eos=s["ignore_eos"], seed=s["seed"] + i)
              for i in range(len(prompts))]
    before, outs, cpu = counters(llm), [], cpu_seconds()
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        outs += llm.generate(prompts[i:i + batch], params[i:i + batch], use_tqdm=False)
    wall = time.perf_counter() - start
    cpu = cpu_seconds() - cpu if cpu is not None else None
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    return {"tokens": tokens, "wall": wall, "new_tokens": sum(map(len, tokens)), "cpu_share": cpu_share(cpu, wall),
            "requests": [request_times(o) for o in outs], "spec": difference(counters(llm), before)}


def engine(spec, speculative):
    from vllm import LLM

    return LLM(model=spec["model"], tokenizer=spec["model"], dtype=spec["dtype"], max_model_len=spec["max_model_len"],
               enforce_eager=spec["enforce_eager"], tensor_parallel_size=spec["tensor_parallel_size"],
               pipeline_parallel_size=spec["pipeline_parallel_size"], max_num_seqs=spec["max_num_seqs"],
               seed=spec["seed"], speculative_config=speculative, disable_log_stats=False)


def warm_up(llm, spec) -> None:
    """First calls pay for allocation and kernel selection: one unmeasured generation per engine."""
    from vllm import SamplingParams

    n = min(len(spec["prompts"]), spec["max_num_seqs"])
    params = SamplingParams(temperature=0.0, max_tokens=max(1, spec["warmup_tokens"]))
    llm.generate([{"prompt_token_ids": p} for p in spec["prompts"][:n]], params, use_tqdm=False)


def main(path: str) -> None:
    with open(path) as f:
        spec = json.load(f)
    import vllm

    start = time.perf_counter()
    ar = engine(spec, None)
    method = engine(spec, spec["speculative_config"]) if spec["speculative_config"] else ar
    for llm in {id(ar): ar, id(method): method}.values():
        warm_up(llm, spec)
    info = {"kind": "info", "vllm": vllm.__version__, "start_s": time.perf_counter() - start, "pid": os.getpid()}
    with open(spec["out"], "a") as out:
        out.write(json.dumps(info) + "\n")
        out.flush()
        for index, batch in enumerate(spec["batch_sizes"]):
            order = [("ar", ar), ("method", method)] if index % 2 == 0 else [("method", method), ("ar", ar)]
            rec = {"kind": "batch", "batch_size": batch} | {key: generate(llm, spec, batch) for key, llm in order}
            out.write(json.dumps(rec) + "\n")
            out.flush()
            os.fsync(out.fileno())


if __name__ == "__main__":  # vLLM spawns processes that import this file: nothing may run on import
    main(sys.argv[1])
