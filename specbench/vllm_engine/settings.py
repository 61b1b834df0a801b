"""The plain JSON spec the vLLM worker receives: vLLM's settings from the composed config, the prompts as token ids.

conf/method/vllm/<name>.yaml keeps vLLM's meaning under shorter names; `speculative_config` maps them to
vLLM's SpeculativeConfig keys (suffix: `suffix_decoding_*`). The prompts are tokenized here, with the
same tokenizer and chat template as the native engine, so both engines decode the same token ids.
"""

from __future__ import annotations

from pathlib import Path

SUFFIX_KEYS = {"max_tree_depth": "suffix_decoding_max_tree_depth", "max_cached_requests": "suffix_decoding_max_cached_requests",
               "max_spec_factor": "suffix_decoding_max_spec_factor", "min_token_prob": "suffix_decoding_min_token_prob"}
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def speculative_config(method) -> dict | None:
    """vLLM's speculative_config for a conf/method/vllm method's settings (None: AR)."""
    name = method.name
    if name == "ar":
        return None
    spec = {"method": name, "num_speculative_tokens": int(method.num_speculative_tokens)}
    if name == "ngram":
        spec |= {"prompt_lookup_min": int(method.prompt_lookup_min), "prompt_lookup_max": int(method.prompt_lookup_max)}
    elif name == "suffix":
        spec |= {vllm_key: getattr(method, key) for key, vllm_key in SUFFIX_KEYS.items()}
    else:  # eagle, eagle3, medusa, draft_model: the drafter vLLM loads
        spec["model"] = str(method.model)
    return spec


def worker_python(engine) -> Path:
    """The vLLM environment's interpreter (engine.python; relative paths from the project root)."""
    p = Path(str(engine.python)).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p


def sampling(run, max_new: int, eos_ids) -> dict:
    s = run.sampling
    return {"temperature": float(s.temperature), "top_p": float(s.top_p),
            "top_k": int(s.top_k) or -1,  # vLLM: -1 is no top-k, the project's 0
            "max_tokens": int(max_new), "stop_token_ids": sorted(int(i) for i in eos_ids),
            "ignore_eos": bool(run.engine.ignore_eos), "seed": int(run.seed)}


def worker_spec(run, model: str, prompts: list[list[int]], ids: list[str], batch_sizes: list[int],
                eos_ids, max_new: int, out: str) -> dict:
    """Everything the worker needs, as plain JSON (`run`: the run's settings, specbench/config/settings.py)."""
    e = run.engine
    return {
        "model": model, "dtype": e.dtype, "max_model_len": int(e.max_model_len), "enforce_eager": bool(e.enforce_eager),
        "tensor_parallel_size": int(e.tensor_parallel_size), "pipeline_parallel_size": int(e.pipeline_parallel_size),
        "max_num_seqs": max(int(b) for b in e.batch_sizes), "seed": int(run.seed),
        "speculative_config": speculative_config(run.method),
        "prompts": prompts, "ids": ids, "batch_sizes": [int(b) for b in batch_sizes],
        "sampling": sampling(run, max_new, eos_ids), "warmup_tokens": int(run.warmup_tokens), "out": out,
    }
